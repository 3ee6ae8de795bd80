"""Held-out evaluation during training (`rl.eval.every`, `sft.eval_every`; TRL's `eval_strategy="steps"`).

Every `eval_every` steps, and at the last step, the policy completes the first `eval_n` questions of the task's
held-out test split greedily (`evaluate_policy` with no sampling) and the task's verifier scores them. The loop logs
the result on that step's metrics line:

    eval/accuracy     greedy exact-match accuracy, fraction in [0, 1] (`evaluate_policy`'s "accuracy")
    eval/score_mean   mean verifier reward of the greedy completions
    time/eval_s       seconds the evaluation took (not counted in time/step_s)

For an environment task (`HeldOutEval(..., episodes=settings)`, the task's `EpisodeSettings`), each question is one
greedy episode (max_new_tokens per model turn) scored once by the outcome reward, and the line also has

    eval/episode/turns_mean  mean model turns per greedy episode
    eval/tool/call_rate      fraction of model turns with a tool call
    eval/tool/errors_mean    tool calls per episode whose status is an error (not ok or skipped_last_turn)
(the training step's `episode/...` and `tool/...` figures, `rewardlab.envs.episode_metrics`, on the held-out rows).

Greedy decoding draws no random numbers, and the RNG state is restored afterwards besides, so a run with evaluation
trains exactly (bit for bit) as the same run without it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rewardlab.envs.sampling import EpisodeSettings
from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
from rewardlab.policy import Policy, SamplingSettings
from rewardlab.rewards import build_reward
from rewardlab.tasks import Task
from rewardlab.train_state import rng_state, set_rng_state


def heldout_rows(task: Task, eval_every: int, eval_n: int, *, field: str) -> list[dict[str, Any]]:
    """The questions evaluated during training: the first `eval_n` rows of `task.test` ([] when `eval_every` is 0).

    Raises:
        ValueError: `eval_every` > 0 and the task has no held-out rows; one line naming `field`.
    """
    if not eval_every:
        return []
    if not task.test:
        raise ValueError(f"{field}: task {task.name} has no held-out test rows to evaluate on; hold some out "
                         f"(task.options.test_size) or set {field}=0")
    return list(task.test[:eval_n])


class HeldOutEval:
    """Greedy accuracy of a policy on fixed held-out rows, due every `every` steps and at `last_step`.

    Args:
        rows: the questions (`heldout_rows`); none: never due. reward_spec: the verifier (the task's reward name).
        every: steps between evaluations (0: off). last_step: the run's last step, always evaluated.
        max_new_tokens: token limit of each greedy completion (of each model turn of an episode).
        batch_size: questions per generate call.
        episodes: the episodes of an environment task (`rewardlab.envs.episode_settings`): each question is a
            greedy episode in its environment; None (default): single completions.
        max_prompt_length: single completions' prompts cut to their last this many tokens
            (`rl.sampling.max_prompt_length`, `Policy.generate`); None: never cut.
    """

    def __init__(self, rows: Sequence[dict[str, Any]], reward_spec: Any, *, every: int, last_step: int,
                 max_new_tokens: int, batch_size: int = 256, episodes: EpisodeSettings | None = None,
                 max_prompt_length: int | None = None) -> None:
        self.rows = list(rows)
        self.episodes = episodes
        self.every, self.last_step = every, last_step
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.max_prompt_length = max_prompt_length
        self.reward = build_reward(reward_spec) if self.rows and every else None

    def due(self, step: int, *, last: bool = False) -> bool:
        """Whether step `step` (1-based) is evaluated: a multiple of `every`, the last step, or any step when `last`
        (the run ends there, e.g. its time budget ran out). Never when evaluation is off."""
        return self.reward is not None and (step % self.every == 0 or step == self.last_step or last)

    def __call__(self, policy: Policy) -> dict[str, float]:
        """Evaluate `policy` now; returns {"eval/accuracy", "eval/score_mean", "time/eval_s"}, plus the episode
        figures for an environment task (see the module docstring). The global RNG state (torch, CUDA, Python's random) is the same afterwards."""
        saved, t0 = rng_state(), time.perf_counter()
        try:
            sampling = SamplingSettings(max_new_tokens=self.max_new_tokens, max_prompt_length=self.max_prompt_length)
            result = evaluate_policy(policy, self.rows, self.reward, sampling, episodes=self.episodes,
                                     settings=EvalSettings(n=0, ks=(), batch_size=self.batch_size))
        finally:
            set_rng_state(saved)
        out = {"eval/accuracy": result["accuracy"], "eval/score_mean": result["score_mean"]}
        if self.episodes is not None:
            out.update({"eval/episode/turns_mean": result["turns_mean"], "eval/tool/call_rate": result["tool_call_rate"],
                        "eval/tool/errors_mean": result["tool_errors_mean"]})
        return {**out, "time/eval_s": time.perf_counter() - t0}
