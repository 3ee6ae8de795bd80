"""The `env` section (episode budgets of environment tasks) and `rl.mask_truncated` by termination reason."""

import pytest

from rewardlab.config import EvaluateConfig, SFTConfig, TrainConfig
from rewardlab.config.loader import ConfigError, load_config


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig, EvaluateConfig])
def test_env_keys_on_a_task_that_is_not_an_environment_are_refused_by_name(cls):
    with pytest.raises(ConfigError, match=r"env\.max_turns, env\.tool_keep: applies to environment tasks only"):
        load_config(cls, None, ["env.max_turns=3", "env.tool_keep=end"])
    load_config(cls, None, ["env.max_turns=4"])  # the default: nothing is set, nothing to refuse
    assert load_config(cls, None, ["task.spec=env:calculator", "env.max_turns=3"]).env.max_turns == 3


@pytest.mark.parametrize("cls, key", [(TrainConfig, "rl.sampling.max_new_tokens"),
                                      (EvaluateConfig, "eval.max_new_tokens")])
def test_a_turn_budget_over_the_episode_budget_is_one_line_naming_both(cls, key):
    with pytest.raises(ConfigError, match=rf"{key}: 33 tokens per model turn is more than env.max_episode_tokens "
                                          r"\(32\)"):
        load_config(cls, None, ["task.spec=env:calculator", "env.max_episode_tokens=32", f"{key}=33"])
    cfg = load_config(cls, None, ["task.spec=env:calculator", "env.max_episode_tokens=32", f"{key}=32"])
    assert cfg.env.max_episode_tokens == 32  # an exact fit is allowed


def test_mask_truncated_true_masks_the_three_truncations_and_keeps_the_rest():
    weights = load_config(TrainConfig, None, ["rl.mask_truncated=true"]).rl.truncation_weights()
    assert weights == {"stop": 1.0, "env_done": 1.0, "max_turns": 1.0, "max_new_tokens": 0.0,
                       "max_episode_tokens": 0.0, "context": 0.0}
    assert set(load_config(TrainConfig, None, []).rl.truncation_weights().values()) == {1.0}


def test_mask_truncated_by_reason_takes_mask_keep_or_a_weight():
    rl = load_config(TrainConfig, None, ["rl.mask_truncated={max_turns: 0.5, context: keep, max_new_tokens: mask}"]).rl
    w = rl.truncation_weights()
    assert (w["max_turns"], w["context"], w["max_new_tokens"], w["max_episode_tokens"]) == (0.5, 1.0, 0.0, 1.0)


@pytest.mark.parametrize("value, message", [("{foo: mask}", "unknown termination reason 'foo'"),
                                            ("{stop: 2}", "a loss weight must be in \\[0, 1\\]")])
def test_mask_truncated_refuses_unknown_reasons_and_weights_outside_0_1(value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, None, [f"rl.mask_truncated={value}"])


@pytest.mark.parametrize("verb", ["search", "rm pairs", "prm label"])
def test_verbs_that_sample_single_completions_refuse_environment_tasks(verb):
    from rewardlab.commands import COMMANDS

    with pytest.raises(ConfigError, match=rf"task.spec: {verb} samples single completions and does not run "
                                          r"environment tasks \('env:calculator'\)"):
        load_config(COMMANDS[verb].config, None, ["task.spec=env:calculator"])


@pytest.mark.parametrize("override, key", [("env.max_turns=true", "env.max_turns"), ("rl.lr=false", "rl.lr"),
                                           ("rl.sampling.max_prompt_length=true", "rl.sampling.max_prompt_length"),
                                           ("env.tool_timeout_s=true", "env.tool_timeout_s")])
def test_a_boolean_where_a_number_is_due_is_one_line_naming_the_key(override, key):
    # pydantic reads true as 1: env.max_turns=true ran episodes of one turn
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, ["task.spec=env:calculator", override])
    assert key in str(err.value) and "expected a number, got" in str(err.value) and "\n" not in str(err.value)
    assert load_config(TrainConfig, None, ["rl.mask_truncated=true"]).rl.mask_truncated is True  # bool keys take one
