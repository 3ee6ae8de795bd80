"""Task loading: de-duplication, disjoint splits, templates, scoring, JSONL errors, the row sampler."""

import json

import pytest

from conftest import CHAIN_SUM, write_jsonl
from rewardlab.tasks import LOADERS, Task, dedup_and_split, load
from rewardlab.tasks.reasoning_gym import format_prompt, score_answer
from rewardlab.tasks.sampler import RowSampler


# ---------------------------------------------------------------- dedup_and_split
def test_dedup_keeps_first_occurrence():
    rows = [{"q": "a", "i": 0}, {"q": "b", "i": 1}, {"q": "a", "i": 2}, {"q": "c", "i": 3}]
    train, test = dedup_and_split(rows, key=lambda r: r["q"], test_size=1, seed=0)
    kept = train + test
    # 4 rows, "a" twice -> 3 unique; the first "a" (i=0) wins.
    assert sorted(r["q"] for r in kept) == ["a", "b", "c"]
    assert [r["i"] for r in kept if r["q"] == "a"] == [0]
    assert len(test) == 1 and len(train) == 2


def test_dedup_fraction_test_size():
    rows = [{"q": str(i)} for i in range(10)]
    train, test = dedup_and_split(rows, key=lambda r: r["q"], test_size=0.2, seed=0)
    assert (len(train), len(test)) == (8, 2)  # round(0.2 * 10) = 2


@pytest.mark.parametrize("test_size", [3, 5, 1.5, 0.0, -1])
def test_dedup_bad_test_size(test_size):
    # 3 unique rows: 3 or 5 test rows leave no training rows; 1.5 and 0.0 are not fractions in (0, 1).
    with pytest.raises(ValueError, match=r"^task\.options\.test_size: "):
        dedup_and_split([{"q": "a"}, {"q": "b"}, {"q": "c"}], key=lambda r: r["q"], test_size=test_size, seed=0)


def test_task_split_names():
    task = Task(name="t", train=[{"prompt": "a"}], test=[{"prompt": "b"}])
    assert task.split("train") == [{"prompt": "a"}] and task.split("test") == [{"prompt": "b"}]
    with pytest.raises(ValueError, match="unknown split 'val'"):
        task.split("val")


# ---------------------------------------------------------------- load()
def test_load_spec_without_colon():
    with pytest.raises(ValueError, match="expected 'kind:argument'"):
        load("chain_sum")


def test_load_unknown_kind_lists_kinds():
    with pytest.raises(ValueError) as info:
        load("csv:data.csv")
    assert "unknown task kind 'csv'" in str(info.value)
    assert "jsonl" in str(info.value) and "reasoning_gym" in str(info.value)
    assert {"jsonl", "reasoning_gym"} <= set(LOADERS)


# ---------------------------------------------------------------- reasoning_gym
def test_chain_sum_deduplicates_questions(chain_sum_task):
    questions = [r["question"] for r in chain_sum_task.train + chain_sum_task.test]
    assert len(questions) == len(set(questions))
    # 400 draws from at most 200 distinct questions must repeat, so de-duplication removed rows.
    assert len(questions) <= 200
    assert len(chain_sum_task.test) == 50


def test_chain_sum_train_and_test_are_disjoint(chain_sum_task):
    train_q = {r["question"] for r in chain_sum_task.train}
    test_q = {r["question"] for r in chain_sum_task.test}
    assert train_q.isdisjoint(test_q)
    assert {r["prompt"] for r in chain_sum_task.train}.isdisjoint(r["prompt"] for r in chain_sum_task.test)


def test_chain_sum_rows_have_documented_fields(chain_sum_task):
    row = chain_sum_task.train[0]
    assert {"prompt", "answer", "question", "metadata", "dataset", "dataset_config"} <= set(row)
    assert row["dataset"] == "chain_sum" and row["dataset_config"] == CHAIN_SUM
    assert isinstance(row["answer"], str)
    assert chain_sum_task.reward == "reasoning_gym" and chain_sum_task.name == "reasoning_gym:chain_sum"


def test_chain_sum_same_seed_same_rows(chain_sum_task):
    again = load("reasoning_gym:chain_sum", size=400, test_size=50, seed=0, **CHAIN_SUM)
    assert again.train == chain_sum_task.train and again.test == chain_sum_task.test


def test_chain_sum_other_seed_other_split(chain_sum_task):
    other = load("reasoning_gym:chain_sum", size=400, test_size=50, seed=1, **CHAIN_SUM)
    assert {r["question"] for r in other.test} != {r["question"] for r in chain_sum_task.test}


def test_compact_template_formats_expression():
    entry = {"question": "What is 4 - 1?", "answer": "3", "metadata": {"expression": "4 - 1"}}
    assert format_prompt(entry, "compact", "chain_sum") == "4-1="


def test_compact_template_on_chain_sum():
    task = load("reasoning_gym:chain_sum", size=20, test_size=2, seed=0, template="compact", **CHAIN_SUM)
    for row in task.train + task.test:
        assert row["prompt"] == row["metadata"]["expression"].replace(" ", "") + "="
        a, op, b, eq = row["prompt"]  # two 1-digit terms: "d+d=" or "d-d="
        assert eq == "=" and str(int(a) + int(b) if op == "+" else int(a) - int(b)) == row["answer"]


def test_compact_template_without_expression_names_template():
    with pytest.raises(ValueError, match="template 'compact'"):
        load("reasoning_gym:leg_counting", size=5, test_size=1, seed=0, template="compact")


def test_format_string_template():
    entry = {"question": "Q?", "metadata": {"expression": "1 + 2"}}
    assert format_prompt(entry, "Q: {expression}\nA:", "chain_sum") == "Q: 1 + 2\nA:"
    with pytest.raises(ValueError, match="template field 'nope'"):
        format_prompt(entry, "{nope}", "chain_sum")


def test_unknown_reasoning_gym_dataset():
    with pytest.raises(ValueError, match="no_such_dataset"):
        load("reasoning_gym:no_such_dataset", size=5, test_size=1)


def test_unknown_reasoning_gym_option():
    with pytest.raises(ValueError, match="unknown option 'bogus' for reasoning-gym dataset 'chain_sum'"):
        load("reasoning_gym:chain_sum", size=5, test_size=1, bogus=3)
    with pytest.raises(ValueError, match="bad dataset option"):  # a field with a bad value: the config's own check
        load("reasoning_gym:chain_sum", size=5, test_size=1, min_terms=3, max_terms=2)


def test_score_answer_right_and_wrong(chain_sum_task):
    for row in chain_sum_task.test[:5]:
        assert score_answer(row, row["answer"]) == 1.0
        assert score_answer(row, str(int(row["answer"]) + 1)) == 0.0


# ---------------------------------------------------------------- jsonl
def test_jsonl_reads_rows_and_keeps_extra_fields(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "answer": str(i), "level": i} for i in range(5)])
    task = load(f"jsonl:{path}", test_size=1, seed=0)
    rows = task.train + task.test
    assert sorted(r["prompt"] for r in rows) == ["p0", "p1", "p2", "p3", "p4"]
    assert all(r["level"] == int(r["answer"]) for r in rows)
    assert (len(task.train), len(task.test)) == (4, 1)
    assert task.reward == "exact_match" and task.name == f"jsonl:{path}"


def test_jsonl_non_string_answer_becomes_json_text(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": 7}, {"prompt": "b", "answer": [1, 2]}])
    from rewardlab.tasks.jsonl import read_rows

    assert [r["answer"] for r in read_rows(path)] == ["7", "[1, 2]"]


def test_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n\n   \n{"prompt": "b", "answer": "2"}\n')
    from rewardlab.tasks.jsonl import read_rows

    assert [r["prompt"] for r in read_rows(path)] == ["a", "b"]


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n{"prompt": "c", "answer":\n')
    with pytest.raises(ValueError) as info:
        load(f"jsonl:{path}")
    msg = str(info.value)
    assert f"{path}:3" in msg and "malformed JSON" in msg and "\n" not in msg


def test_jsonl_missing_field_names_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b"}])
    with pytest.raises(ValueError) as info:
        load(f"jsonl:{path}")
    msg = str(info.value)
    assert f"{path}:2" in msg and "'answer'" in msg and "\n" not in msg


def test_jsonl_non_object_and_non_string_prompt(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('[1, 2]\n')
    with pytest.raises(ValueError, match=r":1: expected a JSON object"):
        load(f"jsonl:{path}")
    write_jsonl(path, [{"prompt": 5, "answer": "1"}])
    with pytest.raises(ValueError, match=r":1: field 'prompt' must be a string"):
        load(f"jsonl:{path}")


def test_jsonl_missing_and_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load(f"jsonl:{tmp_path / 'nope.jsonl'}")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        load(f"jsonl:{tmp_path / 'empty.jsonl'}")


def test_jsonl_test_path_keeps_held_out_prompts_out_of_train(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": p, "answer": "x"} for p in ["A", "B", "C", "A"]])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": p, "answer": "y"} for p in ["B", "D"]])
    task = load(f"jsonl:{train}", test_path=str(test))
    # train file {A, B, C} (A once after de-dup) minus held-out {B, D} -> {A, C}.
    assert sorted(r["prompt"] for r in task.train) == ["A", "C"]
    assert sorted(r["prompt"] for r in task.test) == ["B", "D"]


def test_jsonl_split_is_disjoint_and_seeded(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i % 30}", "answer": "1"} for i in range(60)])
    a = load(f"jsonl:{path}", test_size=5, seed=0)
    b = load(f"jsonl:{path}", test_size=5, seed=0)
    c = load(f"jsonl:{path}", test_size=5, seed=1)
    prompts = [r["prompt"] for r in a.train + a.test]
    assert len(prompts) == len(set(prompts)) == 30  # 60 lines, 30 distinct prompts
    assert {r["prompt"] for r in a.train}.isdisjoint(r["prompt"] for r in a.test)
    assert a.test == b.test and a.train == b.train
    assert {r["prompt"] for r in a.test} != {r["prompt"] for r in c.test}


# ---------------------------------------------------------------- RowSampler
def test_sampler_draws_each_row_once_per_epoch():
    rows = [{"i": i} for i in range(5)]
    s = RowSampler(rows, seed=0)
    first, second = s.next(5), s.next(5)
    assert sorted(r["i"] for r in first) == [0, 1, 2, 3, 4]
    assert sorted(r["i"] for r in second) == [0, 1, 2, 3, 4]


def test_sampler_state_round_trip():
    rows = [{"i": i} for i in range(7)]
    a = RowSampler(rows, seed=3)
    a.next(4)
    state = json.loads(json.dumps(a.state_dict(), default=list))  # survives a save (tuples become lists)
    b = RowSampler(rows, seed=99)
    b.load_state_dict({"rng": _as_tuple(state["rng"]), "order": state["order"], "pos": state["pos"]})
    assert [r["i"] for r in a.next(10)] == [r["i"] for r in b.next(10)]


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list) else x


def test_sampler_rejects_empty_rows():
    with pytest.raises(ValueError, match="no training rows"):
        RowSampler([], seed=0)


def test_jsonl_control_character_message_says_at_column_once(tmp_path):
    # json's message for a raw tab inside a string ends in "at"; the column must not read "at at column".
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a\tb", "answer": "1"}\n')
    with pytest.raises(ValueError) as info:
        load(f"jsonl:{path}")
    assert str(info.value) == f"{path}:1: malformed JSON (Invalid control character at column 14)"
