"""Strict mode of the `code` reward: the tests run in a process the program under test cannot reach.

The sandboxed program is the tests' side (tests_side.py, the trusted harness). It starts the candidate's side
(candidate_side.py) as a fresh interpreter that loads the program and answers requests; arguments and results cross
between the two as plain values (codec.py), rebuilt on the tests' side as fresh built-in objects. See
docs/sandbox.md ("Strict mode") for what this decides and what it does not.

`strict_harness(data)` returns the sandbox program; `trusted_source(prompt, entry)` the part of a task's prompt that
runs on the tests' side.
"""

from __future__ import annotations

import ast
import marshal
from functools import cache, lru_cache
from pathlib import Path

_HERE = Path(__file__).parent


@cache
def _text(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


@cache
def _marshalled(*names: str) -> bytes:
    """The files' code, compiled once per process and marshalled (for an interpreter of this version only)."""
    return marshal.dumps(compile("\n".join(_text(n) for n in names), "<rewardlab strict harness>", "exec"))


def candidate_runner(marshalled: bool = True) -> bytes:
    """The candidate's side (codec.py then candidate_side.py) as the tests' side sends it to the fresh interpreter:
    b"m" + marshalled code when `marshalled` (the sandbox runs this interpreter), else b"s" + source text."""
    if marshalled:
        return b"m" + _marshalled("codec.py", "candidate_side.py")
    return b"s" + (_text("codec.py") + "\n" + _text("candidate_side.py")).encode("utf-8")


def strict_harness(data: dict, marshalled: bool = True) -> str:
    """The sandbox program of one completion under strict mode.

    `data` holds: program (the program under test, source), trusted (task code run on the tests' side, see
    trusted_source), prelude (test setup source), tests ([(index, is_test, source)]), entry (the function under
    test's name or None), key (hex; authenticates result lines), timeout (seconds per test and for loading the
    program). Returns Python source: the `_RL = {...}` literal (data plus the candidate's runner), then the tests'
    side (codec.py and tests_side.py) - as marshalled code when `marshalled` (the sandbox's interpreter is this one:
    compiling the two sides' 25 KB of code for each completion cost about 13 ms of its 54), else as source text.
    """
    payload = {**data, "runner": candidate_runner(marshalled)}
    if marshalled:
        code = _marshalled("codec.py", "tests_side.py")
        return f"_RL = {payload!r}\nimport marshal\nexec(marshal.loads({code!r}))\n"
    return f"_RL = {payload!r}\n{_text('codec.py')}\n{_text('tests_side.py')}"


def _is_stub(node: ast.stmt) -> bool:
    """A function whose body is only a docstring, `pass` or `...`: what the completion is to write."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
               for s in node.body)


@lru_cache(maxsize=4096)  # a task's prompts recur every epoch; bounded for large datasets
def trusted_source(prompt: str, entry: str | None) -> str:
    """The task's own definitions from its prompt, to run on the tests' side: every top-level statement of the
    prompt except function stubs (a body of only a docstring, `pass` or `...`) and any definition of `entry`.
    A prompt that does not parse as Python (a natural-language prompt) gives "". Helpers such as HumanEval/32's
    `poly` then come from the task, not from the completion, which may redefine them."""
    try:
        module = ast.parse(prompt)
    except (SyntaxError, ValueError):
        return ""
    keep = [node for node in module.body
            if not _is_stub(node) and getattr(node, "name", None) != entry]
    return ast.unparse(ast.Module(keep, type_ignores=[])) if keep else ""
