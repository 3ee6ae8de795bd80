"""The README's shaping example: a weight on the reward a shaping wraps scales that reward (0: logged only)."""

import pytest

from conftest import make_rollout
from rewardlab.rewards import build_reward
from rewardlab.rewards.compose import parse_rewards

README_OVERLONG = {"shape": "overlong", "reward": {"name": "exact_match", "weight": 0}, "max_len": 4, "buffer": 2,
                   "factor": 1.0}


def test_weight_zero_inside_a_shaping_leaves_the_penalty_alone_and_logs_the_reward():
    built = build_reward([README_OVERLONG])
    row = {"answer": "ab"}
    # 2, 3 and 5 tokens: start of the ramp = max_len - buffer = 2; penalty 0, (2 - 3)/2 = -0.5, and -1 past max_len.
    short, ramp, over = built([make_rollout("ab", row), make_rollout("abc", row), make_rollout("abcde", row)])
    assert (short.score, ramp.score, over.score) == (0.0, -0.5, -1.0)  # 0 * exact_match + penalty
    # exact_match is still scored and logged (one top-level member: its components are bare)
    assert short.components["exact_match"] == 1.0 and ramp.components["exact_match"] == 0.0
    assert short.components["correct"] == 1.0 and ramp.components["correct"] == 0.0
    assert short.components["overlong_penalty"] == 0.0 and ramp.components["overlong_penalty"] == -0.5
    assert short.components["unshaped"] == 0.0  # the weighted reward before the penalty: 0 * 1


def test_as_a_member_of_the_readme_list_the_node_adds_only_the_penalty():
    built = build_reward([{"name": "exact_match", "weight": 1.0}, {**README_OVERLONG, "label": "overlong"}])
    (ramp,) = built([make_rollout("abc", {"answer": "abc"})])
    assert ramp.score == pytest.approx(1.0 - 0.5)  # exact_match once (weight 1), not twice; the penalty -0.5
    assert ramp.components["overlong"] == -0.5 and ramp.components["overlong/exact_match"] == 1.0
    assert ramp.components["unshaped"] == 1.0  # 1 * 1 + 1 * (0 * 1): the penalty is the only shaping


def test_a_nonzero_weight_scales_the_shaped_reward_before_the_penalty():
    spec = {**README_OVERLONG, "reward": {"name": "exact_match", "weight": 0.5}}
    (ramp,) = build_reward([spec])([make_rollout("abc", {"answer": "abc"})])
    assert ramp.score == pytest.approx(0.5 * 1.0 - 0.5)
    assert ramp.components["unshaped"] == 0.5


def test_a_weight_outside_a_sum_or_a_shaping_is_still_refused():
    with pytest.raises(ValueError, match=r"^rewards\[0\]\.gate\.weight: a weight belongs to a member of a sum"):
        parse_rewards([{"compose": "gated", "gate": {"name": "exact_match", "weight": 0}, "reward": "exact_match"}])
    with pytest.raises(ValueError, match=r"^rewards\[0\]\.reward\.weight: expected a number, got 'none'$"):
        parse_rewards([{**README_OVERLONG, "reward": {"name": "exact_match", "weight": "none"}}])
