"""Rejection-sampling fine-tuning (`rewardlab rft`): STaR, RAFT and RAFT++.

Each of `rft.rounds` rounds R:

1. draws `rft.prompts_per_round` training rows (a seeded `RowSampler`, epoch-wise without replacement) and samples
   `rft.n` completions of each from the current policy, sample k of the round from its own random stream
   (cfg.seed, R, k), so what is sampled does not depend on batching or on torch's global generator;
2. scores them with the reward (`rewards:` specs, default the task's verifier);
3. keeps some (`select_samples`): `best`, per prompt the highest-scoring sample if it reaches `rft.threshold` (RAFT,
   Dong et al. 2023, arXiv:2304.06767), or `threshold`, every sample reaching it (STaR, Zelikman et al. 2022,
   arXiv:2203.14465); with `rft.dedupe`, samples of one prompt with the same completion ids count once;
4. takes `rft.steps_per_round` AdamW steps on the kept samples (`plan_batches`), training on the token ids the policy
   sampled (rollout.prompt_ids + rollout.completion_ids, never decoded and re-tokenized), with
   - importance none: loss = -sum_{i,t} log p_theta(y_{i,t} | x_i, y_{i,<t}) / (trained tokens), the SFT loss
     (`rewardlab.sft.sft_gradient`);
   - importance clip (RAFT++, Xiong et al. 2025, arXiv:2504.11343): the PPO-clipped surrogate with advantage 1,
     `raft_plus_plus_loss`, against the sampler's log-probs. At temperature 1 the first step of a round has ratio 1
     (the weights that sampled are the weights trained), so with steps_per_round=1 clip trains exactly as none; it
     differs from the second step of a round on, where a token whose ratio passed 1 + eps gets no gradient.
   A round that keeps nothing takes no step (rft/empty_rounds counts them).

The run directory (`RunDir`) gets, per round (metrics.jsonl step = the round): rft/kept, rft/kept_frac,
rft/prompts_with_kept, rft/reward_mean (mean score of all samples; those whose reward failed are left out with
on_error skip), rft/sft_loss (mean over the round's steps of the kept samples' NLL per token; null when none),
rft/loss (the loss optimized: the NLL, or the clipped surrogate), rft/clip_frac (importance clip: fraction of trained
tokens whose ratio was outside [1 - eps, 1 + eps]), rft/steps (optimizer steps so far), rft/empty_rounds (so far),
lr, time/sample_s, time/train_s, and with rft.eval_every the held-out greedy eval/accuracy
(`rewardlab.evaluation.heldout`) every that many rounds and at the last; samples.jsonl one line per sample (step,
group, prompt, completion, answer, score, components, error, kept, truncated); checkpoints/step-R every save_every
rounds and at the last (weights + optimizer, schedule, row sampler, batch-shuffle and RNG state), plots/rft.png and
summary.json. A first Ctrl-C or SIGTERM ends the run after the round in flight, checkpointed (`Interrupted`).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import RftConfig, dump_config
from rewardlab.envs.sampling import sample_rollouts
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy, SamplingSettings
from rewardlab.progress import stage
from rewardlab.rewards import Reward
from rewardlab.runs import RunDir, warn
from rewardlab.sft import sft_gradient
from rewardlab.tasks import Task
from rewardlab.tasks.sampler import RowSampler
from rewardlab.threads import apply_threads
from rewardlab.trackers import open_trackers
from rewardlab.train_state import restore_training_state, rng_state, save_state
from rewardlab.types import ProgressBar, RewardOutput, Rollout

#: Settings a resumed run may change (run longer, checkpoint differently, fit in less memory); any other is refused.
RESUME_MAY_CHANGE = ("rft.rounds", "save_every", "keep_checkpoints", "rft.micro_batch_size",
                     "model.gradient_checkpointing", "model.logprob_chunk_tokens")


def select_samples(scores: Sequence[float], groups: Sequence[int], completion_ids: Sequence[Sequence[int]], *,
                   keep: str = "best", threshold: float = 1.0, dedupe: bool = True,
                   eligible: Sequence[bool] | None = None) -> list[int]:
    """The indices of the samples rejection sampling keeps, in sampling order.

    - keep "best" (RAFT, Dong et al. 2023): per group (prompt), the sample with the highest score, ties broken by
      the first sampled, kept only if its score >= `threshold`; at most one per group.
    - keep "threshold" (STaR, Zelikman et al. 2022): every sample with score >= `threshold`.
    With `dedupe`, a sample whose completion ids equal those of an earlier kept sample of its group is dropped (it
    changes nothing for "best", which keeps one per group). A NaN score never passes.

    Args:
        scores: [N] floats, the reward of each sample. groups: [N] ints, the prompt of each sample.
        completion_ids: per sample its completion token ids (compared for `dedupe`).
        eligible: [N] bools; a sample with False is never kept (a failed reward under on_error skip). None: all.
    Returns:
        sorted indices into the N samples.
    Raises:
        ValueError: an unknown `keep`, or inputs of different lengths.
    """
    n = len(scores)
    if keep not in ("best", "threshold"):
        raise ValueError(f"rft.keep: expected 'best' or 'threshold', got {keep!r}")
    if len(groups) != n or len(completion_ids) != n or (eligible is not None and len(eligible) != n):
        raise ValueError(f"select_samples: {n} scores, {len(groups)} groups, {len(completion_ids)} completions"
                         + ("" if eligible is None else f", {len(eligible)} eligible flags"))
    ok = [(eligible is None or bool(eligible[i])) and scores[i] >= threshold for i in range(n)]
    if keep == "best":
        best: dict[int, int] = {}
        for i in range(n):
            if (eligible is None or eligible[i]) and scores[i] == scores[i]:  # NaN never wins
                j = best.get(groups[i])
                if j is None or scores[i] > scores[j]:
                    best[groups[i]] = i
        return sorted(i for i in best.values() if ok[i])
    out, seen = [], set()
    for i in range(n):
        if not ok[i]:
            continue
        key = (groups[i], tuple(completion_ids[i]))
        if dedupe and key in seen:
            continue
        seen.add(key)
        out.append(i)
    return out


def plan_batches(n_kept: int, steps: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    """The batches of one round: `steps` lists of min(`batch_size`, `n_kept`) distinct indices into the kept samples,
    read in order from seeded shuffles of range(`n_kept`), a fresh shuffle once fewer than a batch are left (so each
    sample is seen once per pass and no batch repeats one). [] when `n_kept` is 0 (no step). `rng` advances."""
    if n_kept == 0:
        return []
    size = min(batch_size, n_kept)
    order: list[int] = []
    batches = []
    for _ in range(steps):
        if len(order) < size:
            order = list(range(n_kept))
            rng.shuffle(order)
        batches.append(order[:size])
        order = order[size:]
    return batches


def raft_plus_plus_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, eps: float, *,
                        denominator: float | None = None) -> torch.Tensor:
    """RAFT++'s loss (Xiong et al. 2025, "A Minimalist Approach to LLM Reasoning: from Rejection Sampling to
    Reinforce", arXiv:2504.11343): the PPO-clipped surrogate (Schulman et al. 2017) with advantage 1 on the kept
    samples, averaged per trained token.

    loss = -sum_{i,t} m_{i,t} min(r_{i,t}, clip(r_{i,t}, 1 - eps, 1 + eps)) / sum m,
    r_{i,t} = exp(logprobs_{i,t} - old_logprobs_{i,t}).

    With A = 1 the min is min(r, 1 + eps): a token whose ratio is above 1 + eps has zero gradient; below 1 - eps the
    gradient is that of r (d loss / d logp = -r / sum m), unclipped. At r = 1 the gradient equals the NLL's.

    Args:
        logprobs: [N, T] float32, log p_theta of the sampled tokens (differentiable).
        old_logprobs: [N, T] float32, the sampler's log-probs of the same tokens (no gradient flows to them).
        mask: [N, T] float32 0/1, the trained tokens.
        eps: the clip range, > 0.
        denominator: divide by this instead of sum m (a micro-batch's share of its batch's mean).
    Returns:
        a scalar float32 tensor (0 when no token is trained).
    Raises:
        ValueError: tensors of different shapes, or eps <= 0.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"raft_plus_plus_loss: shapes differ: logprobs {tuple(logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)}, mask {tuple(mask.shape)}")
    if eps <= 0:
        raise ValueError(f"rft.clip_eps: must be > 0, got {eps}")
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp((logprobs - old_logprobs.detach()) * mask)  # 1 off the mask (no overflow from padding)
    surrogate = torch.minimum(ratio, ratio.clamp(1 - eps, 1 + eps))
    denom = mask.sum().clamp(min=1) if denominator is None else max(float(denominator), 1.0)
    return -(surrogate * mask).sum() / denom


@dataclasses.dataclass
class StepStats:
    """What one optimizer step on kept samples measured: `loss` (the optimized loss, per trained token), `nll` (the
    mean negative log-likelihood per trained token, nats), `tokens` (trained tokens), `clip_frac` (importance clip:
    fraction of trained tokens whose ratio was outside [1 - eps, 1 + eps]; None otherwise)."""

    loss: float
    nll: float
    tokens: int
    clip_frac: float | None = None


def rft_gradient(policy: Policy, samples: Sequence[Rollout], micro_batch_size: int | None = None, *,
                 importance: str = "none", eps: float = 0.2) -> StepStats:
    """Accumulate into the policy's .grad the gradient of the step's loss on `samples`: their sampled ids exactly
    (prompt_ids, completion_ids), `micro_batch_size` samples per forward/backward pass (None: all at once), each
    micro-batch divided by the trained tokens of all samples (the batch's mean per token).

    importance "none": the SFT loss (`rewardlab.sft.sft_gradient`); "clip": `raft_plus_plus_loss` against each
    sample's `logprobs` (the sampler's).

    Raises:
        ValueError: an unknown `importance`, micro_batch_size < 1, a sample whose logprobs do not match its
            completion (clip).
    """
    if importance == "none":
        rows = [(r.prompt_ids, r.completion_ids, None) for r in samples]
        loss, tokens = sft_gradient(policy, rows, micro_batch_size)
        return StepStats(loss, loss, tokens)
    if importance != "clip":
        raise ValueError(f"rft.importance: expected 'none' or 'clip', got {importance!r}")
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"rft.micro_batch_size: must be >= 1, got {micro_batch_size}")
    total = sum(len(r.completion_ids) for r in samples)
    size = micro_batch_size or max(len(samples), 1)
    loss_sum = nll_sum = clipped = 0.0
    for start in range(0, len(samples), size):
        part = samples[start:start + size]
        batch = policy.collate([r.prompt_ids for r in part], [r.completion_ids for r in part])
        old = torch.zeros_like(batch.mask)
        for i, r in enumerate(part):
            if len(r.logprobs) != len(r.completion_ids):
                raise ValueError(f"rft.importance clip: a sample has {len(r.logprobs)} log-probs for "
                                 f"{len(r.completion_ids)} completion ids")
            old[i, :len(r.logprobs)] = torch.tensor(r.logprobs, dtype=old.dtype)
        logprobs, _ = policy.token_logprobs(batch)
        loss = raft_plus_plus_loss(logprobs, old, batch.mask, eps, denominator=total)
        loss.backward()
        loss_sum += loss.item()
        with torch.no_grad():
            nll_sum += -(logprobs * batch.mask).sum().item()
            ratio = torch.exp(logprobs - old)
            clipped += (((ratio > 1 + eps) | (ratio < 1 - eps)).float() * batch.mask).sum().item()
    denom = max(total, 1)
    return StepStats(loss_sum, nll_sum / denom, total, clipped / denom)


def train_rft(cfg: RftConfig, task: Task, reward: Reward, policy: Policy, run: RunDir, *, resume: bool = False,
              show_progress: bool = True) -> dict[str, Any]:
    """Run `cfg.rft.rounds` rounds of rejection-sampling fine-tuning of `policy` on `task`'s training rows scored by
    `reward`, in the run directory `run` (opened by the caller with `RunDir.start`); see the module docstring for
    what each round does and logs.

    Records the config (a resume checks it: only RESUME_MAY_CHANGE may differ). With `resume`, the run continues
    from the newest valid checkpoint, so round k+1 logs exactly what the uninterrupted run logs (time/* aside).

    Returns:
        the summary: rounds, rounds_done, kept_total, samples_total, empty_rounds, steps, final_checkpoint,
        resumed_from (round, or None), wall_s, interrupted.
    Raises:
        ValueError: rft.eval_every > 0 with no held-out rows (`heldout_rows`); `RunDirError` (a ValueError): a resume
            with other settings or no valid checkpoint; what the reward raises with on_error raise.
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C or SIGTERM after a round, with its checkpoint.
    """
    p = cfg.rft
    rows = heldout_rows(task, p.eval_every, p.eval_n, field="rft.eval_every")
    apply_threads(cfg.threads)
    start_round, checkpoint = 0, None
    if resume:
        start_round, checkpoint = run.resume_training(dump_config(cfg), may_change=RESUME_MAY_CHANGE, steps=p.rounds,
                                                      steps_key="rft.rounds")
    else:
        run.write_config(dump_config(cfg))
        if p.prompts_per_round > len(task.train):
            warn(f"rft.prompts_per_round={p.prompts_per_round} is more than the {len(task.train)} training rows of "
                 f"{cfg.task.spec}: every round repeats prompts")
    run.attach_trackers(open_trackers(cfg.report_to, run.path, run_name=cfg.out, config=cfg.model_dump(mode="json"),
                                      resume_step=start_round if resume else None))
    training = _RFTTraining.create(cfg, task, reward, policy, run)
    if checkpoint is not None:
        training.restore(checkpoint)
    heldout = HeldOutEval(rows, task.reward, every=p.eval_every, last_step=p.rounds, max_new_tokens=p.max_new_tokens)
    policy.model.train()
    start = time.perf_counter()
    with StopRequest() as stop:  # a first Ctrl-C or SIGTERM ends the run after the current round
        with stage("RFT", p.rounds, enabled=show_progress) as bar:
            bar.advance(start_round)
            done, saved = training.run_rounds(start_round, heldout, stop, bar)
        final = saved if saved is not None else checkpoint
        if final is None:  # rft.rounds=0: the initial model is the result
            final = training.save(0)
        run.plot(["rft/reward_mean", "rft/kept_frac", "eval/accuracy"], "rft.png")
        interrupted = stop.requested and done < p.rounds
        summary = {"stage": "rft", "rounds": p.rounds, "rounds_done": done, "kept_total": training.kept_total,
                   "samples_total": training.samples_total, "empty_rounds": training.empty_rounds,
                   "steps": training.steps, "final_checkpoint": str(final),
                   "resumed_from": start_round if resume else None, "wall_s": time.perf_counter() - start,
                   "interrupted": interrupted}
        run.write_summary(summary)
    if interrupted:
        raise Interrupted("rft", cfg.out, done, final, signum=stop.signum)
    return summary


@dataclasses.dataclass
class _RFTTraining:
    """What an RFT run carries across rounds: the row sampler, the batch-shuffle RNG, one AdamW with its schedule
    (total steps rounds x steps_per_round), and the running counts a checkpoint saves."""

    cfg: RftConfig
    reward: Reward
    policy: Policy
    run: RunDir
    sampler: RowSampler
    shuffle: random.Random
    optimizer: torch.optim.Optimizer
    scheduler: Any
    steps: int = 0
    empty_rounds: int = 0
    kept_total: int = 0
    samples_total: int = 0

    @classmethod
    def create(cls, cfg: RftConfig, task: Task, reward: Reward, policy: Policy, run: RunDir) -> _RFTTraining:
        p = cfg.rft
        sampler = RowSampler(list(task.train), seed=cfg.seed)
        optimizer = make_optimizer(policy.model, p.lr, p.weight_decay)
        scheduler = make_scheduler(optimizer, warmup_steps=p.warmup_steps, total_steps=p.rounds * p.steps_per_round,
                                   kind=p.lr_schedule)
        return cls(cfg, reward, policy, run, sampler, random.Random(f"{cfg.seed}:rft-batches"), optimizer, scheduler)

    def restore(self, checkpoint: Path) -> None:
        """Weights, optimizer, schedule, row sampler, RNG states and the counts of `checkpoint`."""
        state = restore_training_state(checkpoint, self.optimizer, self.scheduler, model=self.policy.model,
                                       sampler=self.sampler)
        self.shuffle.setstate(state["shuffle"])
        for key in ("steps", "empty_rounds", "kept_total", "samples_total"):
            setattr(self, key, int(state[key]))

    def sample(self, round_: int) -> tuple[list[Rollout], list[RewardOutput]]:
        """Round `round_`'s samples (prompt-major, `rft.n` per prompt) and their rewards."""
        p = self.cfg.rft
        rows = self.sampler.next(p.prompts_per_round)
        settings = SamplingSettings(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p)
        rollouts = sample_rollouts(self.policy, rows, settings, episodes=None, n=p.n,
                                   stream=(self.cfg.seed, round_, 0))
        return rollouts, list(self.reward(rollouts))

    def train(self, kept: list[Rollout]) -> list[StepStats]:
        """`rft.steps_per_round` optimizer steps on `kept` (none when it is empty)."""
        p = self.cfg.rft
        out = []
        for batch in plan_batches(len(kept), p.steps_per_round, p.batch_size, self.shuffle):
            self.optimizer.zero_grad(set_to_none=True)
            out.append(rft_gradient(self.policy, [kept[i] for i in batch], p.micro_batch_size,
                                    importance=p.importance, eps=p.clip_eps))
            torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), p.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self.steps += 1
        return out

    def round(self, round_: int) -> dict[str, Any]:
        """Sample, score, keep, train and log round `round_` (1-based); returns its metrics."""
        p = self.cfg.rft
        t0 = time.perf_counter()
        rollouts, outputs = self.sample(round_)
        eligible = [o.error is None for o in outputs] if self.cfg.on_error == "skip" else None
        scores = [float(o.score) for o in outputs]
        kept_idx = select_samples(scores, [r.group for r in rollouts], [r.completion_ids for r in rollouts],
                                  keep=p.keep, threshold=p.threshold, dedupe=p.dedupe, eligible=eligible)
        t1 = time.perf_counter()
        stats = self.train([rollouts[i] for i in kept_idx])
        t2 = time.perf_counter()
        if not kept_idx:
            self.empty_rounds += 1
            warn(f"rft: round {round_} kept none of its {len(rollouts)} samples (rft.keep={p.keep}, "
                 f"rft.threshold={p.threshold}); no optimizer step")
        self.kept_total += len(kept_idx)
        self.samples_total += len(rollouts)
        counted = [s for i, s in enumerate(scores) if eligible is None or eligible[i]]
        kept_set = set(kept_idx)
        self.run.log_samples([{
            "step": round_, "group": r.group, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
            "answer": r.row.get("answer"), "score": o.score, "components": o.components, "error": o.error,
            "kept": i in kept_set, "truncated": r.truncated} for i, (r, o) in enumerate(zip(rollouts, outputs))])
        mean = (lambda xs: sum(xs) / len(xs) if xs else float("nan"))  # noqa: E731
        metrics: dict[str, Any] = {
            "rft/kept": len(kept_idx), "rft/kept_frac": len(kept_idx) / max(len(rollouts), 1),
            "rft/prompts_with_kept": len({rollouts[i].group for i in kept_idx}),
            "rft/reward_mean": mean(counted), "rft/sft_loss": mean([s.nll for s in stats]),
            "rft/loss": mean([s.loss for s in stats]), "rft/steps": self.steps, "rft/empty_rounds": self.empty_rounds,
            "lr": self.scheduler.get_last_lr()[0], "time/sample_s": t1 - t0, "time/train_s": t2 - t1}
        if p.importance == "clip":
            metrics["rft/clip_frac"] = mean([s.clip_frac for s in stats if s.clip_frac is not None])
        return metrics

    def run_rounds(self, start_round: int, heldout: HeldOutEval, stop: StopRequest,
                   bar: ProgressBar) -> tuple[int, Path | None]:
        """Rounds start_round+1 .. rft.rounds, each logged (and evaluated when `heldout` is due) and checkpointed
        every `save_every` rounds, at the last and when `stop` is requested (the loop then ends). Returns (the last
        round run, or `start_round` when none; the last checkpoint saved, or None)."""
        p, done, saved = self.cfg.rft, start_round, None
        for done in range(start_round + 1, p.rounds + 1):
            metrics = self.round(done)
            if heldout.due(done):
                metrics.update(heldout(self.policy))
            self.run.log_metrics(done, metrics)
            bar.advance(1, kept=metrics["rft/kept"])
            if done % self.cfg.save_every == 0 or done == p.rounds or stop.requested:
                saved = self.save(done)
            if stop.requested:
                break
        return done, saved

    def save(self, round_: int) -> Path:
        """Checkpoint step-`round_`: the policy and trainer_state.pt (optimizer, schedule, row sampler, batch
        shuffle and RNG states, counts)."""

        def write(tmp: Path) -> None:
            self.policy.save(tmp)
            save_state(tmp, {"step": round_, "optimizer": self.optimizer.state_dict(),
                             "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                             "rng": rng_state(), "shuffle": self.shuffle.getstate(), "steps": self.steps,
                             "empty_rounds": self.empty_rounds, "kept_total": self.kept_total,
                             "samples_total": self.samples_total})

        return self.run.save_checkpoint(round_, write, keep=self.cfg.keep_checkpoints)
