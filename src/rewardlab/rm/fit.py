"""The training loop shared by the reward-model trainers (`rm train`, `prm train`): shuffled minibatches per epoch,
AdamW with warm-up and the configured schedule, gradient clipping, metrics, periodic evaluation and checkpoints
that resume exactly."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import dump_config
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.progress import stage
from rewardlab.runs import RunDir, RunMode
from rewardlab.train_state import restore_training_state, rng_state, save_state

#: Settings a resumed reward-model run may change (checkpointing, and the micro-batch, which changes the floats'
#: rounding only): the epochs, rows and batch size fix the schedule and the shuffled order, so any other change is
#: refused.
RESUME_MAY_CHANGE = ("save_every", "keep_checkpoints", "train.micro_batch_size")


@contextmanager
def open_fit_run(cfg: Any, *, mode: RunMode) -> Iterator[tuple[RunDir, int, Path | None, random.Random]]:
    """Open `cfg.out` for a reward-model training run (`RunDir.start`), record or check its config, and on a resume
    find the newest valid checkpoint; seed torch with `cfg.seed`.

    Yields:
        (run, the step resumed from (0 for a new run), that checkpoint's directory or None, the `random.Random`
        that shuffles the rows, seeded with `cfg.seed`; `fit` restores the weights and its state from the
        checkpoint).
    Raises:
        RunDirError: as `RunDir.start`, `RunDir.record_config` and `RunDir.resume_checkpoint` raise it.
    """
    with RunDir.start(cfg.out, mode=mode) as run:
        run.record_config(dump_config(cfg), resume=mode == "resume", may_change=RESUME_MAY_CHANGE)
        start_step, checkpoint = run.resume_checkpoint() if mode == "resume" else (0, None)
        torch.manual_seed(cfg.seed)
        yield run, start_step, checkpoint, random.Random(cfg.seed)


def fit(
    model: torch.nn.Module,
    params: Any,
    n_rows: int,
    batch_loss: Callable[[Sequence[int]], tuple[torch.Tensor, Any]],
    *,
    batch_metrics: Callable[[list[Any]], dict[str, float]],
    units: Callable[[Sequence[int]], int] = len,
    rng: random.Random,
    run: RunDir,
    name: str,
    progress_key: str,
    save_model: Callable[[Path], None],
    save_every: int,
    keep_checkpoints: int | None = None,
    resume_from: Path | None = None,
    evaluate: Callable[[], dict[str, float]] | None = None,
    show_progress: bool = True,
) -> tuple[int, dict[str, float], dict[str, float], Path]:
    """Train `model` for `params.epochs` passes over `n_rows` rows in shuffled minibatches of `params.batch_size`.

    Each step's rows are cut into micro-batches of `params.micro_batch_size` rows (None: one), and for each
    `batch_loss(row indices)` -> (its loss, the mean over its `units` (pairs, steps): a scalar tensor; a record of
    what the metrics need) is backpropagated with the weight units(micro-batch) / units(step's rows), so the
    accumulated gradient is that of the step's mean loss up to float rounding; `batch_metrics(records)` gives the
    step's `train/*` metrics from its micro-batches' records. AdamW (`params.lr`, `params.weight_decay`) with
    `params.warmup_steps` linear warm-up and `params.lr_schedule`; the global grad norm clipped to
    `params.grad_clip`. Logged per step to `run`'s metrics.jsonl: `train/loss`, the batch metrics, `lr`,
    `time/step_s` (seconds), plus `evaluate()`'s `eval/*` metrics every `params.eval_every` steps and at the end
    (no evaluation when `evaluate` is None). The row order comes from `rng` (one shuffle per epoch, at its first
    step).

    Every `save_every` steps and at the last one, a checkpoint step-K is saved in `run`: `save_model(dir)` (the
    weights, HF format) and trainer_state.pt (optimizer, schedule, `rng`'s state, the epoch's row order, the torch
    and Python RNG states, the last metrics); the `keep_checkpoints` most recent are kept. With `resume_from` (a
    checkpoint directory this function saved), its weights and state are restored (`restore_training_state`) and
    training continues after its step, logging what the uninterrupted run logs.

    Returns:
        (steps done, the last step's metrics, the last evaluation's metrics or {}, the final checkpoint's path).
    """
    per_epoch = math.ceil(n_rows / params.batch_size)
    steps = params.epochs * per_epoch
    optimizer = make_optimizer(model, params.lr, params.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=params.warmup_steps, total_steps=steps, kind=params.lr_schedule)
    step, last, last_eval, order, final = 0, {}, {}, list(range(n_rows)), resume_from
    if resume_from is not None:
        state = restore_training_state(resume_from, optimizer, scheduler, model=model)
        if (state["rows"], state["batch_size"]) != (n_rows, params.batch_size):
            raise ValueError(f"--resume: {resume_from} was saved by a run over {state['rows']} rows in batches of "
                             f"{state['batch_size']}; this config gives {n_rows} rows in batches of "
                             f"{params.batch_size}")
        rng.setstate(state["order_rng"])
        step, order, last, last_eval = state["step"], state["order"], state["last"], state["last_eval"]

    def save() -> Path:
        def write(tmp: Path) -> None:
            save_model(tmp)
            save_state(tmp, {"step": step, "rows": n_rows, "batch_size": params.batch_size,
                             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                             "order_rng": rng.getstate(), "order": order, "rng": rng_state(), "last": last,
                             "last_eval": last_eval})

        return run.save_checkpoint(step, write, keep=keep_checkpoints)

    with stage(name, steps, enabled=show_progress) as bar:
        bar.advance(step)
        while step < steps:
            s = (step % per_epoch) * params.batch_size
            if s == 0:  # a new epoch
                order = list(range(n_rows))
                rng.shuffle(order)
            t0 = time.perf_counter()
            rows = order[s : s + params.batch_size]
            total = max(units(rows), 1)
            size = params.micro_batch_size or len(rows)
            optimizer.zero_grad(set_to_none=True)
            loss_value, records = 0.0, []
            for a in range(0, len(rows), size):
                part = rows[a : a + size]
                loss, record = batch_loss(part)
                loss = loss * (units(part) / total)
                loss.backward()
                loss_value += loss.item()
                records.append(record)
            metrics = batch_metrics(records)
            torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            last = {"train/loss": loss_value, **metrics, "lr": scheduler.get_last_lr()[0],
                    "time/step_s": time.perf_counter() - t0}
            if evaluate is not None and ((params.eval_every and step % params.eval_every == 0) or step == steps):
                last_eval = evaluate()
                last.update(last_eval)
            run.log_metrics(step, last)
            bar.advance(1, loss=last["train/loss"], acc=last[progress_key])
            if step % save_every == 0 or step == steps:
                final = save()
    assert final is not None  # steps >= 1: the last step saved one, or the run resumed from it
    return step, last, last_eval, final
