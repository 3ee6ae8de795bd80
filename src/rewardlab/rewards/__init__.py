"""The reward layer: `Reward` protocol, `@reward`, the `REWARDS` registry and `build_reward`."""

from rewardlab.rewards.base import (
    REWARDS,
    FunctionReward,
    Reward,
    RewardError,
    WeightedSum,
    build_reward,
    register_reward,
    reward,
)

# Registration imports (no other side effects).
from rewardlab.rewards import text as _text  # noqa: E402,F401
from rewardlab.rewards import reasoning_gym as _reasoning_gym  # noqa: E402,F401
# Reward models (issue 5): worked-solution verifier, reward_model and process_reward_model.
from rewardlab.rewards import worked as _worked  # noqa: E402,F401
from rewardlab.rewards import model as _model  # noqa: E402,F401

__all__ = [
    "REWARDS",
    "FunctionReward",
    "Reward",
    "RewardError",
    "WeightedSum",
    "build_reward",
    "register_reward",
    "reward",
]
