"""Which rows `evaluate` scores: a user's JSONL file whole unless a split is asked for; a generated task's held-out
split. The summary and the console say how many rows of which split."""

import json

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.tasks import load
from rewardlab.tasks.base import Task

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]
EVAL = ["eval.n=2", "eval.k=[1, 2]", "eval.max_new_tokens=2", *TINY_OVERRIDES]


def _evaluate(tmp_path, capsys, *overrides):
    data = write_jsonl(tmp_path / "three.jsonl", ROWS)
    out = tmp_path / "eval"
    assert main(["evaluate", "--no-progress", "--model", "tiny", "--task", f"jsonl:{data}", "--out", str(out),
                 *EVAL, *overrides]) == 0
    captured = capsys.readouterr()
    return json.loads((out / "summary.json").read_text()), json.loads(captured.out), captured.err, data


def test_a_users_file_is_evaluated_whole(tmp_path, capsys):
    summary, printed, err, data = _evaluate(tmp_path, capsys)
    assert summary["n_questions"] == printed["n_questions"] == 3  # was 1: the held-out tenth of the file
    assert summary["split"] == printed["split"] == "all" and summary["split_rows"] == 3
    assert f"evaluated 3 rows of jsonl:{data} (split all: every row)" in err.splitlines()
    assert [e["prompt"] for e in summary["examples"]] == [r["prompt"] for r in ROWS]  # in file order


@pytest.mark.parametrize("split, n", [("test", 1), ("train", 2)])  # test_size 0.1 of 3 rows: max(1, round(0.3))
def test_a_split_asked_for_is_evaluated(tmp_path, capsys, split, n):
    summary, printed, err, data = _evaluate(tmp_path, capsys, f"split={split}")
    assert summary["split"] == split and summary["n_questions"] == summary["split_rows"] == n
    task = load(f"jsonl:{data}")
    assert sorted(e["prompt"] for e in summary["examples"]) == sorted(r["prompt"] for r in task.split(split))
    assert f"evaluated {n} row{'s' if n > 1 else ''} of jsonl:{data} (split {split}:" in err


def test_limit_is_reported_against_the_split(tmp_path, capsys):
    summary, _, err, data = _evaluate(tmp_path, capsys, "eval.limit=2")
    assert summary["n_questions"] == 2 and summary["split_rows"] == 3 and summary["split"] == "all"
    assert [e["prompt"] for e in summary["examples"]] == ["1+1=", "2+2="]
    assert f"evaluated the first 2 of 3 rows of jsonl:{data} (split all: every row)" in err


def test_an_unknown_split_is_a_config_error(tmp_path, capsys):
    data = write_jsonl(tmp_path / "three.jsonl", ROWS)
    assert main(["evaluate", "--no-progress", "--task", f"jsonl:{data}", "--out", str(tmp_path / "e"),
                 "split=dev"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("rewardlab evaluate: error: config error: split:") and "'all'" in line


def test_default_split_is_the_tasks_choice(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", ROWS + [{"prompt": "1+1=", "answer": "3"}])  # a duplicate prompt
    task = load(f"jsonl:{data}")
    assert task.eval_split == "all"
    assert task.split("all") == ROWS  # file order, the duplicate's first occurrence kept
    assert sorted(map(str, task.split("all"))) == sorted(map(str, task.train + task.test))
    with_test = load(f"jsonl:{data}", test_path=str(write_jsonl(tmp_path / "t.jsonl", ROWS[:1])))
    assert with_test.eval_split == "test" and with_test.split("test") == ROWS[:1]  # the test file, whole
    gym = load("reasoning_gym:chain_sum", size=40, test_size=5, seed=0)
    assert gym.eval_split == "test" and len(gym.split("test")) == 5 and len(gym.split("all")) == len(gym.train) + 5
    plain = Task(name="t", train=[{"prompt": "a"}], test=[{"prompt": "b"}])
    assert plain.split("all") == [{"prompt": "a"}, {"prompt": "b"}]


def test_a_one_row_file_is_evaluated(tmp_path, capsys):
    """A single question cannot be split off a held-out row: by default it is all training data and evaluated
    (it was "task.test_size: 1 test rows leave no training rows out of 1 unique questions")."""
    data = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    out = tmp_path / "eval"
    assert main(["evaluate", "--no-progress", "--model", "tiny", "--task", f"jsonl:{data}", "--out", str(out),
                 *EVAL]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["split"] == "all" and summary["n_questions"] == summary["split_rows"] == 1
    task = load(f"jsonl:{data}")
    assert task.train == ROWS[:1] and task.test == []
    with pytest.raises(ValueError, match="task.options.test_size: 1 test rows leave no training rows"):
        load(f"jsonl:{data}", test_size=0.1)  # a split asked for is still checked
    capsys.readouterr()
    assert main(["evaluate", "--no-progress", "--task", f"jsonl:{data}", "--out", str(tmp_path / "e2"),
                 "split=test"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rewardlab evaluate: error: split: the test split of jsonl:{data} has no rows"
    assert not (tmp_path / "e2").exists()
