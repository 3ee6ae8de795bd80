"""`rewards.compose.component_weights`: the (label, weight) pairs GDPO decouples, and the trainer's GDPO inputs built
from them."""

from types import SimpleNamespace

import pytest
import torch

from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.rewards.compose import PenaltyReward, component_weights
from rewardlab.rl.credit import ESTIMATOR_INPUTS, CreditView
from rewardlab.types import Rollout

if "test_cw_length" not in REWARDS:

    @reward(name="test_cw_length")
    def _length(completion):
        """The completion's length in characters."""
        return float(len(completion))

if "test_cw_half" not in REWARDS:

    @reward(name="test_cw_half")
    def _half(completion):
        """0.5 for every completion."""
        return 0.5


def _rollouts(*texts):
    return [Rollout(prompt="p", prompt_ids=[], completion=t, completion_ids=[], logprobs=[], row={}) for t in texts]


def test_a_weighted_sum_gives_its_labels_and_weights_in_member_order():
    built = build_reward([{"name": "test_cw_length"}, {"name": "test_cw_length", "weight": 0.5},
                          {"name": "test_cw_half", "weight": -2}])
    assert component_weights(built) == [("test_cw_length", 1.0), ("test_cw_length#2", 0.5), ("test_cw_half", -2.0)]


def test_any_other_reward_is_one_component_of_weight_one():
    single = build_reward("test_cw_length").members[0][0]
    assert component_weights(single) == [("test_cw_length", 1.0)]
    # a product is not a sum: one component under the reward's own name
    assert component_weights(PenaltyReward(single, [single], name="pen")) == [("pen", 1.0)]


def _components(reward, outputs):
    """GDPO's inputs as the trainer's provider of `components` (and `weights`) computes them."""
    view = CreditView(SimpleNamespace(reward=reward), [], [], outputs, torch.zeros(0), None)
    assert ESTIMATOR_INPUTS["components"] is ESTIMATOR_INPUTS["weights"]  # one provider, run once
    return ESTIMATOR_INPUTS["components"](view).inputs


def test_gdpo_inputs_are_the_members_scores_and_weights():
    built = build_reward([{"name": "test_cw_length"}, {"name": "test_cw_half", "weight": 0.25}])
    outs = built(_rollouts("ab", "abcd"))
    got = _components(built, outs)
    # columns: length (2, 4) and the constant 0.5; weights 1 and 0.25
    assert got["components"].tolist() == [[2.0, 0.5], [4.0, 0.5]]
    assert got["weights"].tolist() == [1.0, 0.25] and got["weights"].dtype == torch.float32


def test_gdpo_inputs_of_a_single_reward_are_its_score():
    single = build_reward("test_cw_length").members[0][0]
    got = _components(single, single(_rollouts("abc")))
    assert got["components"].tolist() == [[3.0]] and got["weights"].tolist() == [pytest.approx(1.0)]
