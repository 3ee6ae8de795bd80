"""Selection rules pinned by hand: best-of-N ties, step-score aggregation, majority and weighted majority votes."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewardlab.rewards import build_reward
from rewardlab.search import (
    STEP_AGGREGATIONS,
    VerifierEquivalence,
    exact_equivalent,
    group_answers,
    majority_vote,
    math_equivalent,
    pick_best,
    solution_score,
    weighted_majority_vote,
)
from rewardlab.types import RewardOutput


# ---------------------------------------------------------------- best-of-N selection
def test_pick_best_takes_the_first_of_tied_maxima():
    # 0.9 occurs at indices 1 and 3: the first sample among the best wins.
    assert pick_best([0.2, 0.9, 0.1, 0.9]) == 1


def test_pick_best_of_constant_scores_is_the_first_sample():
    assert pick_best([0.5] * 7) == 0


def test_pick_best_never_prefers_a_failed_score():
    assert pick_best([-math.inf, 0.0, -math.inf]) == 1


def test_pick_best_rejects_no_candidates():
    with pytest.raises(ValueError, match="no candidates"):
        pick_best([])


@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=20))
def test_pick_best_is_the_first_argmax(scores):
    i = pick_best(scores)
    assert scores[i] == max(scores) and all(s < scores[i] for s in scores[:i])


# ---------------------------------------------------------------- aggregation
@pytest.mark.parametrize(
    "name, expected",
    [
        ("min", 0.25),  # min(0.5, 1.0, 0.25)
        ("last", 0.25),  # the last step
        ("prod", 0.125),  # 0.5 * 1.0 * 0.25
        ("mean", 0.5833333333333334),  # (0.5 + 1.0 + 0.25) / 3 = 1.75 / 3
    ],
)
def test_step_score_aggregations(name, expected):
    assert solution_score(RewardOutput(score=0.0, step_scores=[0.5, 1.0, 0.25]), name) == pytest.approx(expected)


def test_aggregations_are_the_four_of_search_and_learn():
    assert sorted(STEP_AGGREGATIONS) == ["last", "mean", "min", "prod"]


def test_outcome_scorer_uses_its_score_and_errors_are_minus_infinity():
    assert solution_score(RewardOutput(score=0.7), "min") == 0.7  # no step scores
    assert solution_score(RewardOutput(score=0.7, step_scores=[]), "min") == 0.7  # no steps: the outcome score
    assert solution_score(RewardOutput(score=0.0, error="r: boom"), "last") == -math.inf


def test_unknown_aggregation_names_the_key():
    with pytest.raises(ValueError, match="search.aggregate"):
        solution_score(RewardOutput(score=1.0, step_scores=[1.0]), "max")


# ---------------------------------------------------------------- equivalence
@pytest.mark.parametrize(
    "a, b, same",
    [("0.5", "1/2", True), ("1/2", "\\frac{1}{2}", True), ("5", "5.0", True), ("-3", "-3", True),
     ("0.5", "0.25", False), ("x", "x", True), ("x", "y", False), ("", "3", False)],
)
def test_math_equivalence(a, b, same):
    assert math_equivalent(a, b) is same


def test_exact_equivalence_ignores_only_surrounding_whitespace():
    assert exact_equivalent(" 5\n", "5") and not exact_equivalent("0.5", "1/2")


def test_verifier_equivalence_uses_the_tasks_normalizer():
    # reasoning-gym chain_sum's score_answer compares decimals: "+05" and "5.0" both read as 5.
    row = {"prompt": "2+3=", "answer": "5", "question": "State the final answer: 2 + 3 =",
           "metadata": {"expression": "2 + 3"}, "dataset": "chain_sum",
           "dataset_config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    same = VerifierEquivalence(build_reward("reasoning_gym"))
    assert same("+05", "5.0", row) and same("7", "7", row)
    assert not same("6", "5", row)


# ---------------------------------------------------------------- majority vote
def test_majority_groups_equivalent_answers_written_differently():
    # "0.5", "1/2" and "\frac{1}{2}" are one answer with 3 votes; "0.25" has 2.
    vote = majority_vote(["0.25", "0.5", "0.25", "1/2", "\\frac{1}{2}"])
    assert vote.groups == [[0, 2], [1, 3, 4]] and vote.totals == [2.0, 3.0]
    assert (vote.index, vote.answer, vote.support) == (1, "0.5", 3.0)


def test_majority_with_exact_equivalence_splits_them():
    # with exact text, "0.5" and "1/2" are two answers of 1 vote each: "0.25" (2 votes) wins.
    vote = majority_vote(["0.25", "0.5", "0.25", "1/2"], exact_equivalent)
    assert (vote.answer, vote.support) == ("0.25", 2.0)


def test_majority_tie_goes_to_the_answer_seen_first():
    # 7 and 3 have two votes each; 7 appeared first (index 0).
    vote = majority_vote(["7", "3", "3", "7", "1"])
    assert (vote.index, vote.answer, vote.totals) == (0, "7", [2.0, 2.0, 1.0])


def test_majority_of_one_answer():
    assert majority_vote(["42"]).index == 0


def test_vote_rejects_no_answers():
    with pytest.raises(ValueError, match="no answers"):
        majority_vote([])


def test_group_answers_compares_each_distinct_text_once():
    calls = []

    def same(a, b, row=None):
        calls.append((a, b))
        return a == b

    groups = group_answers(["1", "2", "1", "2", "1"], same)
    assert groups == [[0, 2, 4], [1, 3]]
    assert calls == [("2", "1")]  # "1" founds group 0; "2" is compared with "1" once; repeats are looked up


# ---------------------------------------------------------------- weighted majority vote
def test_weighted_majority_sums_scores_per_answer():
    # answers 5 (scores 0.2 + 0.3 + 0.1 = 0.6) and 1/2 ~ 0.5 (0.4 + 0.35 = 0.75): 0.5 wins against 3 votes for 5.
    vote = weighted_majority_vote(["5", "0.5", "5", "1/2", "5"], [0.2, 0.4, 0.3, 0.35, 0.1])
    assert vote.totals == pytest.approx([0.6, 0.75])
    assert (vote.index, vote.answer) == (1, "0.5")
    assert majority_vote(["5", "0.5", "5", "1/2", "5"]).answer == "5"  # unweighted, 5 wins 3 to 2


def test_weighted_majority_tie_goes_to_the_answer_seen_first():
    # 3: 0.5 + 0.25 = 0.75; 8: 0.75 -> tie, 3 appeared first.
    vote = weighted_majority_vote(["3", "8", "3"], [0.5, 0.75, 0.25])
    assert vote.totals == [0.75, 0.75] and vote.answer == "3"


def test_weighted_majority_counts_a_failed_score_as_zero():
    # 4: 0.5 + 0 (failed) = 0.5; 9: 0.4 -> 4.
    vote = weighted_majority_vote(["4", "9", "4"], [0.5, 0.4, -math.inf])
    assert vote.totals == [0.5, 0.4] and vote.answer == "4"


def test_weighted_majority_checks_lengths():
    with pytest.raises(ValueError, match="2 scores for 3 answers"):
        weighted_majority_vote(["1", "2", "3"], [0.1, 0.2])


@given(st.lists(st.sampled_from(["1", "2", "3"]), min_size=1, max_size=12))
def test_weighted_majority_with_equal_scores_is_majority(answers):
    assert weighted_majority_vote(answers, [0.5] * len(answers)).index == majority_vote(answers).index
