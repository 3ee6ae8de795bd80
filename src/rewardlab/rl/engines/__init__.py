"""Rollout engines: where the trainer's `rl.rollouts.produce` generates rollouts (episodes) and scores them.

    engine = make_engine(cfg, episodes=episodes, reward=reward, threads=threads)
    engine.publish(policy, version=0)                           # the weights the next rollouts are sampled with
    rollouts = engine.generate(rows, n=8, stream=(seed, step, round))   # every row of every episode, in order
    outputs = engine.score(episode_ends(rollouts))              # one RewardOutput per rollout (episode)
    engine.metrics()                                            # the engine's own figures of the step (ray/*)
    engine.close()

- `local` (`LocalEngine`): this process, the learner's own policy, environment and reward.
- `ray` (`rewardlab.rl.engines.ray_engine.RayEngine`): rollout worker actors, each with a policy replica and its own
  environment, and reward worker actors, each with the run's reward; new weights reach them through Ray's object
  store once per `publish`.

The engine is a performance switch, never a semantic one: both split a batch into the same chunks (`chunk_spans`,
`rl.sampling.rollout_chunk` rollouts each, whole prompt groups), sample each chunk as one call of
`rewardlab.envs.sample_rollouts` (every rollout from its own counter-based stream keyed by (seed, step, index in the
batch, round[, turn]), so a chunk's samples depend on the chunk alone), with the run's `threads`, and score each
chunk as one call of the reward; results are put back in chunk order. So a seed gives the same rollouts, rewards and
metrics on either engine and any worker count.

A policy version (`Rollout.policy_version`) counts published weights: `publish(policy, version=s)` after step s's
update (0 for the initial weights), so a synchronous step s samples with version s - 1. `generate(..., version=v)`
samples with version v: engine ray keeps the last rl.ray.max_staleness + 1 published versions for batches prefetched
with older weights (`rewardlab.rl.rollouts.Prefetch`); engine local holds only the current one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from rewardlab.policy.settings import SamplingSettings
from rewardlab.types import RewardOutput, Rollout


def chunk_spans(count: int, per_chunk: int | None) -> list[tuple[int, int]]:
    """Consecutive [start, end) spans covering range(count), `per_chunk` items each (the last may be shorter); one
    span for per_chunk None; [] for count 0.

    Raises:
        ValueError: per_chunk below 1.
    """
    if per_chunk is not None and per_chunk < 1:
        raise ValueError(f"chunk_spans: per_chunk must be >= 1, got {per_chunk}")
    step = per_chunk or count or 1
    return [(a, min(a + step, count)) for a in range(0, count, step)]


def row_spans(rows: int, n: int, chunk: int | None) -> list[tuple[int, int]]:
    """The spans of task rows each generation chunk samples: `chunk` rollouts are chunk // n rows of n samples.

    Raises:
        ValueError: `chunk` not a multiple of `n` (a chunk holds whole prompt groups).
    """
    if chunk is not None and chunk % n:
        raise ValueError(f"rl.sampling.rollout_chunk: {chunk} is not a multiple of the {n} samples per prompt")
    return chunk_spans(rows, chunk // n if chunk is not None else None)


class Engine(Protocol):
    """What `rl.rollouts.produce` calls (see the module doc). `version` is the last published policy version."""

    version: int

    def publish(self, policy: Any, version: int) -> None:
        """Make `policy`'s current weights the ones the next `generate` samples with, as policy version `version`."""

    def generate(self, rows: Sequence[dict[str, Any]], *, n: int, stream: tuple[int, int, int],
                 version: int | None = None) -> list[Rollout]:
        """`n` rollouts (episodes) of each row: `sample_rollouts(policy, rows, settings, n=n, stream=stream, ...)`
        chunk by chunk with the weights of policy version `version` (None: the last published), each rollout's
        `policy_version` set."""

    def score(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        """The reward of each rollout (an episode's last row), chunk by chunk; a failed item is a RewardOutput with
        its error (or the reward's exception with on_error=raise), never a silent 0."""

    def metrics(self) -> dict[str, float]:
        """The engine's figures since the last call (e.g. ray/weights_bytes), logged on the step's metrics line."""

    def close(self) -> None:
        """Release the engine's workers (idempotent)."""


class LocalEngine:
    """Generation and scoring in this process, on the learner's own policy, environment and reward.

    Args:
        settings: the run's sampling settings and chunk size.
        episodes: the environment and its budgets (`rewardlab.envs.EpisodeSettings`), None for single completions.
        reward: the run's `Reward`.
    """

    def __init__(self, settings: SamplingSettings, *, episodes: Any, reward: Any) -> None:
        self.settings, self.episodes, self.reward = settings, episodes, reward
        self.policy: Any = None
        self.version = 0

    def publish(self, policy: Any, version: int) -> None:
        """Sample with `policy` itself from now on (nothing is copied: the learner's weights are the sampler's)."""
        self.policy, self.version = policy, version

    def generate(self, rows: Sequence[dict[str, Any]], *, n: int, stream: tuple[int, int, int],
                 version: int | None = None) -> list[Rollout]:
        """See `Engine.generate`.

        Raises:
            RuntimeError: nothing was published yet, or `version` is not the last published one (the learner's
                weights are the sampler's: older versions are not kept).
        """
        if self.policy is None:
            raise RuntimeError("LocalEngine.generate: no policy published yet (call publish first)")
        if version is not None and version != self.version:
            raise RuntimeError(f"LocalEngine.generate: version {version} asked, and the engine holds only the last "
                               f"published one ({self.version})")
        out: list[Rollout] = []
        for a, b in row_spans(len(rows), n, self.settings.chunk):
            out += sample_chunk(self.policy, self.episodes, self.settings, rows[a:b], n=n, stream=stream,
                                first_row=a, version=self.version)
        return out

    def score(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        """See `Engine.score`."""
        out: list[RewardOutput] = []
        for a, b in chunk_spans(len(rollouts), self.settings.chunk):
            out += self.reward(list(rollouts[a:b]))
        return out

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass  # the environment and the reward are the trainer's (see rewardlab.envs.close_env)


def sample_chunk(policy: Any, episodes: Any, settings: SamplingSettings, rows: Sequence[dict[str, Any]], *, n: int,
                 stream: tuple[int, int, int], first_row: int, version: int) -> list[Rollout]:
    """One generation chunk, the same call on every engine: `sample_rollouts` of `rows` (rows first_row.. of the
    batch), each rollout's `policy_version` set to `version`."""
    from rewardlab.envs.sampling import sample_rollouts

    out = sample_rollouts(policy, rows, settings, episodes=episodes, n=n, stream=stream, first_row=first_row)
    for r in out:
        r.policy_version = version
    return out


def make_engine(cfg: Any, *, episodes: Any, reward: Any, threads: int, task: Any = None) -> Engine:
    """The engine `cfg.rl.engine` names, for a `rewardlab.config.TrainConfig`.

    Args:
        episodes, reward: the learner's environment settings and reward (engine local uses them; engine ray's
            workers build their own from `cfg`).
        task: the run's task (engine ray: a single-turn one is sent to the workers without its rows, so that they
            do not load it again; None: they load cfg.task).
        threads: the run's torch threads (`apply_threads`'s result); every worker sets the same.
    Raises:
        ValueError: rl.engine ray without the ray package ("pip install rewardlab[ray]"), or what `RayEngine`
            raises.
    """
    rl = cfg.rl
    s = rl.sampling
    settings = SamplingSettings(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                chunk=s.rollout_chunk, max_prompt_length=s.max_prompt_length)
    if rl.engine == "local":
        return LocalEngine(settings, episodes=episodes, reward=reward)
    from rewardlab.rl.engines.ray_engine import RayEngine

    return RayEngine(cfg, settings, threads=threads, task=task)


__all__ = ["Engine", "LocalEngine", "chunk_spans", "make_engine", "row_spans", "sample_chunk"]
