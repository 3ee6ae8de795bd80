"""The training loop shared by the reward-model trainers (`rm train`, `prm train`): shuffled minibatches per epoch,
AdamW with warm-up and the configured schedule, gradient clipping, metrics, periodic evaluation and checkpoints
that resume exactly."""

from __future__ import annotations

import dataclasses
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
from rewardlab.trackers import open_trackers
from rewardlab.train_state import restore_training_state, rng_state, save_state

#: Settings a resumed reward-model run may change (checkpointing, and the micro-batch, which changes the floats'
#: rounding only): the epochs, rows and batch size fix the schedule and the shuffled order, so any other change is
#: refused.
RESUME_MAY_CHANGE = ("save_every", "keep_checkpoints", "train.micro_batch_size")


@contextmanager
def open_fit_run(cfg: Any, *, mode: RunMode, may_change: Sequence[str] = RESUME_MAY_CHANGE
                 ) -> Iterator[tuple[RunDir, int, Path | None, random.Random]]:
    """Open `cfg.out` for a training run of `fit` (`RunDir.start`), record or check its config (a resume may change
    only the dotted keys `may_change`), and on a resume find the newest valid checkpoint; seed torch with `cfg.seed`.

    Yields:
        (run, the step resumed from (0 for a new run), that checkpoint's directory or None, the `random.Random`
        that shuffles the rows, seeded with `cfg.seed`; `fit` restores the weights and its state from the
        checkpoint).
    Raises:
        RunDirError: as `RunDir.start`, `RunDir.record_config` and `RunDir.resume_checkpoint` raise it.
    """
    with RunDir.start(cfg.out, mode=mode) as run:
        run.record_config(dump_config(cfg), resume=mode == "resume", may_change=may_change)
        start_step, checkpoint = run.resume_checkpoint() if mode == "resume" else (0, None)
        run.attach_trackers(open_trackers(cfg.report_to, run.path, run_name=cfg.out, config=cfg.model_dump(mode="json"),
                                          resume_step=start_step if mode == "resume" else None))
        torch.manual_seed(cfg.seed)
        yield run, start_step, checkpoint, random.Random(cfg.seed)


@dataclasses.dataclass(frozen=True)
class FitObjective:
    """What `fit` minimises and reports.

    batch_loss: row indices -> (their loss, the mean over their `units`: a scalar tensor; a record of what the
        metrics need). batch_metrics: the records of a step's micro-batches -> its `train/*` metrics.
    progress_key: the metric the progress bar shows beside the loss. units: row indices -> how many units (pairs,
        steps) the loss averages over (default: one per row). evaluate: () -> `eval/*` metrics, or None (no
        evaluation).
    """

    batch_loss: Callable[[Sequence[int]], tuple[torch.Tensor, Any]]
    batch_metrics: Callable[[list[Any]], dict[str, float]]
    progress_key: str
    units: Callable[[Sequence[int]], int] = len
    evaluate: Callable[[], dict[str, float]] | None = None


@dataclasses.dataclass(frozen=True)
class FitCheckpoints:
    """Where and how often `fit` saves checkpoints, and the one it resumes from.

    run: the run directory (metrics.jsonl, checkpoints/step-K). save_model: writes the weights into a directory
    (HF format). save_every: steps between checkpoints (the last step always saves one). keep: how many of the most
    recent are kept (None: all). resume_from: a checkpoint directory `fit` saved, or None (a new run).
    """

    run: RunDir
    save_model: Callable[[Path], None]
    save_every: int
    keep: int | None = None
    resume_from: Path | None = None


def fit(model: torch.nn.Module, params: Any, n_rows: int, objective: FitObjective, checkpoints: FitCheckpoints, *,
        rng: random.Random, name: str,
        show_progress: bool = True) -> tuple[int, dict[str, float], dict[str, float], Path]:
    """Train `model` for `params.epochs` passes over `n_rows` rows in shuffled minibatches of `params.batch_size`.

    Each step's rows are cut into micro-batches of `params.micro_batch_size` rows (None: one), and for each
    `objective.batch_loss(row indices)` is backpropagated with the weight units(micro-batch) / units(step's rows),
    so the accumulated gradient is that of the step's mean loss up to float rounding; `objective.batch_metrics`
    gives the step's `train/*` metrics from its micro-batches' records. AdamW (`params.lr`, `params.weight_decay`)
    with `params.warmup_steps` linear warm-up and `params.lr_schedule`; the global grad norm clipped to
    `params.grad_clip`. Logged per step to the run's metrics.jsonl: `train/loss`, the batch metrics, `lr`,
    `time/step_s` (seconds), plus `objective.evaluate()`'s `eval/*` metrics every `params.eval_every` steps and at
    the end. The row order comes from `rng` (one shuffle per epoch, at its first step). `name` titles the progress
    bar.

    Every `checkpoints.save_every` steps and at the last one, a checkpoint step-K is saved in the run:
    `save_model(dir)` (the weights) and trainer_state.pt (optimizer, schedule, `rng`'s state, the epoch's row
    order, the torch and Python RNG states, the last metrics); the `checkpoints.keep` most recent are kept. With
    `checkpoints.resume_from`, its weights and state are restored (`restore_training_state`) and training
    continues after its step, logging what the uninterrupted run logs.

    Returns:
        (steps done, the last step's metrics, the last evaluation's metrics or {}, the final checkpoint's path).
    Raises:
        ValueError: the checkpoint resumed from was saved by a run over other rows or another batch size.
    """
    per_epoch = math.ceil(n_rows / params.batch_size)
    steps = params.epochs * per_epoch
    optimizer = make_optimizer(model, params.lr, params.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=params.warmup_steps, total_steps=steps, kind=params.lr_schedule)
    st = _FitState(order=list(range(n_rows)), final=checkpoints.resume_from)
    if checkpoints.resume_from is not None:
        st = _resume(checkpoints.resume_from, model, optimizer, scheduler, rng, n_rows, params.batch_size)
    with stage(name, steps, enabled=show_progress) as bar:
        bar.advance(st.step)
        while st.step < steps:
            s = (st.step % per_epoch) * params.batch_size
            if s == 0:  # a new epoch
                st.order = list(range(n_rows))
                rng.shuffle(st.order)
            t0 = time.perf_counter()
            loss_value, metrics = _step(model, params, objective, optimizer, st.order[s : s + params.batch_size])
            scheduler.step()
            st.step += 1
            st.last = {"train/loss": loss_value, **metrics, "lr": scheduler.get_last_lr()[0],
                       "time/step_s": time.perf_counter() - t0}
            evaluate_now = (params.eval_every and st.step % params.eval_every == 0) or st.step == steps
            if objective.evaluate is not None and evaluate_now:
                st.last_eval = objective.evaluate()
                st.last.update(st.last_eval)
            checkpoints.run.log_metrics(st.step, st.last)
            bar.advance(1, loss=st.last["train/loss"], acc=st.last[objective.progress_key])
            if st.step % checkpoints.save_every == 0 or st.step == steps:
                st.final = _save(checkpoints, st, optimizer, scheduler, rng, n_rows, params.batch_size)
    assert st.final is not None  # steps >= 1: the last step saved one, or the run resumed from it
    return st.step, st.last, st.last_eval, st.final


@dataclasses.dataclass
class _FitState:
    """What `fit` checkpoints besides the optimizer and schedule: steps done, this epoch's row order, the last
    step's and evaluation's metrics, and the newest checkpoint (None before the first)."""

    step: int = 0
    order: list[int] = dataclasses.field(default_factory=list)
    last: dict[str, float] = dataclasses.field(default_factory=dict)
    last_eval: dict[str, float] = dataclasses.field(default_factory=dict)
    final: Path | None = None


def _resume(checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
            rng: random.Random, n_rows: int, batch_size: int) -> _FitState:
    """Restore the weights, optimizer, schedule, RNG states and `rng` from `checkpoint`; returns its `_FitState`."""
    state = restore_training_state(checkpoint, optimizer, scheduler, model=model)
    if (state["rows"], state["batch_size"]) != (n_rows, batch_size):
        raise ValueError(f"--resume: {checkpoint} was saved by a run over {state['rows']} rows in batches of "
                         f"{state['batch_size']}; this config gives {n_rows} rows in batches of {batch_size}")
    rng.setstate(state["order_rng"])
    return _FitState(step=state["step"], order=state["order"], last=state["last"], last_eval=state["last_eval"],
                     final=checkpoint)


def _save(checkpoints: FitCheckpoints, st: _FitState, optimizer: torch.optim.Optimizer, scheduler: Any,
          rng: random.Random, n_rows: int, batch_size: int) -> Path:
    """Save checkpoint step-K (K = `st.step`): the weights and trainer_state.pt; returns its directory."""

    def write(tmp: Path) -> None:
        checkpoints.save_model(tmp)
        save_state(tmp, {"step": st.step, "rows": n_rows, "batch_size": batch_size,
                         "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                         "order_rng": rng.getstate(), "order": st.order, "rng": rng_state(), "last": st.last,
                         "last_eval": st.last_eval})

    return checkpoints.run.save_checkpoint(st.step, write, keep=checkpoints.keep)


def _step(model: torch.nn.Module, params: Any, objective: FitObjective, optimizer: torch.optim.Optimizer,
          rows: list[int]) -> tuple[float, dict[str, float]]:
    """One optimizer step on `rows` (micro-batches of `params.micro_batch_size`, gradients weighted by their units,
    the grad norm clipped to `params.grad_clip`); returns (the step's loss, its batch metrics)."""
    total = max(objective.units(rows), 1)
    size = params.micro_batch_size or len(rows)
    optimizer.zero_grad(set_to_none=True)
    loss_value, records = 0.0, []
    for a in range(0, len(rows), size):
        part = rows[a : a + size]
        loss, record = objective.batch_loss(part)
        loss = loss * (objective.units(part) / total)
        loss.backward()
        loss_value += loss.item()
        records.append(record)
    metrics = objective.batch_metrics(records)
    torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
    optimizer.step()
    return loss_value, metrics
