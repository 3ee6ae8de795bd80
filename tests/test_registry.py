"""The one Registry class: registering, looking up, checking options, and that every project registry uses it."""

from collections.abc import Mapping

import pytest

from rewardlab.registry import Registry


def _fresh():
    r = Registry("widget", reserved=("x",))

    @r.register("b", needs=("v",))
    def b(x, *, size=1, color="red"):
        return (x, size, color)

    @r.register("a")
    class A:
        def __init__(self, x, depth=2):
            self.depth = depth

    return r, b, A


def test_register_get_and_read_only_mapping():
    r, b, A = _fresh()
    assert r.get("b") is b and r["a"] is A
    assert "b" in r and "c" not in r and ["not", "a", "name"] not in r
    assert list(r) == ["b", "a"]  # registration order
    assert sorted(r) == ["a", "b"] and len(r) == 2 and dict(r) == {"b": b, "a": A}
    assert isinstance(r, Mapping) and not isinstance(r, dict)
    with pytest.raises(TypeError):
        r["c"] = b  # no item assignment: entries are added by register only
    assert r.get("c", None) is None  # Mapping.get with a default still works


def test_unknown_name_lists_the_valid_names_sorted():
    r, _, _ = _fresh()
    with pytest.raises(ValueError) as err:
        r.get("c")
    assert str(err.value) == "unknown widget 'c'; valid: a, b"
    with pytest.raises(KeyError, match="unknown widget 'c'; valid: a, b"):
        r["c"]
    with pytest.raises(ValueError, match="unknown widget 'c'"):
        r.check("c", {})
    assert str(pytest.raises(ValueError, Registry("gadget").get, "x").value) == "unknown gadget 'x'; valid: (none)"


def test_duplicate_registration_raises_and_keeps_the_first():
    r, b, _ = _fresh()
    with pytest.raises(ValueError, match="widget 'b' is already registered"):
        r.register("b")(lambda x: x)
    assert r["b"] is b
    with pytest.raises(ValueError, match="non-empty string"):
        r.register("")


def test_meta_is_per_entry_and_read_only():
    r, _, _ = _fresh()
    assert r.meta("b") == {"needs": ("v",)} and r.meta("a") == {}
    with pytest.raises(TypeError):
        r.meta("b")["needs"] = ()
    with pytest.raises(ValueError, match="unknown widget 'z'"):
        r.meta("z")


def test_options_come_from_the_signature_minus_reserved_inputs():
    r, _, _ = _fresh()
    assert r.options("b") == ("size", "color")  # x is reserved
    assert r.options("a") == ("depth",)  # a class: its __init__ without self
    assert r.options("b", reserved=("color",)) == ("size",)
    assert r.check("b", {"size": 3}) == ("size", "color")


def test_check_names_the_unknown_options_and_lists_the_valid_ones():
    r, _, _ = _fresh()
    with pytest.raises(ValueError) as err:
        r.check("b", {"size": 1, "colour": "blue"})
    assert str(err.value) == "unknown option 'colour' for widget 'b'; valid: color, size"
    with pytest.raises(ValueError) as err:
        r.check("b", {"colour": "blue", "x": 1, "sise": 2}, field="widgets.options")
    # a reserved input is not an option either
    assert str(err.value) == ("widgets.options: unknown options 'colour', 'x', 'sise' for widget 'b'; "
                              "valid: color, size")
    with pytest.raises(ValueError, match="for widget 'a'; valid: depth$"):
        r.check("a", {"width": 1})


def test_complete_check_requires_the_options_without_default():
    r = Registry("node", reserved=("path",))
    r.register("gated")(lambda path, *, gate, reward, threshold=1.0: None)
    assert r.check("gated", {"gate": 1}) == ("gate", "reward", "threshold")  # not complete: a subset is fine
    with pytest.raises(ValueError) as err:
        r.check("gated", {"gate": 1}, complete=True, field="rewards[0]")
    assert str(err.value) == "rewards[0]: missing option 'reward' for node 'gated'"
    with pytest.raises(ValueError, match="^missing options 'gate', 'reward' for node 'gated'$"):
        r.check("gated", {"threshold": 0.5}, complete=True)
    with pytest.raises(ValueError, match="unknown option 'treshold'"):  # an unknown key is reported first
        r.check("gated", {"treshold": 0.5}, complete=True)


def test_positional_only_parameters_are_not_options():
    r = Registry("thing")
    r.register("p")(lambda rows, /, k=1: None)
    assert r.options("p") == ("k",)


def test_an_entry_with_var_keyword_checks_its_own_options():
    r = Registry("thing")
    r.register("open")(lambda **options: options)
    assert r.options("open") is None and r.check("open", {"anything": 1}) is None


def test_unregister_removes_an_entry_for_temporary_registration():
    r, b, _ = _fresh()
    assert r.unregister("b") is b
    assert "b" not in r and list(r) == ["a"]
    r.register("b")(b)  # the name is free again
    with pytest.raises(ValueError, match="unknown widget 'q'"):
        r.unregister("q")


def _project_registries():
    from rewardlab.rewards import REWARDS
    from rewardlab.rewards.compose import COMPOSITIONS
    from rewardlab.rewards.format import PATTERNS
    from rewardlab.rewards.shaping import SHAPINGS
    from rewardlab.rl.advantages import ESTIMATORS
    from rewardlab.rl.curricula import CURRICULA
    from rewardlab.rl.filters import GROUP_FILTERS
    from rewardlab.rl.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from rewardlab.rewards.steps import STEP_AGGREGATIONS
    from rewardlab.search.report import METHODS
    from rewardlab.search.voting import EQUIVALENCES
    from rewardlab.tasks import LOADERS

    return {"ESTIMATORS": ESTIMATORS, "POLICY_LOSSES": POLICY_LOSSES, "KL_ESTIMATORS": KL_ESTIMATORS,
            "AGGREGATIONS": AGGREGATIONS, "GROUP_FILTERS": GROUP_FILTERS, "CURRICULA": CURRICULA, "REWARDS": REWARDS,
            "LOADERS": LOADERS, "COMPOSITIONS": COMPOSITIONS, "SHAPINGS": SHAPINGS, "PATTERNS": PATTERNS,
            "search METHODS": METHODS, "step-score AGGREGATIONS": STEP_AGGREGATIONS, "EQUIVALENCES": EQUIVALENCES}


#: Entries whose `**kwargs` forward to a third-party config that the entry checks itself (reasoning-gym's dataset
#: config, see tasks/reasoning_gym.py), the worked preset that forwards to it, and env:NAME, whose options are the
#: named environment's (checked against ENVIRONMENTS, see envs/task.py).
CHECK_THEIR_OWN = {("LOADERS", "reasoning_gym"), ("LOADERS", "worked"), ("LOADERS", "env")}


def test_every_project_registry_is_a_registry_whose_entries_declare_their_options():
    for label, registry in _project_registries().items():
        assert isinstance(registry, Registry), label
        assert len(registry) > 0, label
        for name in registry:
            if (label, name) not in CHECK_THEIR_OWN:
                assert registry.options(name) is not None, f"{label}[{name!r}] swallows options (**kwargs)"
