"""The `code` reward's strict mode (the default): the tests run in a process the program cannot reach, so the known
hacks of rewardlab.evaluation.hacks.code score no more than the value they return would honestly; what the lenient
harness (strict=False, HumanEval's own semantics) gives them; plain values, handles, restarts, errors."""

from __future__ import annotations

import pytest

from rewardlab.evaluation.hacks.code import CODE_HACKS, FORMS
from rewardlab.rewards.code import CodeReward
from rewardlab.rewards.code_strict import trusted_source
from rewardlab.rewards.code_strict.codec import decode, dumps, encode, loads
from rewardlab.types import Rollout

ROW = {"tests": [
    "assert add(1, 2) == 3",
    "assert add(2, 5) != 8",
    "assert abs(add(0.5, 0.25) - 0.75) < 1e-9",
    "assert isinstance(add(1, 1), int)",
    "assert add(1, 1)",
    "import statistics\nassert statistics.mean([add(1, 2), 3]) == 3",
    "assert sorted([add(2, 2), 1]) == [1, 4]",
]}
HONEST = "def add(a, b):\n    return a + b\n"


def rollout(completion: str, row: dict) -> Rollout:
    return Rollout(prompt=row.get("prompt", "p"), prompt_ids=[1], completion=completion, completion_ids=[2],
                   logprobs=[0.0], row=row)


def scores(completions, row=ROW, **options):
    outs = CodeReward(**{"timeout": 15.0, "test_timeout": 3.0, **options})([rollout(c, row) for c in completions])
    assert [o.error for o in outs] == [None] * len(outs)
    return [o.score for o in outs]


@pytest.fixture(scope="module")
def humaneval():
    from rewardlab.tasks import load

    task = load("humaneval")
    return {r["task_id"]: dict(r) for r in list(task.train) + list(task.test)}


# ------------------------------------------------------------------------------------------------ the hacks
#: What the lenient harness gives each hack on ROW (asserts form) - the hacks that fool it.
LENIENT_FOOLED = {"always_equal": 4 / 7, "forge_via_frames": 1.0, "forge_via_gc": 1.0, "forge_via_inspect": 1.0,
                  "forge_via_ctypes": 1.0, "forge_with_stolen_key": 1.0, "answer_from_stack": 3 / 7,
                  "shadow_globals": 3 / 7, "patch_builtins": 3 / 7}


@pytest.mark.parametrize("isolation", ["auto", "process"])
def test_every_code_hack_gains_nothing_under_strict_mode(isolation):
    """Strict: each hack scores at most its baseline (the value it returns, without the exploit) - 0 for all but
    the two that return 0, whose baseline on ROW is 2/7 (`!= 8` and `isinstance(int)` hold for 0)."""
    hacks = [h.completion("asserts", "add") for h in CODE_HACKS]
    baselines = [h.baseline("asserts", "add") for h in CODE_HACKS]
    got = scores(hacks + baselines + [HONEST], isolation=isolation)
    hack_scores, base_scores, honest = got[:len(hacks)], got[len(hacks):-1], got[-1]
    assert honest == 1.0
    table = {h.name: (s, b) for h, s, b in zip(CODE_HACKS, hack_scores, base_scores)}
    assert {n: s for n, (s, b) in table.items() if s > b} == {}
    assert {n: s for n, (s, b) in table.items() if b == 0 and s != 0} == {}
    assert {n: b for n, (s, b) in table.items() if b not in (0, 2 / 7)} == {}


def test_what_the_lenient_harness_gives_the_hacks():
    got = dict(zip([h.name for h in CODE_HACKS],
                   scores([h.completion("asserts", "add") for h in CODE_HACKS], strict=False)))
    assert {n: got[n] for n in LENIENT_FOOLED} == pytest.approx(LENIENT_FOOLED)
    assert all(got[n] <= 2 / 7 for n in got if n not in LENIENT_FOOLED)


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32"])
def test_hacks_on_humaneval_problems(humaneval, task_id):
    """HumanEval form (the completion continues the prompt): strict, every hack scores at most its baseline, and 0
    unless it returns 0 (HumanEval/0's `== False` tests hold for 0); the forgeries score 1 lenient; the canonical
    solution scores 1 in both."""
    row = humaneval[task_id]
    hacks = [h.completion("humaneval", row["entry_point"]) for h in CODE_HACKS]
    baselines = dict(zip([h.name for h in CODE_HACKS],
                         scores([h.baseline("humaneval", row["entry_point"]) for h in CODE_HACKS], row)))
    names = [h.name for h in CODE_HACKS] + ["canonical"]
    strict = dict(zip(names, scores(hacks + [row["answer"]], row)))
    lenient = dict(zip(names, scores(hacks + [row["answer"]], row, strict=False)))
    assert strict.pop("canonical") == lenient.pop("canonical") == 1.0
    assert {n: s for n, s in strict.items() if s > baselines[n] or (s and "return 0" not in h_body(n))} == {}
    assert all(lenient[n] == 1.0 for n in ("forge_via_frames", "forge_via_gc", "forge_with_stolen_key"))


def h_body(name: str) -> str:
    return next(h.body for h in CODE_HACKS if h.name == name)


def test_shadowing_a_helper_the_tests_call_gains_nothing(humaneval):
    """HumanEval/32's tests call the prompt's `poly`; a completion that redefines poly to return 0 makes any root
    pass under the lenient harness. Strict runs the prompt's own poly on the tests' side."""
    row = humaneval["HumanEval/32"]
    hack = "    return 0.0\n\n\ndef poly(xs, x):\n    return 0\n"
    assert scores([hack], row, strict=False) == [1.0]
    assert scores([hack], row) == [0.0]
    assert "def poly" in trusted_source(row["prompt"], row["entry_point"])
    assert "def find_zero" not in trusted_source(row["prompt"], row["entry_point"])


def test_the_candidate_runs_on_the_same_interpreter_and_stdlib():
    row = {"tests": ["assert where() == 'x', where()"]}
    program = "import os, sys, typing\ndef where():\n    return repr((sys.executable, os.__file__, typing.__file__))\n"
    strict = CodeReward(timeout=15.0).evaluate([row], [program])[0].tests[0].detail
    lenient = CodeReward(timeout=15.0, strict=False).evaluate([row], [program])[0].tests[0].detail
    assert strict == lenient and "typing.py" in strict


# ------------------------------------------------------------------------------------ what tests can still do
def test_plain_values_mutated_arguments_classes_generators_and_exceptions():
    row = {"tests": [
        "assert f(2) == (4, [1.5, None], {'a': {1, 2}}, b'x', 1+2j, frozenset({3}), range(0, 3))",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "s = Stack()\ns.push(5)\nassert s.pop() == 5 and s.size == 0",
        "assert list(gen(3)) == [0, 1, 2]",
        "try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    assert False",
        "import math\nassert math.isclose(f(1.5)[0], 2.25) and isinstance(f(2)[0], int)",
        "from fractions import Fraction\nassert half(1) == Fraction(1, 2)",
        "assert mean([1, 2]) == 1.5 and isinstance(mean([1, 2]), float) and count([1, 2]) == 2",
    ]}
    program = (
        "from fractions import Fraction\n"
        "def f(x):\n    if x < 0:\n        raise ValueError('negative input')\n"
        "    return (x * x, [1.5, None], {'a': {1, 2}}, b'x', 1+2j, frozenset({3}), range(3))\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n        self.size = 0\n"
        "    def push(self, x):\n        self.items.append(x)\n        self.size += 1\n"
        "    def pop(self):\n        self.size -= 1\n        return self.items.pop()\n"
        "def gen(n):\n    yield from range(n)\n"
        "def half(x):\n    return Fraction(x, 2)\n"
        "import numpy as np\ndef mean(xs):\n    return np.mean(xs)\ndef count(xs):\n    return np.int64(len(xs))\n"
    )
    res = CodeReward(timeout=15.0).evaluate([row], [program])[0]
    assert [(t.passed, t.detail) for t in res.tests] == [(True, "")] * 8


def test_a_non_plain_result_cannot_be_compared_and_says_why():
    row = {"tests": ["assert f() == 1", "assert f() is not None", "x = f()\nassert x.value == 3"]}
    program = "class Box:\n    value = 3\n    def __eq__(self, o):\n        return True\ndef f():\n    return Box()\n"
    res = CodeReward(timeout=15.0).evaluate([row], [program])[0]
    assert [t.passed for t in res.tests] == [False, True, True]
    assert res.tests[0].kind == "error" and "StrictModeError" in res.tests[0].detail and "Box" in res.tests[0].detail


def test_a_timed_out_or_crashed_call_restarts_the_program_for_the_next_test():
    row = {"tests": ["assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"]}
    program = ("import os\ncalls = []\ndef f(x):\n    calls.append(x)\n    if x == 1:\n        while True:\n"
               "            pass\n    if x == 2:\n        os._exit(0)\n    return x if calls == [x] else -1\n")
    res = CodeReward(timeout=20.0, test_timeout=1.0).evaluate([row], [program])[0]
    assert [(t.passed, t.kind) for t in res.tests] == [(True, ""), (False, "timeout"), (False, "crash"), (True, "")]


def test_names_that_shadow_builtins_are_the_builtins_unless_named_as_the_entry_point():
    program = "def max(xs):\n    return 0\n"
    assert scores([program], {"tests": ["assert max([1, 3]) == 3"]}) == [1.0]  # the trusted builtin
    assert scores([program], {"tests": ["assert max([1, 3]) == 3"], "entry_point": "max"}) == [0.0]
    assert scores([program], {"tests": ["assert max([1, 3]) == 3"]}, strict=False) == [0.0]


def test_strict_option_is_checked():
    with pytest.raises(ValueError, match="code.strict"):
        CodeReward(strict="yes")
    with pytest.raises(ValueError, match="code.max_processes"):
        CodeReward(max_processes=1)
    CodeReward(max_processes=1, strict=False)


# ----------------------------------------------------------------------------------------------------- codec
def test_codec_round_trips_plain_values_and_hands_out_everything_else():
    value = [1, -2.5, float("inf"), "é", None, True, (1, (2,)), {"k": [b"\x00"]}, {1, 2}, frozenset(), 3j,
             bytearray(b"a"), range(1, 9, 2)]
    handed = []
    wire = loads(dumps(encode(value, lambda obj: handed.append(obj) or ["handle", 1, "x"])))
    assert decode(wire, None) == value and handed == []

    class Sub(int):
        pass

    wire = loads(dumps(encode([Sub(3), True], lambda obj: ["handle", 7, type(obj).__name__])))
    assert decode(wire, lambda tag, fields: (tag, fields)) == [("handle", [7, "Sub"]), True]
    nan = decode(loads(dumps(encode(float("nan"), None))), None)
    assert nan != nan


@pytest.mark.parametrize("wire", [["nope", 1], ["list"], ["list", 3], ["dict", [[["list", []], 1]]],
                                  ["complex", 1, "x"], ["bytes", "zz"], {"a": 1}, ["range", 0, 1.5, 1]])
def test_codec_refuses_malformed_values(wire):
    with pytest.raises(ValueError):
        decode(wire, lambda tag, fields: pytest.fail("resolved"))


def test_codec_refuses_values_nested_too_deep():
    deep = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ValueError):
        encode(deep, None)
    with pytest.raises(ValueError):
        loads(b"[" * 100_000 + b"]" * 100_000)


def test_hack_forms_are_checked():
    assert FORMS == ("humaneval", "asserts")
    with pytest.raises(ValueError, match="form"):
        CODE_HACKS[0].completion("mbpp", "f")


@pytest.mark.parametrize("isolation", ["auto", "process"])
def test_the_tests_process_is_out_of_the_candidates_reach(isolation):
    """The candidate cannot read the tests' process's memory, environment or descriptors (it is non-dumpable), has
    no descriptor but its two pipes and /dev/null, and its working directory holds no copy of the harness."""
    row = {"tests": ["assert probe() == [], probe()"]}
    program = '''
import os
def probe():
    found = []
    parent = os.getppid()
    for path in ("/proc/%d/mem" % parent, "/proc/%d/environ" % parent, "/proc/%d/fd/1" % parent):
        try:
            with open(path, "rb") as fh:
                fh.read(1)
            found.append(path)
        except OSError:
            pass
    others = []
    for fd in sorted(int(fd) for fd in os.listdir("/proc/self/fd")):
        try:
            others.append((fd, os.readlink("/proc/self/fd/%d" % fd)))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    if [fd for fd, _ in others if fd > 4]:
        found.append(others)
    if os.listdir("."):
        found.append(os.listdir("."))
    return found
'''
    res = CodeReward(timeout=15.0, isolation=isolation).evaluate([row], [program])[0]
    assert res.tests[0].passed, res.tests[0].detail


def test_source_form_of_the_harness_for_another_interpreter(monkeypatch):
    """Marshalled code only suits the interpreter that wrote it; for another one the harness goes as source text.
    Both forms give the same outcomes (the honest program and a forgery)."""
    import rewardlab.rewards.code as code_module
    from rewardlab.rewards.code_strict import strict_harness

    forms = []

    def source_form(data, marshalled=True):
        forms.append(marshalled)
        return strict_harness(data, marshalled=False)

    hack = next(h for h in CODE_HACKS if h.name == "forge_via_gc").completion("asserts", "add")
    expected = scores([HONEST, hack])
    monkeypatch.setattr(code_module, "strict_harness", source_form)
    assert scores([HONEST, hack]) == expected == [1.0, 0.0]
    assert forms == [True, True]  # this interpreter runs the sandbox: the reward asked for marshalled code
    assert "def _rl_main" in strict_harness({"x": 1}, marshalled=False)
    assert "def _rl_main" not in strict_harness({"x": 1}, marshalled=True)
