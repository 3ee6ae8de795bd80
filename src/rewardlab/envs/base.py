"""What an environment is: the `Environment` protocol and the `StepResult` of one environment turn.

The environment owns the dynamics and the per-turn rewards; the task's `Reward` owns the outcome (it is called once
per episode, on the episode's final model turn). The episode loop (`rewardlab.envs.episode`) owns tokens, budgets
and termination: an environment sees and returns text and chat messages only, never token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: An environment's per-episode state: whatever `reset` returns (a dict for the built-in environments).
State = Any


def stop_strings(stop: Any, where: str = "stop") -> tuple[str, ...]:
    """`stop`, the strings that end a model turn besides EOS, as a tuple: None is (), a list or tuple of non-empty
    strings is kept in order.

    A str is refused: it is itself a sequence of one-character strings, so `stop = "</answer>"` would end a turn
    at the first "<", "/", "a", ... the model writes.

    Raises:
        ValueError: one line starting with `where` (e.g. "MyEnv.stop"): a str ("write ('</answer>',)"), an empty
            string, an item that is not a str, or a value that is not a list or tuple of them.
    """
    if stop is None:
        return ()
    if isinstance(stop, (str, bytes)):
        raise ValueError(f"{where}: expected a tuple of strings, got the {type(stop).__name__} {stop!r}, whose "
                         f"characters would each end a turn; write ({stop!r},)")
    if not isinstance(stop, (list, tuple)):
        raise ValueError(f"{where}: expected a tuple of strings, got {type(stop).__name__}")
    out = tuple(stop)
    bad = [s for s in out if not isinstance(s, str) or not s]
    if bad:
        raise ValueError(f"{where}: expected non-empty strings, got {bad[0]!r}")
    return out


def env_stop(env: Any) -> tuple[str, ...]:
    """The stop strings of an environment (its optional `stop` attribute, checked by `stop_strings`; () when it
    has none).

    Raises:
        ValueError: one line "<EnvClass>.stop: ..." (see `stop_strings`).
    """
    return stop_strings(getattr(env, "stop", None), f"{type(env).__name__}.stop")


@dataclass
class StepResult:
    """What the environment answers to one model turn.

    Attributes:
        observation: what the model reads next: chat messages ([{"role": "user" | "tool" | ..., "content": str}],
            tool results as role "tool" messages) or a str (appended as is to a raw prompt; for a chat model it
            becomes one user message); None when the episode is done.
        done: True when the episode is over (the loop then appends nothing).
        reward: the environment's reward for this turn (unitless), or None for none (logged and stored as 0.0).
        info: anything else. Keys the loop reads: "tool_calls" (the turn's parsed calls, each a dict with `name`,
            `arguments`, `status`, `seconds`) and "termination" ("stop" when the model answered without a tool
            call; a done step without it ends the episode as "env_done").
    """

    observation: list[dict[str, Any]] | str | None
    done: bool
    reward: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """The interface of an environment (`MultiTurnEnv` and `ToolEnv` implement it; any object with these methods
    works).

    Methods:
        reset(row) -> State: a fresh episode for a task row (`prompt`, `answer`, `messages`, ... as the task gives).
        step(state, action) -> StepResult: the environment's answer to the model's turn `action` (its raw sampled
            text, special tokens removed); may update `state` in place.
    Optional (looked up with getattr; the loop has a default for each):
        state_key(state) -> hashable: the key of the state the model is about to act in (GiGPO's anchor state;
            default: a hash of the whole history, so different states never merge).
        stop: tuple of strings that end a model turn besides EOS (e.g. ("</tool_call>",)); default (). A str is
            refused (`stop_strings`): its characters would each end a turn.
        tools: list of JSON schemas of the environment's tools, given to the chat template; default None.
        raw_text(message) -> str: how an observation message is appended to a raw (non-chat) prompt; default its
            content.
        min_turn_tokens(tokenizer) -> int: the per-turn token budget the environment's own format needs with this
            tokenizer (the built-in environments declare it); `train` and `evaluate` warn at start when their
            max_new_tokens is below it (`rewardlab.envs.sampling.turn_budget_warning`). Default: no check.
        step_batch(states, actions) -> list[StepResult]: the steps of several episodes' turns at once (the episode
            loop calls it once per round with every episode that took a turn); it must return exactly what
            `[step(s, a) for s, a in zip(states, actions)]` would, in order. Default: those serial steps. `ToolEnv`
            has one that runs the tool calls of all the turns concurrently in its pool.
    """

    def reset(self, row: dict[str, Any]) -> State: ...

    def step(self, state: State, action: str) -> StepResult: ...
