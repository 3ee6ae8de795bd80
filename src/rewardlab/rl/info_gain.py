"""IGPO's information-gain turn reward (Wang et al., 2025, "Information Gain-based Policy Optimization: A Simple and
Effective Approach for Multi-Turn LLM Agents"): how much a turn raised the policy's belief in the ground truth.

    r_k = log p(answer | history after turn k) - log p(answer | history before turn k)

under the current policy, where "before turn k" is the episode's ids up to the first token of model turn k and
"after turn k" the ids up to the first token of turn k + 1 (so turn k's own tokens and the observation it got), or
up to the end of the episode for its last turn. log p(answer | h) is the sum of the log-probs of the answer's tokens
(`Policy.encode_target` minus its end-of-sequence token) appended to h, at temperature 1. The rewards telescope: an
episode's gains sum to log p(answer | whole episode) - log p(answer | prompt). Used as the `turn_rewards` of
`turn_grpo` or `gigpo` (rl.turn_rewards: info_gain).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rewardlab.types import Rollout


def _boundaries(rows: Sequence[Rollout]) -> list[list[int]]:
    """The ids of the episode before each of its model turns, and at its end (len = turns + 1)."""
    cuts: list[list[int]] = []
    for r in rows:
        for start, _ in r.turns:
            cuts.append(list(r.prompt_ids) + list(r.completion_ids[:start]))
    last = rows[-1]
    cuts.append(list(last.prompt_ids) + list(last.completion_ids))
    return cuts


@torch.no_grad()
def info_gain_rewards(policy: Any, episodes: Sequence[Sequence[Rollout]], *, batch_size: int = 64
                      ) -> list[list[float]]:
    """The information gain of every model turn of each episode (IGPO, see the module doc).

    Args:
        policy: a `rewardlab.policy.Policy` (its current weights score the answer).
        episodes: each episode's rows in order (`rewardlab.envs.episode_rows`); the answer is the last row's
            `row["answer"]`, as text.
        batch_size: prefixes scored per forward pass.
    Returns:
        per episode, one float per model turn across its rows, in nats (the rewards telescope: their sum is
        log p(answer | whole episode) - log p(answer | prompt)).
    Raises:
        ValueError: an episode whose row has no `answer` (IGPO needs the ground truth).
    """
    prefixes: list[list[int]] = []
    targets: list[list[int]] = []
    spans: list[tuple[int, int]] = []
    eos = policy.tokenizer.eos_token_id
    for rows in episodes:
        answer = rows[-1].row.get("answer")
        if answer is None:
            raise ValueError("rl.turn_rewards: info_gain needs each row's ground-truth 'answer'; a row has none")
        ids = [t for t in policy.encode_target(str(answer))]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        cuts = _boundaries(rows)
        spans.append((len(prefixes), len(cuts)))
        prefixes += cuts
        targets += [ids] * len(cuts)
    scores: list[float] = []
    was_training = policy.model.training
    policy.model.eval()
    try:
        for start in range(0, len(prefixes), batch_size):
            batch = policy.collate(prefixes[start:start + batch_size], targets[start:start + batch_size])
            logprobs, _ = policy.token_logprobs(batch)
            scores += (logprobs * batch.mask).sum(dim=1).tolist()
    finally:
        policy.model.train(was_training)
    return [[scores[a + k + 1] - scores[a + k] for k in range(n - 1)] for a, n in spans]
