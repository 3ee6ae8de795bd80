"""Rollouts and rewards: the first phase of a step, `Prefetch.take(step)` -> `StepBatch`.

- `ScoredEpisode`: one episode's rows (one row for a single completion) and its reward output; the value that flows
  from production to credit (`rl.credit`) and to the logs. No map keyed by object identity.
- `produce(run, step, version)` -> `StepBatch`: draw prompts (the curriculum), the engine generates rl.group_size
  rollouts (episodes) each with policy `version` and scores each episode once, on its last row; with a group
  filter, more rounds until rl.prompts_per_step groups are kept; then what the estimator must not see leaves
  (`training_episodes`: on_error=skip, the estimator's minimum group size).
- `Prefetch`: the one production path. Step s trains on the batch of step s sampled by policy version
  max(0, s - 1 - rl.ray.max_staleness), produced ahead (on engine ray in a background thread); lag 0 is the
  synchronous loop. `Prefetch.rewind` puts a batch back when the run stops for reward errors.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from rewardlab.envs.sampling import episode_metrics, split_episodes
from rewardlab.rl.filters import filter_groups
from rewardlab.train_state import rng_state, set_rng_state
from rewardlab.types import Rollout, RewardOutput


@dataclass(frozen=True)
class ScoredEpisode:
    """An episode as the trainer sees it.

    Attributes:
        rows: its rows in order (`Rollout`s of one `episode_id`; a single completion is one row with none).
        output: its reward output (what the reward returned for its last row).
    """

    rows: tuple[Rollout, ...]
    output: RewardOutput

    @property
    def last(self) -> Rollout:
        """The last row: the one the reward read (its `completion` is the final model turn), with the episode's
        group, termination and policy version."""
        return self.rows[-1]


@dataclass
class StepBatch:
    """One step's episodes, built by `produce`.

    Attributes:
        episodes: every episode generated and scored this step, every filter round, in order (all are logged).
        kept: the indices in `episodes` of those the estimator and the loss see (after the group filter,
            on_error=skip and the estimator's minimum group size), ascending.
        metrics: reward, accuracy, rollout-shape and filter metrics.
        gen_s: seconds spent generating. gen_tokens: tokens generated.
        before: (prompt sampler state, RNG states) before the batch was produced (`Prefetch.rewind`).
    """

    episodes: list[ScoredEpisode]
    kept: list[int]
    metrics: dict[str, float] = field(default_factory=dict)
    gen_s: float = 0.0
    gen_tokens: int = 0
    before: tuple[dict, dict] | None = None

    @property
    def trained(self) -> list[ScoredEpisode]:
        """The kept episodes, in order."""
        return [self.episodes[i] for i in self.kept]

    def to_state(self) -> dict[str, Any]:
        """A copy for a checkpoint, in the types trainer_state.pt loads (`train_state.load_state`)."""
        return {"rows": [list(e.rows) for e in self.episodes], "outputs": [e.output for e in self.episodes],
                "kept": list(self.kept), "metrics": self.metrics, "gen_s": self.gen_s, "gen_tokens": self.gen_tokens}

    @classmethod
    def from_state(cls, saved: dict[str, Any]) -> StepBatch:
        """The inverse of `to_state`; also reads the batches of checkpoints written before `ScoredEpisode` (keys
        all_rollouts, all_outputs, rows, kept)."""
        if "all_rollouts" in saved:
            rows = [r or [last] for last, r in zip(saved["all_rollouts"], saved["rows"])]
            outputs = saved["all_outputs"]
        else:
            rows, outputs = saved["rows"], saved["outputs"]
        episodes = [ScoredEpisode(tuple(r), o) for r, o in zip(rows, outputs)]
        return cls(episodes, list(saved["kept"]), saved["metrics"], saved["gen_s"], saved["gen_tokens"])


def filter_metric(output: RewardOutput, name: str) -> float:
    """The per-rollout value a group filter looks at (`rl.filtering.filter_metric`).

    Raises:
        ValueError: `name` is neither 'score', 'unshaped' nor a component of the output.
    """
    if name == "score" or output.error is not None:
        return output.score
    if name == "unshaped":
        return output.components.get("unshaped", output.score)
    if name not in output.components:
        raise ValueError(f"rl.filtering.filter_metric: {name!r} is not a reward component; components: "
                         f"{', '.join(sorted(output.components)) or '(none)'}")
    return output.components[name]


def step_metrics(rollouts: list[Rollout], outputs: list[RewardOutput], group_size: int) -> dict[str, float]:
    """Reward, accuracy and rollout-shape metrics of one batch (names as logged in metrics.jsonl); `rollouts` are
    the episodes' last rows."""
    scores = torch.tensor([o.score for o in outputs])
    lengths = torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.float32)
    m: dict[str, float] = {
        "reward/mean": scores.mean().item(),
        "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
        "reward/errors": float(sum(o.error is not None for o in outputs)),
        "accuracy": sum(o.correct for o in outputs) / len(outputs),
        "rollout/len_mean": lengths.mean().item(),
        "rollout/len_max": lengths.max().item(),
        "rollout/truncated_frac": sum(r.truncated for r in rollouts) / len(rollouts),
        "rollout/tied_group_frac": (scores.view(-1, group_size).std(dim=1, unbiased=False) == 0).float().mean().item(),
    }
    for name in sorted({k for o in outputs for k in o.components}):
        vals = [o.components[name] for o in outputs if name in o.components]
        m[f"reward/{name}/mean"] = sum(vals) / len(vals)
    for o in outputs:  # one count per failed reward of a rollout
        for name, _ in o.errors:
            m[f"reward/errors/{name}"] = m.get(f"reward/errors/{name}", 0.0) + 1.0
    return m


def training_episodes(episodes: list[ScoredEpisode], kept: list[int], *, skip_errors: bool,
                      min_group_size: int) -> tuple[list[int], int, int]:
    """The episodes the estimator and the loss see, of the `kept` indices into `episodes`.

    With `skip_errors` (on_error=skip) an episode whose reward errored leaves the batch: it has no reward, so it must
    count in no group statistic and no loss denominator. A prompt group then left with fewer than `min_group_size`
    episodes (e.g. 2 for rloo) leaves too: it contributes no gradient this step instead of failing the estimator.

    Returns:
        (kept, skipped, dropped_groups): the indices left, in order; the number of errored episodes left out; the
        number of prompt groups with no episode left.
    """
    groups = {episodes[i].last.group for i in kept}
    left = [i for i in kept if not (skip_errors and episodes[i].output.error is not None)]
    skipped = len(kept) - len(left)
    size = Counter(episodes[i].last.group for i in left)
    left = [i for i in left if size[episodes[i].last.group] >= min_group_size]
    return left, skipped, len(groups) - len({episodes[i].last.group for i in left})


@dataclass
class Timing:
    """Seconds spent generating and scoring a step's rounds, and the tokens generated."""

    gen_s: float = 0.0
    gen_tokens: int = 0
    reward_s: float = 0.0


def sample_round(run: Any, step: int, round: int, rows: list[dict[str, Any]], first_group: int,
                 version: int | None, timing: Timing) -> list[ScoredEpisode]:
    """Round `round` of step `step`: rl.group_size episodes of each of `rows`, generated by the engine with policy
    `version`, groups numbered from `first_group`, reasoning steps marked (rl.step_separator), and each episode
    scored once on its last row; generation and reward time added to `timing`."""
    rl = run.cfg.rl
    t0 = time.perf_counter()
    # each rollout (episode) draws from its own stream (seed, step, index in this round's batch, round[, turn]),
    # and the engine samples in rl.sampling.rollout_chunk chunks whatever its workers, so what a rollout samples depends
    # neither on the engine, the worker nor torch's global generator
    sampled = run.engine.generate(rows, n=rl.group_size, stream=(run.cfg.seed, step, round), version=version)
    timing.gen_s += time.perf_counter() - t0
    timing.gen_tokens += sum(r.sampled_tokens for r in sampled)
    for r in sampled:
        r.group += first_group
        if rl.step_separator is not None:
            run.policy.mark_steps(r, rl.step_separator)
    split = split_episodes(sampled)
    t0 = time.perf_counter()
    outputs = run.engine.score([rows_[-1] for rows_ in split])  # the reward is called once per episode
    timing.reward_s += time.perf_counter() - t0
    return [ScoredEpisode(tuple(r), o) for r, o in zip(split, outputs)]


def produce(run: Any, step: int, version: int | None = None) -> StepBatch:
    """The episodes of step `step`, sampled by policy `version` (None: the last published): draw prompts, sample and
    score a round (`sample_round`, streams keyed by (seed, `step`, round)), update the curriculum; with a group filter,
    keep the groups it passes and sample more rounds (up to rl.filtering.max_rounds) until rl.prompts_per_step groups
    are kept. Then leave out what the estimator must not see (`training_episodes`). Touches the prompt sampler and the
    engine only (no global RNG), so the prefetch thread may run it while the learner updates (`Prefetch`).
    """
    rl, sampler = run.cfg.rl, run.sampler
    before = (sampler.state_dict(), rng_state())  # the end of the step before: what a stop for reward errors restores
    timing, episodes, kept = Timing(), [], []
    rounds = dropped = 0
    next_group = step * rl.prompts_per_step * rl.filtering.max_rounds  # group ids unique across steps
    while rounds < rl.filtering.max_rounds and len(kept) < rl.prompts_per_step * rl.group_size:
        rounds += 1
        need = rl.prompts_per_step - len(kept) // rl.group_size
        indices = sampler.next_indices(need)
        new = sample_round(run, step, rounds, [run.task.train[i] for i in indices], next_group, version, timing)
        next_group += need
        correct = torch.tensor([float(e.output.correct) for e in new]).view(need, rl.group_size)
        sampler.update(indices, correct.mean(dim=1).tolist())
        keep = [True] * len(new) if rl.filtering.group_filter is None else filter_groups(
            rl.filtering.group_filter,
            metric=torch.tensor([filter_metric(e.output, rl.filtering.filter_metric) for e in new]),
            group=torch.tensor([e.last.group for e in new]), **rl.filtering.group_filter_options).tolist()
        dropped += keep.count(False) // rl.group_size
        kept += [len(episodes) + i for i, k in enumerate(keep) if k]
        episodes += new
        if rl.filtering.group_filter is None:
            break
    metrics = round_metrics(run, episodes, timing)
    if rl.filtering.group_filter is not None:
        metrics.update({"filter/rounds": float(rounds), "filter/dropped_groups": float(dropped),
                        "filter/kept_groups": float(len(kept[: rl.prompts_per_step * rl.group_size]) // rl.group_size)})
    kept, skipped, dropped_groups = training_episodes(
        episodes, kept[: rl.prompts_per_step * rl.group_size], skip_errors=run.cfg.on_error == "skip",
        min_group_size=run.specs.estimator.min_group_size)
    metrics.update({"reward/skipped": float(skipped), "rollout/dropped_groups": float(dropped_groups)})
    return StepBatch(episodes, kept, metrics, timing.gen_s, timing.gen_tokens, before=before)


def round_metrics(run: Any, episodes: list[ScoredEpisode], timing: Timing) -> dict[str, float]:
    """The metrics of every episode generated in a step: `step_metrics`, the reward's wall clock, the engine's
    figures and, for an environment task, the episodes' shape (`envs.episode_metrics`)."""
    metrics = step_metrics([e.last for e in episodes], [e.output for e in episodes], run.cfg.rl.group_size)
    metrics["time/reward_s"] = timing.reward_s  # the outcome reward's wall clock (every round), whatever the engine
    metrics.update(run.engine.metrics())  # engine ray: ray/weights_bytes, ray/rollout_s, ray/reward_s
    if run.episodes is not None:
        metrics.update(episode_metrics([list(e.rows) for e in episodes]))
    return metrics


def reward_error_share(batch: StepBatch, limit: float | None) -> tuple[int, int, str] | None:
    """(failed, scored, first cause) when at least `limit` of the batch's scored episodes (every round) have a
    reward error, else None (also for `limit` None)."""
    failed = [e.output for e in batch.episodes if e.output.error is not None]
    if limit is None or not batch.episodes or len(failed) / len(batch.episodes) < limit:
        return None
    first = "; ".join(f"{name}: {cause}" for name, cause in failed[0].errors[:1]) or failed[0].error
    return len(failed), len(batch.episodes), first


class Prefetch:
    """The batches of later steps, produced ahead of the learner: asynchronous training with a fixed lag.

    With lag k = rl.ray.max_staleness, step s trains on the batch of step s (prompts and streams keyed by s, as in a
    synchronous run) sampled by policy version `version_for(s)` = max(0, s - 1 - k): the batches of steps 1..k+1
    with the initial weights, then batch s + k + 1 as soon as step s has published version s. k = 0 is the
    synchronous loop (batch s sampled by version s - 1). Batches are produced one after the other, in step order,
    so the prompt sampler's draws and curriculum updates happen in the same order whatever k is; nothing produced
    is discarded (every batch up to rl.steps + k is produced, the last k are in flight when the run ends).

    On engine ray a background thread produces them (the workers generate and score while this process runs the
    update; `Engine.generate(..., version=v)` samples with the kept weights of version v); on engine local, each is
    produced in this thread when its step asks for it. Checkpoints wait for the batch in production and store the
    finished, untrained ones (`state_dict`); older weights are then never needed: after a resume from step s the
    next batch produced is s + k + 1, with version s, the weights the checkpoint holds.

    Args:
        run: the run (`rl.trainer.TrainRun`; its engine holds the last published version).
        start_step: the last step done before (0, or the resumed checkpoint's).
        saved: `state_dict()` of the resumed checkpoint, or None (a new run, or a checkpoint without one: nothing
            prefetched).
        background: produce in a background thread; None: on engine ray only.
    """

    def __init__(self, run: Any, start_step: int = 0, saved: dict[str, Any] | None = None, *,
                 background: bool | None = None) -> None:
        rl = run.cfg.rl
        self.run, self.lag = run, rl.ray.max_staleness
        self.batches: dict[int, Any] = {}  # step -> StepBatch, or the Future of one in production
        self.next = start_step + 1  # the next step whose batch to produce
        self.trained = self.filtered = 0  # episodes trained and left out, cumulative
        if saved is not None:
            self.next, self.trained, self.filtered = saved["next"], saved["trained"], saved["filtered"]
            self.batches = {t: StepBatch.from_state(b) for t, b in saved["batches"].items()}
        if background is None:
            background = rl.engine != "local"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rewardlab-prefetch") if background else None

    def version_for(self, step: int) -> int:
        """The policy version that samples step `step`'s batch: max(0, step - 1 - lag)."""
        return max(0, step - 1 - self.lag)

    def submit(self) -> None:
        """Start producing, in step order, every batch up to rl.steps + lag whose weights are published."""
        run = self.run
        while self.next <= run.cfg.rl.steps + self.lag and self.version_for(self.next) <= run.engine.version:
            t, v = self.next, self.version_for(self.next)
            self.batches[t] = self._pool.submit(produce, run, t, v) if self._pool else produce(run, t, v)
            self.next += 1

    def wait(self, upto: float) -> None:
        """Wait for the batches of steps up to `upto` (their production's exception, if any, raised here)."""
        for t in sorted(self.batches):
            if t <= upto and not isinstance(self.batches[t], StepBatch):
                self.batches[t] = self.batches[t].result()

    def take(self, step: int) -> StepBatch:
        """Step `step`'s batch (produced now if it was not yet), its staleness logged: async/staleness_mean and
        async/staleness_max, over the episodes trained, of step - 1 - policy_version (exactly min(step - 1, lag))."""
        self.submit()
        self.wait(step)
        batch = self.batches.pop(step)
        stale = [step - 1 - e.last.policy_version for e in (batch.trained or batch.episodes)]
        batch.metrics.update({"async/staleness_mean": sum(stale) / max(len(stale), 1),
                              "async/staleness_max": float(max(stale, default=0))})
        self.trained += len(batch.kept)
        self.filtered += len(batch.episodes) - len(batch.kept)
        return batch

    def rewind(self, step: int, batch: StepBatch) -> bool:
        """Put step `step`'s batch back as never produced, for a run that stops on it: with lag 0, the prompt
        sampler and the RNGs return to their state before it (`batch.before`) and `step` is produced again next;
        returns True. With a lag, later batches are drawn already and nothing is put back; returns False."""
        if self.lag or batch.before is None:
            return False
        self.run.sampler.load_state_dict(batch.before[0])
        set_rng_state(batch.before[1])
        self.next = step
        self.trained -= len(batch.kept)
        self.filtered -= len(batch.episodes) - len(batch.kept)
        return True

    def counts(self, step: int) -> dict[str, float]:
        """The accounting after step `step` trained: async/trained and async/filtered (episodes trained, and left out
        by the group filter, on_error=skip or the estimator's minimum group size; cumulative over the run) and
        async/in_flight (finished episodes of the batches of steps step+1 .. step+lag-1, waited for; batch
        step + lag, the newest, counts once finished). Every finished episode is exactly one of the three."""
        self.wait(step + self.lag - 1)
        flight = sum(len(b.episodes) for t, b in self.batches.items() if t <= step + self.lag - 1)
        return {"async/trained": float(self.trained), "async/filtered": float(self.filtered),
                "async/in_flight": float(flight)}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores, after waiting for every batch in production: the next step to produce, the
        finished untrained batches and the counts."""
        self.wait(float("inf"))
        return {"next": self.next, "trained": self.trained, "filtered": self.filtered,
                "batches": {t: b.to_state() for t, b in self.batches.items()}}

    def close(self) -> None:
        """Wait for the batch in production, if any, and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
