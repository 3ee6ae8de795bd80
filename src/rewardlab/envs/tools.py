"""Tools: `ToolEnv`, the tool-call parsers (`TOOL_PARSERS`) and how a call is checked and run.

    def calc(expression: str) -> str:
        '''Evaluate an arithmetic expression.

        Args:
            expression: e.g. "12*34"
        '''
        ...

    env = ToolEnv([calc], parser="hermes", timeout_s=5.0)
    env.tools      # [JSON schema of calc] (transformers.utils.get_json_schema), for the chat template
    env.stop       # ("</tool_call>",): a model turn ends where a call closes
    state = env.reset({"prompt": "What is 12*34?"})
    env.step(state, '<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>')
    # StepResult([{"role": "tool", "name": "calc", "content": "408"}], done=False,
    #            info={"tool_calls": [{"name": "calc", "arguments": {...}, "status": "ok", "seconds": 0.001}]})

Call formats (parsers, by name):
    hermes   `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`, as Hermes and Qwen chat templates write
             them; several calls per turn. A tool message is rendered in a raw prompt as
             `<tool_response>\\nCONTENT\\n</tool_response>\\n`.
    compact  `<c>TEXT</c>` calls the environment's single tool with TEXT as its one argument (read as the
             argument's JSON type: "32" is 32 for an integer argument), answered by `<o>RESULT</o>`. For the embedded
             tiny model, whose vocabulary is printable ASCII: `<c>12*34</c><o>408</o>`. Several calls per turn.

Statuses of a call: ok (it ran and returned), malformed (not parseable: bad JSON, no "name", an unclosed tag,
JSON nested deeper than `MAX_JSON_DEPTH`, an integer of more than `MAX_INT_DIGITS` digits, a string that is not valid
Unicode), unknown_tool, bad_arguments (a required argument missing, an unknown one, a value of the wrong JSON type),
error (the tool raised, or its worker process died), timeout (it ran past `timeout_s` and its worker was killed),
over_limit (a call after the turn's first `max_calls_per_turn`; not run), skipped_last_turn (a good call on the
episode's last allowed turn: not run, since the episode ends there and nobody would read its result; not an error).
Every call that is not ok becomes a tool message whose content says what was wrong, in one short line starting with
"error:"; a bad call never raises, whatever the model wrote (`ToolEnv.parse` also turns a parser's own exception into
one malformed call), and every call's record is plain JSON that UTF-8 can encode (what samples.jsonl writes).
"""

from __future__ import annotations

import inspect
import json
import math
import pickle
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from rewardlab.envs.base import State, StepResult, stop_strings
from rewardlab.envs.multiturn import MultiTurnEnv
from rewardlab.registry import Registry

__all__ = ["CALL_STATUSES", "CompactParser", "HermesParser", "MAX_INT_DIGITS", "MAX_JSON_DEPTH", "NOT_ERRORS",
           "TOOL_PARSERS", "ToolEnv", "check_arguments", "tool_schema"]

#: The status of a parsed call, as `info["tool_calls"][i]["status"]` and `Rollout.tool_calls` record it.
CALL_STATUSES = ("ok", "malformed", "unknown_tool", "bad_arguments", "error", "timeout", "over_limit",
                 "skipped_last_turn")
#: The statuses of calls that did not fail: the episode metrics count every other status as a tool error.
NOT_ERRORS = ("ok", "skipped_last_turn")

#: name -> tool-call parser class (no options). A parser has `stop` (the strings that close a call), `check(schemas)`
#: (raises ValueError when it cannot serve these tools), `parse(text, schemas) -> list[dict]` and `raw_text(message)`.
TOOL_PARSERS: Registry[Callable[[], Any]] = Registry("tool-call parser")

#: Longest text of a bad call quoted back in its error observation (characters).
_QUOTE = 40


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= _QUOTE else text[:_QUOTE] + "...")


def _call(name: Any, arguments: Any, status: str = "ok", error: str = "") -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "status": status, "error": error}


#: Deepest nesting of arrays and objects in a tool call's JSON (the call object itself is level 1); a deeper call is
#: malformed. Decoding, checking, pickling and logging a value each recurse once per level, so an unbounded depth is
#: a RecursionError waiting for the first of them.
MAX_JSON_DEPTH = 64
#: Most digits of an integer in a tool call; a longer one is malformed (hermes) or bad_arguments (compact). It is
#: Python's default `sys.get_int_max_str_digits()`, fixed here whatever the process sets: reading and writing a
#: longer integer is a ValueError under the default and superlinear time without it.
MAX_INT_DIGITS = 4300


class _Unreadable(ValueError):
    """Why a call's text is not accepted, one line (raised inside `_read_json`, never out of a parser)."""


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of `text` as repr text (JSON's "\\ud800" escape makes one; UTF-8 cannot encode it,
    so neither a tokenizer nor samples.jsonl could take it), or None when `text` is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return repr(text[exc.start])
    return None


def _encodable(text: str) -> str:
    """`text` with any lone surrogate written as its backslash escape, so that a record quoting it stays UTF-8."""
    return text if _lone_surrogate(text) is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _read_int(text: str) -> int:
    """int(text) for an integer of at most MAX_INT_DIGITS digits; raises _Unreadable for a longer one."""
    digits = len(text) - (text[:1] in "+-")
    if digits > MAX_INT_DIGITS:
        raise _Unreadable(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _json_problem(value: Any) -> str | None:
    """Why a decoded JSON value is refused (nested deeper than MAX_JSON_DEPTH, a string or key that is not valid
    Unicode), or None. Walks the value with an explicit stack: no recursion however deep it is."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            bad = _lone_surrogate(item)
            if bad is not None:
                return f"a string that is not valid Unicode (lone surrogate {bad})"
        elif isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return None


def _read_json(text: str) -> Any:
    """json.loads(text, strict=False) (a raw newline inside a string, as in code, is fine), bounded: nesting at most
    MAX_JSON_DEPTH levels, integers of at most MAX_INT_DIGITS digits, every string valid Unicode.

    Raises:
        _Unreadable: one line, e.g. "not JSON (Expecting value at char 0)", "nested deeper than 64 levels".
    """
    try:
        value = json.loads(text, strict=False, parse_int=_read_int)
    except _Unreadable:
        raise
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"not JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:  # json's decoder recurses per level and stops at the interpreter's recursion limit
        raise _Unreadable(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    why = _json_problem(value)
    if why is not None:
        raise _Unreadable(why)
    return value


@TOOL_PARSERS.register("hermes")
class HermesParser:
    """Hermes/Qwen tool calls: `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`, any number per turn.

    "arguments" may be missing (no arguments) or a JSON string that holds an object (OpenAI style). A call whose
    body is not JSON, is not an object, has no str "name" or non-object "arguments" is `malformed`, and so is a
    `<tool_call>` that never closes, and one whose JSON is nested deeper than MAX_JSON_DEPTH levels, holds an
    integer of more than MAX_INT_DIGITS digits or a string that is not valid Unicode (a lone surrogate escape such
    as "\\ud800"). A malformed call's "arguments" is its body text (lone surrogates backslash-escaped).
    """

    name = "hermes"
    stop = ("</tool_call>",)
    _CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def check(self, schemas: Sequence[dict[str, Any]]) -> None:
        """Any set of tools works."""

    def parse(self, text: str, schemas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The calls in one model turn, in order: {"name", "arguments", "status" ("ok" or "malformed"), "error"}."""
        calls = []
        for match in self._CALL.finditer(text):
            body, closed = match.group(1).strip(), bool(match.group(2))
            if not closed:
                calls.append(_call(None, _encodable(body), "malformed", "<tool_call> is never closed by </tool_call>"))
                continue
            try:
                obj = _read_json(body)
            except _Unreadable as exc:
                calls.append(_call(None, _encodable(body), "malformed", f"{exc}: {_quote(body)}"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                calls.append(_call(None, _encodable(body), "malformed", 'expected {"name": ..., "arguments": {...}}'))
                continue
            arguments = obj.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = _read_json(arguments) if arguments.strip() else {}
                except _Unreadable as exc:
                    calls.append(_call(obj["name"], arguments, "malformed",
                                       f'"arguments" must be a JSON object, got a string that is {exc}'))
                    continue
            if not isinstance(arguments, dict):
                calls.append(_call(obj["name"], arguments, "malformed", '"arguments" must be a JSON object'))
                continue
            calls.append(_call(obj["name"], arguments))
        return calls

    def raw_text(self, message: dict[str, Any]) -> str:
        """A tool message as Hermes templates write it: `<tool_response>\\nCONTENT\\n</tool_response>\\n`."""
        if message.get("role") == "tool":
            return f"<tool_response>\n{message.get('content', '')}\n</tool_response>\n"
        return str(message.get("content", ""))


#: JSON types `compact` can read its argument text as, and how.
_FROM_TEXT: dict[str, Callable[[str], Any]] = {
    "string": str,
    "integer": _read_int,
    "number": float,
    "boolean": lambda s: {"true": True, "false": False}[s.lower()],
}


@TOOL_PARSERS.register("compact")
class CompactParser:
    """The compact raw form: `<c>TEXT</c>` calls the environment's single tool with TEXT (stripped) as its one
    argument, read as the argument's JSON type (string as is; integer, number, boolean parsed: "32" -> 32);
    answered by `<o>RESULT</o>`. Any number of calls per turn. An unclosed `<c>` is `malformed`, and so is TEXT
    that is not valid Unicode (a lone surrogate); TEXT that does not read as the argument's type (an integer of more
    than MAX_INT_DIGITS digits included) is `bad_arguments`.
    """

    name = "compact"
    stop = ("</c>",)
    _CALL = re.compile(r"<c>(.*?)(</c>|$)", re.DOTALL)

    def check(self, schemas: Sequence[dict[str, Any]]) -> None:
        """Raises ValueError unless there is exactly one tool and it has exactly one parameter of type string,
        integer, number or boolean."""
        names = [s["function"]["name"] for s in schemas]
        if len(schemas) != 1:
            raise ValueError(f"ToolEnv: parser 'compact' calls the environment's single tool; got {len(schemas)} "
                             f"tools ({', '.join(names)}): use parser 'hermes'")
        params = schemas[0]["function"].get("parameters", {}).get("properties", {})
        if len(params) != 1:
            raise ValueError(f"ToolEnv: parser 'compact' passes one argument; tool {names[0]!r} has "
                             f"{len(params)} ({', '.join(params) or 'none'})")
        (spec,) = params.values()
        if spec.get("type") not in _FROM_TEXT:
            raise ValueError(f"ToolEnv: parser 'compact' reads its argument as one of {', '.join(_FROM_TEXT)}; "
                             f"tool {names[0]!r} takes {spec.get('type', 'an untyped value')}")

    def parse(self, text: str, schemas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The calls in one model turn: {"name", "arguments", "status" (ok / malformed / bad_arguments), "error"}."""
        function = schemas[0]["function"]
        (param, spec), = function["parameters"]["properties"].items()
        calls = []
        for match in self._CALL.finditer(text):
            body, closed = match.group(1).strip(), bool(match.group(2))
            if not closed:
                calls.append(_call(None, _encodable(body), "malformed", "<c> is never closed by </c>"))
                continue
            bad = _lone_surrogate(body)
            if bad is not None:
                calls.append(_call(None, _encodable(body), "malformed", f"not valid Unicode (lone surrogate {bad})"))
                continue
            try:
                value = _FROM_TEXT[spec["type"]](body)
            except (ValueError, KeyError):
                calls.append(_call(function["name"], {param: body}, "bad_arguments",
                                   f"{param} must be {_TYPE_WORDS[spec['type']]}, got {_quote(body)}"))
                continue
            calls.append(_call(function["name"], {param: value}))
        return calls

    def raw_text(self, message: dict[str, Any]) -> str:
        """A tool message as `<o>CONTENT</o>`; any other message as its content."""
        if message.get("role") == "tool":
            return f"<o>{message.get('content', '')}</o>"
        return str(message.get("content", ""))


_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
               "array": "a list", "object": "an object", "null": "null"}


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "null":
        return value is None
    return True  # a type this check does not know: not checked


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not fit the tool `schema` (a `tool_schema`), or None when they do.

    Checked: every required parameter present, no parameter the tool does not declare, each value of its declared
    JSON type (integer, number, string, boolean, array, object, null; a list of types means any of them; an int is a
    number, a bool is neither), and in its `enum` when there is one. Nested structure is not checked.

    Returns:
        None, or one short line, e.g. "missing argument 'expression'", "unknown argument 'x' (takes: expression)",
        "expression must be a string, got 12".
    """
    parameters = schema["function"].get("parameters", {})
    properties = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument{'s' if len(missing) > 1 else ''} {', '.join(repr(k) for k in missing)}"
    unknown = [k for k in arguments if k not in properties]
    if unknown:
        return (f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(repr(k) for k in unknown)} "
                f"(takes: {', '.join(properties) or 'none'})")
    for key, value in arguments.items():
        spec = properties[key]
        kinds = spec.get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        if kinds and not any(_is_type(value, k) for k in kinds):
            want = " or ".join(_TYPE_WORDS.get(k, k) for k in kinds)
            return f"{key} must be {want}, got {_quote(json.dumps(value))}"
        if "enum" in spec and value not in spec["enum"]:
            allowed = ", ".join(json.dumps(v) for v in spec["enum"])
            return f"{key} must be one of {allowed}, got {_quote(json.dumps(value))}"
    return None


def _tool_name(tool: Any) -> str:
    return getattr(tool, "__name__", None) or type(tool).__name__


#: Parameter kinds a call by keyword (`tool(**arguments)`) cannot fill, as a tool's error names them.
_NOT_BY_KEYWORD = {inspect.Parameter.VAR_POSITIONAL: "*{} (*args)", inspect.Parameter.VAR_KEYWORD: "**{} (**kwargs)",
                   inspect.Parameter.POSITIONAL_ONLY: "{} (positional-only)"}


def _check_keyword_parameters(tool: Callable[..., Any], name: str) -> None:
    """Raise ValueError naming the tool and its first parameter that a call by keyword cannot fill."""
    try:
        parameters = inspect.signature(tool).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): get_json_schema says what is wrong
        return
    for p in parameters:
        if p.kind in _NOT_BY_KEYWORD:
            raise ValueError(f"tool {name!r}: parameter {_NOT_BY_KEYWORD[p.kind].format(p.name)} cannot be given by "
                             "name, and a tool call passes its arguments by name (tool(**arguments)); give the tool "
                             "named parameters")


def tool_schema(tool: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a tool, by `transformers.utils.get_json_schema` (from its type hints and its Google-style
    docstring, whose Args section describes every parameter).

    Raises:
        ValueError: one line naming the tool when it is not callable, has a parameter a call by keyword cannot fill
            (`*args`, `**kwargs` or positional-only: a call passes its JSON arguments by name, `tool(**arguments)`,
            so each would fail with TypeError), or its hints or docstring do not give a schema, e.g. "tool 'calc':
            Cannot generate JSON schema for calc because it has no docstring!".
    """
    from transformers.utils import get_json_schema

    name = _tool_name(tool)
    if not callable(tool):
        raise ValueError(f"tool {name!r}: expected a callable, got {type(tool).__name__}")
    _check_keyword_parameters(tool, name)
    try:
        return get_json_schema(tool)
    except Exception as exc:  # noqa: BLE001 - transformers' TypeHintParsingException / DocstringParsingException
        text = f"{exc}".splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"tool {name!r}: {text} (a tool needs type hints and a docstring with an Args section)"
                         ) from None


def _run_tool(item: tuple[Callable[..., Any], dict[str, Any]]) -> tuple[bool, str, float]:
    """Worker side of one call: (True, str(result), seconds) or (False, "ExceptionType: message", seconds)."""
    fn, arguments = item
    start = time.perf_counter()
    try:
        result = fn(**arguments)
        return True, str(result), time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - reported to the model as an error observation
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return False, text.splitlines()[0] if text.strip() else type(exc).__name__, time.perf_counter() - start


class ToolEnv(MultiTurnEnv):
    """An environment whose model calls Python tools until it answers without a call.

    Each model turn is parsed with the parser; a turn without a call ends the episode (info["termination"] =
    "stop": the model answered). Otherwise each call is checked (known tool, arguments fitting its schema) and the
    good ones run at once in a process pool, each under `timeout_s` (`step_batch` runs the calls of several
    episodes' turns at once, with the results of serial steps); the observation is one role "tool" message per
    call, in call order, {"role": "tool", "name": NAME, "content": str(result)} or, for a bad call, content
    "error: <what was wrong>". info["tool_calls"] lists the calls, each {"name", "arguments", "status", "seconds"}
    (status one of CALL_STATUSES; seconds the tool's own run time, `timeout_s` for a timeout, 0.0 for a call that
    did not run). On the episode's last allowed turn - the turn that reaches this environment's `max_turns` or the
    episode loop's (`state["max_turns"]`, which `rewardlab.envs.Episode` sets) - the calls are parsed and recorded
    but not run (the episode ends there, so nobody would read their results, and a hanging tool would cost its
    whole timeout): a call that parsed ok gets status "skipped_last_turn", a bad one keeps its status, seconds 0.0;
    on this environment's own limit the episode ends with termination "max_turns". A turn's
    calls after its first `max_calls_per_turn` are not run: each is status "over_limit", its content an error line
    (the calls before it run as usual).

    Tools must be picklable top-level callables (functions defined at a module's top level, not lambdas or nested
    functions): they run in worker processes (pebble, via `rewardlab.rewards.executor.Executor`), so a call that
    hangs is really stopped - its worker is killed and replaced. Each needs type hints and a docstring with an Args
    section (its JSON schema comes from `transformers.utils.get_json_schema`). A tool's result is sent back as
    `str(result)`; an exception it raises becomes status "error" with "ExceptionType: message".

    The pool starts on the first call, is reused across calls and episodes, and is stopped by `close()`, by leaving
    a `with` block, or at interpreter exit.

    Args:
        tools: the callables (at least one; names unique).
        max_turns: end the episode after this many model turns, or None (the episode loop's limit only).
        parser: a name in TOOL_PARSERS: "hermes" (default) or "compact" (one one-argument tool).
        timeout_s: wall seconds one call may run (> 0).
        max_calls_per_turn: calls of one model turn that are run (>= 1; later ones are "over_limit"), or None for
            no limit. It bounds a turn's tool time to about ceil(max_calls_per_turn / workers) * timeout_s.
        workers: worker processes of the pool (default: min(4, the run's thread budget)).
    Attributes:
        tools: [K] JSON schemas (for `apply_chat_template(..., tools=...)`); stop: the parser's closing strings;
        parser_name: the parser's name.
    Raises:
        ValueError: one line: no tools, a tool that is not callable, has no schema (missing hints or docstring), has
            a `*args`, `**kwargs` or positional-only parameter (a call passes its arguments by name), is not
            picklable, or shares a name; an unknown parser; a parser that cannot serve the tools ("compact" with
            several tools); timeout_s, max_calls_per_turn or workers out of range.
    """

    def __init__(self, tools: Sequence[Callable[..., Any]], *, max_turns: int | None = None, parser: str = "hermes",
                 timeout_s: float = 10.0, max_calls_per_turn: int | None = 4, workers: int | None = None) -> None:
        super().__init__(max_turns=max_turns)
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence) or not tools:
            raise ValueError(f"ToolEnv.tools: expected a non-empty list of callables, got {tools!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"ToolEnv.timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"ToolEnv.workers: expected an integer >= 1 or None, got {workers!r}")
        if max_calls_per_turn is not None and (isinstance(max_calls_per_turn, bool)
                                               or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1):
            raise ValueError(f"ToolEnv.max_calls_per_turn: expected an integer >= 1 or None, got "
                             f"{max_calls_per_turn!r}")
        try:
            self.parser = TOOL_PARSERS.get(parser)()
        except ValueError as exc:
            raise ValueError(f"ToolEnv.parser: {exc}") from None
        schemas, functions = [], {}
        for tool in tools:
            schema = tool_schema(tool)
            name = schema["function"]["name"]
            if name in functions:
                raise ValueError(f"ToolEnv.tools: two tools are named {name!r}")
            try:
                pickle.dumps(tool)
            except Exception as exc:  # noqa: BLE001 - PicklingError, AttributeError, TypeError
                raise ValueError(f"tool {name!r} cannot be pickled ({type(exc).__name__}); tools run in worker "
                                 "processes: define it at module top level") from None
            schemas.append(schema)
            functions[name] = tool
        self.parser.check(schemas)
        self.parser_name = parser
        self.tools = schemas
        self.stop = stop_strings(self.parser.stop, f"ToolEnv.parser: parser {parser!r}'s stop")
        self.timeout_s = float(timeout_s)
        self.max_calls_per_turn = max_calls_per_turn
        self._functions = functions
        self._schemas = {s["function"]["name"]: s for s in schemas}
        self._workers = workers
        self._executor = None
        #: id(state) -> (action, its parsed calls, their contents): what `step_batch` ran, read by env_response.
        self._prepared: dict[int, tuple[str, list[dict[str, Any]], list[str]]] = {}

    # ---------------------------------------------------------------------------------------- lifecycle
    def _get_executor(self):
        if self._executor is None:
            from rewardlab.rewards.executor import Executor
            from rewardlab.sandbox import default_workers

            self._executor = Executor(self._workers or min(4, default_workers()))
        return self._executor

    def close(self) -> None:
        """Stop the tool workers (idempotent; a later call starts a new pool)."""
        if self._executor is not None:
            self._executor.close()

    def __enter__(self) -> ToolEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def raw_text(self, message: dict[str, Any]) -> str:
        """How an observation message is appended to a raw prompt: the parser's form (`<o>...</o>` for compact)."""
        return self.parser.raw_text(message)

    # ---------------------------------------------------------------------------------------- calls
    def parse(self, text: str) -> list[dict[str, Any]]:
        """The calls in a model turn, checked but not run: each {"name", "arguments", "status", "error"} with
        status ok, malformed, unknown_tool, bad_arguments or over_limit (every call after the first
        `max_calls_per_turn`, whatever it parsed as), and a one-line `error` for a bad one. Never raises on the
        model's text: should the parser itself raise (a bug, or a registered parser less careful than the built-in
        ones), the turn is one malformed call naming the parser and the exception type."""
        try:
            calls = self.parser.parse(text, self.tools)
        except Exception as exc:  # noqa: BLE001 - a model's text must never stop an episode, a run or an evaluation
            calls = [_call(None, _encodable(text), "malformed",
                           f"the {self.parser_name} parser could not read this turn ({type(exc).__name__})")]
        limit = self.max_calls_per_turn
        for k, call in enumerate(calls):
            if limit is not None and k >= limit:
                call["status"] = "over_limit"
                call["error"] = (f"call {k + 1} of {len(calls)} is over the limit of {limit} tool call"
                                 f"{'s' if limit > 1 else ''} per turn; it was not run")
                continue
            if call["status"] == "ok":
                if call["name"] not in self._schemas:
                    call["status"] = "unknown_tool"
                    call["error"] = f"unknown tool {_quote(call['name'])}; tools: {', '.join(self._schemas)}"
                    continue
                why = check_arguments(self._schemas[call["name"]], call["arguments"])
                if why is None:
                    continue
                call["status"], call["error"] = "bad_arguments", why
            if call["status"] == "malformed":
                call["error"] = f"malformed tool call: {call['error']}"
            elif call["status"] == "bad_arguments":
                call["error"] = f"bad arguments for {call['name']}: {call['error']}"
        return calls

    def run_calls(self, calls: list[dict[str, Any]]) -> list[str]:
        """Run the ok calls of `calls` (from `parse`) in the pool, at once; set each call's status and `seconds`
        in place. Returns the content of each call's tool message, in order (a bad call's is "error: ...")."""
        return self._run_turns([calls])[0]

    def _run_turns(self, turns: list[list[dict[str, Any]]]) -> list[list[str]]:
        """`run_calls` of several turns (of different episodes) with one pool `map` over all their ok calls, so that
        they run concurrently up to the pool's workers; per turn, the contents `run_calls` would return."""
        contents = [["" for _ in calls] for calls in turns]
        jobs = []
        for t, calls in enumerate(turns):
            for i, call in enumerate(calls):
                call.setdefault("seconds", 0.0)
                if call["status"] == "ok":
                    jobs.append((t, i))
                else:
                    contents[t][i] = f"error: {call['error']}"
        if not jobs:
            return contents
        from rewardlab.rewards.executor import TaskError

        results = self._get_executor().map(
            _run_tool, [(self._functions[turns[t][i]["name"]], turns[t][i]["arguments"]) for t, i in jobs],
            timeout=self.timeout_s)
        for (t, i), result in zip(jobs, results):
            call = turns[t][i]
            if isinstance(result, TaskError):
                if result.kind == "timeout":
                    call["status"], call["seconds"] = "timeout", self.timeout_s
                    contents[t][i] = f"error: {call['name']} timed out after {self.timeout_s:g} s"
                else:
                    call["status"] = "error"
                    contents[t][i] = f"error: {call['name']} failed: {result.message}"
                continue
            ok, text, seconds = result
            call["seconds"] = seconds
            if ok:
                contents[t][i] = text
            else:
                call["status"] = "error"
                contents[t][i] = f"error: {text}"
        return contents

    def _runs_calls(self, state: State, turn: int) -> bool:
        """Whether the calls of model turn `turn` (1-based) of the episode `state` run: not on the turn that reaches
        this environment's `max_turns` or the episode loop's limit (`state["max_turns"]`, when the loop set it)."""
        limits = [m for m in (self.max_turns, state.get("max_turns") if isinstance(state, dict) else None)
                  if m is not None]
        return not limits or turn < min(limits)

    def step_batch(self, states: Sequence[State], actions: Sequence[str]) -> list[StepResult]:
        """`[self.step(state, action) for ...]` for the turns of several episodes, with the tool calls of all of
        them run at once in the pool (up to its workers at a time) instead of one episode after another. The
        results, the states and the calls' records are those of the serial steps, in order (a call's `seconds` is
        its own run time, as measured in its worker).

        A subclass that overrides `step`, `env_response` or `run_calls` is stepped one episode after another, so
        its own code sees each turn as `step` would give it.

        Raises:
            ValueError: states and actions of different lengths; what `step` raises.
        """
        states, actions = list(states), list(actions)
        if len(states) != len(actions):
            raise ValueError(f"{type(self).__name__}.step_batch: {len(states)} states and {len(actions)} actions")
        cls = type(self)
        if (cls.step is not MultiTurnEnv.step or cls.env_response is not ToolEnv.env_response
                or cls.run_calls is not ToolEnv.run_calls or len({id(s) for s in states}) != len(states)):
            return [self.step(state, action) for state, action in zip(states, actions)]
        turns = [self.parse(action) for action in actions]
        contents = self._run_turns([calls if self._runs_calls(state, state["turn"] + 1) else []
                                    for state, calls in zip(states, turns)])
        try:
            for state, action, calls, text in zip(states, actions, turns, contents):
                self._prepared[id(state)] = (action, calls, text)
            return [self.step(state, action) for state, action in zip(states, actions)]
        finally:
            self._prepared.clear()

    def env_response(self, messages: list[dict[str, Any]], state: State) -> StepResult:
        """Parse the model's latest turn and run its calls (see the class docstring); under `step_batch`, take the
        calls it already parsed and ran."""
        action = messages[-1]["content"]
        prepared = self._prepared.pop(id(state), None)
        if prepared is not None and prepared[0] == action:
            _, calls, contents = prepared
        else:
            calls, contents = self.parse(action), None
        state["calls"] = calls
        if not calls:
            return StepResult(None, True, None, {"termination": "stop", "tool_calls": []})
        if not self._runs_calls(state, state["turn"]):
            for call in calls:
                call["seconds"] = 0.0
                if call["status"] == "ok":
                    call["status"] = "skipped_last_turn"
                    call["error"] = "not run: the episode's last turn (its result would not be read)"
            contents = [f"error: {c['error']}" for c in calls]
        elif contents is None:
            contents = self.run_calls(calls)
        observation = [{"role": "tool", "name": c["name"] if isinstance(c["name"], str) else "", "content": text}
                       for c, text in zip(calls, contents)]
        record = [{"name": c["name"], "arguments": c["arguments"], "status": c["status"], "seconds": c["seconds"]}
                  for c in calls]
        return StepResult(observation, False, None, {"tool_calls": record})

    def is_done(self, messages: list[dict[str, Any]], state: State) -> bool:
        """True when the model's latest turn had no tool call (it answered)."""
        return not state.get("calls")
