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


def sample_solutions(
    policy: SearchPolicy,
    rows: Sequence[dict[str, Any]],
    *,
    n: int,
    temperature: float = 0.8,
    top_p: float = 1.0,
    max_new_tokens: int = 64,
    separator: str = "\n",
    batch_size: int = 1024,
    greedy: bool = False,
) -> list[list[Rollout]]:
    """`n` whole solutions per row (steps marked with `separator`), sampled in batches of about `batch_size`
    sequences. Returns one list of n rollouts per row, in sampling order."""
    per_call = max(1, batch_size // n)
    out: list[list[Rollout]] = []
    for start in range(0, len(rows), per_call):
        chunk = list(rows[start : start + per_call])
        kwargs: dict[str, Any] = {"greedy": True} if greedy else {"n": n, "temperature": temperature, "top_p": top_p}
        rollouts = policy.generate([r["prompt"] for r in chunk], max_new_tokens=max_new_tokens, rows=chunk, **kwargs)
        for i in range(len(chunk)):
            group = [policy.mark_steps(r, separator) for r in rollouts[i * n : (i + 1) * n]]
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


def pool_groups(
    policy: SearchPolicy | None,
    rows: Sequence[dict[str, Any]],
    n: int,
    samples: Sequence[Sequence[Rollout]] | None = None,
    **sampling: Any,
) -> list[list[Rollout]]:
    """The N candidates of each row for the pool methods (best-of-N and the votes): the first `n` of each row's
    `samples` when given (a shared pool sampled once for several budgets; `policy` is not called), else `n` fresh
    solutions per row from `sample_solutions(policy, rows, n=n, **sampling)`.

    Raises:
        ValueError: `samples` with another number of rows than `rows`, or fewer than n in a row.
    """
    if samples is not None:
        return _first_n("samples", samples, len(rows), n)
    if policy is None:
        raise ValueError("search: give a policy or samples")
    return sample_solutions(policy, rows, n=n, **sampling)


def pool_scores(
    scorer: Reward | None,
    groups: Sequence[Sequence[Rollout]],
    n: int,
    scores: Sequence[Sequence[float]] | None = None,
    aggregate: str = "last",
) -> list[float]:
    """The scores of the candidates `groups` (N per row), flat in row order: the first `n` of each row's `scores`
    when given (`scorer` is not called), else `score_solutions(scorer, ..., aggregate)` in one batch.

    Raises:
        ValueError: `scores` with another number of rows than `groups`, or fewer than n in a row; an unknown
            aggregation.
    """
    if scores is not None:
        return [float(x) for g in _first_n("scores", scores, len(groups), n) for x in g]
    if scorer is None:
        raise ValueError("search: give a scorer or scores")
    return score_solutions(scorer, [r for g in groups for r in g], aggregate)
