"""A round of the episode loop steps its episodes at once: a `ToolEnv` runs the tool calls of all of them
concurrently in its pool (`ToolEnv.step_batch`, `rewardlab.envs.episode.step_all`), and the episodes are exactly
those of stepping them one after another."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from episode_fakes import RawRenderer, ScriptedSampler, assert_prefixes, run_episodes_flat

from rewardlab.envs import StepResult, ToolEnv, run_episodes
from rewardlab.envs.episode import step_all
from tool_fakes import add, boom, call, hang, shout

#: How many calls `meet` waits for.
MEET = 3


def meet(where: str) -> str:
    """Leave a mark in a folder and wait up to 10 s until MEET calls have left theirs.

    Args:
        where: the folder the calls share
    """
    folder = Path(where)
    (folder / uuid.uuid4().hex).touch()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if len(list(folder.iterdir())) >= MEET:
            return "met"
        time.sleep(0.01)
    return "alone"












ROWS = [{"prompt": f"Q{k}:", "answer": "5"} for k in range(8)]
#: Per episode, its turns, each ended by EOS ("$"; the environments below have no stop strings, so a turn can hold
#: several calls, as with a driver that samples without them): every call status, several calls per turn, episodes
#: of 1 to 3 turns, and one whose third turn reaches the environment's own max_turns (its calls are recorded, not
#: run).
SCRIPTS = {
    0: [call("add", a=1, b=2) + "$", "5$"],
    1: [call("shout", text="a") + call("nope") + call("add", a=1) + "$", call("boom", text="x") + "$", "done$"],
    2: [call("shout", text="b") * 4 + "$", "x$"],  # the fourth is over the limit of 3
    3: [call("hang", text="h") + "$", "y$"],  # timeout
    4: ["no call$"],
    5: [call("add", a=2, b=2) + "$", call("add", a=3, b=3) + "$", call("add", a=4, b=4) + "$"],
    6: ["<tool_call>{bad}</tool_call>$", "z$"],
    7: [call("shout", text="c") + call("add", a=5, b=6) + "$", call("shout", text="d") + "$", "w$"],
}


class SerialToolEnv(ToolEnv):
    """A ToolEnv stepped one episode after another: it overrides `step`, so `step_batch` steps each in turn."""

    def step(self, state, action):
        return super().step(state, action)


def _run(env):
    renderer = RawRenderer()
    sampler = ScriptedSampler(SCRIPTS, renderer=renderer)
    out = run_episodes_flat(sampler, env, ROWS, n=1, max_turns=4, max_new_tokens=400, max_episode_tokens=4000,
                            renderer=renderer, seed=3)
    assert_prefixes(sampler, out)
    for r in out:  # a call's seconds is its own run time: measured, so not reproducible
        r.tool_calls = [[dict(c, seconds=None) for c in turn] for turn in r.tool_calls]
    return out


def test_concurrent_episodes_are_exactly_the_serial_ones(monkeypatch):
    options = dict(parser="hermes", timeout_s=1.0, max_calls_per_turn=3, max_turns=3, workers=2)
    with ToolEnv([add, shout, boom, hang], **options) as env, \
            SerialToolEnv([add, shout, boom, hang], **options) as serial:
        env.stop = serial.stop = ()  # turns end at EOS only (see SCRIPTS)
        batches = []
        batch = env.step_batch

        def spy(states, actions):
            batches.append(len(states))
            return batch(states, actions)

        monkeypatch.setattr(env, "step_batch", spy)
        concurrent = _run(env)
        one_by_one = _run(serial)
    assert batches == [8, 7, 3]  # each round's live episodes, stepped at once
    assert concurrent == one_by_one
    statuses = {c["status"] for r in concurrent for turn in r.tool_calls for c in turn}
    assert statuses == {"ok", "unknown_tool", "bad_arguments", "error", "timeout", "over_limit", "malformed",
                        "skipped_last_turn"}
    assert [r.termination for r in concurrent] == ["stop"] * 5 + ["max_turns"] + ["stop"] * 2
    assert concurrent[5].tool_calls[2] == [{"name": "add", "arguments": {"a": 4, "b": 4},
                                            "status": "skipped_last_turn", "seconds": None}]  # recorded, not run


def test_the_calls_of_a_round_run_concurrently_across_episodes(tmp_path):
    # Each call waits until MEET calls are in the folder: only calls that run at the same time can all meet.
    where = tmp_path / "meet"
    where.mkdir()
    renderer = RawRenderer()
    sampler = ScriptedSampler({e: [f"<c>{where}</c>", "ok$"] for e in range(MEET)}, renderer=renderer)
    with ToolEnv([meet], parser="compact", timeout_s=30.0, workers=MEET) as env:
        start = time.monotonic()
        out = run_episodes_flat(sampler, env, ROWS[:MEET], n=1, max_turns=2, max_new_tokens=200, max_episode_tokens=400,
                                renderer=renderer)
        seconds = time.monotonic() - start
    assert [r.tool_calls[0][0]["status"] for r in out] == ["ok"] * MEET
    assert [r.messages[-2]["content"] for r in out] == ["met"] * MEET, "the calls ran one after another"
    assert seconds < 10.0


def test_step_all_uses_step_batch_only_for_several_turns_and_checks_its_length():
    class Env:
        def __init__(self, extra=0):
            self.extra, self.seen = extra, []

        def step(self, state, action):
            self.seen.append(("step", action))
            return StepResult(None, True)

        def step_batch(self, states, actions):
            self.seen.append(("batch", list(actions)))
            return [StepResult(None, True) for _ in range(len(actions) + self.extra)]

    env = Env()
    assert len(step_all(env, [{}], ["a"])) == 1 and env.seen == [("step", "a")]
    assert len(step_all(env, [{}, {}], ["a", "b"])) == 2 and env.seen[-1] == ("batch", ["a", "b"])
    assert step_all(env, [], []) == []
    with pytest.raises(ValueError, match="^Env.step_batch returned 3 results for 2 turns$"):
        step_all(Env(extra=1), [{}, {}], ["a", "b"])


def test_step_batch_refuses_states_and_actions_of_different_lengths():
    with ToolEnv([shout], workers=1) as env, pytest.raises(ValueError, match="1 states and 2 actions"):
        env.step_batch([env.reset({"prompt": "q"})], ["a", "b"])
