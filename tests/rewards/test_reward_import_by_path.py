"""A reward named MODULE:FUNCTION or PATH.py:FUNCTION is imported, as TRL's CLI imports reward functions."""

import textwrap

import pytest

from conftest import make_rollout
from rewardlab.config import load_config
from rewardlab.config.schema import TrainConfig
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.compose import parse_rewards

PLAIN = '''
def units_match(completion, answer, unit: str = "m"):
    """1 when the completion is the answer followed by the unit."""
    return float(completion.strip() == f"{answer} {unit}")
'''

DECORATED = '''
from rewardlab.rewards import reward

@reward(name="h20_units_dec", weight=0.25)
def units_match(completion, answer, tol: float = 0.0):
    value = float(completion.split()[0])
    return {"score": float(abs(value - float(answer)) <= tol), "value": value}
'''


@pytest.fixture(autouse=True)
def _forget_imported_rewards():
    """Registrations made by a test's imports are undone, so each test imports its own files afresh."""
    before = set(REWARDS)
    yield
    for name in set(REWARDS) - before:
        REWARDS.unregister(name)


def _write(directory, name, text):
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_plain_function_from_a_relative_file_path_scores_each_rollout(tmp_path, monkeypatch):
    _write(tmp_path, "my_rewards.py", PLAIN)
    monkeypatch.chdir(tmp_path)
    built = build_reward([{"name": "./my_rewards.py:units_match", "unit": "km"}])
    assert built.labels == ["units_match"]
    outs = built([make_rollout("3 km", {"answer": "3"}), make_rollout("3 m", {"answer": "3"})])
    assert [o.score for o in outs] == [1.0, 0.0]


def test_a_module_path_from_the_current_directory_keeps_the_reward_decorators_name_and_weight(tmp_path, monkeypatch):
    (tmp_path / "h20_pkg").mkdir()
    _write(tmp_path / "h20_pkg", "__init__.py", "")
    _write(tmp_path / "h20_pkg", "rewards.py", DECORATED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the import below is undone with it
    built = build_reward(["h20_pkg.rewards:units_match", {"name": "h20_pkg.rewards:units_match", "tol": 0.5}])
    assert built.labels == ["h20_units_dec", "h20_units_dec#2"]
    assert [w for _, w in built.members] == [0.25, 0.25]  # @reward(weight=0.25) is the default weight
    (out,) = built([make_rollout("3.4 m", {"answer": "3"})])
    assert out.components["h20_units_dec"] == 0.0 and out.components["h20_units_dec#2"] == 1.0
    assert out.score == 0.25  # 0.25 * 0 + 0.25 * 1


def test_an_imported_rewards_options_are_checked_like_any_others(tmp_path, monkeypatch):
    _write(tmp_path, "my_rewards.py", PLAIN)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        parse_rewards([{"name": "./my_rewards.py:units_match", "unit": 3}])
    assert str(err.value) == "rewards[0].unit: expected a string, got 3"
    with pytest.raises(ValueError, match=r"^rewards\[0\]: unknown option 'units' for reward '.*my_rewards.py:"
                                         r"units_match'; valid: answer, completion, item_timeout, max_concurrency, "
                                         r"unit, workers$"):
        parse_rewards([{"name": "./my_rewards.py:units_match", "units": "km"}])


@pytest.mark.parametrize("files, name, message", [
    ({}, "./missing.py:f", "no file {tmp}/missing.py (a relative path is read from the current directory, {tmp})"),
    ({}, "h20_no_such_pkg.rewards:f", "no module named 'h20_no_such_pkg'"),
    ({"r.py": PLAIN}, "./r.py:unit_match", "./r.py has no attribute 'unit_match'; it defines: units_match"),
    ({"r.py": "def f(completion):\n    return 1.0 +\n"}, "./r.py:f", "running {tmp}/r.py raised SyntaxError: "),
    ({"r.py": "import h20_absent_dependency\n"}, "./r.py:f",
     "running {tmp}/r.py raised ModuleNotFoundError: No module named 'h20_absent_dependency'"),
    ({"r.py": "LIMIT = 3\n"}, "./r.py:LIMIT", "LIMIT is not a function or class (its type is int)"),
    ({"r.py": "def f(prompts, completions, **kwargs):\n    return [0.0] * len(completions)\n"}, "./r.py:f",
     "f takes 'completions', a whole batch (TRL's signature); a rewardlab reward function scores one completion"),
    ({}, "./r.py:", "expected MODULE:FUNCTION or PATH.py:FUNCTION"),
])
def test_a_bad_module_file_or_attribute_is_one_line_naming_it(tmp_path, monkeypatch, files, name, message):
    for filename, text in files.items():
        _write(tmp_path, filename, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        parse_rewards(["exact_match", {"name": name}])
    text = str(err.value)
    assert text.startswith(f"rewards[1].name: cannot import reward {name!r}: "
                           + message.format(tmp=tmp_path.resolve())), text
    assert "\n" not in text


def test_a_class_is_a_reward_factory_and_a_config_names_it_as_a_bare_string(tmp_path, monkeypatch):
    _write(tmp_path, "cls_reward.py", '''
        from rewardlab.types import RewardOutput

        class Length:
            name = "length"

            def __init__(self, scale: float = 1.0):
                self.scale = scale

            def __call__(self, rollouts):
                return [RewardOutput(score=self.scale * len(r.completion)) for r in rollouts]
    ''')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(TrainConfig, overrides=["rewards=[exact_match, ./cls_reward.py:Length]"])
    with pytest.raises(ValueError, match=r"^rewards\[0\]\.scale: expected a number, got 'big'$"):
        parse_rewards([{"name": "./cls_reward.py:Length", "scale": "big"}])
    built = build_reward(cfg.rewards)
    (out,) = built([make_rollout("abc", {"answer": "x"})])
    assert built.labels == ["exact_match", "length"] and out.score == 3.0  # exact_match 0 + length 3


def test_the_file_is_executed_once_per_process(tmp_path, monkeypatch):
    _write(tmp_path, "counted.py", '''
        import builtins
        builtins.h20_imports = getattr(builtins, "h20_imports", 0) + 1

        def f(completion):
            return 1.0
    ''')
    monkeypatch.chdir(tmp_path)
    import builtins
    monkeypatch.setattr(builtins, "h20_imports", 0, raising=False)
    build_reward(["./counted.py:f"])
    build_reward([{"name": str(tmp_path / "counted.py") + ":f"}])  # the same file by its absolute path
    assert builtins.h20_imports == 1


@pytest.mark.parametrize("name, hint", [
    ("my_pkg.rewards.units_match", "write MODULE:FUNCTION, e.g. my_pkg.rewards:units_match"),  # TRL's dotted form
    ("./my_rewards.py", "write PATH.py:FUNCTION, e.g. ./my_rewards.py:my_reward"),
])
def test_an_unknown_name_that_looks_like_a_path_says_how_to_write_it(name, hint):
    with pytest.raises(ValueError) as err:
        parse_rewards([name])
    assert str(err.value).startswith(f"rewards[0].name: unknown reward {name!r}; valid: ")
    assert str(err.value).endswith(f"; to import your own reward {hint}")
