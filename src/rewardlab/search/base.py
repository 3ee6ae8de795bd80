"""What the search methods share: the result record with its cost, step-score aggregation, sampling and scoring.

The policy only needs the interface of `rewardlab.policy.Policy` used here: `generate(prompts, *, n, temperature,
top_p, max_new_tokens, rows, batch_size, prefixes, stop) -> list[Rollout]` (prompt-major) and
`mark_steps(rollout, separator) -> Rollout`. A scorer is any rewardlab `Reward`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards.base import Reward
from rewardlab.rewards.steps import STEP_AGGREGATIONS
from rewardlab.types import Rollout, RewardOutput


class SearchPolicy(Protocol):
    """The part of `rewardlab.policy.Policy` that search uses (a scripted object can stand in for tests)."""

    def generate(self, prompts: Sequence[str], **kwargs: Any) -> list[Rollout]: ...

    def mark_steps(self, rollout: Rollout, separator: str = "\n") -> Rollout: ...


@dataclass
class SearchResult:
    """What one search method returns for one prompt.

    Attributes:
        best: the chosen solution (whole completion of the prompt).
        score: the chosen solution's score (aggregated step scores or outcome score; for majority vote the size of
            the winning group, for weighted majority its summed score).
        candidates: the finished solutions the choice was made among, in the order they were produced.
        scores: the score of each candidate (same length), -inf where the scorer failed.
        tokens: tokens the policy generated for this prompt, every sampled token counted (pruned branches too).
        scorer_calls: (partial) solutions the scorer was asked to score for this prompt.
        answer: the final answer of `best` for the voting methods, else None.
    """

    best: Rollout
    score: float
    candidates: list[Rollout]
    scores: list[float]
    tokens: int
    scorer_calls: int
    answer: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchSettings:
    """What every search method reads besides its sampling settings.

    Attributes:
        separator: the text that ends a step (steps are marked with it; a tree search samples one step at a time).
        batch_size: about this many sequences per `generate` call.
        aggregate: how a process scorer's step scores make one score (`STEP_AGGREGATIONS`: min | last | prod |
            mean); an outcome score is used as it is.
    """

    separator: str = "\n"
    batch_size: int = 1024
    aggregate: str = "last"


@dataclass(frozen=True)
class Pool:
    """Solutions already sampled (and scored) for several budgets N, e.g. `rewardlab search`'s shared pool: a pool
    method takes the first N of each row and neither samples nor scores them again.

    Attributes:
        samples: one list of solutions per row, at least N each (then `policy` is not called and may be None).
        scores: their scores, the same layout (-inf for a failed score; then `scorer` is not called and may be
            None), or None: the scorer scores the samples.
    """

    samples: Sequence[Sequence[Rollout]]
    scores: Sequence[Sequence[float]] | None = None


#: The sampling of a whole solution when a pool method is given none: 64 tokens at temperature 0.8.
SOLUTION_SAMPLING = SamplingSettings(max_new_tokens=64, temperature=0.8)


def solution_score(output: RewardOutput, aggregate: str = "last") -> float:
    """One number per (partial) solution from a scorer's output.

    A process scorer's `step_scores` (non-empty) are aggregated with `STEP_AGGREGATIONS[aggregate]` (`rewards.steps`); otherwise the
    outcome `score` is used. A failed score (`error` set) is -inf, so it is never preferred.

    Raises:
        ValueError: an unknown aggregation (the message lists the valid ones).
    """
    try:
        fn = STEP_AGGREGATIONS.get(aggregate)
    except ValueError as exc:
        raise ValueError(f"search.aggregate: {exc}") from None
    if output.error is not None:
        return -math.inf
    if output.step_scores:
        return fn(output.step_scores)
    return float(output.score)


def score_solutions(scorer: Reward, rollouts: Sequence[Rollout], aggregate: str = "last") -> list[float]:
    """`solution_score` of each rollout under `scorer` (one scorer call per rollout, in one batch)."""
    if not rollouts:
        return []
    return [solution_score(o, aggregate) for o in scorer(list(rollouts))]


def pick_best(scores: Sequence[float]) -> int:
    """Index of the highest score; a tie goes to the first (earliest sampled) candidate.

    Raises:
        ValueError: on an empty list.
    """
    if not scores:
        raise ValueError("pick_best: no candidates")
    best = 0
    for i, s in enumerate(scores):
        if s > scores[best]:
            best = i
    return best


def check_budget(n: int, beam_width: int | None = None) -> None:
    """Validate a search budget: n >= 1; for beam search and DVTS also 1 <= beam_width <= n, n % beam_width == 0.

    Raises:
        ValueError: naming `n` or `beam_width`.
    """
    if n < 1:
        raise ValueError(f"search.n: must be >= 1, got {n}")
    if beam_width is not None:
        if beam_width < 1 or beam_width > n or n % beam_width:
            raise ValueError(f"search.beam_width: must divide n={n} (1 <= M <= N), got {beam_width}")


def sample_solutions(policy: SearchPolicy, rows: Sequence[dict[str, Any]], sampling: SamplingSettings, *,
                     n: int, search: SearchSettings = SearchSettings()) -> list[list[Rollout]]:
    """`n` whole solutions per row (steps marked with `search.separator`), sampled in batches of about
    `search.batch_size` sequences. Returns one list of n rollouts per row, in sampling order.

    Args:
        policy: a `rewardlab.policy.Policy` (or an object with its `generate` and `mark_steps`).
        rows: task rows with `prompt`.
        sampling: `rewardlab.policy.SamplingSettings`: max_new_tokens (of a solution), temperature and top_p, or
            greedy (then n must be 1); chunk and max_prompt_length are not read.
        n: solutions per row.
        search: `SearchSettings`: separator and batch_size (aggregate is not read).
    Raises:
        ValueError: what `policy.generate` raises.
    """
    per_call = max(1, search.batch_size // n)
    out: list[list[Rollout]] = []
    for start in range(0, len(rows), per_call):
        chunk = list(rows[start : start + per_call])
        kwargs: dict[str, Any] = ({"greedy": True} if sampling.greedy else
                                  {"n": n, "temperature": sampling.temperature, "top_p": sampling.top_p})
        rollouts = policy.generate([r["prompt"] for r in chunk], max_new_tokens=sampling.max_new_tokens, rows=chunk,
                                   **kwargs)
        for i in range(len(chunk)):
            group = [policy.mark_steps(r, search.separator) for r in rollouts[i * n : (i + 1) * n]]
            for r in group:
                r.group = start + i
            out.append(group)
    return out


def _first_n(what: str, given: Sequence[Sequence[Any]], rows: int, n: int) -> list[list[Any]]:
    if len(given) != rows:
        raise ValueError(f"{what}: {len(given)} lists for {rows} rows")
    short = next((i for i, g in enumerate(given) if len(g) < n), None)
    if short is not None:
        raise ValueError(f"{what}: row {short} has {len(given[short])}, fewer than n={n}")
    return [list(g[:n]) for g in given]


def pool_groups(policy: SearchPolicy | None, rows: Sequence[dict[str, Any]], n: int, pool: Pool | None,
                sampling: SamplingSettings | None, search: SearchSettings) -> list[list[Rollout]]:
    """The N candidates of each row for the pool methods (best-of-N and the votes): the first `n` of each row of
    `pool.samples` when given (`policy` is not called), else `n` fresh solutions per row from
    `sample_solutions(policy, rows, sampling or SOLUTION_SAMPLING, n=n, search=search)`.

    Raises:
        ValueError: `pool.samples` with another number of rows than `rows`, or fewer than n in a row; neither a
            policy nor a pool.
    """
    if pool is not None:
        return _first_n("samples", pool.samples, len(rows), n)
    if policy is None:
        raise ValueError("search: give a policy or samples")
    return sample_solutions(policy, rows, sampling or SOLUTION_SAMPLING, n=n, search=search)


def pool_scores(scorer: Reward | None, groups: Sequence[Sequence[Rollout]], n: int, pool: Pool | None,
                aggregate: str = "last") -> list[float]:
    """The scores of the candidates `groups` (N per row), flat in row order: the first `n` of each row of
    `pool.scores` when given (`scorer` is not called), else `score_solutions(scorer, ..., aggregate)` in one batch.

    Raises:
        ValueError: `pool.scores` with another number of rows than `groups`, or fewer than n in a row; an unknown
            aggregation; neither a scorer nor scores.
    """
    if pool is not None and pool.scores is not None:
        return [float(x) for g in _first_n("scores", pool.scores, len(groups), n) for x in g]
    if scorer is None:
        raise ValueError("search: give a scorer or scores")
    return score_solutions(scorer, [r for g in groups for r in g], aggregate)
