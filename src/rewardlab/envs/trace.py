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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewardlab.envs.base import stop_strings
from rewardlab.envs.episode import prompt_text
from rewardlab.types import Rollout

__all__ = ["OBSERVATION_ROLES", "trace_rollouts"]

#: The roles of the messages an environment answers with.
OBSERVATION_ROLES = ("tool", "user")


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def trace_rollouts(renderer: Any, messages: Sequence[dict[str, Any]], *, eos_id: int,
                   stop: Sequence[str] | None = None, where: str = "trace") -> list[Rollout]:
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
    Returns:
        The rows in order, each a `Rollout`: `prompt_ids` [P] and `prompt` (its text), `completion_ids` [T]
        (assistant and observation ids interleaved), `loss_mask` [T] (1 on assistant ids and their EOS, 0
        elsewhere), `logprobs` [T] all 0.0 (no behaviour policy), `turns` (the span of each of the row's assistant
        turns), `first_turn` (the trace-wide index of its first turn), `completion` (the text of its last assistant
        turn), `messages` (the trace up to the row's end), `episode_id` 0; `termination` on the last row only:
        "stop" when the final turn ends with EOS, else "env_done" (None on earlier rows, as in an episode).
    Raises:
        ValueError: one line naming `where` and the message index: a message that is not a dict with a role and a
            str content; no prompt message before the first assistant turn, or no assistant turn; a trace that does
            not end with an assistant turn; an observation whose role is not "tool" or "user"; two assistant turns
            in a row; an assistant turn with a stop string before its end (the sampler would have stopped there)
            or an empty one; a `stop` that is a str or holds an empty or non-string item.
    """
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
    stops = list(stop_strings(stop, f"{where}: stop"))
    tokenizer = renderer.tokenizer
    history = msgs[:first]
    rows: list[Rollout] = []
    prompt_ids = list(renderer.start(history))
    completion: list[int] = []
    mask: list[int] = []
    turns: list[tuple[int, int]] = []
    first_turn = n_turns = 0
    final_text, final_stop = "", False

    def close_row(termination: str | None, upto: int) -> None:
        rows.append(Rollout(prompt=prompt_text(renderer, prompt_ids), prompt_ids=prompt_ids, completion=final_text,
                            completion_ids=completion, logprobs=[0.0] * len(completion), loss_mask=mask,
                            turns=turns, first_turn=first_turn, episode_id=0, termination=termination,
                            messages=msgs[:upto]))

    i = first
    while i < len(msgs):
        m = msgs[i]
        if m["role"] != "assistant":
            raise ValueError(f"{where}: message {i} has role {m['role']!r} where an assistant turn is due")
        text = m["content"]
        if not text:
            raise ValueError(f"{where}: message {i} is an empty assistant turn")
        ends_at_stop = any(text.endswith(s) for s in stops)
        for s in stops:
            at = text.find(s)
            if at != -1 and at + len(s) < len(text):
                raise ValueError(f"{where}: message {i} goes on after the stop string {s!r}; the model's turn ends "
                                 "there")
        ids = _encode(tokenizer, text) + ([] if ends_at_stop else [eos_id])
        turns.append((len(completion), len(completion) + len(ids)))
        completion += ids
        mask += [1] * len(ids)
        n_turns += 1
        history.append({"role": "assistant", "content": text})
        final_text, final_stop = text, ends_at_stop
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
        if not new:
            continue
        obs = renderer.extend(prompt_ids + completion, history, new)
        if obs is not None:
            completion += list(obs)
            mask += [0] * len(obs)
            history += new
            continue
        close_row(None, i - len(new))  # the template rewrote an earlier turn: the trace goes on in a new row
        history += new
        prompt_ids, completion, mask, turns, first_turn = list(renderer.start(history)), [], [], [], n_turns
    close_row("env_done" if final_stop else "stop", len(msgs))
    return rows
