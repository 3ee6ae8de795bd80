"""Supervised warm start: next-token cross-entropy on the answer tokens of task rows (prompt tokens masked).

During training:
- with `sft.eval_every`, the policy is evaluated greedily on the first `sft.eval_n` held-out questions every that
  many steps and at the last (`rewardlab.evaluation.heldout`; completions up to the longest training target's
  tokens), logged as eval/accuracy and plotted in plots/sft_loss.png; a task without held-out rows is a ValueError
  naming sft.eval_every (`heldout_rows`, to be called before the run directory is opened);
- a first Ctrl-C (SIGINT, main thread only) ends the run after the step it is in: a checkpoint of that step and the
  summary (`interrupted: true`) are written and `rewardlab.interrupt.Interrupted` is raised; a second one raises
  KeyboardInterrupt at once. The SIGINT handler in place before is restored.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import SFTConfig, dump_config
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy
from rewardlab.progress import stage
from rewardlab.runs import RunDir
from rewardlab.tasks import Task, check_task_for_policy
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


def check_target(task: Task, target: str, spec: str) -> None:
    """Every training row of `task` (loaded from `spec`) must have the field `target`.

    Raises:
        ValueError: "sft.target: training row I of SPEC has no field 'T'".
    """
    missing = next((i for i, r in enumerate(task.train) if target not in r), None)
    if missing is not None:
        raise ValueError(f"sft.target: training row {missing} of {spec} has no field {target!r}")


#: Settings a resumed run may change (train longer, checkpoint differently); any other change is refused.
RESUME_MAY_CHANGE = ("sft.steps", "save_every", "keep_checkpoints")


def train_sft(cfg: SFTConfig, task: Task, policy: Policy, run: RunDir, *, resume: bool = False,
              show_progress: bool = True) -> dict[str, Any]:
    """Train `policy` on `task`'s training rows (prompt -> row[`cfg.sft.target`] + EOS, the target field defaulting
    to `answer`) for `cfg.sft.steps` steps, in the run directory `run` (opened by the caller with `RunDir.start`).

    Records the config (a resume checks it: only RESUME_MAY_CHANGE may differ) and writes metrics.jsonl (`sft/loss`,
    `lr`, `time/step_s`, `time/tokens_per_s`), checkpoints/step-K every `cfg.save_every` steps and at the end (HF
    format plus trainer_state.pt: optimizer, schedule, row sampler and RNG state; the `cfg.keep_checkpoints` most
    recent kept), plots/sft_loss.png and summary.json. With `resume`, training continues from the newest valid
    checkpoint, so step k+1 logs exactly (bit for bit) what the uninterrupted run logs.

    Returns:
        the summary: final loss, steps, wall seconds, `final_checkpoint` path, `resumed_from` (step, or None).
    Raises:
        ValueError: a training row without the target field; sft.eval_every > 0 with no held-out rows
            (`heldout_rows`); `RunDirError` (a ValueError): a resume with other settings or no valid checkpoint.
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C after a step (see the module docstring).
    """
    p = cfg.sft
    check_target(task, p.target, cfg.task.spec)
    check_task_for_policy(task, policy)  # characters the tokenizer cannot encode, chat rows without a template
    rows = heldout_rows(task, p.eval_every, p.eval_n, field="sft.eval_every")
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
        (policy.encode_prompt(policy.format_prompt(r["prompt"], r.get("messages"))),
         policy.encode_target(str(r[p.target])))
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

    heldout = HeldOutEval(rows, task.reward, every=p.eval_every, last_step=p.steps,
                          max_new_tokens=max((len(t) for _, t in encoded), default=1))
    policy.model.train()
    start, final, step = time.perf_counter(), checkpoint, start_step
    with StopRequest() as stop:  # a first Ctrl-C ends the run after the current step
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
                evals = heldout(policy) if heldout.due(step) else {}
                run.log_metrics(step, {"sft/loss": loss_value, "lr": scheduler.get_last_lr()[0],
                                       "time/step_s": dt, "time/tokens_per_s": n_tokens / dt, **evals})
                bar.advance(1, loss=loss_value)
                if step % cfg.save_every == 0 or step == p.steps or stop.requested:
                    final = save(step)
                if stop.requested:
                    break
        if final is None:  # sft.steps=0: the initial model is the result
            final = save(0)
        run.plot(["sft/loss", "eval/accuracy"], "sft_loss.png")
        interrupted = stop.requested and step < p.steps
        summary = {"stage": "sft", "steps": p.steps, "final_loss": loss_value, "wall_s": time.perf_counter() - start,
                   "train_rows": len(task.train), "final_checkpoint": str(final),
                   "resumed_from": start_step if resume else None, "steps_done": step, "interrupted": interrupted}
        run.write_summary(summary)
    if interrupted:
        raise Interrupted("sft", cfg.out, step, final)
    return summary
