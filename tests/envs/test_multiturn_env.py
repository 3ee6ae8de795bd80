"""MultiTurnEnv: the transcript it keeps, what env_response may return, is_done after env_response, max_turns."""

import pytest

from episode_fakes import run_episodes_flat

from rewardlab.envs import Environment, MultiTurnEnv, StepResult, initial_messages


class Countdown(MultiTurnEnv):
    """Answers each turn with how many turns are left; done after 3 turns; per-turn reward = turn number."""

    def env_response(self, messages, state):
        state["seen"] = messages[-1]["content"]
        return f"{3 - state['turn']} left", float(state["turn"])

    def is_done(self, messages, state):
        return state["turn"] >= 3


def test_step_keeps_the_transcript_and_passes_reward_and_observation():
    env = Countdown()
    assert isinstance(env, Environment)
    state = env.reset({"prompt": "go"})
    assert state == {"row": {"prompt": "go"}, "turn": 0, "messages": [{"role": "user", "content": "go"}]}
    first = env.step(state, "a")
    assert first == StepResult("2 left", False, 1.0, {})
    assert state["messages"][-2:] == [{"role": "assistant", "content": "a"}, {"role": "user", "content": "2 left"}]
    env.step(state, "b")
    last = env.step(state, "c")
    # is_done runs after env_response: the last reward is kept, the observation dropped
    assert last == StepResult(None, True, 3.0, {})
    assert state["seen"] == "c" and state["turn"] == 3
    assert [m["role"] for m in state["messages"]] == ["user", "assistant", "user", "assistant", "user", "assistant"]


class Plain(MultiTurnEnv):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def env_response(self, messages, state):
        return self.out

    def is_done(self, messages, state):
        return False


def test_env_response_may_return_messages_a_bare_observation_or_a_step_result():
    tool = [{"role": "tool", "name": "t", "content": "x"}]
    env = Plain(tool)
    state = env.reset({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
    assert env.step(state, "a") == StepResult(tool, False, None, {})
    assert state["messages"][-1] == tool[0] and state["messages"][-1] is not tool[0]
    env = Plain(StepResult([], True, 0.5, {"termination": "env_done"}))
    assert env.step(env.reset({"prompt": "p"}), "a") == StepResult(None, True, 0.5, {"termination": "env_done"})


def test_max_turns_ends_the_episode_with_its_termination():
    env = Plain("more", max_turns=2)
    state = env.reset({"prompt": "p"})
    assert not env.step(state, "a").done
    assert env.step(state, "b") == StepResult(None, True, None, {"termination": "max_turns"})


@pytest.mark.parametrize("out,error,match", [
    (("x", float("nan")), ValueError, "reward must be a finite number"),
    (("x", 1.0, 2.0), TypeError, "expected \\(observation, reward\\), got a 3-tuple"),
    (42, TypeError, "observation must be a str, a list of messages"),
    ([{"role": "tool"}], TypeError, "observation must be a str, a list of messages"),
])
def test_a_bad_env_response_is_a_one_line_error_naming_the_class(out, error, match):
    with pytest.raises(error, match=f"Plain.env_response: .*{match}"):
        env = Plain(out)
        env.step(env.reset({"prompt": "p"}), "a")


def test_initial_messages_and_bad_rows():
    assert initial_messages({"prompt": "p"}) == [{"role": "user", "content": "p"}]
    chat = [{"role": "user", "content": "u"}]
    assert initial_messages({"prompt": "p", "messages": chat}) == chat
    with pytest.raises(ValueError, match="expected a str 'prompt' or a list 'messages'"):
        initial_messages({"answer": "1"})
    with pytest.raises(ValueError, match="Plain.max_turns"):
        Plain("x", max_turns=0)


# ------------------------------------------------------------------------------------------------ stop strings
def test_a_str_stop_is_refused_where_it_is_given_not_split_into_one_character_stops():
    # `stop = "</answer>"` used to end a turn at each of its characters (issue 32, item 5)
    with pytest.raises(ValueError, match=r"^Answers.stop: expected a tuple of strings, got the str '</answer>', whose "
                                         r"characters would each end a turn; write \('</answer>',\)$"):
        class Answers(MultiTurnEnv):
            stop = "</answer>"

    class Late(Countdown):
        def __init__(self):
            super().__init__()
            self.stop = "</answer>"  # set on the instance: refused where the loop reads it

    from rewardlab.envs import run_episodes, trace_rollouts
    from rewardlab.envs.render import RawRenderer
    from rewardlab.policy import load_policy
    from rewardlab.policy.tiny import build_tokenizer

    policy = load_policy("tiny", seed=0)
    with pytest.raises(ValueError, match=r"^Late.stop: expected a tuple of strings, got the str '</answer>'"):
        run_episodes_flat(policy, Late(), [{"prompt": "go"}], n=1, max_turns=2, max_new_tokens=4, max_episode_tokens=32)
    with pytest.raises(ValueError, match=r"^sample_ids.stop: expected a list of strings, got the str '</answer>'"):
        policy.sample_ids([[1, 5]], max_new_tokens=2, stop="</answer>")
    trace = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a</answer>"}]
    with pytest.raises(ValueError, match=r"^trace: stop: expected a tuple of strings, got the str '</answer>'"):
        trace_rollouts(RawRenderer(build_tokenizer()), trace, eos_id=2, stop="</answer>")
    for bad, match in ((["</a>", ""], "expected non-empty strings, got ''"), (("</a>", 3), "got 3"),
                       ({"</a>": 1}, "got dict")):
        with pytest.raises(ValueError, match=match):
            class Bad(MultiTurnEnv):
                stop = bad
    class Fine(MultiTurnEnv):  # a tuple or list of strings is what stop is
        stop = ["</answer>", "</g>"]
    assert [len(r.turns) for r in trace_rollouts(RawRenderer(build_tokenizer()), trace, eos_id=2,
                                                  stop=("</answer>",))] == [1]


def test_a_tool_call_parser_with_a_str_stop_is_refused_when_the_tool_env_is_built(monkeypatch):
    from rewardlab.envs import TOOL_PARSERS, ToolEnv
    from tool_fakes import shout

    monkeypatch.setattr(TOOL_PARSERS.get("hermes"), "stop", "</tool_call>")
    with pytest.raises(ValueError, match=r"^ToolEnv.parser: parser 'hermes''s stop: expected a tuple of strings"):
        ToolEnv([shout])
