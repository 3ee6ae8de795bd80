"""ToolEnv: parsing (hermes, compact), argument checks, every bad-call status as its observation, the process pool
with its per-call timeout, and the one-line construction errors."""

import re
import time

import pytest
from transformers.utils import get_json_schema

from rewardlab.envs import CALL_STATUSES, TOOL_PARSERS, ToolEnv, check_arguments
from tool_fakes import add, boom, call, hang, shout


# Tools must be picklable module-level callables with type hints and an Args docstring.








def square(x: int) -> int:
    """Square an integer.

    Args:
        x: the integer
    """
    return x * x


def no_doc(x: int) -> int:
    return x


def no_hints(x):
    """No hints.

    Args:
        x: a value
    """
    return x




@pytest.fixture(scope="module")
def env():
    with ToolEnv([add, shout, boom], parser="hermes", timeout_s=10.0, workers=1) as e:
        yield e


# ------------------------------------------------------------------------------------------------ construction
def test_schemas_come_from_get_json_schema_and_stop_is_the_parsers_closing_string(env):
    assert env.tools == [get_json_schema(add), get_json_schema(shout), get_json_schema(boom)]
    assert env.stop == ("</tool_call>",)
    assert ToolEnv([square], parser="compact").stop == ("</c>",)
    assert set(TOOL_PARSERS) == {"hermes", "compact"}
    assert CALL_STATUSES == ("ok", "malformed", "unknown_tool", "bad_arguments", "error", "timeout", "over_limit",
                             "skipped_last_turn")


@pytest.mark.parametrize("tool,match", [(no_doc, "tool 'no_doc': .*docstring"), (no_hints, "tool 'no_hints': ")])
def test_a_tool_without_docstring_or_hints_is_a_one_line_error_naming_it(tool, match):
    with pytest.raises(ValueError, match=match) as info:
        ToolEnv([tool])
    assert "\n" not in str(info.value)


def total(*xs: int) -> int:
    """Sum integers.

    Args:
        xs: the integers
    """
    return sum(xs)


def options(**kw: int) -> int:
    """Count options.

    Args:
        kw: the options
    """
    return len(kw)


def ident(x: int, /) -> int:
    """The integer itself.

    Args:
        x: the integer
    """
    return x


def scaled(x: int, *rest: int) -> int:
    """An integer and more.

    Args:
        x: the integer
        rest: more integers
    """
    return x + sum(rest)


@pytest.mark.parametrize("tool,what", [(total, "*xs (*args)"), (options, "**kw (**kwargs)"),
                                       (ident, "x (positional-only)"), (scaled, "*rest (*args)")])
def test_a_tool_whose_parameters_a_call_by_name_cannot_fill_is_refused_naming_it(tool, what):
    # get_json_schema gives such a tool a schema, and every call then failed with TypeError (issue 32, item 10)
    with pytest.raises(ValueError, match=rf"^tool '{tool.__name__}': parameter {re.escape(what)} cannot be given by "
                                         "name") as info:
        ToolEnv([add, tool])
    assert "\n" not in str(info.value)


def test_an_unpicklable_tool_is_a_one_line_error():
    def local(x: int) -> int:
        """A local function cannot be pickled by reference.

        Args:
            x: a value
        """
        return x

    with pytest.raises(ValueError, match="tool 'local' cannot be pickled.*module top level") as info:
        ToolEnv([local])
    assert "\n" not in str(info.value)


def test_bad_construction_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="ToolEnv.parser: unknown tool-call parser 'xml'; valid: compact, hermes"):
        ToolEnv([add], parser="xml")
    with pytest.raises(ValueError, match="parser 'compact' calls the environment's single tool; got 2 tools"):
        ToolEnv([square, shout], parser="compact")
    with pytest.raises(ValueError, match="parser 'compact' passes one argument; tool 'add' has 2"):
        ToolEnv([add], parser="compact")
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolEnv([add, add])
    with pytest.raises(ValueError, match="ToolEnv.timeout_s"):
        ToolEnv([add], timeout_s=0)
    with pytest.raises(ValueError, match="ToolEnv.tools"):
        ToolEnv([])
    for bad in (0, -1, True, 1.5, "4"):
        with pytest.raises(ValueError, match=r"^ToolEnv.max_calls_per_turn: expected an integer >= 1 or None, got "):
            ToolEnv([add], max_calls_per_turn=bad)


# ------------------------------------------------------------------------------------------------ hermes parsing
def test_hermes_parses_zero_one_and_two_calls(env):
    assert env.parse("The answer is 5.") == []
    (one,) = env.parse("Let me add. " + call("add", a=2, b=3))
    assert (one["name"], one["arguments"], one["status"]) == ("add", {"a": 2, "b": 3}, "ok")
    two = env.parse(call("add", a=1, b=1) + "\n" + call("shout", text="hi"))
    assert [(c["name"], c["arguments"]) for c in two] == [("add", {"a": 1, "b": 1}), ("shout", {"text": "hi"})]


def test_hermes_accepts_arguments_as_a_json_string_and_raw_newlines_in_strings(env):
    (c,) = env.parse('<tool_call>{"name": "shout", "arguments": "{\\"text\\": \\"a\\"}"}</tool_call>')
    assert (c["status"], c["arguments"]) == ("ok", {"text": "a"})
    (c,) = env.parse('<tool_call>{"name": "shout", "arguments": {"text": "line1\nline2"}}</tool_call>')
    assert (c["status"], c["arguments"]) == ("ok", {"text": "line1\nline2"})


def test_no_call_ends_the_episode_as_stop(env):
    state = env.reset({"prompt": "q"})
    result = env.step(state, "42")
    assert result.done and result.observation is None
    assert result.info == {"termination": "stop", "tool_calls": []}


# ------------------------------------------------------------------------------------------------ statuses
def _one(env, action):
    state = env.reset({"prompt": "q"})
    result = env.step(state, action)
    assert not result.done
    (message,) = result.observation
    (record,) = result.info["tool_calls"]
    assert set(record) == {"name", "arguments", "status", "seconds"}
    return message, record


def test_an_ok_call_returns_str_of_the_result(env):
    message, record = _one(env, call("add", a=20, b=22))
    assert message == {"role": "tool", "name": "add", "content": "42"}
    assert record["status"] == "ok" and record["arguments"] == {"a": 20, "b": 22} and record["seconds"] >= 0.0


@pytest.mark.parametrize("action,status,content", [
    ("<tool_call>{bad json}</tool_call>", "malformed", "error: malformed tool call: not JSON"),
    ('<tool_call>{"arguments": {}}</tool_call>', "malformed", "error: malformed tool call: expected {\"name\""),
    ('<tool_call>["add"]</tool_call>', "malformed", "error: malformed tool call: expected {\"name\""),
    ('<tool_call>{"name": "add", "arguments": 3}</tool_call>', "malformed",
     'error: malformed tool call: "arguments" must be a JSON object'),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', "malformed",
     "error: malformed tool call: <tool_call> is never closed"),
    (call("mul", a=1, b=2), "unknown_tool", "error: unknown tool 'mul'; tools: add, shout, boom"),
    (call("add", a=1), "bad_arguments", "error: bad arguments for add: missing argument 'b'"),
    (call("add", a=1, b=2, c=3), "bad_arguments", "error: bad arguments for add: unknown argument 'c' (takes: a, b)"),
    (call("add", a="1", b=2), "bad_arguments", "error: bad arguments for add: a must be an integer, got '\"1\"'"),
    (call("add", a=True, b=2), "bad_arguments", "error: bad arguments for add: a must be an integer, got 'true'"),
    (call("add", a=1.5, b=2), "bad_arguments", "error: bad arguments for add: a must be an integer, got '1.5'"),
    (call("boom", text="x"), "error", "error: KeyError: 'x'"),
])
def test_every_bad_call_becomes_an_error_observation_with_its_status(env, action, status, content):
    message, record = _one(env, action)
    assert record["status"] == status
    assert message["role"] == "tool" and message["content"].startswith(content), message["content"]
    assert "\n" not in message["content"]
    if status != "error":
        assert record["seconds"] == 0.0  # it never ran


def test_good_and_bad_calls_of_one_turn_keep_their_order(env):
    state = env.reset({"prompt": "q"})
    result = env.step(state, call("shout", text="a") + call("nope") + call("add", a=1, b=2))
    assert [m["content"] for m in result.observation] == ["A", "error: unknown tool 'nope'; tools: add, shout, boom",
                                                          "3"]
    assert [c["status"] for c in result.info["tool_calls"]] == ["ok", "unknown_tool", "ok"]


def test_calls_over_max_calls_per_turn_are_error_observations_and_the_earlier_ones_still_run():
    with ToolEnv([hang, shout, add], timeout_s=1.0, max_calls_per_turn=2, workers=2) as env:
        state = env.reset({"prompt": "q"})
        # the third call (ok), the fourth (malformed) and the two hanging ones are over the limit: none of them runs
        result = env.step(state, call("shout", text="a") + call("add", a=1, b=2) + call("shout", text="b")
                          + "<tool_call>{bad}</tool_call>" + call("hang", text="x") * 2)
        assert [c["status"] for c in result.info["tool_calls"]] == ["ok", "ok"] + ["over_limit"] * 4
        contents = [m["content"] for m in result.observation]
        assert contents[:2] == ["A", "3"]
        for k, text in enumerate(contents[2:], start=3):
            assert text == f"error: call {k} of 6 is over the limit of 2 tool calls per turn; it was not run"
        assert [c["seconds"] for c in result.info["tool_calls"][2:]] == [0.0] * 4
        assert result.info["tool_calls"][2]["arguments"] == {"text": "b"}  # recorded as parsed
    with ToolEnv([shout], max_calls_per_turn=None, workers=1) as env:  # None: no limit
        result = env.step(env.reset({"prompt": "q"}), call("shout", text="a") * 6)
        assert [c["status"] for c in result.info["tool_calls"]] == ["ok"] * 6
    default = ToolEnv([shout], workers=1)
    assert default.max_calls_per_turn == 4
    assert [c["status"] for c in default.parse(call("shout", text="a") * 5)] == ["ok"] * 4 + ["over_limit"]


def test_a_hanging_tool_is_stopped_by_its_timeout_and_the_pool_keeps_working():
    with ToolEnv([hang, shout], timeout_s=1.0, workers=1) as env:
        message, record = _one(env, call("hang", text="x"))
        assert record["status"] == "timeout" and record["seconds"] == 1.0
        assert message["content"] == "error: hang timed out after 1 s"
        message, record = _one(env, call("shout", text="after"))  # the killed worker was replaced
        assert (record["status"], message["content"]) == ("ok", "AFTER")


def test_close_stops_the_pool_and_a_later_call_starts_a_new_one():
    env = ToolEnv([shout], workers=1)
    assert _one(env, call("shout", text="a"))[0]["content"] == "A"
    env.close()
    env.close()  # idempotent
    assert _one(env, call("shout", text="b"))[0]["content"] == "B"
    env.close()


def test_the_turn_that_reaches_max_turns_ends_the_episode_without_running_its_calls():
    with ToolEnv([boom], max_turns=2, workers=1) as env:
        state = env.reset({"prompt": "q"})
        first = env.step(state, call("boom", text="1"))
        assert not first.done and first.info["tool_calls"][0]["status"] == "error"
        last = env.step(state, call("boom", text="2") + call("nope"))
        assert last.done and last.observation is None and last.info["termination"] == "max_turns"
        # its own status, not "ok" as if it ran (issue 32, item 12); a bad call keeps its own
        assert last.info["tool_calls"] == [{"name": "boom", "arguments": {"text": "2"}, "status": "skipped_last_turn",
                                            "seconds": 0.0},
                                           {"name": "nope", "arguments": {}, "status": "unknown_tool", "seconds": 0.0}]


@pytest.mark.parametrize("episodes", [1, 3])  # one episode: env.step; several: step_batch runs a round's calls
def test_the_calls_of_the_episode_loops_last_turn_are_not_run(episodes):
    # the loop's max_turns, not the environment's: a hanging tool on the last turn used to cost its whole timeout,
    # its result thrown away (issue 32, item 12)
    from episode_fakes import RawRenderer, ScriptedSampler, run_episodes_flat

    from rewardlab.envs import episode_metrics, run_episodes

    scripts = {e: [call("shout", text="a") + "$", call("hang", text="h") + "$"] for e in range(episodes)}
    renderer = RawRenderer()
    with ToolEnv([hang, shout], timeout_s=60.0, workers=1) as env:
        env.stop = ()
        start = time.perf_counter()
        out = run_episodes_flat(ScriptedSampler(scripts, renderer=renderer), env, [{"prompt": "q"}] * episodes, n=1,
                                max_turns=2, max_new_tokens=400, max_episode_tokens=4000, renderer=renderer)
        assert time.perf_counter() - start < 20  # not the hanging call's 60 s
    for r in out:
        assert r.termination == "max_turns"
        assert [[c["status"] for c in turn] for turn in r.tool_calls] == [["ok"], ["skipped_last_turn"]]
        assert r.tool_calls[1][0]["seconds"] == 0.0
    m = episode_metrics([[r] for r in out])
    assert m["tool/calls_mean"] == 2 and m["tool/errors_mean"] == 0 and m["tool/skipped_last_turn_mean"] == 1


def test_the_transcript_holds_the_model_turns_and_the_tool_messages(env):
    state = env.reset({"prompt": "q"})
    env.step(state, call("shout", text="a"))
    env.step(state, "done")
    assert state["messages"] == [{"role": "user", "content": "q"},
                                 {"role": "assistant", "content": call("shout", text="a")},
                                 {"role": "tool", "name": "shout", "content": "A"},
                                 {"role": "assistant", "content": "done"}]
    assert state["turn"] == 2


# ------------------------------------------------------------------------------------------------ compact form
def test_compact_calls_the_single_tool_with_its_argument_read_as_its_type():
    with ToolEnv([square], parser="compact", workers=1) as env:
        state = env.reset({"prompt": "12*12="})
        result = env.step(state, "<c>12</c>")
        assert result.observation == [{"role": "tool", "name": "square", "content": "144"}]
        assert result.info["tool_calls"][0]["arguments"] == {"x": 12}
        assert env.raw_text(result.observation[0]) == "<o>144</o>"
        assert env.raw_text({"role": "user", "content": "hi"}) == "hi"
        bad = env.step(state, "<c>twelve</c>")
        assert bad.info["tool_calls"][0]["status"] == "bad_arguments"
        assert bad.observation[0]["content"] == "error: bad arguments for square: x must be an integer, got 'twelve'"
        assert env.raw_text(bad.observation[0]) == ("<o>error: bad arguments for square: x must be an integer, "
                                                    "got 'twelve'</o>")
        unclosed = env.step(state, "<c>12")
        assert unclosed.info["tool_calls"][0]["status"] == "malformed"
        assert env.parse("<c>1</c><c>2</c>") == [
            {"name": "square", "arguments": {"x": 1}, "status": "ok", "error": ""},
            {"name": "square", "arguments": {"x": 2}, "status": "ok", "error": ""}]
        assert env.step(state, "144").info["termination"] == "stop"


def test_compact_passes_a_string_argument_stripped():
    env = ToolEnv([shout], parser="compact")
    assert env.parse("<c> ab </c>")[0]["arguments"] == {"text": "ab"}


def test_hermes_raw_text_wraps_a_tool_message_in_tool_response(env):
    assert env.raw_text({"role": "tool", "name": "add", "content": "3"}) == "<tool_response>\n3\n</tool_response>\n"


# ------------------------------------------------------------------------------------------------ argument checks
def test_check_arguments_by_hand():
    schema = {"function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "number"}, "flag": {"type": "boolean"}, "mode": {"type": "string", "enum": ["a", "b"]},
        "maybe": {"type": ["integer", "null"]}}, "required": ["n"]}}}
    assert check_arguments(schema, {"n": 1}) is None  # an int is a number
    assert check_arguments(schema, {"n": 1.5, "flag": False, "mode": "b", "maybe": None}) is None
    assert check_arguments(schema, {"n": True}) == "n must be a number, got 'true'"
    assert check_arguments(schema, {"n": 1, "flag": 1}) == "flag must be true or false, got '1'"
    assert check_arguments(schema, {"n": 1, "mode": "c"}) == 'mode must be one of "a", "b", got \'"c"\''
    assert check_arguments(schema, {"n": 1, "maybe": 2.5}) == "maybe must be an integer or null, got '2.5'"
    assert check_arguments(schema, {}) == "missing argument 'n'"


# ------------------------------------------------------------------------------------------------ hostile calls
# Issue 31 item 3: what a model writes is never an exception out of env.step or evaluate_policy (the fuzzing of every
# parser is tests/faults/test_fuzz_tool_parsers.py).
HOSTILE = [
    ("<tool_call>" + "[" * 1000 + "</tool_call>", "nested deeper than 64 levels"),  # was RecursionError
    ('<tool_call>{"name": "calc", "arguments": {"expression": ' + "1" * 4301 + "}}</tool_call>",
     "an integer of 4301 digits (at most 4300)"),  # was ValueError (int max str digits)
    ('<tool_call>{"name": "calc", "arguments": "' + "[" * 1000 + '"}</tool_call>',
     '"arguments" must be a JSON object, got a string that is nested deeper than 64 levels'),
    ('<tool_call>{"name": "calc", "arguments": {"expression": "\\ud800"}}</tool_call>',
     "a string that is not valid Unicode (lone surrogate '\\ud800')"),  # samples.jsonl (UTF-8) could not take it
]


@pytest.mark.parametrize("action,why", HOSTILE, ids=["deep", "4301_digits", "deep_arguments_string", "surrogate"])
def test_hostile_hermes_calls_are_malformed_observations(action, why):
    import json

    from rewardlab.envs import make_env

    with make_env("calculator", parser="hermes", workers=1) as env:
        message, record = _one(env, action)
    assert record["status"] == "malformed"
    assert message["content"].startswith(f"error: malformed tool call: {why}"), message["content"]
    assert "\n" not in message["content"] and len(message["content"]) < 200
    json.dumps(record, ensure_ascii=False).encode("utf-8")  # as samples.jsonl writes it


def test_hostile_hermes_calls_do_not_stop_evaluate_policy():
    from render_helpers import CHATML, char_tokenizer

    from rewardlab.envs import make_env
    from rewardlab.envs.sampling import EpisodeSettings
    from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
    from rewardlab.policy.settings import SamplingSettings
    from rewardlab.rewards import build_reward
    from rewardlab.types import Sampled

    class Chat:  # every episode: one hostile call per turn, then the answer
        prompt_format, context_window = "chat", 100_000

        def __init__(self, turns):
            self.tokenizer = char_tokenizer(CHATML, specials=("<|im_start|>",))
            self.eos_token_id = self.tokenizer.eos_token_id
            self.turns = turns

        def sample_ids(self, prompts, *, streams, stop=None, **_kw):
            out = []
            for stream in streams:
                text = self.turns[stream[4]]
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                ends_in_stop = bool(stop) and any(text.endswith(s) for s in stop)
                ids = ids if ends_in_stop else ids + [self.eos_token_id]
                out.append(Sampled(ids, [0.0] * len(ids), "stop" if ends_in_stop else "eos"))
            return out

    turns = [action for action, _ in HOSTILE if action.isascii()] + ["<answer>7</answer>"]
    with make_env("calculator", parser="hermes", workers=1) as env:
        settings = EpisodeSettings(env, max_turns=len(turns), max_episode_tokens=50_000, max_tool_tokens=64,
                                   name="calculator")
        result = evaluate_policy(Chat(turns), [{"prompt": "q", "answer": "7"}], build_reward("exact_match"),
                                 SamplingSettings(max_new_tokens=10_000), settings=EvalSettings(n=0, ks=()),
                                 episodes=settings)
    calls = result["predictions"][0]["tool_calls"]
    assert [[c["status"] for c in turn] for turn in calls] == [["malformed"]] * (len(turns) - 1) + [[]]


def test_a_parser_that_raises_gives_one_malformed_call_not_an_exception(env, monkeypatch):
    def broken(text, schemas):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(env.parser, "parse", broken)
    message, record = _one(env, "<tool_call>anything</tool_call>")
    assert record["status"] == "malformed"
    assert message["content"] == ("error: malformed tool call: the hermes parser could not read this turn "
                                  "(RecursionError)")


def test_compact_refuses_huge_integers_and_lone_surrogates():
    env = ToolEnv([square], parser="compact")
    (c,) = env.parse("<c>" + "1" * 4301 + "</c>")
    assert c["status"] == "bad_arguments" and c["error"].startswith("bad arguments for square: x must be an integer")
    assert env.parse("<c>" + "1" * 4300 + "</c>")[0]["status"] == "ok"
    (c,) = ToolEnv([shout], parser="compact").parse("<c>a\ud800</c>")
    assert c["status"] == "malformed" and c["arguments"] == "a\\ud800"
    assert c["error"] == "malformed tool call: not valid Unicode (lone surrogate '\\ud800')"
