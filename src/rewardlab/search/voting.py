"""Majority vote and weighted majority vote over the final answers of N sampled solutions.

Answers are grouped by an equivalence `equivalent(a, b, row) -> bool`: `exact_equivalent` (same text),
`math_equivalent` (math-verify: "0.5", "1/2" and "\\frac{1}{2}" are one answer) or `VerifierEquivalence(reward)`
(the task's own verifier decides, reading b as the reference answer: its normalizer, e.g. reasoning-gym's decimal
comparison, groups the answers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rewardlab.policy.settings import SamplingSettings
from rewardlab.registry import Registry
from rewardlab.rewards.base import Reward
from rewardlab.rewards.steps import final_answer
from rewardlab.search.base import (Pool, SearchPolicy, SearchResult, SearchSettings, check_budget, pick_best,
                                   pool_groups, pool_scores)
from rewardlab.types import Rollout

#: equivalent(a, b, row) -> True when answers a and b (strings) are the same answer to the row's question.
Equivalence = Callable[[str, str, "dict[str, Any] | None"], bool]

#: Equivalences by config name ("verifier" needs a reward and is built with `VerifierEquivalence`).
EQUIVALENCES: Registry[Equivalence] = Registry("answer equivalence", reserved=("a", "b", "row"))


@EQUIVALENCES.register("exact")
def exact_equivalent(a: str, b: str, row: dict[str, Any] | None = None) -> bool:
    """Same text after stripping surrounding whitespace."""
    return a.strip() == b.strip()


@lru_cache(maxsize=65536)
def _parse(text: str):
    from math_verify import parse

    return parse(text)


@EQUIVALENCES.register("math")
def math_equivalent(a: str, b: str, row: dict[str, Any] | None = None) -> bool:
    """Mathematically equal (math-verify's `parse` + `verify`), or the same text when either does not parse.

    Examples: "0.5" ~ "1/2" ~ "\\frac{1}{2}"; "5" ~ "5.0"; "x" ~ "x" (text) but not "y".
    """
    if a.strip() == b.strip():
        return True
    pa, pb = _parse(a), _parse(b)
    if not pa or not pb:
        return False
    from math_verify import verify

    return bool(verify(pa, pb))


class VerifierEquivalence:
    """a ~ b when `verifier` scores answer a as correct for the row with b put in its `answer` field.

    This reuses the task's own normalization (e.g. reasoning-gym's `score_answer`, which reads "+01.0" as 1), so
    votes group the way the task grades. Each comparison is one verifier call on a one-rollout batch; the
    reference answer of the row is never read.
    """

    def __init__(self, verifier: Reward) -> None:
        self.verifier = verifier

    def __call__(self, a: str, b: str, row: dict[str, Any] | None = None) -> bool:
        probe = Rollout(prompt=str((row or {}).get("prompt", "")), prompt_ids=[], completion=a, completion_ids=[],
                        logprobs=[], row={**(row or {}), "answer": b})
        (out,) = self.verifier([probe])
        return out.correct


@dataclass
class Vote:
    """The outcome of a vote.

    Attributes:
        index: the sample that represents the winner: the first member of the winning group.
        answer: its answer text.
        support: the winning group's total (votes, or summed scores for a weighted vote).
        groups: the groups of equivalent answers as lists of sample indices, in order of first appearance.
        totals: each group's total (same order).
    """

    index: int
    answer: str
    support: float
    groups: list[list[int]]
    totals: list[float]


def group_answers(
    answers: Sequence[str], equivalent: Equivalence = math_equivalent, row: dict[str, Any] | None = None
) -> list[list[int]]:
    """Group sample indices by equivalent answers, groups in order of first appearance.

    Each answer joins the first group whose first answer (its representative) is equivalent to it, else starts a
    new group; identical texts (after stripping) are compared once. Equivalence is not assumed transitive.
    """
    groups: list[list[int]] = []
    reps: list[str] = []
    seen: dict[str, int] = {}
    for i, answer in enumerate(answers):
        key = answer.strip()
        g = seen.get(key)
        if g is None:
            g = next((j for j, rep in enumerate(reps) if equivalent(key, rep, row)), None)
            if g is None:
                groups.append([])
                reps.append(key)
                g = len(groups) - 1
            seen[key] = g
        groups[g].append(i)
    return groups


def _vote(answers: Sequence[str], weights: Sequence[float], equivalent: Equivalence, row) -> Vote:
    if not answers:
        raise ValueError("vote: no answers")
    groups = group_answers(answers, equivalent, row)
    totals = [float(sum(weights[i] for i in g)) for g in groups]
    w = pick_best(totals)  # a tie goes to the group that appeared first
    return Vote(index=groups[w][0], answer=answers[groups[w][0]].strip(), support=totals[w], groups=groups,
                totals=totals)


def majority_vote(
    answers: Sequence[str], equivalent: Equivalence = math_equivalent, row: dict[str, Any] | None = None
) -> Vote:
    """Majority vote, a.k.a. self-consistency (Wang et al. 2023): the answer given by the most samples.

    winner = argmax_a sum_i [answer_i ~ a]; a tie goes to the answer that appeared first.

    Raises:
        ValueError: on no answers.
    """
    return _vote(answers, [1.0] * len(answers), equivalent, row)


def weighted_majority_vote(
    answers: Sequence[str],
    scores: Sequence[float],
    equivalent: Equivalence = math_equivalent,
    row: dict[str, Any] | None = None,
) -> Vote:
    """Weighted majority vote (Uesato et al. 2022; Li et al. 2023): the answer whose group has the highest summed
    score. winner = argmax_a sum_i s_i [answer_i ~ a]; a tie goes to the answer that appeared first.

    Scores are meant to be non-negative (verifier probabilities); a failed score (-inf or NaN) counts as 0.

    Raises:
        ValueError: on no answers, or scores of another length.
    """
    if len(scores) != len(answers):
        raise ValueError(f"weighted_majority_vote: {len(scores)} scores for {len(answers)} answers")
    weights = [s if math.isfinite(s) else 0.0 for s in scores]
    return _vote(answers, weights, equivalent, row)


def _voted(group: list[Rollout], scores: list[float], vote: Vote, tokens: int, scorer_calls: int) -> SearchResult:
    return SearchResult(best=group[vote.index], score=vote.support, candidates=group, scores=scores, tokens=tokens,
                        scorer_calls=scorer_calls, answer=vote.answer,
                        info={"index": vote.index, "groups": vote.groups, "totals": vote.totals})


@dataclass(frozen=True)
class Voting:
    """How the votes read an answer: `extract` turns a completion into its final answer, `equivalent` says when
    two answers are one (`Equivalence`: math_equivalent, exact_equivalent, `VerifierEquivalence`)."""

    equivalent: Equivalence = math_equivalent
    extract: Callable[[str], str] = final_answer


def majority(policy: SearchPolicy | None, rows: Sequence[dict[str, Any]], sampling: SamplingSettings | None = None, *,
             n: int, voting: Voting = Voting(), search: SearchSettings = SearchSettings(),
             pool: Pool | None = None) -> list[SearchResult]:
    """Sample N solutions per row and return the majority-vote answer (`majority_vote` over
    `voting.extract(completion)`, answers compared with `voting.equivalent`).

    Args:
        policy, rows, sampling, n, search: as in `rewardlab.search.best_of_n` (aggregate is not read).
        voting: `Voting`: equivalent, extract.
        pool: already sampled solutions, at least N per row; the first N of each row are voted on and `policy` is
            not called (it may be None); its scores are not read. `rewardlab search` passes its shared pool.
    Returns:
        one `SearchResult` per row: `best` = the first sample giving the winning answer, `answer` = that answer,
        `score` = its vote count, `info["index"]` = the index of `best`; cost: the sampled tokens, 0 scorer calls.
    Raises:
        ValueError: n < 1; a pool with another number of rows or fewer than N in a row.
    """
    check_budget(n)
    out = []
    for row, group in zip(rows, pool_groups(policy, rows, n, pool, sampling, search)):
        vote = majority_vote([voting.extract(r.completion) for r in group], voting.equivalent, row)
        out.append(_voted(group, [1.0] * len(group), vote, sum(len(r.completion_ids) for r in group), 0))
    return out


def weighted_majority(policy: SearchPolicy | None, rows: Sequence[dict[str, Any]], scorer: Reward | None,
                      sampling: SamplingSettings | None = None, *, n: int, voting: Voting = Voting(),
                      search: SearchSettings = SearchSettings(), pool: Pool | None = None) -> list[SearchResult]:
    """Sample N solutions per row, score them (`solution_score` with `search.aggregate`), return the
    weighted-majority answer (`weighted_majority_vote`).

    Args:
        policy, rows, scorer, sampling, n, search, pool: as in `rewardlab.search.best_of_n`.
        voting: `Voting`: equivalent, extract.
    Returns:
        one `SearchResult` per row: `best` = the first sample giving the winning answer, `score` = the winning
        group's summed score, `info["index"]` = the index of `best`; cost: the sampled tokens, N scorer calls.
    Raises:
        ValueError: n < 1, an unknown aggregation; a pool with another number of rows or fewer than N in a row.
    """
    check_budget(n)
    groups = pool_groups(policy, rows, n, pool, sampling, search)
    flat = pool_scores(scorer, groups, n, pool, search.aggregate)
    out = []
    for i, (row, group) in enumerate(zip(rows, groups)):
        scores = flat[i * n : (i + 1) * n]
        vote = weighted_majority_vote([voting.extract(r.completion) for r in group], scores, voting.equivalent, row)
        out.append(_voted(group, scores, vote, sum(len(r.completion_ids) for r in group), n))
    return out
