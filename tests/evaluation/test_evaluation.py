"""Policy evaluation: the unbiased pass@k estimator and `evaluate_policy` on the tiny model."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardlab.evaluation.policy import EvalSettings, evaluate_policy, pass_at_k

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards import reward
from rewardlab.types import RewardOutput


# ---------------------------------------------------------------- pass@k
def test_pass_at_1_is_fraction_correct():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 2 / 5


def test_pass_at_2_hand_computed():
    # 1 - C(3, 2) / C(5, 2) = 1 - 3 / 10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)


def test_pass_at_k_no_correct_is_zero():
    assert pass_at_k(8, 0, 4) == 0.0


def test_pass_at_k_too_few_wrong_is_one():
    assert pass_at_k(5, 4, 2) == 1.0  # n - c = 1 < k = 2: any 2 samples include a correct one
    assert pass_at_k(5, 5, 1) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (0, 0, 1)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_pass_at_k_matches_binomial_formula(data):
    n = data.draw(st.integers(1, 60))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-9)


# ---------------------------------------------------------------- RewardOutput.correct
def test_correct_uses_correct_component_then_score():
    assert RewardOutput(score=1.0).correct
    assert not RewardOutput(score=0.5).correct
    assert not RewardOutput(score=1.0, components={"correct": 0.0}).correct
    assert RewardOutput(score=0.2, components={"correct": 1.0}).correct
    assert not RewardOutput(score=1.0, error="r: boom").correct


# ---------------------------------------------------------------- evaluate_policy
@reward(register=False)
def _always(completion):
    return 1.0


@reward(register=False)
def _never(completion):
    return 0.0


@reward(register=False)
def _prompt_starts_with_a(prompt):
    return float(prompt.startswith("a"))


ROWS = [{"prompt": "a1", "answer": "x"}, {"prompt": "b2", "answer": "y"}, {"prompt": "a3", "answer": "z"}]


def test_evaluate_all_correct(tiny_policy):
    result = evaluate_policy(tiny_policy, ROWS, _always(), SamplingSettings(max_new_tokens=3),
                             settings=EvalSettings(n=4, ks=(1, 4)))
    assert result["accuracy"] == 1.0 and result["score_mean"] == 1.0
    assert result["pass@1"] == 1.0 and result["pass@4"] == 1.0
    assert result["n_questions"] == 3 and result["samples_per_question"] == 4 and result["errors"] == 0
    assert [e["prompt"] for e in result["examples"]] == ["a1", "b2", "a3"]
    assert [e["answer"] for e in result["examples"]] == ["x", "y", "z"]


def test_evaluate_none_correct(tiny_policy):
    result = evaluate_policy(tiny_policy, ROWS, _never(), SamplingSettings(max_new_tokens=3),
                             settings=EvalSettings(n=2, ks=(1, 2)))
    assert (result["accuracy"], result["pass@1"], result["pass@2"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("batch_size", [1, 2, 256])
def test_evaluate_counts_per_question(tiny_policy, batch_size):
    # questions a1 and a3 are always right, b2 never: accuracy 2/3; pass@k = (1 + 0 + 1) / 3 for every k.
    result = evaluate_policy(tiny_policy, ROWS, _prompt_starts_with_a(), SamplingSettings(max_new_tokens=2),
                             settings=EvalSettings(n=3, ks=(1, 3), batch_size=batch_size))
    assert result["accuracy"] == pytest.approx(2 / 3)
    assert result["pass@1"] == pytest.approx(2 / 3) and result["pass@3"] == pytest.approx(2 / 3)
    assert [e["correct"] for e in result["examples"]] == [True, False, True]


def test_evaluate_rejects_bad_k_and_no_rows(tiny_policy):
    with pytest.raises(ValueError, match="eval.k"):
        evaluate_policy(tiny_policy, ROWS, _always(), SamplingSettings(max_new_tokens=8),
                        settings=EvalSettings(n=2, ks=(1, 4)))
    with pytest.raises(ValueError, match="no rows"):
        evaluate_policy(tiny_policy, [], _always(), SamplingSettings(max_new_tokens=8),
                        settings=EvalSettings(n=2, ks=(1,)))
