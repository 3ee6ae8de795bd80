"""`rm pairs --source mutants`: canonical solution vs sandbox-confirmed failing mutant (HumanEval), and
`rm eval` scoring those pairs with the `code` reward and the length rule."""

import json

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.rewards.code import CodeReward
from rewardlab.rm.data import load_pairs, make_rollout
from rewardlab.rm.pairs import mutant_pairs
from rewardlab.tasks import load
from rewardlab.rm.mutants import mutate

ADD_TEST = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n"


def _err(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def he_pairs(tmp_path_factory):
    """Pairs from the first 3 problems of HumanEval's test split, through the CLI, and rm eval on them."""
    d = tmp_path_factory.mktemp("he")
    assert main(["rm", "pairs", "--no-progress", "--task", "humaneval", "--source", "mutants", "--out",
                 str(d / "pairs"), "split=test", "pairs.limit=3", "pairs.pairs_per_question=2", "--seed", "1"]) == 0
    assert main(["rm", "eval", "--no-progress", "--data", str(d / "pairs" / "pairs.jsonl"), "--out", str(d / "eval"),
                 "scorer=[{name: code}]"]) == 0
    return d


def test_pairs_file_is_rewardbench_format_with_the_task_row(he_pairs):
    pairs = _jsonl(he_pairs / "pairs" / "pairs.jsonl")
    summary = json.loads((he_pairs / "pairs" / "summary.json").read_text())
    test_rows = load("humaneval").test[:3]
    by_id = {r["task_id"]: r for r in test_rows}
    assert summary["source"] == "mutants" and summary["questions"] == 3 and summary["pairs"] == len(pairs) > 0
    for p in pairs:
        assert set(p) == {"prompt", "chosen", "rejected", "subset"} | {"row"} and p["subset"] == "humaneval"
        row = by_id[p["row"]["task_id"]]
        assert p["row"] == row and p["prompt"] == row["prompt"] and p["chosen"] == row["answer"]
        assert p["rejected"] != p["chosen"] and p["rejected"] in mutate(row["answer"], seed=1)
    per_task = [sum(p["row"]["task_id"] == t for p in pairs) for t in by_id]
    assert max(per_task) <= 2 and len({(p["row"]["task_id"], p["rejected"]) for p in pairs}) == len(pairs)
    assert summary["questions_no_failing_mutant"] == per_task.count(0)
    assert summary["chosen_len_mean"] == sum(len(p["chosen"]) for p in pairs) / len(pairs)
    assert summary["rejected_len_mean"] == sum(len(p["rejected"]) for p in pairs) / len(pairs)
    longer = sum(len(p["chosen"]) > len(p["rejected"]) for p in pairs)
    assert summary["longer_wins_accuracy"] == longer / len(pairs) and summary["chosen_longer"] == longer
    assert summary["mutants_tried"] >= summary["mutants_failing"] >= len(pairs)
    assert summary["sandbox_runs"] == 3 + summary["mutants_tried"]  # each canonical once, then the mutants
    assert len(load_pairs(he_pairs / "pairs" / "pairs.jsonl")) == len(pairs)  # rm train / eval read it


def test_chosen_passes_and_rejected_fails_in_a_fresh_sandbox(he_pairs):
    pairs = _jsonl(he_pairs / "pairs" / "pairs.jsonl")
    reward = CodeReward(timeout=20.0, test_timeout=5.0)  # not the limits the pairs were made with
    chosen = reward([make_rollout(p["prompt"], p["chosen"], p["row"]) for p in pairs])
    rejected = reward([make_rollout(p["prompt"], p["rejected"], p["row"]) for p in pairs])
    assert all(o.error is None and o.score == 1.0 for o in chosen)
    assert all(o.error is None and o.score < 1.0 for o in rejected)
    assert all(o.components["failed/assertion"] + o.components["failed/error"] + o.components["failed/load"] > 0
               for o in rejected)


def test_rm_eval_code_reward_gets_every_pair_right(he_pairs):
    report = json.loads((he_pairs / "eval" / "report.json").read_text())
    summary = json.loads((he_pairs / "pairs" / "summary.json").read_text())
    p = report["pairs"]
    assert p["n"] == summary["pairs"] and p["errors"] == 0 and p["ties"] == 0
    assert p["accuracy"] == 1.0 and p["per_subset"]["subsets"]["humaneval"]["mean"] == 1.0
    assert p["length_bias"]["longer_wins_accuracy"] == summary["longer_wins_accuracy"]
    assert p["master_keys"]["rate"] == 0.0  # ":" and "" are no solution
    assert min(p["chosen_scores"]) == 1.0 and max(p["rejected_scores"]) < 1.0


def _code_rows():
    add = {"prompt": "def add(a, b):\n", "test": ADD_TEST, "entry_point": "add"}
    return [
        {**add, "answer": "    return a + b\n", "task_id": "good"},
        {**add, "answer": "    return a - b\n", "task_id": "wrong canonical"},
        # every mutant (x = 2, x = 0, either line dropped) still returns None: no failing mutant
        {"prompt": "def f():\n", "answer": "    x = 1\n    return None\n", "entry_point": "f", "task_id": "weak",
         "test": "def check(candidate):\n    assert candidate() is None\n"},
        {"prompt": "Write mul.", "answer": "def mul(a, b):\n    return a * b\n", "task_id": "asserts form",
         "tests": ["assert mul(2, 3) == 6", "assert mul(0, 5) == 0"]},
    ]


def test_mutant_pairs_skip_failing_canonicals_and_count_the_sandbox():
    pairs, stats = mutant_pairs(_code_rows(), pairs_per_question=3, subset="toy", batch_size=2)
    ids = [p["row"]["task_id"] for p in pairs]
    # "good" has 2 mutants (a - b, return None), "asserts form" 2 (a + b, return None): all fail, fewer than 3
    assert ids == ["good", "good", "asserts form", "asserts form"]
    assert all(p["chosen"] == p["row"]["answer"] and p["subset"] == "toy" for p in pairs)
    assert stats["questions"] == 4 and stats["canonical_failures"] == 1 and stats["pairs"] == 4
    assert stats["questions_no_failing_mutant"] == 1 and stats["questions_fewer_mutants"] == 2
    assert stats["mutants_passing"] == len(mutate("    x = 1\n    return None\n")) == 4
    assert stats["mutants_tried"] == sum(stats[f"mutants_{k}"] for k in ("failing", "passing", "unconfirmed",
                                                                         "errors"))
    assert stats["sandbox_runs"] == 4 + stats["mutants_tried"]


def test_limit_max_pairs_and_batches():
    rows = _code_rows()
    full, _ = mutant_pairs(rows, pairs_per_question=2, subset="toy", batch_size=4, seed=3)
    one_by_one, _ = mutant_pairs(rows, pairs_per_question=2, subset="toy", batch_size=1, seed=3)
    assert full == one_by_one and len(full) == 4  # a row's mutants do not depend on its batch
    few, stats = mutant_pairs(rows, pairs_per_question=2, subset="toy", batch_size=4, seed=3, max_pairs=3)
    assert few == full[:3] and stats["pairs"] == 3
    assert stats["questions"] == 4  # the last row's second pair crossed max_pairs
    first, stats = mutant_pairs(rows, pairs_per_question=2, subset="toy", batch_size=1, seed=3, max_pairs=1)
    assert first == full[:1] and stats["questions"] == 1  # the later batches never ran
    assert stats["sandbox_runs"] == 1 + stats["mutants_tried"]


def test_cli_limit_and_max_pairs_on_humaneval(tmp_path):
    assert main(["rm", "pairs", "--no-progress", "--task", "humaneval", "--out", str(tmp_path / "p"),
                 "pairs.source=mutants", "pairs.limit=2", "pairs.pairs_per_question=3", "pairs.max_pairs=4"]) == 0
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    pairs = _jsonl(tmp_path / "p" / "pairs.jsonl")
    train = load("humaneval").train[:2]
    assert summary["pairs"] == len(pairs) == 4 and summary["split"] == "train" and summary["questions"] == 2
    assert [p["row"]["task_id"] for p in pairs] == [train[0]["task_id"]] * 3 + [train[1]["task_id"]]


def test_task_without_canonical_solutions_is_one_line(tmp_path, capsys):
    task = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)])
    assert main(["rm", "pairs", "--task", f"jsonl:{task}", "--source", "mutants", "--out", str(tmp_path / "p"),
                 "task.options={test_size: 1}"]) == 2
    line = _err(capsys)
    assert line.startswith("rewardlab rm pairs: error: rm pairs: pairs.source=mutants needs a canonical solution")
    assert "train row 0" in line and "has no tests ('test' + 'entry_point', or 'tests')" in line
    assert not (tmp_path / "p").exists()
    assert main(["rm", "pairs", "--task", "humaneval", "pairs.source=mutant", "--out", str(tmp_path / "q")]) == 2
    assert "pairs.source: Input should be 'policy' or 'mutants'" in _err(capsys)


def test_policy_that_is_never_right_on_code_rows_points_to_mutants(tmp_path, capsys):
    task = write_jsonl(tmp_path / "t.jsonl", [r for r in _code_rows() if r["task_id"] != "asserts form"])
    assert main(["rm", "pairs", "--no-progress", "--model", "tiny", "--task", f"jsonl:{task}", "--out",
                 str(tmp_path / "p"), "task.options={test_size: 1, reward: code}", "pairs.n=2",
                 "pairs.max_new_tokens=1", *TINY_OVERRIDES]) == 2
    assert "sample accuracy 0.0%" in (line := _err(capsys)) and "use --source mutants" in line


def test_model_with_mutants_is_refused_not_ignored(tmp_path, capsys):
    # the mutant source samples nothing, so a model given with it would be silently unused
    for args in (["--source", "mutants", "--model", "tiny"], ["pairs.source=mutants", "model.path=tiny"],
                 ["--source", "mutants", "model.device=cpu"]):
        assert main(["rm", "pairs", "--task", "humaneval", "--out", str(tmp_path / "p"), *args]) == 2
        assert _err(capsys) == ("rewardlab rm pairs: error: config error: pairs.source=mutants uses no model; "
                                "drop --model and the model.* settings, or use pairs.source=policy")
    assert not (tmp_path / "p").exists()
