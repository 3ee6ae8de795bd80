"""A `rewards:` spec tree is checked whole before any leaf reward is constructed (a reward model would load)."""

import pytest

from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.compose import check_specs
from rewardlab.types import RewardOutput

BUILT: list[dict] = []


class Expensive:
    """Test reward standing in for a reward model: constructing it is the costly part, so it is recorded."""

    name = "expensive"

    def __init__(self, path: str, scale: float = 1.0) -> None:
        BUILT.append({"path": path, "scale": scale})
        self.scale = scale

    def __call__(self, rollouts):
        return [RewardOutput(score=self.scale) for _ in rollouts]


@pytest.fixture(autouse=True)
def _expensive():
    REWARDS.register("expensive")(Expensive)
    BUILT.clear()
    yield
    REWARDS.unregister("expensive")


@pytest.mark.parametrize("specs, message", [
    ([{"name": "expensive", "path": "m"}, {"name": "exact_match", "casee": False}],
     "rewards[1]: unknown option 'casee' for reward 'exact_match'"),
    ([{"name": "expensive", "path": "m"}, {"compose": "gated", "gate": "exact_match",
                                           "reward": {"name": "expensive", "path": "m", "scal": 2}}],
     "rewards[1].reward: unknown option 'scal' for reward 'expensive'; valid: path, scale"),
    ([{"name": "expensive", "path": "m"}, {"shape": "length", "reward": "exact_match", "coef": -1.0}],
     "rewards[1] (shape: length): length penalty: coef and free_len must be >= 0"),
    ([{"name": "expensive", "path": "m"}, {"name": "expensive"}],
     "rewards[1]: missing option 'path' for reward 'expensive'"),
])
def test_a_bad_spec_anywhere_is_reported_before_any_reward_is_built(specs, message):
    with pytest.raises(ValueError) as err:
        build_reward(specs)
    assert str(err.value).startswith(message)
    assert BUILT == []  # the first, valid reward was not constructed either


def test_check_specs_constructs_nothing_and_build_constructs_each_leaf_once():
    specs = [{"name": "expensive", "path": "m", "scale": 2.0, "weight": 0.5}, "exact_match"]
    check_specs(specs)
    assert BUILT == []
    built = build_reward(specs)
    assert BUILT == [{"path": "m", "scale": 2.0}]
    assert built.labels == ["expensive", "exact_match"] and [w for _, w in built.members] == [0.5, 1.0]
