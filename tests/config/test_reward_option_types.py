"""Every reward option's value is checked against its annotation when the config is checked, before a run starts."""

import inspect
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES
from rewardlab.config import load_config
from rewardlab.config.schema import TrainConfig
from rewardlab.registry import option_annotations
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.compose import COMPOSITIONS, parse_rewards
from rewardlab.rewards.shaping import SHAPINGS


class _NoType:
    """A value no annotation accepts (not a number, string, bool, sequence or mapping)."""

    def __repr__(self) -> str:
        return "<no type>"


def _required(registry, name):
    """Placeholder values for the options an entry requires (none of them is the option under test)."""
    params = inspect.signature(registry[name]).parameters
    placeholders = {"rewards": ["exact_match"], "tiers": ["exact_match", "exact_match"], "gate": "exact_match",
                    "reward": "exact_match", "penalties": ["exact_match"], "members": ["exact_match", "exact_match"],
                    "path": "some/model", "coef": 0.1,
                    "max_len": 8, "buffer": 2, "eta": 0.5}
    declared = registry.options(name) or ()
    return {k: placeholders[k] for k in declared if params[k].default is inspect.Parameter.empty}


def _typed_options():
    cases = []
    for registry, key in ((REWARDS, "name"), (COMPOSITIONS, "compose"), (SHAPINGS, "shape")):
        for name in list(registry):
            declared = registry.options(name) or ()
            for option in option_annotations(registry[name]):
                if option in declared and option != key:  # `name` is the spec's own key, not an option
                    cases.append((registry.kind, key, name, option))
    return cases


TYPED = _typed_options()


def test_every_registered_reward_composition_and_shaping_has_typed_options():
    kinds = {(kind, name) for kind, _, name, _ in TYPED}
    assert {("reward", "numeric"), ("reward", "exact_match"), ("composition", "gated"), ("shaping", "overlong"),
            ("reward", "judge"), ("reward", "code")} <= kinds
    assert len(TYPED) > 80  # e.g. numeric: completion, abs_tol, rel_tol, extract, max_concurrency, workers, ...


@pytest.mark.parametrize("kind, key, name, option", TYPED, ids=[f"{c[2]}.{c[3]}" for c in TYPED])
def test_a_value_of_the_wrong_type_names_its_path(kind, key, name, option):
    registry = {"reward": REWARDS, "composition": COMPOSITIONS, "shaping": SHAPINGS}[kind]
    spec = {key: name, **_required(registry, name), option: _NoType()}
    if key == "shape":
        spec["reward"] = "exact_match"
    with pytest.raises(ValueError) as err:
        parse_rewards([{"compose": "sum", "rewards": ["exact_match", spec]}])
    assert str(err.value).startswith(f"rewards[0].rewards[1].{option}: expected ")
    assert str(err.value).endswith("got <no type>")


@pytest.mark.parametrize("spec, message", [
    ({"name": "numeric", "rel_tol": "abc"}, "rewards[0].rel_tol: expected a number, got 'abc'"),
    ({"name": "numeric", "rel_tol": True}, "rewards[0].rel_tol: expected a number, got True"),
    ({"name": "exact_match", "case": "maybe"}, "rewards[0].case: expected true or false, got 'maybe'"),
    ({"name": "chrf", "char_order": 2.5}, "rewards[0].char_order: expected an integer, got 2.5"),
    ({"name": "exact_match", "workers": 0},
     "rewards[0].workers: expected an integer, got 0 (input should be greater than or equal to 1)"),
    ({"compose": "gated", "gate": "exact_match", "reward": {"name": "numeric", "abs_tol": [1]}},
     "rewards[0].reward.abs_tol: expected a number, got [1]"),
    ({"shape": "par", "reward": "exact_match", "ref": "high"}, "rewards[0].ref: expected a number or null, got 'high'"),
])
def test_wrong_types_are_one_line_errors(spec, message):
    with pytest.raises(ValueError) as err:
        parse_rewards([spec])
    assert str(err.value) == message


def test_values_are_read_as_their_annotation_says():
    # YAML 1.1 reads 1e-3 as a string; the option is a float, so it is read as one (not passed on as text).
    built = build_reward([{"name": "numeric", "rel_tol": "1e-3", "abs_tol": 0}])
    numeric = built.members[0][0]
    assert numeric.options["rel_tol"] == 0.001 and isinstance(numeric.options["abs_tol"], float)
    # from Python, a pathlib.Path is accepted where a str path is annotated, and passed on as that str
    assert REWARDS.validate("reward_model", {"path": Path("runs/rm")}) == {"path": "runs/rm"}


def test_a_bad_option_type_fails_in_setup_before_the_run_directory_exists(tmp_path):
    from rewardlab.rl.trainer import setup

    out = tmp_path / "run"
    cfg = load_config(TrainConfig, overrides=[*TINY_OVERRIDES, f"out={out}", "rl.steps=1",
                                              "rewards=[{name: numeric, rel_tol: abc}]"])
    with pytest.raises(ValueError, match=r"^rewards\[0\]\.rel_tol: expected a number, got 'abc'$"):
        setup(cfg)
    assert not out.exists()


def test_bare_names_in_the_rewards_list_load():
    cfg = load_config(TrainConfig, overrides=["rewards=[exact_match, numeric]"])
    assert cfg.rewards == ["exact_match", "numeric"]
    assert build_reward(cfg.rewards).labels == ["exact_match", "numeric"]
