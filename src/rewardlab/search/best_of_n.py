"""Best-of-N: sample N whole solutions, keep the one the scorer ranks highest."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards.base import Reward
from rewardlab.search.base import (Pool, SearchPolicy, SearchResult, SearchSettings, check_budget, pick_best,
                                   pool_groups, pool_scores)
from rewardlab.types import Rollout


def select_best_of_n(candidates: Sequence[Rollout], scores: Sequence[float], tokens: int = 0) -> SearchResult:
    """Best-of-N selection over already sampled and scored candidates: argmax of `scores`, ties to the first.

    Cost recorded: `tokens` as given, one scorer call per candidate. `info["index"]` is the chosen candidate's index.
    """
    i = pick_best(scores)
    return SearchResult(best=candidates[i], score=scores[i], candidates=list(candidates), scores=list(scores),
                        tokens=tokens, scorer_calls=len(candidates), info={"index": i})


def best_of_n(policy: SearchPolicy | None, rows: Sequence[dict[str, Any]], scorer: Reward | None,
              sampling: SamplingSettings | None = None, *, n: int, search: SearchSettings = SearchSettings(),
              pool: Pool | None = None) -> list[SearchResult]:
    """Best-of-N (rejection sampling with a verifier or reward model; e.g. Cobbe et al. 2021, Lightman et al. 2023).

    For each row: sample N whole solutions y_1..y_N, score each, return y_i with i = argmax_i s(y_i), the first
    such i on a tie. s is `solution_score`: the scorer's step scores aggregated by `search.aggregate` (min | last |
    prod | mean) when it gives step scores (steps split at `search.separator`), else its outcome score.

    Args:
        policy: a `rewardlab.policy.Policy` (or an object with its `generate` and `mark_steps`).
        rows: task rows with `prompt` (and what the scorer reads).
        scorer: any rewardlab `Reward`.
        sampling: `rewardlab.policy.SamplingSettings` of each solution (max_new_tokens in tokens, temperature,
            top_p); None: `SOLUTION_SAMPLING` (64 tokens, temperature 0.8).
        n: N, samples per row.
        search: `SearchSettings`: separator, batch_size (about this many sequences per `generate` call), aggregate.
        pool: already sampled solutions (and their scores), at least N per row: the first N of each row are the
            candidates and `policy` (with scores, `scorer`) is not called (it may be None). `rewardlab search`
            passes its shared pool.
    Returns:
        one `SearchResult` per row (`info["index"]`: the chosen candidate's index); cost: the sampled tokens
        (of the N candidates), N scorer calls.
    Raises:
        ValueError: n < 1, an unknown aggregation, a pool with another number of rows or fewer than N in a row.
    """
    check_budget(n)
    groups = pool_groups(policy, rows, n, pool, sampling, search)
    flat = pool_scores(scorer, groups, n, pool, search.aggregate)  # one batch for all rows
    return [
        select_best_of_n(g, flat[i * n : (i + 1) * n], tokens=sum(len(r.completion_ids) for r in g))
        for i, g in enumerate(groups)
    ]
