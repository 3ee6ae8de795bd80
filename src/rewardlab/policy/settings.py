"""How a policy samples: one `SamplingSettings` value, passed whole to every function that samples (single
completions, episodes, engines, evaluation)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingSettings:
    """How completions (or the model turns of episodes) are sampled, fixed for a run or a call.

    Attributes:
        max_new_tokens: tokens of a completion (of one model turn of an episode) at most.
        temperature, top_p: as in `Policy.generate`; ignored when greedy.
        greedy: argmax decoding (one sample per row): no random numbers are drawn.
        chunk: rollouts (episodes) per chunk of a rollout engine, a multiple of every `n` it generates with
            (`rl.sampling.rollout_chunk`, `rewardlab.rl.engines`); None: a call's whole batch is one chunk.
        max_prompt_length: a single completion's prompt is cut to its last this many tokens
            (`rl.sampling.max_prompt_length`, `Policy.generate`); None: never cut.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    chunk: int | None = None
    max_prompt_length: int | None = None
    greedy: bool = False


__all__ = ["SamplingSettings"]
