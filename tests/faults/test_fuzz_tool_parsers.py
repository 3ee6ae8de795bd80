"""Property-based fuzzing of every registered tool-call parser (`rewardlab.envs.TOOL_PARSERS`: hermes, compact and
any parser registered later), on its own and through `ToolEnv.parse` and `ToolEnv.step`.

Model turns are built from pieces that broke parsers before or might: any text (lone surrogates included), calls in
every parser's tags, JSON calls of the environment's tools with arbitrary arguments, nesting thousands of levels deep
(arrays, objects, inside the "arguments" string), integers of thousands of digits and huge exponents, lone surrogates
raw and as JSON escapes, and strings of 100k characters. Property: parsing never raises; each call has a status of
`CALL_STATUSES`, a bad one a non-empty one-line error; each call's record is plain JSON that UTF-8 encodes (what
samples.jsonl writes) and pickles (what a tool worker receives); `ToolEnv.step` turns the turn into one observation
per call, each content one line.
"""

from __future__ import annotations

import json
import os
import pickle

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rewardlab.envs import CALL_STATUSES, TOOL_PARSERS, ToolEnv
from tool_fakes import add, shout

# FUZZ_EXAMPLES=5000 for a longer hunt; the suite's budget is 200.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])






def half(x: float) -> float:
    """Halve a number.

    Args:
        x: the number
    """
    return x / 2


def negate(flag: bool) -> bool:
    """Negate a flag.

    Args:
        flag: the flag
    """
    return not flag


def _envs(max_turns: int | None) -> list[ToolEnv]:
    """One environment per (registered parser, tool set it can serve), in a fixed order. With max_turns=1, `step`
    parses and records the calls without running them; no call here ever runs, so no worker pool starts."""
    envs = []
    for name in sorted(TOOL_PARSERS):
        for tools in ([add, shout, half, negate], [add], [shout], [half], [negate]):
            try:
                envs.append(ToolEnv(tools, parser=name, max_turns=max_turns, workers=1))
            except ValueError:  # this parser cannot serve these tools (compact: one one-argument tool)
                continue
    return envs


ENVS = _envs(max_turns=1)
ROOMY = _envs(max_turns=None)  # the same environments with turns left
TOOL_NAMES = ["add", "shout", "half", "negate", "nope", ""]
TAGS = [("<tool_call>", "</tool_call>"), ("<c>", "</c>"), ("<o>", "</o>"), ("<tool_response>", "</tool_response>")]

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # lone surrogates included
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "text", "x", "flag", "z"])
                                                                | any_text, inner, max_size=3),
    max_leaves=8)
depth = st.integers(1, 3000)
deep = st.one_of(
    depth.map(lambda d: "[" * d + "]" * d),
    depth.map(lambda d: "[" * d),
    depth.map(lambda d: '{"a": ' * d + "1" + "}" * d),
    depth.map(lambda d: json.dumps(json.dumps("[" * d + "]" * d))[1:-1]),  # deep JSON inside a JSON string
)
huge_number = st.one_of(
    st.integers(4290, 6000).map(lambda n: "1" * n),
    st.integers(4290, 6000).map(lambda n: "-" + "9" * n),
    st.integers(4290, 6000).map(lambda n: "1" * n + ".5"),
    st.sampled_from(["1e999999999", "-1e400", "1e-99999", "0" * 5000 + "1", "NaN", "Infinity", "-Infinity"]),
)
surrogate = st.one_of(
    st.sampled_from(['"\\ud800"', '"\\udfff"', '"a\\ud83d"', '"\\ude00b"', '"\\ud83d\\ude00"']),
    st.integers(0xD800, 0xDFFF).map(lambda c: '"' + chr(c) + '"'),
)
huge_string = st.integers(10_000, 100_000).map(lambda n: json.dumps("x" * n))
argument = st.one_of(json_value.map(lambda v: json.dumps(v, ensure_ascii=False)), deep, huge_number, surrogate,
                     huge_string)


@st.composite
def json_call(draw) -> str:
    """A hermes-shaped call body: {"name": ..., "arguments": {KEY: VALUE, ...}} with VALUE any of the pieces, the
    arguments sometimes given as a JSON string (OpenAI style) or not as an object at all."""
    name = json.dumps(draw(st.sampled_from(TOOL_NAMES) | any_text), ensure_ascii=False)
    keys = draw(st.lists(st.sampled_from(["a", "b", "text", "x", "flag", "zz"]), max_size=3, unique=True))
    arguments = "{" + ", ".join(f'"{k}": {draw(argument)}' for k in keys) + "}"
    form = draw(st.sampled_from(["object", "string", "raw"]))
    if form == "string":
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif form == "raw":
        arguments = draw(argument)
    return '{"name": ' + name + ', "arguments": ' + arguments + "}"


body = st.one_of(any_text, json_call(), argument, deep, huge_number, huge_string)


@st.composite
def model_turn(draw) -> str:
    """A model turn: a few pieces, each free text or a body in one of the parsers' tags (sometimes left open)."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            parts.append(draw(any_text))
            continue
        opening, closing = draw(st.sampled_from(TAGS))
        parts.append(opening + draw(body) + (closing if draw(st.integers(0, 4)) else ""))
    return "".join(parts)


def _one_line(text: str) -> None:
    assert isinstance(text, str) and text.strip() and "\n" not in text and "\r" not in text, repr(text[:200])


def _writable(record) -> None:
    """What samples.jsonl does with a call record (runs.RunDir._append), and what a tool worker receives."""
    json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")
    pickle.dumps(record)


def _check_calls(calls, statuses=CALL_STATUSES) -> None:
    assert isinstance(calls, list)
    for call in calls:
        assert {"name", "arguments", "status", "error"} <= set(call)
        assert call["status"] in statuses, call["status"]
        if call["status"] != "ok":
            _one_line(call["error"])
        _writable({k: call[k] for k in ("name", "arguments", "status")})


def test_every_registered_parser_is_fuzzed():
    assert {env.parser_name for env in ENVS} == set(TOOL_PARSERS)


@FUZZ
@given(text=model_turn())
@example(text="<tool_call>" + "[" * 1000 + "</tool_call>")  # RecursionError out of env.step before (issue 31)
@example(text='<tool_call>{"name": "add", "arguments": {"a": ' + "1" * 4301 + ', "b": 1}}</tool_call>')  # ValueError
@example(text='<tool_call>{"name": "add", "arguments": "' + "[" * 1000 + '"}</tool_call>')
@example(text='<tool_call>{"name": "shout", "arguments": {"text": "\\ud800"}}</tool_call>')
@example(text="<c>" + "1" * 5000 + "</c>")
@example(text="<c>\ud800</c>")
def test_parsers_never_raise_and_every_call_has_a_status(text):
    for env in ENVS:
        _check_calls(env.parser.parse(text, env.tools), ("ok", "malformed", "bad_arguments"))
        _check_calls(env.parse(text), ("ok", "malformed", "unknown_tool", "bad_arguments"))


@FUZZ
@given(text=model_turn())
@example(text="<tool_call>" + "[" * 1000 + "</tool_call>")
@example(text='<tool_call>{"name": "shout", "arguments": {"text": ' + "7" * 4301 + "}}</tool_call>")
def test_step_turns_any_turn_into_observations(text):
    for env in ENVS:
        result = env.step(env.reset({"prompt": "q"}), text)
        records = result.info["tool_calls"]
        for record in records:
            assert record["status"] in CALL_STATUSES
            _writable(record)
        if records:  # the turn reached max_turns: the calls are recorded, not run
            assert result.done and result.info["termination"] == "max_turns"
        else:
            assert result.done and result.info["termination"] == "stop"


@FUZZ
@given(text=model_turn())
def test_step_observations_are_one_line_errors_for_bad_calls(text):
    """With turns left, a turn whose calls are all bad (none runs, no pool starts) becomes one tool message per
    call, each "error: ..." on one line."""
    for env in ROOMY:
        calls = env.parse(text)
        if not calls or any(c["status"] == "ok" for c in calls):
            continue
        result = env.step(env.reset({"prompt": "q"}), text)
        assert not result.done and len(result.observation) == len(calls)
        assert env._executor is None  # nothing ran
        for message in result.observation:
            assert message["role"] == "tool" and message["content"].startswith("error: ")
            _one_line(message["content"])
            message["content"].encode("utf-8")
