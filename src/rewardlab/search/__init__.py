"""Reward-guided search at inference: best-of-N, majority and weighted majority vote, step-level beam search, DVTS.

Every method takes a policy (`rewardlab.policy.Policy`), task rows and, except `majority`, a scorer (any rewardlab
`Reward`; a process scorer's `step_scores` are aggregated with min | last | prod | mean), and returns one
`SearchResult` per row with its cost: tokens generated and scorer calls. `rewardlab search` (`search.report`)
compares them against pass@N and greedy decoding.
"""

from rewardlab.rewards.steps import STEP_AGGREGATIONS
from rewardlab.search.base import Pool, SearchResult, SearchSettings, pick_best, sample_solutions, solution_score
from rewardlab.search.beam import beam, dvts, join_steps
from rewardlab.search.best_of_n import best_of_n, select_best_of_n
from rewardlab.search.voting import (
    EQUIVALENCES,
    VerifierEquivalence,
    Vote,
    Voting,
    exact_equivalent,
    group_answers,
    majority,
    majority_vote,
    math_equivalent,
    weighted_majority,
    weighted_majority_vote,
)

__all__ = [
    "EQUIVALENCES",
    "STEP_AGGREGATIONS",
    "Pool",
    "SearchResult",
    "SearchSettings",
    "VerifierEquivalence",
    "Vote",
    "Voting",
    "beam",
    "best_of_n",
    "dvts",
    "exact_equivalent",
    "group_answers",
    "join_steps",
    "majority",
    "majority_vote",
    "math_equivalent",
    "pick_best",
    "sample_solutions",
    "select_best_of_n",
    "solution_score",
    "weighted_majority",
    "weighted_majority_vote",
]
