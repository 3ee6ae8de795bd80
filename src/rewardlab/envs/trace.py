"""Supervised training rows from multi-turn traces, with the ids an episode would hold.

    for row in trace_rollouts(renderer, messages, eos_id=tok.eos_token_id, stop=env.stop):
        row.prompt_ids, row.completion_ids, row.loss_mask   # train on completion ids where loss_mask == 1

A trace is a transcript in chat messages: the prompt messages (everything before the first assistant message),
then assistant turns (their raw text) and the observations between them ("tool" or "user" messages). It becomes
token ids exactly as `rewardlab.envs.run_episodes` builds an episode whose model sampled the same turns, so that
supervised training and RL see the same ids (token-exact):
- the prompt is `renderer.start(prompt messages)`;
- an assistant turn is its text encoded alone, no special tokens added; a turn that ends at one of the stop strings
  (a tool call closing, e.g. "</c>") ends there, as the sampler stops it, and every other turn (one that answers
  and so ends the episode) is followed by the end-of-sequence id, as the sampler samples it;
- the observations after a turn are `renderer.extend(row ids so far, transcript so far, observations)`; where the
  chat template rewrites earlier turns (`extend` returns None, e.g. Qwen3 drops the reasoning of earlier turns), the
  row ends there and the trace goes on in a new row whose prompt is `renderer.start(transcript so far)`, as the
  episode loop does, so a trace gives one row per row its episode would have.
The loss mask is 1 exactly on the assistant turns' ids (their EOS included) and 0 on everything the environment
or the template added.

The rows are built by the episode state machine itself (`rewardlab.envs.episode.Episode`), fed the trace's turns as
samples and its observations as the environment's answers, so they cannot drift from what the episode loop builds.
With budgets (`limits`: max_turns, max_episode_tokens, the context window, max_tool_tokens) the trace holds what an
episode under them holds: tool outputs clipped, cut where the episode would end, with that termination.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rewardlab.envs.base import StepResult, stop_strings
from rewardlab.envs.episode import Episode, EpisodeLimits
from rewardlab.types import Rollout, Sampled

__all__ = ["OBSERVATION_ROLES", "trace_rollouts"]

#: The roles of the messages an environment answers with.
OBSERVATION_ROLES = ("tool", "user")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def trace_rollouts(renderer: Any, messages: Sequence[dict[str, Any]], *, eos_id: int,
                   stop: Sequence[str] | None = None, where: str = "trace",
                   limits: EpisodeLimits | None = None) -> list[Rollout]:
    """The rows of a trace (see the module docstring): the ids an episode holds after a model sampled its
    assistant turns, with a loss mask on exactly those turns; one row, or more where the chat template rewrites
    earlier turns.

    Args:
        renderer: the `Renderer` the episode loop uses (`rewardlab.envs.make_renderer(tokenizer, prompt_format,
            tools=env.tools, raw_text=env.raw_text)`); its `tokenizer` encodes the assistant turns.
        messages: the trace: one or more prompt messages (system/user), then assistant and observation ("tool" or
            "user") messages, ending with an assistant message; each a dict with "role" and a str "content".
        eos_id: the end-of-sequence id appended to a turn that does not end at a stop string.
        stop: the strings that end a model turn besides EOS (the environment's `stop`, e.g. ("</c>",)); a str is
            refused (`rewardlab.envs.base.stop_strings`).
        where: how errors name the trace (e.g. "sft: training row 3").
        limits: the episode budgets (`EpisodeLimits`; its max_new_tokens is not read: a turn may take what is left of
            the episode) or None (default): none, the whole trace. Under budgets a trace is cut where its episode
            would end: after turn max_turns (termination "max_turns", the observation after it dropped), inside a
            turn at the episode or context budget ("max_episode_tokens", "context"; that turn keeps the ids that
            fit, no EOS), or before an observation that does not fit; tool outputs are clipped to max_tool_tokens.
    Returns:
        The rows in order, each a `Rollout`: `prompt_ids` [P] and `prompt` (its text), `completion_ids` [T]
        (assistant and observation ids interleaved), `loss_mask` [T] (1 on assistant ids and their EOS, 0
        elsewhere), `logprobs` [T] all 0.0 (no behaviour policy), `turns` (the span of each of the row's assistant
        turns), `first_turn` (the trace-wide index of its first turn), `completion` (the text of its last assistant
        turn), `messages` (the trace up to the row's end), `episode_id` 0; `termination` on the last row only:
        "stop" when the final turn ends with EOS, "env_done" when it ends at a stop string, or the budget that cut
        the trace (None on earlier rows, as in an episode).
    Raises:
        ValueError: one line naming `where` and the message index: a message that is not a dict with a role and a
            str content; no prompt message before the first assistant turn, or no assistant turn; a trace that does
            not end with an assistant turn; an observation whose role is not "tool" or "user"; two assistant turns
            in a row; an assistant turn with a stop string before its end (the sampler would have stopped there)
            or an empty one; a `stop` that is a str or holds an empty or non-string item; a prompt that leaves no
            room in `limits.context_window`.
    """
    msgs, first = _checked_messages(messages, where)
    stops = list(stop_strings(stop, f"{where}: stop"))
    turns, steps = _split_turns(msgs, first, renderer.tokenizer, eos_id, stops, where)
    if limits is None:  # no budget binds: the whole trace
        longest = max(len(ids) for ids, _ in turns)
        limits = EpisodeLimits(max_turns=len(turns), max_new_tokens=longest, max_episode_tokens=10**12)
    else:  # every turn may take what is left of the episode, as much as a sampler could give it
        limits = replace(limits, max_new_tokens=limits.max_episode_tokens)
    try:
        episode = Episode(_TraceEnv(steps, turns[-1][1]), {"messages": msgs[:first]}, renderer, limits)
    except ValueError as exc:  # "episode 0: the prompt has N tokens and ..."
        raise ValueError(f"{where}: {str(exc).removeprefix('episode 0: ')}") from None
    while (request := episode.next_request()) is not None:
        ids, at_stop = turns[episode.turn]
        finish = "length" if len(ids) > request.max_new_tokens else "stop" if at_stop else "eos"
        ids = ids[:request.max_new_tokens]
        episode.feed(Sampled(ids, [0.0] * len(ids), finish))
    rows = episode.rollouts()
    if episode.termination in ("stop", "env_done"):  # the whole trace: its own text, not the decoded turns
        for ro in rows:
            ro.messages = msgs[:len(ro.messages)]
        rows[-1].completion = msgs[-1]["content"]
    return rows


def _checked_messages(messages: Sequence[dict[str, Any]], where: str) -> tuple[list[dict[str, Any]], int]:
    """Copies of the trace's messages and the index of its first assistant turn, after checking that each message
    has a str role and content, that prompt messages come first and that an assistant turn ends the trace."""
    msgs = [dict(m) for m in messages]
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where}: message {i} must be a dict with a str 'role' and a str 'content'")
    first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError(f"{where}: has no assistant message (nothing to train on)")
    if first == 0:
        raise ValueError(f"{where}: message 0 is an assistant turn; a trace starts with its prompt messages")
    if msgs[-1]["role"] != "assistant":
        raise ValueError(f"{where}: message {len(msgs) - 1} ({msgs[-1]['role']}) ends the trace; a trace ends with "
                         "the model's final assistant turn")
    return msgs, first


def _split_turns(msgs: list[dict[str, Any]], first: int, tokenizer: Any, eos_id: int, stops: list[str],
                 where: str) -> tuple[list[tuple[list[int], bool]], list[list[dict[str, Any]]]]:
    """The trace from message `first` on as (turns, steps): per assistant turn its ids (EOS included) and whether
    it ends at a stop string, and the observation messages after it."""
    turns: list[tuple[list[int], bool]] = []
    steps: list[list[dict[str, Any]]] = []
    i = first
    while i < len(msgs):
        if msgs[i]["role"] != "assistant":
            raise ValueError(f"{where}: message {i} has role {msgs[i]['role']!r} where an assistant turn is due")
        turns.append(_turn_ids(msgs[i]["content"], i, tokenizer, eos_id, stops, where))
        i += 1
        new = []
        while i < len(msgs) and msgs[i]["role"] != "assistant":
            if msgs[i]["role"] not in OBSERVATION_ROLES:
                raise ValueError(f"{where}: message {i} has role {msgs[i]['role']!r}; an observation is one of "
                                 f"{', '.join(OBSERVATION_ROLES)}")
            new.append(msgs[i])
            i += 1
        if i < len(msgs) and not new:
            raise ValueError(f"{where}: message {i} is an assistant turn right after another (no observation "
                             "between them)")
        steps.append(new)
    return turns, steps


def _turn_ids(text: str, i: int, tokenizer: Any, eos_id: int, stops: list[str],
              where: str) -> tuple[list[int], bool]:
    """Assistant turn `text` (message `i`) as the sampler would have produced it: (its ids, EOS appended unless it
    ends at a stop string; whether it ends at one)."""
    if not text:
        raise ValueError(f"{where}: message {i} is an empty assistant turn")
    ends_at_stop = any(text.endswith(s) for s in stops)
    for s in stops:
        at = text.find(s)
        if at != -1 and at + len(s) < len(text):
            raise ValueError(f"{where}: message {i} goes on after the stop string {s!r}; the model's turn ends "
                             "there")
    return _encode(tokenizer, text) + ([] if ends_at_stop else [eos_id]), ends_at_stop


class _TraceEnv:
    """The environment of a trace: step k answers with the observation messages after assistant turn k, and the
    step of the last turn ends the episode ("env_done" when that turn ended at a stop string, else "stop")."""

    def __init__(self, steps: list[list[dict[str, Any]]], last_at_stop: bool) -> None:
        self.steps, self.last_at_stop = steps, last_at_stop

    def reset(self, row: dict[str, Any]) -> list[int]:
        return [0]

    def step(self, state: list[int], action: str) -> StepResult:
        k = state[0]
        state[0] += 1
        if k == len(self.steps) - 1:
            return StepResult(observation=None, reward=None, done=True,
                              info={"termination": "env_done" if self.last_at_stop else "stop"})
        return StepResult(observation=[dict(m) for m in self.steps[k]], reward=None, done=False)
