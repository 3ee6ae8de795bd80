"""The RL training loop (GRPO family), top to bottom in one function.

Per step: sample prompts -> generate G rollouts each -> score -> token rewards -> advantages (estimator looked up by
name) -> mu epochs of policy-loss minimization (loss looked up by name, optional KL to a frozen reference) -> log,
checkpoint. The loop never branches on an algorithm name.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import TrainConfig, dump_config
from rewardlab.evaluation.policy import is_correct
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy, load_policy, rollout_batch
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.rl.advantages import ESTIMATORS, compute_advantages
from rewardlab.rl.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, aggregate, compute_policy_loss, kl_penalty
from rewardlab.runs import RunDir
from rewardlab.tasks import load as load_task
from rewardlab.tasks.sampler import RowSampler
from rewardlab.types import Rollout, RewardOutput

STATE_FILE = "trainer_state.pt"


def check_names(cfg: TrainConfig) -> None:
    """Fail fast, with the valid names, when an algorithm name in `cfg.rl` is not registered."""
    for field, name, registry in (
        ("rl.estimator", cfg.rl.estimator, ESTIMATORS),
        ("rl.loss", cfg.rl.loss, POLICY_LOSSES),
        ("rl.agg", cfg.rl.agg, AGGREGATIONS),
        ("rl.kl_estimator", cfg.rl.kl_estimator, KL_ESTIMATORS),
    ):
        if name not in registry:
            raise ValueError(f"{field}: unknown name {name!r}; valid: {', '.join(sorted(registry))}")


def reward_tensors(rollouts: list[Rollout], outputs: list[RewardOutput], mask: torch.Tensor, skip_errors: bool):
    """Outcome rewards on the last response token, and the prompt-group ids.

    Returns:
        token_rewards [N, T] float32 (score_i at t = len_i - 1, else 0), mask [N, T] float32 (rows of errored
        rollouts zeroed when `skip_errors`), group [N] int64 (an errored, skipped rollout gets a group of its own).
    """
    token_rewards = torch.zeros_like(mask)
    group = torch.tensor([r.group for r in rollouts], dtype=torch.long)
    mask = mask.clone()
    for i, (r, o) in enumerate(zip(rollouts, outputs)):
        token_rewards[i, len(r.completion_ids) - 1] = o.score
        if skip_errors and o.error is not None:
            mask[i] = 0
            group[i] = -1 - i
    return token_rewards * mask, mask, group


def step_metrics(rollouts: list[Rollout], outputs: list[RewardOutput], group_size: int) -> dict[str, float]:
    """Reward, accuracy and rollout-shape metrics of one batch (names as logged in metrics.jsonl)."""
    scores = torch.tensor([o.score for o in outputs])
    lengths = torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.float32)
    m: dict[str, float] = {
        "reward/mean": scores.mean().item(),
        "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
        "reward/errors": float(sum(o.error is not None for o in outputs)),
        "accuracy": sum(is_correct(o) for o in outputs) / len(outputs),
        "rollout/len_mean": lengths.mean().item(),
        "rollout/len_max": lengths.max().item(),
        "rollout/truncated_frac": sum(r.truncated for r in rollouts) / len(rollouts),
        "rollout/tied_group_frac": (scores.view(-1, group_size).std(dim=1, unbiased=False) == 0).float().mean().item(),
    }
    for name in sorted({k for o in outputs for k in o.components}):
        vals = [o.components[name] for o in outputs if name in o.components]
        m[f"reward/{name}/mean"] = sum(vals) / len(vals)
    return m


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def train(cfg: TrainConfig, *, resume: bool = False, show_progress: bool = True,
          time_budget_s: float | None = None) -> dict[str, Any]:
    """Optimize `cfg.model` on `cfg.task` with the configured estimator and policy loss.

    Writes the run directory `cfg.out` (see `rewardlab.runs`). With `resume`, continues from the latest
    checkpoint there (weights, optimizer, schedule, prompt sampler and RNG state), so step k+1 after a resume logs
    what an uninterrupted run logs. With `time_budget_s` (seconds of wall clock since the first step began), the run
    stops after the first step that ends past the budget (or at `cfg.rl.steps`) and saves its final checkpoint there:
    for equal-wall-time comparisons (benchmarks/grpo_vs_trl.py).

    Returns:
        the summary (also written to summary.json).
    Raises:
        ValueError: unknown algorithm or reward names, or `resume` without a checkpoint.
    """
    check_names(cfg)
    rl = cfg.rl
    task = load_task(cfg.task.spec, **cfg.task.options)
    reward = build_reward(cfg.rewards if cfg.rewards is not None else task.reward, on_error=cfg.on_error)
    run = RunDir(cfg.out)  # created only once the config, task and rewards are known to be good
    model_kw = dict(prompt_format=cfg.model.prompt_format, dtype=cfg.model.dtype, device=cfg.model.device,
                    tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)

    start_step, latest = 0, run.latest_checkpoint() if resume else None
    if resume and latest is None:
        raise ValueError(f"--resume: no checkpoint in {run.checkpoints}")
    policy: Policy = load_policy(str(latest[1]) if latest else cfg.model.path, **model_kw)
    reference = load_policy(cfg.model.path, **model_kw) if rl.beta > 0 else None
    if reference is not None:
        reference.model.eval().requires_grad_(False)

    optimizer = make_optimizer(policy.model, rl.lr, rl.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=rl.warmup_steps, total_steps=rl.steps, kind=rl.lr_schedule)
    sampler = RowSampler(task.train, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    if latest is not None:
        state = torch.load(latest[1] / STATE_FILE, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        sampler.load_state_dict(state["sampler"])
        _set_rng_state(state["rng"])
        start_step = state["step"]
    else:
        run.write_config(dump_config(cfg))

    loss_options = dict(rl.loss_options)
    if rl.clip_eps is not None:
        loss_options = {"clip_low": rl.clip_eps, "clip_high": rl.clip_eps, **loss_options}
    loss_options.setdefault("max_len", rl.max_new_tokens)

    def save(step: int) -> Path:
        def write(tmp: Path) -> None:
            policy.save(tmp)
            torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "sampler": sampler.state_dict(), "rng": _rng_state()}, tmp / STATE_FILE)

        return run.save_checkpoint(step, write, keep=cfg.keep_checkpoints)

    policy.model.train()
    wall0, last = time.perf_counter(), {}
    with stage(rl.estimator.upper(), rl.steps, enabled=show_progress) as bar:
        bar.advance(start_step)
        for step in range(start_step + 1, rl.steps + 1):
            t0 = time.perf_counter()
            # 1. rollouts
            rows = sampler.next(rl.prompts_per_step)
            rollouts = policy.generate([r["prompt"] for r in rows], n=rl.group_size, temperature=rl.temperature,
                                       top_p=rl.top_p, max_new_tokens=rl.max_new_tokens, rows=rows)
            gen_s = time.perf_counter() - t0
            for r in rollouts:
                r.group += step * rl.prompts_per_step  # group ids unique across steps (for the samples log)
            # 2. rewards -> token rewards -> advantages
            outputs = reward(rollouts)
            batch, old_logprobs = rollout_batch(policy, rollouts)
            token_rewards, mask, group = reward_tensors(rollouts, outputs, batch.mask, cfg.on_error == "skip")
            advantages = compute_advantages(rl.estimator, token_rewards=token_rewards, mask=mask, group=group,
                                            **rl.estimator_options)
            ref_logprobs = None
            if reference is not None:
                with torch.no_grad():
                    ref_logprobs, _ = reference.token_logprobs(batch, temperature=rl.temperature)
            # 3. policy optimization: mu epochs over minibatches
            n = len(rollouts)
            mb = rl.minibatch_size or n
            sums: dict[str, float] = {}
            updates = 0
            for _ in range(rl.epochs):
                for idx in torch.randperm(n).split(mb):
                    logprobs, entropy = policy.token_logprobs(batch.select(idx), temperature=rl.temperature,
                                                              with_entropy=True)
                    m = mask[idx]
                    loss, stats = compute_policy_loss(rl.loss, logprobs=logprobs, old_logprobs=old_logprobs[idx],
                                                      advantages=advantages[idx], mask=m, agg=rl.agg, **loss_options)
                    stats["policy/entropy"] = ((entropy * m).sum() / m.sum().clamp(min=1)).item()
                    if ref_logprobs is not None:
                        kl = aggregate(kl_penalty(rl.kl_estimator, logprobs, ref_logprobs[idx]), m, rl.agg,
                                       max_len=rl.max_new_tokens)
                        loss = loss + rl.beta * kl
                        stats["policy/kl"] = kl.item()
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), rl.grad_clip)
                    optimizer.step()
                    stats["policy/loss"] = loss.item()
                    stats["policy/grad_norm"] = grad_norm.item()
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v
                    updates += 1
            scheduler.step()
            # 4. log
            step_s = time.perf_counter() - t0
            gen_tokens = sum(len(r.completion_ids) for r in rollouts)
            metrics = step_metrics(rollouts, outputs, rl.group_size)
            metrics.update({k: v / updates for k, v in sums.items()})
            metrics.update({"lr": scheduler.get_last_lr()[0], "time/step_s": step_s, "time/gen_s": gen_s,
                            "time/gen_tokens_per_s": gen_tokens / gen_s,
                            "time/elapsed_s": time.perf_counter() - wall0})
            run.log_metrics(step, metrics)
            adv_seq = advantages[:, 0].tolist()
            run.log_samples(
                {"step": step, "group": r.group, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
                 "answer": r.row.get("answer"), "reward": o.score, "components": o.components, "error": o.error,
                 "advantage": a, "truncated": r.truncated}
                for r, o, a in zip(rollouts, outputs, adv_seq)
            )
            last = metrics
            bar.advance(1, reward=metrics["reward/mean"], acc=metrics["accuracy"])
            out_of_time = time_budget_s is not None and time.perf_counter() - wall0 >= time_budget_s
            if step % cfg.save_every == 0 or step == rl.steps or out_of_time:
                save(step)
            if out_of_time:
                break
    latest = run.latest_checkpoint()
    run.plot(["reward/mean", "accuracy", "policy/entropy", "rollout/len_mean"], "train.png")
    summary = {
        "stage": "train",
        "estimator": rl.estimator,
        "loss": rl.loss,
        "steps": rl.steps,
        "steps_done": step if rl.steps > start_step else start_step,
        "resumed_from": start_step if resume else None,
        "wall_s": time.perf_counter() - wall0,
        "final_metrics": last or (run.read_metrics() or [{}])[-1],
        "final_checkpoint": str(latest[1]) if latest else None,
    }
    run.write_summary(summary)
    return summary
