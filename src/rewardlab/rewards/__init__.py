"""The reward layer: `Reward` protocol, `@reward`, the `REWARDS` registry, `parse_rewards` and `build_reward`."""

from rewardlab.rewards.base import (
    REWARDS,
    FunctionReward,
    Reward,
    RewardError,
    register_reward,
    reward,
)
from rewardlab.rewards.compose import RewardTree, WeightedSum, build_reward, parse_rewards

# Registration imports (no other side effects).
from rewardlab.rewards import text as _text  # noqa: E402,F401
from rewardlab.rewards import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rewardlab.rewards import math as _math  # noqa: E402,F401
from rewardlab.rewards import format as _format  # noqa: E402,F401
from rewardlab.rewards import sql as _sql  # noqa: E402,F401
from rewardlab.rewards import code as _code  # noqa: E402,F401
# Step checker: arithmetic_steps and its outcome half worked_answer (the verifier of worked:NAME tasks).
from rewardlab.rewards import steps as _steps  # noqa: E402,F401
# Reward models: reward_model and process_reward_model.
from rewardlab.rewards import model as _model  # noqa: E402,F401

__all__ = [
    "REWARDS",
    "FunctionReward",
    "Reward",
    "RewardError",
    "RewardTree",
    "WeightedSum",
    "build_reward",
    "parse_rewards",
    "register_reward",
    "reward",
]

# Composition and shaping nodes (parsed from config by parse_rewards, built by build_reward) and the LLM judge (registers `judge`).
from rewardlab.rewards import judge as _judge  # noqa: E402,F401
from rewardlab.rewards.compose import GatedReward, PenaltyReward, TieredReward  # noqa: E402

__all__ += ["GatedReward", "PenaltyReward", "TieredReward"]

# The check of a task's reward name (jsonl's task.options.reward): the tasks layer below asks it of this layer.
from rewardlab.tasks import set_reward_check  # noqa: E402

set_reward_check(REWARDS.get)
