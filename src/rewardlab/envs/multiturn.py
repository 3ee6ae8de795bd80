"""`MultiTurnEnv`: the base class of a text environment that answers each model turn until it is done.

    class Echo(MultiTurnEnv):
        def env_response(self, messages, state):
            return f"you said {messages[-1]['content']!r}", 0.0     # observation, per-turn reward
        def is_done(self, messages, state):
            return state["turn"] >= 3

The episode loop (`rewardlab.envs.episode`) calls `reset(row)` once per episode and `step(state, action)` after
every model turn; `step` keeps the transcript in `state["messages"]` and calls the two methods a subclass writes.
"""

from __future__ import annotations

import math
from typing import Any

from rewardlab.envs.base import State, StepResult, stop_strings

__all__ = ["MultiTurnEnv", "initial_messages"]


def initial_messages(row: dict[str, Any], where: str = "environment row") -> list[dict[str, Any]]:
    """The conversation an episode of `row` starts from: a copy of the row's chat `messages` when it has them, else
    one user message holding its `prompt`.

    Raises:
        ValueError: one line starting with `where`: `messages` that is not a non-empty list of dicts with a role, or a
            row with neither `messages` nor a str `prompt`.
    """
    messages = row.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m
                                                                     for m in messages):
            raise ValueError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} dicts")
        return [dict(m) for m in messages]
    prompt = row.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError(f"{where}: expected a str 'prompt' or a list 'messages', got fields {sorted(row)}")
    return [{"role": "user", "content": prompt}]


def _observation_messages(observation: Any, owner: str) -> list[dict[str, Any]]:
    """`observation` as the messages appended to the transcript: a str is one user message, None is none."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    if isinstance(observation, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in observation):
        return observation
    raise TypeError(f"{owner}.env_response: the observation must be a str, a list of messages "
                    f"({{'role': str, 'content': str}}) or None, got {type(observation).__name__}")


class MultiTurnEnv:
    """Base class of a multi-turn environment: subclass `env_response` and `is_done`; `reset` and `step` are done.

    State (what `reset` returns, updated in place by `step`): a dict with
        row: the task row (as given); turn: model turns taken so far (0 at reset);
        messages: the transcript, starting with `initial_messages(row)`; `step` appends the model's turn as
            {"role": "assistant", "content": action} and, when the episode goes on, the observation's messages;
        max_turns: the episode loop's turn limit, added by the loop (`rewardlab.envs.Episode`) after reset; absent
            when the environment is stepped by hand.
    A subclass may add its own keys in `reset` (call `super().reset(row)` first) or in `env_response`.

    `step(state, action)`, in order:
        1. appends the model's turn to `state["messages"]` and adds 1 to `state["turn"]`;
        2. calls `env_response(messages, state)` (messages = the transcript, the model's latest turn last);
        3. calls `is_done(messages, state)` - after env_response, so it can read what env_response stored in state;
        4. ends the episode when is_done is true, when env_response returned a StepResult with done=True, or when
           `max_turns` (if set) model turns were taken (info["termination"] = "max_turns" then, unless set);
        5. returns StepResult(observation, done, reward, info). When done, the observation is dropped (None: the
           loop appends nothing after the final turn) but the reward and info are kept.

    `env_response(messages, state)` returns one of:
        - an observation: a str (appended as is to a raw prompt; one user message for a chat model), a list of
          chat messages ({"role": ..., "content": str}; tool results as role "tool" with a "name"), or None
          (nothing appended; the model simply takes another turn);
        - a pair `(observation, reward)`, reward a finite float (this turn's per-turn reward, unitless) or None;
        - a `StepResult` for full control (its done, reward and info are used; is_done is still consulted).

    Class attributes a subclass may set: `stop` (a tuple of strings that end a model turn besides EOS; a str is
    refused when the class is defined, `stop_strings`), `tools` (JSON schemas for the chat template), `max_turns`
    (None: only the episode loop's limit applies).

    Args:
        max_turns: end the episode after this many model turns (>= 1), or None.
    Raises:
        ValueError: max_turns is not None and not an integer >= 1.
    """

    stop: tuple[str, ...] = ()
    tools: list[dict[str, Any]] | None = None
    max_turns: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check a subclass's own `stop` when it is defined (`stop_strings`: `stop = "</answer>"` is a ValueError
        naming the class, not a turn that ends at every "a")."""
        super().__init_subclass__(**kwargs)
        if "stop" in cls.__dict__ and not isinstance(cls.__dict__["stop"], property):
            stop_strings(cls.__dict__["stop"], f"{cls.__name__}.stop")

    def __init__(self, *, max_turns: int | None = None) -> None:
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                      or max_turns < 1):
            raise ValueError(f"{type(self).__name__}.max_turns: expected an integer >= 1 or None, got {max_turns!r}")
        self.max_turns = max_turns

    # ---------------------------------------------------------------------------------------- to subclass
    def env_response(self, messages: list[dict[str, Any]], state: State) -> Any:
        """The environment's answer to the model's latest turn (`messages[-1]["content"]`); see the class docstring
        for what it may return."""
        raise NotImplementedError(f"{type(self).__name__} must define env_response(messages, state)")

    def is_done(self, messages: list[dict[str, Any]], state: State) -> bool:
        """True when the episode is over after the model's latest turn (called after `env_response`)."""
        raise NotImplementedError(f"{type(self).__name__} must define is_done(messages, state)")

    # ---------------------------------------------------------------------------------------- the protocol
    def reset(self, row: dict[str, Any]) -> State:
        """A fresh episode of `row`: {"row": row, "turn": 0, "messages": initial_messages(row)}.

        Raises:
            ValueError: see `initial_messages`.
        """
        return {"row": row, "turn": 0, "messages": initial_messages(row)}

    def raw_text(self, message: dict[str, Any]) -> str:
        """How an observation message is appended to a raw (non-chat) prompt: its content."""
        return str(message.get("content", ""))

    def step(self, state: State, action: str) -> StepResult:
        """Take the model's turn `action` (its raw sampled text, special tokens removed); see the class docstring.

        Raises:
            TypeError: env_response returned something that is not an observation, a pair or a StepResult.
            ValueError: its reward is not a finite number.
        """
        owner = type(self).__name__
        messages = state["messages"]
        messages.append({"role": "assistant", "content": action})
        state["turn"] += 1
        out = self.env_response(messages, state)
        if isinstance(out, StepResult):
            observation, done, reward, info = out.observation, bool(out.done), out.reward, dict(out.info)
        elif isinstance(out, tuple):
            if len(out) != 2:
                raise TypeError(f"{owner}.env_response: expected (observation, reward), got a {len(out)}-tuple")
            (observation, reward), done, info = out, False, {}
        else:
            observation, reward, done, info = out, None, False, {}
        if reward is not None:
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise ValueError(f"{owner}.env_response: the reward must be a finite number or None, got {reward!r}")
            reward = float(reward)
        new = _observation_messages(observation, owner)
        done = done or bool(self.is_done(messages, state))
        if not done and self.max_turns is not None and state["turn"] >= self.max_turns:
            done = True
            info.setdefault("termination", "max_turns")
        if done:
            return StepResult(None, True, reward, info)
        messages.extend(dict(m) for m in new)
        return StepResult(observation, False, reward, info)
