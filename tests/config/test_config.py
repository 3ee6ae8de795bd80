"""Typed configs: YAML + dotted overrides, one-line errors naming the key."""

import pytest

from rewardlab.commands import config_classes
from rewardlab.config import (
    ConfigError,
    EvaluateConfig,
    QuickstartConfig,
    RLConfig,
    TrainConfig,
    apply_override,
    dump_config,
    load_config,
)

VERB_CONFIGS = config_classes()


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_override_sets_float_from_exponent_notation():
    cfg = load_config(TrainConfig, None, ["rl.lr=1e-4"])  # YAML 1.1 reads "1e-4" as a string
    assert cfg.rl.lr == 1e-4 and isinstance(cfg.rl.lr, float)
    cfg = load_config(TrainConfig, None, ["rl.step_separator='5'"])  # quoted: the string "5", not the number
    assert cfg.rl.step_separator == "5"


def test_overrides_parse_yaml_values():
    cfg = load_config(TrainConfig, None, ["rl.steps=7", "rewards=[{name: exact_match, weight: 0.5}]",
                                          "task.options={size: 10}", "model.path=tiny", "seed=3"])
    assert cfg.rl.steps == 7 and cfg.seed == 3
    assert cfg.rewards == [{"name": "exact_match", "weight": 0.5}]
    assert cfg.task.options == {"size": 10}


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  lr: 0.5\n  steps: 7\nmodel:\n  tiny:\n    hidden_size: 32\n")
    cfg = load_config(TrainConfig, path, ["rl.lr=0.25"])
    assert cfg.rl.lr == 0.25  # the override wins over the file
    assert cfg.rl.steps == 7 and cfg.model.tiny.hidden_size == 32  # file values kept
    assert cfg.rl.group_size == TrainConfig().rl.group_size  # untouched keys keep their defaults


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("")
    assert load_config(TrainConfig, path) == TrainConfig()


def test_unknown_key_names_key_and_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, None, ["rl.lrr=1e-4"])
    msg = _one_line(info)
    assert "rl.lrr" in msg and "unknown key" in msg
    assert "lr" in msg.split("valid keys here:")[1] and "group_size" in msg


def test_unknown_nested_key_lists_keys_of_its_section():
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, None, ["model.tiny.width=3"])
    msg = _one_line(info)
    assert "model.tiny.width" in msg and "hidden_size" in msg and "num_hidden_layers" in msg


def test_unknown_top_level_key():
    with pytest.raises(ConfigError) as info:
        load_config(EvaluateConfig, None, ["rl.lr=1"])  # evaluate has no `rl` section
    msg = _one_line(info)
    assert "rl" in msg and "eval" in msg and "split" in msg


def test_bad_value_names_key_and_expected_type():
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, None, ["rl.lr=abc"])
    msg = _one_line(info)
    assert "rl.lr" in msg and "number" in msg and "'abc'" in msg


def test_out_of_range_value_names_key():
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, None, ["rl.group_size=0"])
    msg = _one_line(info)
    assert "rl.group_size" in msg and "greater than 0" in msg


def test_literal_value_lists_choices():
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, None, ["on_error=ignore"])
    msg = _one_line(info)
    assert "on_error" in msg and "'zero'" in msg and "'raise'" in msg


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rl:\n  lr: 0.1\n  steps: [1, 2\n")  # the unclosed list is only detected at end of input
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, path)
    msg = _one_line(info)
    assert f"{path}:" in msg and "invalid YAML" in msg


def test_invalid_yaml_line_number(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\nout: x\n  rl: 3\n")  # line 3: an indented key after a plain value
    with pytest.raises(ConfigError) as info:
        load_config(TrainConfig, path)
    assert f"{path}:3:" in _one_line(info)


def test_missing_file_and_non_mapping_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(TrainConfig, tmp_path / "nope.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(TrainConfig, path)


@pytest.mark.parametrize("item", ["rl.lr", "=3", ""])
def test_override_without_key_value_is_an_error(item):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(TrainConfig, None, [item])


def test_override_into_a_value_is_an_error():
    data = {"seed": 1}
    with pytest.raises(ConfigError, match="'seed' is a value, not a section"):
        apply_override(data, "seed.x=2")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("verb", sorted(VERB_CONFIGS))
def test_dump_config_round_trips(tmp_path, verb):
    cls = VERB_CONFIGS[verb]
    required = [f"{name}=x.jsonl" for name, f in cls.model_fields.items() if f.is_required()]  # rm/prm: data
    required += {"po": ["pairs=x.jsonl"]}.get(verb, [])  # offline po (the default) needs its pairs file
    seed = ["seed=5"] if "seed" in cls.model_fields else []  # merge: nothing random
    cfg = load_config(cls, None, [*seed, *required])
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(cls, path) == cfg


# ---------------------------------------------------------------- partly given sections keep the verb's defaults
def test_dotted_override_keeps_the_verbs_other_section_defaults():
    # QuickstartConfig.rl is an RLConfig with non-class defaults; overriding one key must not reset the others
    # (rl.steps=N once silently turned 128 prompts per step at lr 3e-4, T=0.7 into 16 at 1e-4, T=1.0).
    base = load_config(QuickstartConfig)
    cfg = load_config(QuickstartConfig, overrides=["rl.steps=123", "task.options.size=5000"])
    assert cfg.rl.steps == 123
    assert cfg.rl.model_dump(exclude={"steps"}) == base.rl.model_dump(exclude={"steps"})
    assert cfg.rl.prompts_per_step == 128 != RLConfig().prompts_per_step
    assert cfg.task.options == dict(base.task.options, size=5000)
    assert cfg.sft == base.sft and cfg.eval == base.eval


def test_whole_value_override_replaces_a_mapping():
    cfg = load_config(QuickstartConfig, overrides=["task.options={size: 7}"])
    assert cfg.task.options == {"size": 7}


def test_yaml_section_keeps_the_verbs_other_defaults(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("rl:\n  lr: 1.0e-3\nsft:\n  steps: 10\n")
    base = load_config(QuickstartConfig)
    cfg = load_config(QuickstartConfig, path)
    assert (cfg.rl.lr, cfg.sft.steps) == (1e-3, 10)
    assert cfg.rl.model_dump(exclude={"lr"}) == base.rl.model_dump(exclude={"lr"})
    assert cfg.sft.model_dump(exclude={"steps"}) == base.sft.model_dump(exclude={"steps"})


def test_unknown_key_in_a_defaulted_section_is_still_named():
    with pytest.raises(ConfigError, match="rl.bogus: unknown key"):
        load_config(QuickstartConfig, overrides=["rl.bogus=1"])
