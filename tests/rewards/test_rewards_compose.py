"""Composition nodes (weighted sum, gated, tiered, penalty) with hand-computed values, and their config syntax."""

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_rollout
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards import REWARDS, GatedReward, PenaltyReward, TieredReward, WeightedSum, build_reward, reward
from rewardlab.rewards.compose import error_sources
from rewardlab.types import Rollout, RewardOutput

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rewards-compose.md"


#: completions each test reward was called with (to check lazy evaluation).
CALLS: dict[str, list[str]] = {}


@reward(name="field", register=False)
def field(completion, row, key, steps_key=None, correct_key=None):
    """Test reward: the score is row[key]; step_scores row[steps_key]; an `x` in row[key] raises."""
    CALLS.setdefault(key, []).append(completion)
    if row[key] == "x":
        raise RuntimeError(f"no {key}")
    comps = {"correct": row[correct_key]} if correct_key else {}
    return RewardOutput(score=row[key], components=comps, step_scores=row[steps_key] if steps_key else None)


@pytest.fixture(autouse=True)
def _field_reward():
    REWARDS.register("field")(field)
    CALLS.clear()
    yield
    REWARDS.unregister("field")


def F(key, **kw):
    return field(key=key, **kw)


# ---------------------------------------------------------------------------------------------- weighted sum
def test_compose_owns_build_reward_and_base_does_not_import_compose():
    import ast
    import inspect

    from rewardlab.rewards import base

    assert WeightedSum.__module__ == build_reward.__module__ == "rewardlab.rewards.compose"
    imported = {n.module for n in ast.walk(ast.parse(inspect.getsource(base))) if isinstance(n, ast.ImportFrom)}
    assert "rewardlab.rewards.compose" not in imported and not hasattr(base, "build_reward")


def test_weighted_sum_components_and_weighted_step_scores():
    ws = WeightedSum([(F("o"), 1.0), (F("p", steps_key="ps"), 0.5), (F("q", steps_key="qs"), 0.0)],
                     labels=["outcome", "prm", None])
    (out,) = ws([make_rollout(row={"o": 1.0, "p": 0.5, "ps": [0.2, 0.4], "q": 3.0, "qs": [9.0, 9.0]})])
    assert out.score == pytest.approx(1.25)  # 1 * 1.0 + 0.5 * 0.5 + 0 * 3.0
    assert out.components == {"outcome": 1.0, "prm": 0.5, "field": 3.0}
    # step scores: 0.5 * [0.2, 0.4] = [0.1, 0.2]; the zero-weight member (a logged metric) adds nothing
    assert out.step_scores == pytest.approx([0.1, 0.2])


def test_weighted_sum_step_scores_of_different_lengths_are_an_error():
    ws = WeightedSum([(F("p", steps_key="ps"), 1.0), (F("q", steps_key="qs"), 1.0)], labels=["a", "b"])
    (out,) = ws([make_rollout(row={"p": 0.0, "ps": [1.0], "q": 0.0, "qs": [1.0, 2.0]})])
    assert out.error == "reward: step_scores of b have 2 entries, another member's 1" and out.score == 0.0


def test_errors_of_several_members_are_joined_and_attributable():
    ws = WeightedSum([(F("o"), 1.0), (F("p"), 1.0)], labels=["a", "b"])
    (out,) = ws([make_rollout(row={"o": "x", "p": "x"})])
    assert out.error == "field: RuntimeError: no o; field: RuntimeError: no p"
    assert error_sources(out.error) == ["field", "field"]  # one entry per failed reward, for reward/errors/<name>
    assert error_sources("judge: HTTP 500 from http://h/v1/chat/completions: 'x' [3 attempts]") == ["judge"]
    assert error_sources(None) == []


# ---------------------------------------------------------------------------------------------- gated
def test_gated_posterior_grpo_process_reward_only_when_correct():
    gated = GatedReward(F("o"), F("p", steps_key="ps"), threshold=1.0, gate_weight=1.0, labels=("outcome", "prm"))
    two_steps = {"steps": [(0, 1), (1, 2)], "step_text": ["s", "s"]}
    correct = make_rollout("right", {"o": 1.0, "p": 0.6, "ps": [0.5, 0.7]}, **two_steps)
    wrong = make_rollout("wrong", {"o": 0.0, "p": 0.9, "ps": [0.9, 0.9]}, **two_steps)
    a, b = gated([correct, wrong])
    assert a.score == pytest.approx(1.6)  # 1.0 * gate 1.0 + process 0.6
    assert a.step_scores == [0.5, 0.7] and a.components == {"outcome": 1.0, "gate_open": 1.0, "prm": 0.6}
    assert b.score == 0.0  # 1.0 * gate 0.0 + nothing: the process reward does not count
    assert b.step_scores == [0.0, 0.0]  # one zero per marked step
    assert b.components == {"outcome": 0.0, "gate_open": 0.0}
    assert CALLS["p"] == ["right"]  # the gated reward was not even called for the wrong rollout


def test_gated_g_ra_threshold_tau_and_default_gate_weight():
    gated = GatedReward(F("o"), F("p"), threshold=0.5)
    at, below = gated([make_rollout(row={"o": 0.5, "p": 0.3}), make_rollout(row={"o": 0.49, "p": 0.3})])
    assert at.score == pytest.approx(0.3)  # 0.5 >= tau = 0.5: open; gate_weight 0, so only 0.3 counts
    assert below.score == 0.0 and below.step_scores is None  # closed, and no steps marked: no step scores


def test_gated_errors():
    gated = GatedReward(F("o"), F("p"), threshold=1.0)
    gate_err, inner_err, closed_inner_would_err = gated([
        make_rollout("g", {"o": "x", "p": 1.0}),
        make_rollout("i", {"o": 1.0, "p": "x"}),
        make_rollout("c", {"o": 0.0, "p": "x"}),
    ])
    assert gate_err.error == "field: RuntimeError: no o" and gate_err.score == 0.0
    assert inner_err.error == "field: RuntimeError: no p" and inner_err.score == 0.0
    assert closed_inner_would_err.error is None  # never scored by the gated reward, so nothing failed


# ---------------------------------------------------------------------------------------------- tiered
def _tiers():
    return TieredReward([F("fmt"), F("ok"), F("eff")], [1.0, 1.0], labels=["format", "correct", "efficiency"])


def test_tiered_bands():
    rows = [
        {"fmt": 0.5, "ok": 1.0, "eff": 1.0},  # stuck at tier 0: (0 + 0.5) / 3
        {"fmt": 1.0, "ok": 0.0, "eff": 1.0},  # stuck at tier 1: (1 + 0.0) / 3
        {"fmt": 1.0, "ok": 1.0, "eff": 0.6},  # reached tier 2: (2 + 0.6) / 3
        {"fmt": 1.0, "ok": 1.0, "eff": 1.0},  # (2 + 1) / 3
        {"fmt": 0.0, "ok": 1.0, "eff": 1.0},  # (0 + 0) / 3
    ]
    outs = _tiers()([make_rollout(str(i), r) for i, r in enumerate(rows)])
    assert [o.score for o in outs] == pytest.approx([0.5 / 3, 1 / 3, 2.6 / 3, 1.0, 0.0])
    assert [o.components["tier"] for o in outs] == [0.0, 1.0, 2.0, 2.0, 0.0]
    assert outs[0].components == {"format": 0.5, "tier": 0.0}  # lower tiers were not scored
    assert CALLS["ok"] == ["1", "2", "3"] and CALLS["eff"] == ["2", "3"]


def test_tiered_partial_threshold():
    tiers = TieredReward([F("fmt"), F("ok")], [0.8])
    a, b = tiers([make_rollout(row={"fmt": 0.8, "ok": 0.25}), make_rollout(row={"fmt": 0.7, "ok": 1.0})])
    assert a.score == pytest.approx(0.625)  # 0.8 >= 0.8 passes: (1 + 0.25) / 2
    assert b.score == pytest.approx(0.35)  # 0.7 < 0.8: (0 + 0.7) / 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 20).map(lambda k: k / 20), min_size=3, max_size=3), min_size=2, max_size=6),
       st.lists(st.integers(1, 20).map(lambda k: k / 20), min_size=2, max_size=2))
def test_tiered_order_is_lexicographic(rows, thresholds):
    """Sorting by score equals sorting by (tier reached, that tier's score): a lower tier never outweighs a higher.

    Scores on a grid of 1/20 so that distinct keys give scores distinguishable in floating point."""
    CALLS.clear()
    tiers = TieredReward([F("a"), F("b"), F("c")], thresholds)
    outs = tiers([make_rollout(row=dict(zip("abc", r))) for r in rows])

    def key(r):
        k = next((j for j in range(2) if r[j] < thresholds[j]), 2)
        return (k, r[k])

    for x, ox in zip(rows, outs):
        for y, oy in zip(rows, outs):
            if key(x) < key(y):
                assert ox.score < oy.score
            assert (ox.score == oy.score) == (key(x) == key(y))


def test_tiered_score_outside_unit_interval_is_an_error():
    (out,) = _tiers()([make_rollout(row={"fmt": 1.5, "ok": 1.0, "eff": 1.0})])
    assert out.error == "tiered: tier format scored 1.5, outside [0, 1]"


def test_tiered_validation():
    with pytest.raises(ValueError, match="needs at least 2 tiers"):
        TieredReward([F("a")], [])
    with pytest.raises(ValueError, match="tier 0 threshold must be in"):
        TieredReward([F("a"), F("b")], [1.5])


# ---------------------------------------------------------------------------------------------- penalty
def test_penalty_multiplies_factors():
    pen = PenaltyReward(F("r", steps_key="rs"), [F("p1"), F("p2")], labels=["completion", "collision", "speed"])
    (out,) = pen([make_rollout(row={"r": 0.8, "rs": [1.0, 0.5], "p1": 0.5, "p2": 0.9})])
    assert out.score == pytest.approx(0.36)  # 0.8 * 0.5 * 0.9
    assert out.components == pytest.approx({"completion": 0.8, "collision": 0.5, "speed": 0.9,
                                            "penalty_factor": 0.45})  # 0.5 * 0.9
    assert out.step_scores == pytest.approx([0.45, 0.225])  # [1.0, 0.5] * 0.45


def test_penalty_factor_outside_unit_interval_is_an_error():
    pen = PenaltyReward(F("r"), [F("p1")])
    (out,) = pen([make_rollout(row={"r": 1.0, "p1": 1.2})])
    assert out.error == "penalty: factor field#2 = 1.2 is outside [0, 1]" and out.score == 0.0


# ---------------------------------------------------------------------------------------------- config
def test_build_nested_config_and_components():
    built = build_reward([
        {"name": "field", "key": "o", "label": "outcome", "correct_key": "o"},
        {"compose": "gated", "gate": {"name": "field", "key": "o"}, "threshold": 1.0,
         "reward": {"compose": "penalty", "reward": {"name": "field", "key": "p"},
                    "penalties": [{"name": "field", "key": "f", "label": "brevity"}]},
         "weight": 0.5},
    ])
    (out,) = built([make_rollout(row={"o": 1.0, "p": 0.8, "f": 0.5})])
    assert out.score == pytest.approx(1.2)  # 1 * 1.0 + 0.5 * (gate open: 0.8 * 0.5)
    assert out.components == pytest.approx({
        "outcome": 1.0, "outcome/correct": 1.0, "correct": 1.0,
        "gated": 0.4, "gated/field": 1.0, "gated/gate_open": 1.0, "gated/penalty": 0.4,
        "gated/penalty/field": 0.8, "gated/penalty/brevity": 0.5, "gated/penalty/penalty_factor": 0.5,
    })


def test_plain_leaf_specs_unchanged():
    built = build_reward([{"name": "exact_match"}, {"name": "exact_match", "weight": 0.5, "case": False}])
    assert [w for _, w in built.members] == [1.0, 0.5] and built.labels == ["exact_match", "exact_match#2"]


@pytest.mark.parametrize(
    "specs, message",
    [
        ([{"name": "field", "key": "o"}, {"compose": "tiered", "tiers": [{"threshold": 1.0}, {"name": "field"}]}],
         "rewards[1].tiers[0]: missing 'name'"),
        ([{"compose": "gate"}],
         "rewards[0].compose: unknown composition 'gate'; valid: ensemble, gated, penalty, sum, tiered"),
        ([{"compose": "gated", "gate": "exact_match", "reward": "exact_match", "treshold": 1}],
         "rewards[0]: unknown option 'treshold' for composition 'gated'; valid: gate, gate_weight, reward, threshold"),
        ([{"compose": "gated", "reward": "exact_match"}], "rewards[0]: missing option 'gate' for composition 'gated'"),
        ([{"compose": "gated", "name": "x", "gate": "exact_match", "reward": "exact_match"}],
         "rewards[0]: give one of 'name' (a reward), 'compose' or 'shape', got name and compose"),
        ([{"compose": "gated", "gate": {"name": "exact_match", "weight": 2}, "reward": "exact_match"}],
         "rewards[0].gate.weight: a weight belongs to a member of a sum"),
        ([{"compose": "tiered", "tiers": ["exact_match", {"name": "exact_match", "threshold": 1.5}, "exact_match"]}],
         "rewards[0].tiers[1].threshold: must be in [0, 1]"),
        ([{"compose": "tiered", "tiers": ["exact_match"]}], "rewards[0].tiers: needs at least 2 tiers, got 1"),
        ([{"compose": "penalty", "reward": "exact_match", "penalties": ["exact_match", {"name": "nope"}]}],
         "rewards[0].penalties[1].name: unknown reward 'nope'; valid: "),
        ([{"compose": "penalty", "reward": "exact_match", "penalties": []}],
         "rewards[0].penalties: expected a non-empty list of reward specs, got []"),
        ([{"compose": "sum", "rewards": [{"name": "field", "key": "o", "kee": 1}]}],
         "rewards[0].rewards[0]: unknown option 'kee' for reward 'field'; valid: completion, correct_key, "
         "item_timeout, key, max_concurrency, row, steps_key, workers"),
        ([{"compose": "gated", "gate": "exact_match", "reward": "exact_match", "threshold": "high"}],
         "rewards[0].threshold: expected a number, got 'high'"),
        ([3], "rewards[0]: expected a reward spec (a mapping like {name: ...} or a name), got 3"),
        ([{"name": "exact_match", "label": ""}], "rewards[0].label: expected a non-empty string"),
    ],
)
def test_bad_specs_name_their_path(specs, message):
    with pytest.raises(ValueError) as info:
        build_reward(specs)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def _doc_yaml_blocks():
    """The raw text of every ```yaml block of docs/rewards-compose.md."""
    return re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)


def _leaf_names(node):
    if isinstance(node, dict):
        if "name" in node and not ({"compose", "shape"} & set(node)):
            yield node["name"]
        for v in node.values():
            yield from _leaf_names(v)
    elif isinstance(node, list):
        for v in node:
            yield from _leaf_names(v)


def test_docs_examples_build(monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", "test-key")
    blocks = [b for b in map(yaml.safe_load, _doc_yaml_blocks()) if isinstance(b, dict) and "rewards" in b]
    assert len(blocks) >= 6
    built = 0
    for block in blocks:
        missing = sorted(set(_leaf_names(block["rewards"])) - set(REWARDS))
        if missing:  # rewards of other modules (math, process_reward_model, ...) not in this checkout
            continue
        if {"reward_model", "process_reward_model"} & set(_leaf_names(block["rewards"])):
            continue  # these load trained weights from `path`; tests/test_rewards_model.py builds them on real ones
        assert isinstance(build_reward(block["rewards"]), WeightedSum)
        built += 1
    assert built >= 4


def test_docs_round_trip_tiered_example_scores_by_hand():
    """The docs' tiered example, built from its YAML, on rollouts whose parts are known."""
    (text,) = [b for b in _doc_yaml_blocks() if "# round trip" in b]
    built = build_reward(yaml.safe_load(text)["rewards"])
    row = {"answer": "Paris"}
    exact, loose, wrong = built([
        make_rollout("<answer>Paris</answer>", row),
        make_rollout("<answer>paris</answer>", row),
        make_rollout("<answer>Rome</answer>", row),
    ])
    # tiers, K = 2: loose (case-insensitive exact match, threshold 1) -> strict (exact match)
    assert exact.score == pytest.approx(1.0)  # (1 + 1) / 2
    assert loose.score == pytest.approx(0.5)  # (1 + 0) / 2
    assert wrong.score == pytest.approx(0.0)  # (0 + 0) / 2, strict not scored
    # one top-level member: its components stay bare ("loose", not "tiered/loose")
    assert loose.components["loose"] == 1.0 and loose.components["strict"] == 0.0 and loose.components["tier"] == 1
    assert "strict" not in wrong.components and wrong.components["tiered"] == 0.0


def test_train_config_with_composed_reward_validates_and_builds(tmp_path):
    cfg_file = tmp_path / "train.yaml"
    cfg_file.write_text(
        """
rewards:
  - {name: exact_match, weight: 1.0}
  - compose: gated
    gate: {name: exact_match}
    threshold: 1.0
    weight: 0.5
    reward:
      shape: overlong
      max_len: 8
      buffer: 4
      reward: {compose: penalty, reward: {name: exact_match, case: false}, penalties: [{name: exact_match}]}
on_error: skip
""",
        encoding="utf-8",
    )
    cfg = load_config(TrainConfig, cfg_file)
    built = build_reward(cfg.rewards, on_error=cfg.on_error)
    assert built.on_error == "skip" and built.labels == ["exact_match", "gated"]
    ids6 = list(range(6))
    r = Rollout(prompt="p", prompt_ids=[1], completion="7", completion_ids=ids6, logprobs=[0.0] * 6,
                row={"answer": "7"})
    (out,) = built([r])
    # exact 1.0 + 0.5 * (gate open: penalty 1.0 * 1.0 = 1.0, overlong L=6: (8-4-6)/4 = -0.5 -> 0.5) = 1.25
    assert out.score == pytest.approx(1.25)
    assert out.components["gated/penalty/overlong_penalty"] == pytest.approx(-0.5)
    assert out.components["gated/penalty/unshaped"] == 1.0  # shaped inside the gate: not re-derived at the top


# ---------------------------------------------------------------------------------------------- ensemble
def _ensemble_scores(reduce, lam=1.0):
    spec = {"compose": "ensemble", "reduce": reduce, "lam": lam,
            "members": [{"name": "field", "key": "a"}, {"name": "field", "key": "b"}, {"name": "field", "key": "c"}]}
    (out,) = build_reward([spec])([make_rollout("y", {"a": 0.2, "b": 0.8, "c": 0.5})])
    return out


@pytest.mark.parametrize("reduce, lam, expected", [
    ("mean", 1.0, 0.5),                         # (0.2 + 0.8 + 0.5) / 3
    ("min", 1.0, 0.2),                          # worst case
    ("mean_minus_var", 2.0, 0.5 - 2 * 0.06),    # var = (0.09 + 0.09 + 0) / 3 = 0.06 (population)
    ("mean_minus_std", 1.0, 0.5 - 0.06 ** 0.5),
    ("mean_minus_std", 0.0, 0.5),
])
def test_ensemble_reductions_on_hand_vectors(reduce, lam, expected):
    out = _ensemble_scores(reduce, lam)
    assert out.error is None and out.score == pytest.approx(expected)
    assert out.components["field"] == 0.2 and out.components["field#2"] == 0.8 and out.components["field#3"] == 0.5
    assert out.components["ensemble_mean"] == pytest.approx(0.5)
    assert out.components["ensemble_std"] == pytest.approx(0.06 ** 0.5)


def test_ensemble_step_scores_errors_and_validation():
    from rewardlab.rewards.compose import EnsembleReward

    row = {"a": 1.0, "b": 0.0, "sa": [1.0, 0.0], "sb": [0.0, 0.0], "sc": [1.0], "x": "x"}
    ens = EnsembleReward([F("a", steps_key="sa"), F("b", steps_key="sb")], reduce="min")
    (out,) = ens([make_rollout("y", row)])
    assert out.score == 0.0 and out.step_scores == [0.0, 0.0]
    (out,) = EnsembleReward([F("a", steps_key="sa"), F("b")])([make_rollout("y", row)])
    assert out.step_scores is None and out.score == 0.5  # not every member gives step scores
    (out,) = EnsembleReward([F("a", steps_key="sa"), F("b", steps_key="sc")])([make_rollout("y", row)])
    assert out.error and "different numbers of step scores" in out.error
    (out,) = EnsembleReward([F("a"), F("x")])([make_rollout("y", row)])
    assert out.score == 0.0 and "no x" in out.error and out.components["field"] == 1.0
    members = [{"name": "field", "key": "a"}, {"name": "field", "key": "b"}]
    for bad, message in [({"members": members[:1]}, r"rewards\[0\]\.members: an ensemble needs at least 2"),
                         ({"members": members, "reduce": "median"}, r"rewards\[0\]\.reduce: expected one of"),
                         ({"members": members, "lam": -1}, r"rewards\[0\]\.lam: must be >= 0"),
                         ({"members": members, "lam": "big"}, r"rewards\[0\]\.lam: expected a number"),
                         ({"members": members, "beta": 1}, "beta")]:
        with pytest.raises(ValueError, match=message):
            build_reward([{"compose": "ensemble", **bad}])
