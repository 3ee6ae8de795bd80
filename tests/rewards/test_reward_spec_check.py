"""A `rewards:` config is parsed whole into a frozen `RewardTree` (every check, nothing constructed), then built from
that tree (every leaf constructed once, nothing checked again)."""

import dataclasses
import textwrap

import pytest

from conftest import make_rollout
from rewardlab.registry import Registry
from rewardlab.rewards import REWARDS, RewardTree, build_reward, parse_rewards, reward
from rewardlab.rewards.compose import ComposeSpec, LeafSpec, ShapeSpec, WeightedSum
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


class Counted:
    """Test reward: score = scale * row[key], component `len` = the completion's length; each construction is
    recorded. Its built name, "counted_<key>", is not its registered name (labels come from the built reward)."""

    def __init__(self, key: str, scale: float = 1.0) -> None:
        BUILT.append({"key": key, "scale": scale})
        self.name = f"counted_{key}"
        self.key, self.scale = key, scale

    def __call__(self, rollouts):
        return [RewardOutput(score=self.scale * r.row[self.key], components={"len": float(len(r.completion))})
                for r in rollouts]


@reward(name="metric_only", weight=0.0, register=False)
def metric_only(completion):
    """Test reward with default weight 0 (a logged metric)."""
    return float(len(completion))


@pytest.fixture(autouse=True)
def _test_rewards():
    REWARDS.register("expensive")(Expensive)
    REWARDS.register("counted")(Counted)
    REWARDS.register("metric_only")(metric_only)
    BUILT.clear()
    yield
    for name in ("expensive", "counted", "metric_only"):
        REWARDS.unregister(name)


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
    for parse_or_build in (parse_rewards, build_reward):
        with pytest.raises(ValueError) as err:
            parse_or_build(specs)
        assert str(err.value).startswith(message)
        assert BUILT == []  # the first, valid reward was not constructed either


@pytest.mark.parametrize("specs, message", [
    ([{"shape": "overlong", "reward": "exact_match", "max_len": 8, "buffer": 9}],
     "rewards[0] (shape: overlong): overlong penalty: need max_len > 0, 0 < buffer <= max_len and factor >= 0; got "
     "max_len=8.0, buffer=9.0, factor=1.0"),
    ([{"shape": "par", "reward": "exact_match", "ref": 0.5, "ref_field": "r"}],
     "rewards[0] (shape: par): give exactly one of 'ref', 'ref_field' or 'ref_completion_field' (got ref, ref_field)"),
    ([{"shape": "par", "reward": "exact_match", "ref": 0.5, "ref_reward": "exact_match"}],
     "rewards[0] (shape: par): 'ref_reward' scores reference responses: it needs 'ref_completion_field'"),
    ([{"shape": "par", "reward": "exact_match", "ref_completion_field": "r", "ref_reward": {"name": "nope"}}],
     "rewards[0].ref_reward.name: unknown reward 'nope'"),
    ("exact_match", None),
])
def test_the_shapings_own_checks_run_in_the_parse(specs, message):
    if message is None:
        assert isinstance(parse_rewards(specs), RewardTree)
        return
    with pytest.raises(ValueError) as err:
        parse_rewards(specs)
    assert str(err.value).startswith(message)


def test_parse_constructs_nothing_and_build_constructs_each_leaf_once():
    specs = [{"name": "expensive", "path": "m", "scale": 2.0, "weight": 0.5}, "exact_match"]
    tree = parse_rewards(specs)
    assert BUILT == []
    built = build_reward(tree)
    assert BUILT == [{"path": "m", "scale": 2.0}]
    assert built.labels == ["expensive", "exact_match"] and [w for _, w in built.members] == [0.5, 1.0]
    build_reward(tree)  # a tree builds again: a fresh reward, each leaf constructed once more
    assert len(BUILT) == 2


def test_the_parsed_tree_is_typed_frozen_and_holds_the_read_option_values():
    tree = parse_rewards([
        {"name": "counted", "key": "a", "scale": "1e-3", "label": "A"},  # YAML 1.1 reads 1e-3 as a string
        "metric_only",
        {"compose": "gated", "gate": "exact_match", "reward": {"name": "counted", "key": "b"}, "gate_weight": 0.5,
         "weight": 2},
        {"shape": "overlong", "reward": {"name": "exact_match", "weight": 0}, "max_len": 8, "buffer": 4},
    ], on_error="skip")
    assert tree.on_error == "skip" and tree.weights == (1.0, 0.0, 2.0, 1.0)
    leaf, metric, gated, shaped = tree.members
    assert leaf == LeafSpec("counted", {"key": "a", "scale": 0.001}, "A", "rewards[0]")
    assert metric == LeafSpec("metric_only", {}, None, "rewards[1]")
    assert isinstance(gated, ComposeSpec) and gated.kind == "gated" and gated.label is None
    assert gated.children == (LeafSpec("exact_match", {}, None, "rewards[2].gate"),
                              LeafSpec("counted", {"key": "b"}, None, "rewards[2].reward"))
    assert dict(gated.options) == {"threshold": 1.0, "gate_weight": 0.5}
    assert isinstance(shaped, ShapeSpec) and (shaped.kind, shaped.weight) == ("overlong", 0.0)
    assert shaped.reward == LeafSpec("exact_match", {}, None, "rewards[3].reward")
    assert dict(shaped.options) == {"max_len": 8, "buffer": 4}
    with pytest.raises(dataclasses.FrozenInstanceError):
        leaf.label = "B"
    with pytest.raises(TypeError):
        leaf.options["scale"] = 2.0
    assert BUILT == []


def _count_validate(monkeypatch) -> list[str]:
    calls: list[str] = []
    validate = Registry.validate

    def counting(self, name, options, **kw):
        calls.append(f"{self.kind} {name}")
        return validate(self, name, options, **kw)

    monkeypatch.setattr(Registry, "validate", counting)
    return calls


#: A tree with every node kind: 18 nodes (6 compositions and shapings, 12 leaves, one of them PAR's ref_reward).
TREE = [
    {"name": "counted", "key": "a", "weight": 0.5, "label": "A"},
    {"compose": "gated", "gate": {"name": "counted", "key": "a"}, "reward": {"name": "counted", "key": "b"},
     "threshold": 0.5, "gate_weight": 0.25},
    {"compose": "tiered",
     "tiers": [{"name": "counted", "key": "a", "threshold": 0.5}, {"name": "counted", "key": "b"}]},
    {"compose": "penalty", "reward": {"name": "counted", "key": "b"}, "penalties": [{"name": "counted", "key": "a"}],
     "label": "pen"},
    {"shape": "overlong", "reward": {"name": "counted", "key": "a", "weight": 0}, "max_len": 8, "buffer": 4},
    {"shape": "par", "reward": {"name": "counted", "key": "b"}, "ref_completion_field": "ref",
     "ref_reward": {"name": "counted", "key": "a", "scale": 0.5}},
    {"compose": "sum", "rewards": [{"name": "counted", "key": "b"}, {"name": "counted", "key": "a", "weight": 2}],
     "weight": 0.1},
]
TREE_NODES = 18


def test_each_node_is_validated_once_in_the_parse_and_never_in_the_build(monkeypatch):
    calls = _count_validate(monkeypatch)
    tree = parse_rewards(TREE)
    assert len(calls) == TREE_NODES
    assert calls.count("reward counted") == 12 and calls.count("composition gated") == 1
    assert calls.count("shaping par") == 1
    build_reward(tree)
    assert len(calls) == TREE_NODES  # building the tree checks nothing again
    assert len(BUILT) == 12
    build_reward(TREE)  # from a config: one parse, one build
    assert len(calls) == 2 * TREE_NODES and len(BUILT) == 24


#: The outputs of TREE on ROLLOUTS as `build_reward` built it before the parse/build split (the same labels,
#: components and scores).
ROLLOUTS = [make_rollout("ok", {"a": 1.0, "b": 0.5, "ref": "r1"}),
            make_rollout("much too long", {"a": 0.25, "b": 1.0, "ref": ["r1", "r2"]})]
LABELS = ["A", "gated", "tiered", "pen", "counted_a", "counted_b", "sum"]
SCORES = [3.25, 0.376622179519433]
COMPONENTS = [{
    "A": 1.0, "A/len": 2.0, "counted_a": 0.0, "counted_a/counted_a": 1.0, "counted_a/len": 2.0,
    "counted_a/overlong_penalty": 0.0, "counted_a/unshaped": 0.0, "counted_b": 0.5, "counted_b/len": 2.0,
    "counted_b/par_ref": 0.5, "counted_b/unshaped": 0.5, "gated": 0.75, "gated/counted_a": 1.0,
    "gated/counted_a/len": 2.0, "gated/counted_b": 0.5, "gated/counted_b/len": 2.0, "gated/gate_open": 1.0,
    "pen": 0.5, "pen/counted_a": 1.0, "pen/counted_a/len": 2.0, "pen/counted_b": 0.5, "pen/counted_b/len": 2.0,
    "pen/penalty_factor": 1.0, "sum": 2.5, "sum/counted_a": 1.0, "sum/counted_a/len": 2.0, "sum/counted_b": 0.5,
    "sum/counted_b/len": 2.0, "tiered": 0.75, "tiered/counted_a": 1.0, "tiered/counted_a/len": 2.0,
    "tiered/counted_b": 0.5, "tiered/counted_b/len": 2.0, "tiered/tier": 1.0, "unshaped": 3.25,
}, {
    "A": 0.25, "A/len": 13.0, "counted_a": -1.0, "counted_a/counted_a": 0.25, "counted_a/len": 13.0,
    "counted_a/overlong_penalty": -1.0, "counted_a/unshaped": 0.0, "counted_b": 0.664122179519433,
    "counted_b/len": 13.0, "counted_b/par_ref": 0.3125, "counted_b/unshaped": 1.0, "gated": 0.0625,
    "gated/counted_a": 0.25, "gated/counted_a/len": 13.0, "gated/gate_open": 0.0, "pen": 0.25,
    "pen/counted_a": 0.25, "pen/counted_a/len": 13.0, "pen/counted_b": 1.0, "pen/counted_b/len": 13.0,
    "pen/penalty_factor": 0.25, "sum": 1.5, "sum/counted_a": 0.25, "sum/counted_a/len": 13.0, "sum/counted_b": 1.0,
    "sum/counted_b/len": 13.0, "tiered": 0.125, "tiered/counted_a": 0.25, "tiered/counted_a/len": 13.0,
    "tiered/tier": 0.0, "unshaped": 1.7125,
}]


def test_a_composed_and_shaped_tree_scores_as_before():
    tree = parse_rewards(TREE, on_error="raise")
    for built in (build_reward(tree), build_reward(TREE, on_error="raise")):
        assert isinstance(built, WeightedSum) and built.on_error == "raise" and built.name == "reward"
        assert built.labels == LABELS
        assert [w for _, w in built.members] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.1]
        outs = built(ROLLOUTS)
        assert [o.score for o in outs] == pytest.approx(SCORES, rel=1e-12)
        assert [o.components for o in outs] == [pytest.approx(c, rel=1e-12) for c in COMPONENTS]
        assert all(o.error is None and o.step_scores is None for o in outs)
    assert [b["key"] for b in BUILT] == list("aababbaababa") * 2  # config order, each leaf once per build
    assert BUILT[9] == {"key": "a", "scale": 0.5}  # PAR's ref_reward, built after the reward it shapes


def test_on_error_belongs_to_the_tree():
    tree = parse_rewards(["exact_match"], on_error="skip")
    assert build_reward(tree).on_error == "skip" and build_reward(tree, on_error="skip").on_error == "skip"
    with pytest.raises(ValueError, match=r"^on_error: 'raise' given for a reward tree parsed with on_error='skip'$"):
        build_reward(tree, on_error="raise")
    with pytest.raises(ValueError, match=r"^on_error: expected one of \('zero', 'skip', 'raise'\), got 'drop'$"):
        parse_rewards(["exact_match"], on_error="drop")


def test_an_import_name_leaf_is_imported_by_the_parse_and_constructed_by_the_build(tmp_path, monkeypatch):
    (tmp_path / "r_spec_check.py").write_text(textwrap.dedent('''
        class Loud:
            """A reward class that refuses to be constructed."""

            def __init__(self, level: int = 1):
                raise RuntimeError("constructed")
    '''), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    before = set(REWARDS)
    try:
        tree = parse_rewards([{"name": "./r_spec_check.py:Loud", "level": "2"}])
        (leaf,) = tree.members
        assert leaf.name == f"{tmp_path.resolve() / 'r_spec_check.py'}:Loud" and dict(leaf.options) == {"level": 2}
        with pytest.raises(RuntimeError, match="constructed"):
            build_reward(tree)
    finally:
        for name in set(REWARDS) - before:
            REWARDS.unregister(name)
