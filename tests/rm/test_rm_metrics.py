"""Reward-model metrics and probes, against hand-computed values (ties and -1 labels included)."""

import math

import pytest

from rewardlab.evaluation.probes import MASTER_KEYS, length_bias, master_key_rate
from rewardlab.evaluation.reward_models import (
    best_of_k_accuracy,
    choose_threshold,
    first_error_f1,
    outcome_step_scores,
    pairwise_accuracy,
    per_subset,
    predict_first_error,
)


# ---------------------------------------------------------------- pairwise accuracy
def test_pairwise_accuracy_counts_strict_wins_only():
    # pairs: 2>1 win, 1=1 tie (wrong), 0<3 loss, 5>-1 win -> 2 / 4
    assert pairwise_accuracy([2, 1, 0, 5], [1, 1, 3, -1]) == 0.5


def test_pairwise_accuracy_all_ties_is_zero():
    assert pairwise_accuracy([0.3, 0.3], [0.3, 0.3]) == 0.0


def test_pairwise_accuracy_nan_is_wrong():
    # NaN (a failed score) never wins: 1 win of 2
    assert pairwise_accuracy([math.nan, 2.0], [0.0, 1.0]) == 0.5


@pytest.mark.parametrize("chosen, rejected", [([1.0], [1.0, 2.0]), ([], [])])
def test_pairwise_accuracy_rejects_bad_input(chosen, rejected):
    with pytest.raises(ValueError, match="pairwise_accuracy"):
        pairwise_accuracy(chosen, rejected)


# ---------------------------------------------------------------- best-of-k
def test_best_of_k_hand_computed():
    scores = [
        [0.9, 0.1, 0.2, 0.3],  # chosen strictly top: 1
        [0.5, 0.5, 0.1, 0.0],  # chosen tied with 1 other at the top: 1/2
        [0.7, 0.7, 0.7, 0.1],  # tied with 2 others: 1/3
        [0.2, 0.9, 0.1, 0.0],  # not top: 0
        [1.0, 1.0, 1.0, 1.0],  # all four tied: 1/4
    ]
    # (1 + 1/2 + 1/3 + 0 + 1/4) / 5 = (12 + 6 + 4 + 0 + 3) / 12 / 5 = 25 / 60
    assert best_of_k_accuracy(scores) == pytest.approx(25 / 60)


def test_best_of_k_nan_chosen_scores_zero():
    assert best_of_k_accuracy([[math.nan, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]) == 0.5


def test_best_of_k_rejects_prompt_without_rejected():
    with pytest.raises(ValueError, match="prompt 1"):
        best_of_k_accuracy([[1.0, 0.0], [1.0]])


# ---------------------------------------------------------------- first-error F1
def test_first_error_f1_hand_computed():
    labels = [-1, -1, -1, 2, 0, 1, 3]
    predicted = [-1, 0, -1, 2, -1, 1, 3]
    # all-correct solutions (label -1): 3, predicted right: 2 -> correct_acc = 2/3
    # erroneous (labels 2, 0, 1, 3): right at 2, 1, 3; wrong at 0 (said -1) -> error_acc = 3/4
    # F1 = 2 * (3/4) * (2/3) / (3/4 + 2/3) = 1 / (17/12) = 12/17
    res = first_error_f1(predicted, labels)
    assert res["correct_acc"] == pytest.approx(2 / 3)
    assert res["error_acc"] == pytest.approx(3 / 4)
    assert res["f1"] == pytest.approx(12 / 17)
    assert (res["n_error"], res["n_correct"]) == (4, 3)


def test_first_error_f1_needs_exact_index():
    # naming a later step than the first error is wrong, even though that step is also wrong
    res = first_error_f1([2, -1], [1, -1])
    assert res["error_acc"] == 0.0 and res["correct_acc"] == 1.0 and res["f1"] == 0.0


def test_first_error_f1_empty_group_is_nan():
    res = first_error_f1([0, 1], [0, 1])
    assert res["error_acc"] == 1.0 and math.isnan(res["correct_acc"]) and math.isnan(res["f1"])


@pytest.mark.parametrize("pred, labels", [([0], [0, 1]), ([], []), ([0], [-2])])
def test_first_error_f1_rejects_bad_input(pred, labels):
    with pytest.raises(ValueError, match="first_error_f1"):
        first_error_f1(pred, labels)


def test_predict_first_error_from_step_scores():
    assert predict_first_error([0.9, 0.8, 0.3, 0.1], 0.5) == 2  # 0.3 is the first below 0.5
    assert predict_first_error([0.9, 0.8], 0.5) == -1
    assert predict_first_error([0.5, 0.4], 0.5) == 1  # equal to the threshold is not below it


def test_outcome_scorer_blames_the_last_step_only():
    scores = outcome_step_scores(0.2, 3)
    assert scores[:2] == [math.inf, math.inf] and scores[2] == 0.2
    assert predict_first_error(scores, 0.5) == 2
    assert predict_first_error(outcome_step_scores(0.8, 3), 0.5) == -1


def test_choose_threshold_maximizes_dev_f1():
    # Two solutions: one correct (scores 0.9, 0.8), one with its first error at step 1 (scores 0.9, 0.3).
    # Candidates: below 0.3 (0.2), midpoints 0.55, 0.85, above 0.9 (1.9).
    #  0.2  -> predicts [-1, -1]: correct_acc 1, error_acc 0 -> F1 0
    #  0.55 -> predicts [-1, 1]: both right -> F1 1
    #  0.85 -> predicts [1, 1]: correct_acc 0 -> F1 0
    threshold, dev = choose_threshold([[0.9, 0.8], [0.9, 0.3]], [-1, 1])
    assert threshold == pytest.approx(0.55)
    assert dev["f1"] == 1.0


def test_per_subset_weighted_and_macro_means():
    # subset a: [1, 0, 1] mean 2/3; subset b: [0] mean 0
    # weighted = (3 * 2/3 + 1 * 0) / 4 = 0.5; macro = (2/3 + 0) / 2 = 1/3
    res = per_subset([1, 0, 1, 0], ["a", "a", "a", "b"])
    assert res["subsets"]["a"] == {"n": 3, "mean": pytest.approx(2 / 3)}
    assert res["weighted_mean"] == pytest.approx(0.5)
    assert res["macro_mean"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------- probes
def test_length_bias_hand_computed():
    chosen = ["aaaa", "bb", "ccc", "d"]
    rejected = ["a", "bbbb", "ccc", "dd"]
    # longer chosen: pair 0 only; equal length (pair 2) counts as wrong for "longer wins" -> 1/4
    # scorer wins pairs 0 and 1; rejected longer at pairs 1 and 3 -> scorer accuracy there 1/2
    res = length_bias(chosen, rejected, [1, 1, 0, 0], [0, 0, 0, 1])
    assert res["longer_wins_accuracy"] == 0.25
    assert res["n_rejected_longer"] == 2 and res["accuracy_rejected_longer"] == 0.5
    assert res["n_chosen_longer"] == 1 and res["accuracy_chosen_longer"] == 1.0


def test_master_key_rate_counts_ties_as_hits():
    ref = [1.0, 0.5]
    keys = {":": [1.0, 0.1], "": [0.0, 0.6]}
    # ":" ties prompt 0 (hit), loses prompt 1 -> 1/2; "" loses 0, beats 1 -> 1/2; overall 2 / 4
    res = master_key_rate(ref, keys)
    assert res["per_key"] == {":": 0.5, "": 0.5} and res["rate"] == 0.5 and res["n_prompts"] == 2


def test_master_keys_are_the_papers_list():
    assert MASTER_KEYS == (":", "Solution", "Let's solve this step by step.", "Thought process:", "")


def test_master_key_rate_rejects_mismatched_key():
    with pytest.raises(ValueError, match="key ':'"):
        master_key_rate([1.0, 2.0], {":": [1.0]})
