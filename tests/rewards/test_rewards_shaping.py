"""Shaping rules as pure functions and as config nodes, with hand-computed values."""

import math

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.rewards.shaping import (
    clip_steps,
    delta_steps,
    length_penalty,
    overlong_penalty,
    par_reward,
)
from rewardlab.types import RewardOutput

SIG1 = 1 / (1 + math.exp(-1))  # sigmoid(1) = 0.7310585786


SCORED: list[str] = []


@reward(name="field", register=False)
def field(completion, row, key="r", steps_key=None):
    """Test reward: row[key] (an "x" raises), step scores row[steps_key]."""
    SCORED.append(completion)
    if row[key] == "x":
        raise RuntimeError("broken")
    return RewardOutput(score=row[key], step_scores=row[steps_key] if steps_key else None,
                        components={"correct": float(row[key] >= 1)})


@reward(name="tenths", register=False)
def tenths(completion):
    """Test reward: a tenth of the completion's character count."""
    SCORED.append(completion)
    return len(completion) / 10


@pytest.fixture(autouse=True)
def _test_rewards():
    REWARDS.register("field")(field)
    REWARDS.register("tenths")(tenths)
    SCORED.clear()
    yield
    REWARDS.unregister("field")
    REWARDS.unregister("tenths")


# ---------------------------------------------------------------------------------------------- pure functions
def test_overlong_penalty_dapo_values():
    # L_max = 20, L_buf = 4: free up to 16 tokens, a linear ramp over 17..20, -1 beyond
    got = overlong_penalty([10, 16, 17, 18, 20, 21], max_len=20, buffer=4)
    assert got == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])  # (16-17)/4, (16-18)/4, (16-20)/4, -1
    assert overlong_penalty([18, 30], 20, 4, factor=0.5) == pytest.approx([-0.25, -0.5])  # 0.5 * -0.5, 0.5 * -1


@pytest.mark.parametrize("args", [(0, 4), (20, 0), (20, 21)])
def test_overlong_penalty_rejects_bad_settings(args):
    with pytest.raises(ValueError, match="overlong penalty: need max_len > 0, 0 < buffer <= max_len"):
        overlong_penalty([1], *args)


def test_length_penalty_values():
    assert length_penalty([5, 10, 25], coef=0.01, free_len=10) == pytest.approx([0.0, 0.0, -0.15])  # -0.01 * 15
    assert length_penalty([3], coef=0.5) == pytest.approx([-1.5])  # -0.5 * 3
    with pytest.raises(ValueError, match="coef and free_len must be >= 0"):
        length_penalty([1], coef=-1)


def test_par_reward_values():
    assert par_reward([1.0, 0.0], [0.0, 0.0]) == pytest.approx([SIG1, 0.5])  # sigmoid(1 - 0), sigmoid(0)
    # two references: (sigmoid(0.5 - 0.5) + sigmoid(0.5 - 1.5)) / 2 = (0.5 + 0.2689414214) / 2
    assert par_reward([0.5], [[0.5, 1.5]]) == pytest.approx([0.3844707107])
    assert par_reward([-800.0], [0.0])[0] == 0.0  # numerically stable far from the reference
    with pytest.raises(ValueError, match="par: 1 rewards but 2 references"):
        par_reward([1.0], [0.0, 0.0])


def test_clip_and_delta_steps():
    assert clip_steps([0.9, 0.3, 0.6], eta=0.5) == pytest.approx([0.0, -0.2, 0.0])  # min(0.4, 0), min(-0.2, 0), ...
    got = delta_steps([0.9, 0.3, 0.6])
    assert got == pytest.approx([0.6, -0.3, 0.6])  # 0.9 - 0.3, 0.3 - 0.6, last kept
    assert sum(got) == pytest.approx(0.9)  # the return telescopes to the first step's reward
    assert delta_steps([0.4]) == [0.4] and delta_steps([]) == []


# ---------------------------------------------------------------------------------------------- config nodes
def test_overlong_node_keeps_unshaped_and_components():
    built = build_reward([{"shape": "overlong", "reward": {"name": "field"}, "max_len": 20, "buffer": 4}])
    short, long = built([make_rollout(row={"r": 1.0}, n_tokens=10), make_rollout(row={"r": 1.0}, n_tokens=18)])
    assert short.score == 1.0 and short.components["unshaped"] == 1.0 and short.components["overlong_penalty"] == 0
    assert long.score == pytest.approx(0.5)  # 1.0 + (16 - 18) / 4
    assert long.components == pytest.approx({"field": 0.5, "correct": 1.0, "unshaped": 1.0,
                                             "overlong_penalty": -0.5})


def test_nested_shaping_keeps_the_innermost_unshaped_score():
    built = build_reward([{"shape": "length", "coef": 0.1, "free_len": 2,
                           "reward": {"shape": "overlong", "reward": "field", "max_len": 8, "buffer": 4}}])
    (out,) = built([make_rollout(row={"r": 1.0}, n_tokens=6)])
    # overlong: 1.0 + (4 - 6) / 4 = 0.5; length: 0.5 - 0.1 * (6 - 2) = 0.1
    assert out.score == pytest.approx(0.1)
    assert out.components["unshaped"] == 1.0  # before any shaping
    assert out.components["overlong_penalty"] == pytest.approx(-0.5)
    assert out.components["length_penalty"] == pytest.approx(-0.4)


def test_weighted_sum_combines_unshaped_scores():
    built = build_reward([
        {"shape": "overlong", "reward": "field", "max_len": 8, "buffer": 4, "weight": 2.0},
        {"name": "tenths", "weight": 1.0},
    ])
    (out,) = built([make_rollout("abcdef", row={"r": 1.0})])  # 6 tokens, 6 characters
    assert out.score == pytest.approx(1.6)  # 2 * (1.0 - 0.5) + 1 * 0.6
    assert out.components["unshaped"] == pytest.approx(2.6)  # 2 * 1.0 + 1 * 0.6
    assert out.components["field/unshaped"] == 1.0


def test_par_node_with_constant_and_row_field_references():
    built = build_reward([{"shape": "par", "reward": "field", "ref": 0.0}])
    assert built([make_rollout(row={"r": 1.0})])[0].score == pytest.approx(SIG1)
    built = build_reward([{"shape": "par", "reward": "field", "ref_field": "ref"}])
    a, b, missing = built([make_rollout(row={"r": 0.5, "ref": [0.5, 1.5]}), make_rollout(row={"r": 2.0, "ref": 1.0}),
                           make_rollout(row={"r": 1.0})])
    assert a.score == pytest.approx(0.3844707107) and a.components["par_ref"] == pytest.approx(1.0)  # mean ref
    assert b.score == pytest.approx(SIG1)  # sigmoid(2 - 1)
    assert missing.error == "par: the task row has no field 'ref'" and missing.components["unshaped"] == 1.0


def test_par_node_scores_reference_responses_with_the_same_reward_once_per_prompt():
    built = build_reward([{"shape": "par", "reward": "tenths", "ref_completion_field": "reference"}])
    row = {"reference": "abcde"}  # tenths("abcde") = 0.5
    outs = built([make_rollout("abcdefghij", row), make_rollout("abcde", row), make_rollout("", row)])
    # sigmoid(1.0 - 0.5), sigmoid(0.5 - 0.5), sigmoid(0.0 - 0.5)
    assert [o.score for o in outs] == pytest.approx([0.6224593312, 0.5, 0.3775406688])
    assert SCORED.count("abcde") == 2  # once as a rollout, once (not three times) as the shared reference


def test_par_node_with_a_separate_reference_reward():
    built = build_reward([{"shape": "par", "reward": "field", "ref_completion_field": "reference",
                           "ref_reward": {"name": "tenths"}}])
    (out,) = built([make_rollout("x", {"r": 1.0, "reference": "abcdefghij"})])  # reference: tenths = 1.0
    assert out.score == pytest.approx(0.5)  # sigmoid(1.0 - 1.0)


def test_clip_and_delta_nodes_transform_step_scores_only():
    spec = {"name": "field", "steps_key": "s"}
    row = {"r": 0.6, "s": [0.9, 0.3, 0.6]}
    (clipped,) = build_reward([{"shape": "clip", "reward": spec, "eta": 0.5}])([make_rollout(row=row)])
    assert clipped.step_scores == pytest.approx([0.0, -0.2, 0.0]) and clipped.score == 0.6
    (delta,) = build_reward([{"shape": "delta", "reward": spec}])([make_rollout(row=row)])
    assert delta.step_scores == pytest.approx([0.6, -0.3, 0.6]) and delta.score == 0.6
    # clip then delta, as Gao et al. combine them: delta([0, -0.2, 0]) = [0.2, -0.2, 0]
    (both,) = build_reward([{"shape": "delta", "reward": {"shape": "clip", "reward": spec, "eta": 0.5}}])(
        [make_rollout(row=row)])
    assert both.step_scores == pytest.approx([0.2, -0.2, 0.0])


def test_clip_on_an_outcome_reward_is_an_error():
    (out,) = build_reward([{"shape": "clip", "reward": "field", "eta": 0.5}])([make_rollout(row={"r": 1.0})])
    assert out.error == "clip: reward field gave no step_scores (clip transforms process rewards)"


def test_errors_pass_through_shaping_unchanged():
    (out,) = build_reward([{"shape": "overlong", "reward": "field", "max_len": 8, "buffer": 4}])(
        [make_rollout(row={"r": "x"})])
    assert out.error == "field: RuntimeError: broken" and "unshaped" not in out.components


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"shape": "overlong", "reward": "field", "max_len": 20},
         "rewards[0]: missing option 'buffer' for shaping 'overlong'"),
        ({"shape": "overlong", "reward": "field", "max_len": 20, "buffer": 40},
         "rewards[0] (shape: overlong): overlong penalty: need max_len > 0"),
        ({"shape": "overlong", "max_len": 20, "buffer": 4}, "rewards[0]: missing 'reward' (shape: overlong)"),
        ({"shape": "longness", "reward": "field"}, "rewards[0].shape: unknown shaping 'longness'; valid: clip, "
         "delta, length, overlong, par"),
        ({"shape": "length", "reward": "field", "coef": 0.1, "free": 3},
         "rewards[0]: unknown option 'free' for shaping 'length'; valid: coef, free_len"),
        ({"shape": "length", "reward": "field", "coef": "big"}, "rewards[0].coef: expected a number, got 'big'"),
        ({"shape": "par", "reward": "field", "ref": 0.0, "ref_field": "r"},
         "rewards[0] (shape: par): give exactly one of 'ref', 'ref_field' or 'ref_completion_field' (got ref, "
         "ref_field)"),
        ({"shape": "par", "reward": "field", "ref_field": "r", "ref_reward": "tenths"},
         "rewards[0] (shape: par): 'ref_reward' scores reference responses: it needs 'ref_completion_field'"),
        ({"shape": "par", "reward": "field", "ref_completion_field": "c", "ref_reward": {"name": "nope"}},
         "rewards[0].ref_reward.name: unknown reward 'nope'"),
        ({"shape": "clip", "reward": {"name": "nope"}, "eta": 0}, "rewards[0].reward.name: unknown reward 'nope'"),
    ],
)
def test_bad_shaping_specs(spec, message):
    with pytest.raises(ValueError) as info:
        build_reward([spec])
    assert str(info.value).startswith(message), str(info.value)
