"""The training loop shared by the reward-model trainers (`rm train`, `prm train`): shuffled minibatches per epoch,
AdamW with warm-up and the configured schedule, gradient clipping, metrics and periodic evaluation."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.progress import stage
from rewardlab.runs import RunDir


def fit(
    model: torch.nn.Module,
    params: Any,
    n_rows: int,
    batch_loss: Callable[[Sequence[int]], tuple[torch.Tensor, dict[str, float]]],
    *,
    rng: random.Random,
    run: RunDir,
    name: str,
    progress_key: str,
    evaluate: Callable[[], dict[str, float]] | None = None,
    show_progress: bool = True,
) -> tuple[int, dict[str, float], dict[str, float]]:
    """Train `model` for `params.epochs` passes over `n_rows` rows in shuffled minibatches of `params.batch_size`.

    Each step: `batch_loss(row indices)` -> (scalar loss tensor, its `train/*` metrics); AdamW (`params.lr`,
    `params.weight_decay`) with `params.warmup_steps` linear warm-up and `params.lr_schedule`; the global grad norm
    clipped to `params.grad_clip`. Logged per step to `run`'s metrics.jsonl: `train/loss`, the batch metrics, `lr`,
    `time/step_s` (seconds), plus `evaluate()`'s `eval/*` metrics every `params.eval_every` steps and at the end
    (no evaluation when `evaluate` is None). The row order comes from `rng` (one shuffle per epoch).

    Returns:
        (steps done, the last step's metrics, the last evaluation's metrics or {}).
    """
    steps = params.epochs * math.ceil(n_rows / params.batch_size)
    optimizer = make_optimizer(model, params.lr, params.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=params.warmup_steps, total_steps=steps, kind=params.lr_schedule)
    step, last, last_eval = 0, {}, {}
    with stage(name, steps, enabled=show_progress) as bar:
        for _ in range(params.epochs):
            order = list(range(n_rows))
            rng.shuffle(order)
            for s in range(0, n_rows, params.batch_size):
                t0 = time.perf_counter()
                loss, metrics = batch_loss(order[s : s + params.batch_size])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), params.grad_clip)
                optimizer.step()
                scheduler.step()
                step += 1
                last = {"train/loss": loss.item(), **metrics, "lr": scheduler.get_last_lr()[0],
                        "time/step_s": time.perf_counter() - t0}
                if evaluate is not None and ((params.eval_every and step % params.eval_every == 0) or step == steps):
                    last_eval = evaluate()
                    last.update(last_eval)
                run.log_metrics(step, last)
                bar.advance(1, loss=last["train/loss"], acc=last[progress_key])
    return step, last, last_eval
