"""Reward-model data: JSONL readers with FILE:LINE errors, and preference pairs from a scripted policy."""

import random

import pytest

from conftest import write_jsonl
from rewardlab.rewards import build_reward
from rewardlab.rm.data import (
    load_eval_rows,
    load_pairs,
    load_step_rows,
    make_rollout,
)
from rewardlab.rm.pairs import PairSettings, generate_pairs, pairs_from_samples
from rewardlab.policy.settings import SamplingSettings
from rewardlab.types import Rollout
from rm_scripted import chain_row


def test_load_rewardbench_pairs(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "q", "chosen": "a", "rejected": "b", "subset": "math", "margin": 1.5},
        {"prompt": "q2", "chosen": "c", "rejected": "d"},
    ])
    pairs = load_pairs(path)
    assert (pairs[0].subset, pairs[0].margin) == ("math", 1.5)
    assert (pairs[1].subset, pairs[1].margin) == ("default", 0.0)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "chosen": "a"}, "missing field 'rejected'"),
    ({"prompt": "q", "chosen": 3, "rejected": "b"}, "field 'chosen' must be a string"),
    ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}, "field 'margin' must be a finite number"),
])
def test_bad_pair_names_file_line_and_field(tmp_path, row, message):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "ok", "chosen": "a", "rejected": "b"}, row])
    with pytest.raises(ValueError, match=f"p.jsonl:2: {message}"):
        load_pairs(path)


def test_malformed_json_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: malformed JSON"):
        load_pairs(path)


def test_rewardbench2_rows_need_exactly_one_chosen(tmp_path):
    good = {"prompt": "q", "chosen": ["a"], "rejected": ["b", "c", "d"], "subset": "Math"}
    rows = load_eval_rows(write_jsonl(tmp_path / "g.jsonl", [good]))["best_of_k"]
    assert rows[0].chosen == "a" and rows[0].rejected == ["b", "c", "d"]
    with pytest.raises(ValueError, match="b.jsonl:1: field 'chosen' must hold exactly one"):
        load_eval_rows(write_jsonl(tmp_path / "b.jsonl", [dict(good, chosen=["a", "e"])]))


def test_step_rows_and_processbench_labels(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [
        {"prompt": "q", "steps": ["a", "b", "c"], "labels": [1, 0.25, 0]},
        {"problem": "q2", "steps": ["a", "b", "c"], "label": 1},  # ProcessBench: first error at step 1
        {"problem": "q3", "steps": ["a", "b"], "label": -1},
    ])
    rows = load_step_rows(path)
    assert rows[0].labels == [1.0, 0.25, 0.0] and rows[0].first_error == 2  # 0.25 > 0: some continuation succeeds
    assert rows[1].labels == [1.0, 0.0, 0.0] and rows[1].first_error == 1
    assert rows[2].first_error == -1


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "steps": ["a", "b"], "labels": [1]}, r"field 'labels' must be a list with one label per step \(2\)"),
    ({"prompt": "q", "steps": ["a"], "labels": [2]}, r"field 'labels' must hold numbers in \[0, 1\]"),
    ({"problem": "q", "steps": ["a"], "label": 1}, "field 'label' must be -1 or a step index below 1"),
    ({"prompt": "q", "steps": []}, "field 'steps' must be a non-empty list of strings"),
    ({"prompt": "q", "steps": ["a"]}, "missing field 'labels' \\(per step\\)"),
])
def test_bad_step_rows(tmp_path, row, message):
    with pytest.raises(ValueError, match=f"s.jsonl:1: {message}"):
        load_step_rows(write_jsonl(tmp_path / "s.jsonl", [row]))


def test_mixed_eval_file_is_split_by_kind(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"prompt": "q", "chosen": "a", "rejected": "b"},
        {"prompt": "q", "chosen": ["a"], "rejected": ["b", "c", "d"]},
        {"prompt": "q", "steps": ["a"], "labels": [1]},
    ])
    rows = load_eval_rows(path)
    assert [len(rows[k]) for k in ("pair", "best_of_k", "steps")] == [1, 1, 1]
    with pytest.raises(ValueError, match="x.jsonl:1: not a pair, best-of-k or steps row"):
        load_eval_rows(write_jsonl(tmp_path / "x.jsonl", [{"prompt": "q"}]))


def test_make_rollout_keeps_given_steps():
    r = make_rollout("q", "a\nbb", step_text=["a\n", "bb"])
    assert r.steps == [(0, 2), (2, 4)] and r.step_text == ["a\n", "bb"] and r.row == {"prompt": "q"}


def test_pairs_from_samples_pairs_only_correct_with_incorrect():
    texts = ["r1", "w1", "r1", "w2", "r2"]
    ok = [True, False, True, False, True]
    pairs = pairs_from_samples(texts, ok, k=10, rng=random.Random(0))
    # unique correct {r1, r2} x unique incorrect {w1, w2} = 4 pairs
    assert sorted(pairs) == [("r1", "w1"), ("r1", "w2"), ("r2", "w1"), ("r2", "w2")]
    assert len(pairs_from_samples(texts, ok, k=3, rng=random.Random(0))) == 3
    assert pairs_from_samples(["r"], [True], k=2, rng=random.Random(0)) == []


class _Alternating:
    """Answers each question right on even samples and wrong (+1) on odd ones."""

    def generate(self, prompts, *, n=1, rows=None, **_):
        out = []
        for i, p in enumerate(prompts):
            for j in range(n):
                value = int(rows[i]["final"]) + (j % 2)
                out.append(Rollout(prompt=p, prompt_ids=[], completion=f"x={value}", completion_ids=[], logprobs=[],
                                   row=rows[i], group=i))
        return out


def test_generate_pairs_from_a_policy_and_a_verifier():
    rows = [chain_row("3+4"), chain_row("5-2"), chain_row("1+1")]
    sampling = SamplingSettings(max_new_tokens=32)
    pairs, stats = generate_pairs(_Alternating(), rows, build_reward("worked_answer"), sampling, n=4,
                                  settings=PairSettings(pairs_per_question=1, subset="toy", batch_size=2))
    # each question: samples x=7, x=8, x=7, x=8 -> one unique right, one unique wrong -> 1 pair each
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [("x=7", "x=8"), ("x=3", "x=4"), ("x=2", "x=3")]
    assert stats["questions"] == 3 and stats["samples"] == 12 and stats["sample_accuracy"] == 0.5
    assert stats["mixed_questions"] == 3 and pairs[0]["row"]["final"] == "7" and pairs[0]["subset"] == "toy"
    few, _ = generate_pairs(_Alternating(), rows, build_reward("worked_answer"), sampling, n=4,
                            settings=PairSettings(pairs_per_question=1, subset="toy", batch_size=1, max_pairs=2))
    assert len(few) == 2
