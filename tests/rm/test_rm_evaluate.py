"""The `rm eval` runner's sections with hand-made scorers: pairs + probes, best-of-k, first error with a dev threshold."""

import math

import pytest

from rewardlab.rewards import reward
from rewardlab.rm.data import BestOfK, Pair, StepRow
from rewardlab.rm.evaluate import evaluate_best_of_k, evaluate_first_error, evaluate_pairs, step_scores_of
from rewardlab.types import RewardOutput

# A scorer that rewards length: score = number of characters of the completion.
by_length = reward(name="test_length_scorer", register=False)(lambda completion: float(len(completion)))()


def test_pairs_section_with_a_length_scorer():
    pairs = [
        Pair("p1", chosen="long answer", rejected="short", subset="a"),  # 11 > 5: right
        Pair("p1", chosen="ok", rejected="wrong!", subset="a"),  # 2 < 6: wrong
        Pair("p2", chosen="abc", rejected="xyz", subset="b"),  # tie: wrong
    ]
    res = evaluate_pairs(by_length, pairs)
    assert res["accuracy"] == pytest.approx(1 / 3) and res["ties"] == 1
    assert res["per_subset"]["subsets"] == {"a": {"n": 2, "mean": 0.5}, "b": {"n": 1, "mean": 0.0}}
    # a length scorer is the length rule: it is right exactly where "longer wins" is right
    assert res["length_bias"]["longer_wins_accuracy"] == pytest.approx(1 / 3)
    assert res["length_bias"]["n_rejected_longer"] == 1 and res["length_bias"]["accuracy_rejected_longer"] == 0.0
    # master keys against the first chosen answer of each prompt: p1 -> "long answer" (11), p2 -> "abc" (3).
    # ":" (1) and "" (0) lose both; "Solution" (8) beats p2 only; the two long openers (30, 17) beat both.
    mk = res["master_keys"]
    assert mk["per_key"] == {":": 0.0, "Solution": 0.5, "Let's solve this step by step.": 1.0,
                             "Thought process:": 1.0, "": 0.0}
    assert mk["rate"] == pytest.approx(2.5 / 5) and mk["n_prompts"] == 2


def test_best_of_k_section():
    rows = [BestOfK("p", chosen="longest one", rejected=["a", "bb", "ccc"], subset="s"),  # chosen top: 1
            BestOfK("q", chosen="aa", rejected=["bb", "c", "d"], subset="s")]  # tied with "bb" at the top: 1/2
    res = evaluate_best_of_k(by_length, rows)
    assert res["accuracy"] == pytest.approx(0.75) and res["random"] == 0.25
    assert res["per_subset"]["subsets"]["s"]["mean"] == pytest.approx(0.75)


class _StepScorer:
    """A process scorer whose step scores are given per prompt; prompt "err" fails with an error."""

    name = "fixed_steps"

    def __init__(self, table):
        self.table = table

    def __call__(self, rollouts):
        out = []
        for r in rollouts:
            if r.row["prompt"] == "err":
                out.append(RewardOutput(score=0.0, error="fixed_steps: boom"))
            else:
                s = self.table[r.row["prompt"]]
                out.append(RewardOutput(score=min(s), step_scores=s))
        return out


def test_first_error_threshold_from_dev_split():
    scorer = _StepScorer({"d1": [0.9, 0.8], "d2": [0.9, 0.2], "t1": [0.7, 0.6], "t2": [0.7, 0.4, 0.9],
                          "t3": [0.3, 0.9]})
    dev = [StepRow("d1", ["a", "b"], [1, 1]), StepRow("d2", ["a", "b"], [1, 0])]
    test = [StepRow("t1", ["a", "b"], [1, 1]),  # no score below 0.5 -> -1: right
            StepRow("t2", ["a", "b", "c"], [1, 0, 0]),  # 0.4 at step 1 -> 1: right
            StepRow("t3", ["a", "b"], [1, 1]),  # 0.3 at step 0 -> 0, truth -1: wrong
            StepRow("err", ["a", "b"], [0, 0])]  # scorer error: +inf everywhere -> -1, truth 0: wrong
    res = evaluate_first_error(scorer, test, dev)
    # dev: d1 all right, d2 first error 1 (0.2); the best threshold is the midpoint 0.5 of 0.2 and 0.8
    assert res["threshold"] == pytest.approx(0.5) and res["dev"]["f1"] == 1.0
    # error_acc: t2 right, err wrong -> 1/2; correct_acc: t1 right, t3 wrong -> 1/2; F1 = 1/2
    assert (res["error_acc"], res["correct_acc"], res["f1"]) == (0.5, 0.5, 0.5)
    assert res["errors"] == 1 and res["scorer_kind"] == "process"


def test_outcome_scorer_on_step_rows_blames_the_last_step():
    @reward(name="test_outcome_scorer", register=False)
    def outcome(completion):
        return 1.0 if completion.endswith("good") else 0.0

    rows = [StepRow("p", ["x", "good"], [1, 1]), StepRow("q", ["x", "bad"], [1, 0]), StepRow("r", ["bad", "bad"], [0, 0])]
    scores, kind, _ = step_scores_of(outcome(), rows)
    assert kind == "outcome" and scores[1] == [math.inf, 0.0]
    res = evaluate_first_error(outcome(), rows, [], threshold=0.5)
    # predictions -1, 1, 1 against labels -1, 1, 0: correct_acc 1, error_acc 1/2 -> F1 = 2/3
    assert res["correct_acc"] == 1.0 and res["error_acc"] == 0.5 and res["f1"] == pytest.approx(2 / 3)
    assert res["threshold_from"] == "given"
