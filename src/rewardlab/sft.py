"""Supervised warm start: next-token cross-entropy on the answer tokens of task rows (prompt tokens masked)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import SFTConfig, dump_config
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy, load_policy
from rewardlab.progress import stage
from rewardlab.runs import RunDir
from rewardlab.tasks import load as load_task
from rewardlab.tasks.sampler import RowSampler
from rewardlab.threads import apply_threads
from rewardlab.train_state import load_state, load_weights, rng_state, save_state, set_rng_state


def sft_loss(policy: Policy, prompt_ids: list[list[int]], target_ids: list[list[int]]) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood per answer token (nats), and the number of answer tokens.

    loss = -sum_{i,t} m_{i,t} log p(y_{i,t} | x_i, y_{i,<t}) / sum m, m = 1 on answer tokens (EOS included).
    """
    batch = policy.collate(prompt_ids, target_ids)
    logprobs, _ = policy.token_logprobs(batch)
    n_tokens = batch.mask.sum()
    return -(logprobs * batch.mask).sum() / n_tokens.clamp(min=1), int(n_tokens.item())


def run_sft(cfg: SFTConfig, *, resume: bool = False, overwrite: bool = False,
            show_progress: bool = True) -> dict[str, Any]:
    """Train `cfg.model` on `cfg.task`'s training rows (prompt -> row[`cfg.sft.target`] + EOS, the target field
    defaulting to `answer`) for `cfg.sft.steps` steps.

    Writes the run directory `cfg.out` (see `rewardlab.runs`): config.yaml, metrics.jsonl (`sft/loss`, `lr`,
    `time/step_s`, `time/tokens_per_s`), checkpoints/step-K every `cfg.save_every` steps and at the end (HF format
    plus trainer_state.pt: optimizer, schedule, row sampler and RNG state; the `cfg.keep_checkpoints` most recent
    kept), plots/sft_loss.png and summary.json. The directory is opened with `RunDir.start` once the task and model
    load: a new run needs an empty or missing directory; `overwrite` replaces the run there; `resume` continues it
    from its newest valid checkpoint, so step k+1 logs exactly (bit for bit) what the uninterrupted run logs.

    Returns:
        the summary: final loss, steps, wall seconds, `final_checkpoint` path, `resumed_from` (step, or None).
    Raises:
        ValueError: a training row without the target field; `RunDirError` (a ValueError): the directory holds a
            run and neither `resume` nor `overwrite` is given, is in use, or has no valid checkpoint to resume.
    """
    torch.manual_seed(cfg.seed)
    task = load_task(cfg.task.spec, **cfg.task.options)
    policy = load_policy(
        cfg.model.path, prompt_format=cfg.model.prompt_format, dtype=cfg.model.dtype, device=cfg.model.device,
        tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed,
    )
    p = cfg.sft
    missing = next((i for i, r in enumerate(task.train) if p.target not in r), None)
    if missing is not None:
        raise ValueError(f"sft.target: training row {missing} of {cfg.task.spec} has no field {p.target!r}")
    with RunDir.start(cfg.out, resume=resume, overwrite=overwrite) as run:  # only once the task and model load
        return _train(cfg, task, policy, run, resume, show_progress)

#: Settings a resumed run may change (train longer, checkpoint differently); any other change is refused.
RESUME_MAY_CHANGE = ("sft.steps", "save_every", "keep_checkpoints")


def _train(cfg: SFTConfig, task, policy: Policy, run: RunDir, resume: bool, show_progress: bool) -> dict[str, Any]:
    p = cfg.sft
    apply_threads(cfg.threads)
    start_step, checkpoint = 0, None
    if resume:  # the newest valid checkpoint, logs rolled back to it; allowed changes written to config.yaml
        start_step, checkpoint = run.resume_training(dump_config(cfg), may_change=RESUME_MAY_CHANGE, steps=p.steps,
                                                     steps_key="sft.steps")
    else:
        run.write_config(dump_config(cfg))
    if checkpoint is not None:
        load_weights(policy.model, checkpoint)
    encoded = [
        (policy.encode_prompt(policy.format_prompt(r["prompt"])), policy.encode_target(str(r[p.target])))
        for r in task.train
    ]
    sampler = RowSampler(list(range(len(encoded))), seed=cfg.seed)  # type: ignore[arg-type]
    optimizer = make_optimizer(policy.model, p.lr, p.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=p.warmup_steps, total_steps=p.steps, kind="cosine")
    loss_value = float("nan")
    if checkpoint is not None:
        state = load_state(checkpoint)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        loss_value = state["loss"]

    def save(step: int) -> Path:
        def write(tmp: Path) -> None:
            policy.save(tmp)
            save_state(tmp, {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                             "sampler": sampler.state_dict(), "rng": rng_state(), "loss": loss_value})

        return run.save_checkpoint(step, write, keep=cfg.keep_checkpoints)

    policy.model.train()
    start, final = time.perf_counter(), checkpoint
    with stage("SFT", p.steps, enabled=show_progress) as bar:
        bar.advance(start_step)
        for step in range(start_step + 1, p.steps + 1):
            t0 = time.perf_counter()
            idx = sampler.next(p.batch_size)
            loss, n_tokens = sft_loss(policy, [encoded[i][0] for i in idx], [encoded[i][1] for i in idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), p.grad_clip)
            optimizer.step()
            scheduler.step()
            loss_value = loss.item()
            dt = time.perf_counter() - t0
            run.log_metrics(step, {"sft/loss": loss_value, "lr": scheduler.get_last_lr()[0],
                                   "time/step_s": dt, "time/tokens_per_s": n_tokens / dt})
            bar.advance(1, loss=loss_value)
            if step % cfg.save_every == 0 or step == p.steps:
                final = save(step)
    if final is None:  # sft.steps=0: the initial model is the result
        final = save(0)
    run.plot(["sft/loss"], "sft_loss.png")
    summary = {"stage": "sft", "steps": p.steps, "final_loss": loss_value, "wall_s": time.perf_counter() - start,
               "train_rows": len(task.train), "final_checkpoint": str(final),
               "resumed_from": start_step if resume else None}
    run.write_summary(summary)
    return summary
