"""Online and semi-online DPO (`rewardlab po --online`): preference pairs sampled during training and labelled by a
reward.

Each step t = 1..po.steps:

1. the next po.prompts_per_step training rows (a seeded `RowSampler`) get K = po.num_generations completions each
   from the sampling model, each completion from its own random stream (seed, t, k), so what is sampled does not
   depend on batching;
2. the reward (any rewardlab reward or reward model; default the task's verifier) scores them, and each prompt's
   highest- and lowest-scoring completions become its pair (the first sampled wins a tie for best or worst); a
   prompt whose best and worst score the same is skipped and counted (`po/ties`), as is one with fewer than two
   scored completions (`po/unscored`, on_error skip);
3. the policy takes one AdamW step on the mean preference loss of the pairs, computed on the sampled token ids
   themselves (never decoded and re-tokenized); the reference's log-probs come from the reference model.

The sampling model is a copy of the policy synced every po.sync_every steps, at the start of steps 1, 1 + s, 1 + 2s,
...: s = 1 is online DPO (the policy itself samples: no copy), s > 1 semi-online, null never (the starting policy
samples throughout: offline pairs drawn fresh each step). Lanchantin et al. 2025, "Bridging Offline and Online
Reinforcement Learning for LLMs", arXiv:2506.21495. The reference is the starting model, or with po.ref_refresh
the sampling copy (the policy as of the last sync).

Logged per step, besides the TRL names of `rewardlab.po.train`: `po/pairs`, `po/ties`, `po/unscored`,
`po/reward_mean` (all samples), `po/reward_chosen`, `po/reward_rejected`, `po/completion_length` (tokens, all
samples), `po/synced` (1 on a step whose sampler was synced), `time/sample_s`, `time/step_s`; eval/* as offline.
A step with no pair takes no optimizer step (its schedule still advances). samples.jsonl holds every completion with
its reward and role (chosen, rejected or null); pairs.jsonl the pairs trained on, in the format `rm pairs` writes
(so an offline run, or TRL's DPOTrainer through `rewardlab.integrations.trl.pairs_to_trl`, can train on them).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rewardlab.envs.sampling import sample_rollouts
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.po.train import EncodedPair, LossSpec, mean_stats, pair_loss, reference_logps
from rewardlab.policy import Policy, SamplingSettings
from rewardlab.progress import stage
from rewardlab.runs import RunDir
from rewardlab.tasks.sampler import RowSampler
from rewardlab.train_state import restore_training_state, rng_state, save_state
from rewardlab.types import Rollout

__all__ = ["OnlineModels", "best_worst_pairs", "sync_due", "train_online"]

#: The sampling copy's trained weights inside a checkpoint of a semi-online run.
SAMPLER_FILE = "sampler.pt"
#: The pairs an online run trained on, one JSON line each (`_pair_rows`).
PAIRS_FILE = "pairs.jsonl"


def best_worst_pairs(scores: Sequence[float | None], n: int) -> tuple[list[tuple[int, int]], int, int]:
    """Each prompt's (best, worst) sample indices from prompt-major scores, K = `n` per prompt.

    The best is the highest score, the worst the lowest, the first sampled winning ties; None scores (failed
    rewards left out) do not take part.

    Returns:
        (pairs as indices into `scores`, prompts skipped because best == worst (ties), prompts skipped with fewer
        than two scores).
    Raises:
        ValueError: len(scores) is not a multiple of n.
    """
    if n < 1 or len(scores) % n:
        raise ValueError(f"best_worst_pairs: {len(scores)} scores are not whole groups of {n}")
    pairs, ties, unscored = [], 0, 0
    for g in range(0, len(scores), n):
        scored = [(float(s), i) for i, s in enumerate(scores[g:g + n], start=g) if s is not None]
        if len(scored) < 2:
            unscored += 1
            continue
        best = max(scored, key=lambda x: (x[0], -x[1]))
        worst = min(scored, key=lambda x: (x[0], x[1]))
        if best[0] == worst[0]:
            ties += 1
            continue
        pairs.append((best[1], worst[1]))
    return pairs, ties, unscored


def sync_due(step: int, sync_every: int | None) -> bool:
    """Whether the sampling copy is synced to the policy at the start of `step` (1-based): steps 1, 1 + s, ...;
    never when `sync_every` is None (the copy stays the starting policy)."""
    return sync_every is not None and (step - 1) % sync_every == 0


@dataclasses.dataclass
class OnlineModels:
    """The models of an online run: the policy (trained), the sampling model (the policy itself when sync_every is
    1, else a copy), the reference (None for a reference-free loss), the reward, and the task's training rows."""

    policy: Policy
    sampler: Policy
    reference: Policy | None
    reward: Any
    rows: list[dict[str, Any]]

    @property
    def copied(self) -> bool:
        return self.sampler is not self.policy


def _sample_and_pair(cfg: Any, m: OnlineModels, row_sampler: RowSampler, step: int
                     ) -> tuple[list[EncodedPair], list[Rollout], list[float | None], list[tuple[int, int]], dict]:
    """Step `step`'s rollouts, their scores, pairs and counts (module doc, items 1 and 2)."""
    p = cfg.po
    rows = [m.rows[i] for i in row_sampler.next_indices(p.prompts_per_step)]
    settings = SamplingSettings(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p)
    rollouts = sample_rollouts(m.sampler, rows, settings, episodes=None, n=p.num_generations,
                               stream=(cfg.seed, step, 0))
    outputs = m.reward(rollouts)
    scores = [None if (o.error is not None and cfg.on_error == "skip") else float(o.score) for o in outputs]
    index, ties, unscored = best_worst_pairs(scores, p.num_generations)
    pairs = [EncodedPair(rollouts[b].prompt_ids, rollouts[b].completion_ids, rollouts[w].completion_ids,
                         f"step {step}, prompt {b // p.num_generations}") for b, w in index]
    valid = [s for s in scores if s is not None]
    counts = {"po/pairs": len(pairs), "po/ties": ties, "po/unscored": unscored,
              "po/reward_mean": sum(valid) / max(len(valid), 1),
              "po/completion_length": sum(len(r.completion_ids) for r in rollouts) / max(len(rollouts), 1)}
    if index:
        counts["po/reward_chosen"] = sum(scores[b] for b, _ in index) / len(index)  # type: ignore[misc]
        counts["po/reward_rejected"] = sum(scores[w] for _, w in index) / len(index)  # type: ignore[misc]
    return pairs, rollouts, scores, index, counts


def _records(step: int, rollouts: list[Rollout], scores: list[float | None], index: list[tuple[int, int]]
             ) -> list[dict[str, Any]]:
    role = {b: "chosen" for b, _ in index} | {w: "rejected" for _, w in index}
    return [{"step": step, "group": r.group, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
             "answer": r.row.get("answer"), "reward": s, "pair": role.get(i)}
            for i, (r, s) in enumerate(zip(rollouts, scores))]


def _pair_rows(step: int, rollouts: list[Rollout], scores: list[float | None], index: list[tuple[int, int]]
               ) -> list[dict[str, Any]]:
    """The step's pairs in the pair row format `rm pairs` writes (prompt = the task prompt, the texts decoded from
    the sampled ids), with their step and scores: pairs.jsonl is an offline `po` run's --pairs, and TRL's
    (`rewardlab.integrations.trl.pairs_to_trl`)."""
    return [{"prompt": rollouts[b].row.get("prompt", rollouts[b].prompt), "chosen": rollouts[b].completion,
             "rejected": rollouts[w].completion, "step": step, "chosen_score": scores[b], "rejected_score": scores[w],
             "row": rollouts[b].row} for b, w in index]


@dataclasses.dataclass
class _OnlineTraining:
    cfg: Any
    models: OnlineModels
    spec: LossSpec
    run: RunDir
    row_sampler: RowSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any

    def sync(self) -> None:
        """The sampling copy takes the policy's current weights."""
        if self.models.copied:
            self.models.sampler.load_trained_weights(self.models.policy.trained_weights())

    def update(self, pairs: list[EncodedPair]) -> tuple[float, dict[str, float]]:
        """One optimizer step on `pairs` (module doc, item 3); returns (the mean loss, the TRL stats)."""
        p, m = self.cfg.po, self.models
        ref = reference_logps(m.reference, pairs, p.micro_batch_size) if m.reference is not None else None
        self.optimizer.zero_grad(set_to_none=True)
        size = p.micro_batch_size or len(pairs)
        value, records = 0.0, []
        for a in range(0, len(pairs), size):
            part = pairs[a:a + size]
            loss, stats = pair_loss(m.policy, part, None if ref is None else ref[a:a + size], self.spec)
            loss = loss * (len(part) / len(pairs))
            loss.backward()
            value += loss.item()
            records.append((len(part), stats))
        torch.nn.utils.clip_grad_norm_(m.policy.model.parameters(), p.grad_clip)
        self.optimizer.step()
        return value, mean_stats(records)

    def step(self, step: int) -> dict[str, Any]:
        """Step `step` whole: sync when due, sample, pair, update; returns its metrics."""
        synced = sync_due(step, self.cfg.po.sync_every) and self.models.copied
        if synced:
            self.sync()
        t0 = time.perf_counter()
        pairs, rollouts, scores, index, counts = _sample_and_pair(self.cfg, self.models, self.row_sampler, step)
        t1 = time.perf_counter()
        metrics: dict[str, Any] = {}
        if pairs:
            loss, stats = self.update(pairs)
            metrics = {"train/loss": loss, **stats}
        with warnings.catch_warnings():  # a step without pairs advances the schedule without an optimizer step
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()
        self.run.log_samples(_records(step, rollouts, scores, index))
        self.run.append_jsonl(PAIRS_FILE, _pair_rows(step, rollouts, scores, index))
        return {**metrics, **counts, "po/synced": int(synced), "lr": self.scheduler.get_last_lr()[0],
                "time/sample_s": t1 - t0, "time/step_s": time.perf_counter() - t0}

    def save(self, step: int) -> Path:
        """Checkpoint step-`step`: the policy, the sampling copy's weights (a semi-online run's), trainer_state.pt."""

        def write(tmp: Path) -> None:
            self.models.policy.save(tmp)
            if self.models.copied and self.cfg.po.sync_every is not None:
                torch.save(self.models.sampler.trained_weights(), tmp / SAMPLER_FILE)
            save_state(tmp, {"step": step, "optimizer": self.optimizer.state_dict(),
                             "scheduler": self.scheduler.state_dict(), "sampler": self.row_sampler.state_dict(),
                             "rng": rng_state()})

        return self.run.save_checkpoint(step, write, keep=self.cfg.keep_checkpoints)


def train_online(cfg: Any, models: OnlineModels, spec: LossSpec, run: RunDir, *, heldout: Any,
                 checkpoint: tuple[int, Path] | None = None, show_progress: bool = True) -> dict[str, Any]:
    """Online / semi-online DPO (module doc) for cfg.po.steps steps in the run directory `run` (opened, its config
    recorded, by the caller), evaluating with `heldout` (a `HeldOutEval`, or None) when due and checkpointing every
    cfg.save_every steps and at the last. With `checkpoint` (step, directory), the policy, the sampling copy, the
    optimizer, schedule, row sampler and RNG state are restored from it and training continues after its step,
    logging what the uninterrupted run logs.

    Returns:
        the summary: steps, pairs, ties, samples, wall seconds, final_checkpoint, resumed_from, interrupted.
    Raises:
        Interrupted: stopped by a Ctrl-C or SIGTERM after a step (checkpointed).
    """
    p = cfg.po
    optimizer = make_optimizer(models.policy.model, p.lr, p.weight_decay)
    scheduler = make_scheduler(optimizer, warmup_steps=p.warmup_steps, total_steps=p.steps, kind=p.lr_schedule)
    row_sampler = RowSampler(list(range(len(models.rows))), seed=cfg.seed)  # type: ignore[arg-type]
    training = _OnlineTraining(cfg, models, spec, run, row_sampler, optimizer, scheduler)
    start, final = 0, None
    if checkpoint is not None:
        start, final = checkpoint
        restore_training_state(final, optimizer, scheduler, model=models.policy.model, sampler=row_sampler)
        if (final / SAMPLER_FILE).is_file() and models.copied:
            models.sampler.load_trained_weights(torch.load(final / SAMPLER_FILE, weights_only=True))
    wall0, step = time.perf_counter(), start
    models.policy.model.train()
    with StopRequest() as stop, stage("PO online", p.steps, enabled=show_progress) as bar:
        bar.advance(start)
        for step in range(start + 1, p.steps + 1):
            metrics = training.step(step)
            if heldout is not None and heldout.due(step):
                metrics.update(heldout(models.policy))
            run.log_metrics(step, metrics)
            bar.advance(1, loss=metrics.get("train/loss", float("nan")))
            if step % cfg.save_every == 0 or step == p.steps or stop.requested:
                final = training.save(step)
            if stop.requested:
                break
    if final is None:
        final = training.save(0)
    run.plot(["train/loss", "rewards/accuracies", "po/reward_mean", "eval/accuracy"], "po.png")
    interrupted = stop.requested and step < p.steps
    logged = [m for m in run.read_metrics() if "po/pairs" in m]  # every step of the run, a resumed one's included
    totals = {key: sum(m[f"po/{key}"] for m in logged) for key in ("pairs", "ties", "unscored")}
    summary = {"stage": "po", "mode": "online", "loss_type": list(spec.names), "steps": p.steps, "steps_done": step,
               "sync_every": p.sync_every, "ref_refresh": p.ref_refresh, **totals,
               "samples": step * p.prompts_per_step * p.num_generations,
               "wall_s": time.perf_counter() - wall0, "final_checkpoint": str(final),
               "resumed_from": start if checkpoint is not None else None, "interrupted": interrupted}
    run.write_summary(summary)
    if interrupted:
        raise Interrupted("po", cfg.out, step, final, signum=stop.signum)
    return summary
