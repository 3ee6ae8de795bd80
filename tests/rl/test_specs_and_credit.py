"""The config resolved once into specs (`rl.specs`), and the registries the credit phase looks its inputs up in
(`rl.credit.ESTIMATOR_INPUTS`, `TURN_REWARD_SOURCES`): a new estimator with a new input, or a new source of turn
rewards, is a registration, and the trainer runs each provider once."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.rl import credit as credit_module
from rewardlab.rl import losses
from rewardlab.rl.advantages import ESTIMATORS, register_estimator
from rewardlab.rl.credit import ESTIMATOR_INPUTS, TURN_REWARD_SOURCES, Provided, assign_credit
from rewardlab.rl.rollouts import produce
from rewardlab.rl.specs import resolve_specs
from rewardlab.rl.trainer import close, setup

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(2)]


def _cfg(tmp_path, *overrides):
    task = write_jsonl(tmp_path / "task.jsonl", ROWS)
    return load_config(TrainConfig, None, [f"task.spec=jsonl:{task}", "task.options={test_size: 2}",
                                           f"out={tmp_path / 'run'}", *TINY_OVERRIDES, "rl.prompts_per_step=2",
                                           "rl.group_size=2", "rl.sampling.max_new_tokens=3", "threads=1", *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["rl.loss_options={dual_clip: 0.5}"], "rl.loss_options: ppo_clip: dual_clip must be > 1, got 0.5"),
    (["rl.loss=cispo", "rl.loss_options={clip_low: 2}"], "rl.loss_options: cispo: clip_low must be in [0, 1], got 2"),
    (["rl.agg=seq-mean-token-sum-norm", "rl.loss_options={max_len: 0}"],
     "rl.loss_options: seq-mean-token-sum-norm: max_len must be > 0, got 0"),
    (["rl.loss_options={clip_low: abc}"], "rl.loss_options.clip_low: expected a number, got 'abc'"),
    (["rl.turn_rewards=from_the_sky"], "rl.turn_rewards: unknown name 'from_the_sky'; valid: env, info_gain"),
])
def test_option_values_are_checked_by_building_the_spec_without_computing_a_loss(tmp_path, monkeypatch, overrides,
                                                                                 message):
    def never(*args, **kwargs):
        raise AssertionError("a loss was computed to check the options")

    monkeypatch.setattr(losses, "_prepare", never)  # what every policy loss computes first
    monkeypatch.setattr(losses, "_agg_inputs", never)  # and every aggregation
    with pytest.raises(ValueError) as err:
        resolve_specs(_cfg(tmp_path, *overrides))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_loss_spec_holds_the_options_as_read_and_split(tmp_path):
    spec = resolve_specs(_cfg(tmp_path, "rl.agg=seq-mean-token-sum-norm", "rl.clip_eps=0.1",
                              "rl.loss_options={clip_high: '0.28'}")).loss
    assert spec.options == {"clip_low": 0.1, "clip_high": 0.28, "max_len": 3}  # "0.28" read as the float it means
    assert spec.agg_options == {"max_len": 3}


@pytest.fixture
def length_estimator():
    """A registered estimator that needs a registered input, `lengths`, whose provider counts its calls."""
    calls = []

    @ESTIMATOR_INPUTS.register("test_lengths")
    def lengths(view):
        calls.append(len(view.rows))
        return Provided({"test_lengths": view.sampled.sum(dim=1)})

    @register_estimator("test_length_baseline", needs=("test_lengths",))
    def estimator(*, token_rewards, mask, group, test_lengths):
        return ((token_rewards * mask).sum(dim=1) - 0.01 * test_lengths)[:, None] * mask

    yield calls
    ESTIMATORS.unregister("test_length_baseline")
    ESTIMATOR_INPUTS.unregister("test_lengths")


def test_a_new_estimator_input_is_a_registration_and_its_provider_runs_once_a_step(tmp_path, length_estimator):
    run, progress = setup(_cfg(tmp_path, "rl.estimator=test_length_baseline", "rewards=[{name: exact_match}]"))
    try:
        assert run.specs.estimator.provided == ("test_lengths",)
        credit = assign_credit(run, produce(run, 1))
    finally:
        close(run, progress)
    assert length_estimator == [4]  # once, over the step's 4 rows
    lengths = credit.sampled.sum(dim=1)
    rewards = torch.tensor([o.score for o in credit.outputs])
    assert torch.allclose(credit.advantages, (rewards - 0.01 * lengths)[:, None] * credit.sampled)


def test_an_input_without_a_provider_is_refused_at_config_time(tmp_path):
    register_estimator("test_needs_nothing_known", needs=("test_unknown_input",))(
        lambda *, token_rewards, mask, group, test_unknown_input: token_rewards)
    try:
        with pytest.raises(ValueError, match=r"^rl.estimator: 'test_needs_nothing_known' needs "
                                             r"\['test_unknown_input'\], which the trainer cannot compute"):
            resolve_specs(_cfg(tmp_path, "rl.estimator=test_needs_nothing_known"))
    finally:
        ESTIMATORS.unregister("test_needs_nothing_known")


def test_one_provider_of_two_inputs_runs_once(tmp_path, monkeypatch):
    calls = []
    provider = ESTIMATOR_INPUTS["components"]

    def counted(view):
        calls.append(1)
        return provider(view)

    monkeypatch.setitem(ESTIMATOR_INPUTS._entries, "components", counted)
    monkeypatch.setitem(ESTIMATOR_INPUTS._entries, "weights", counted)
    run, progress = setup(_cfg(tmp_path, "rl.estimator=gdpo",
                               "rewards=[{name: exact_match}, {name: format, weight: 0.5}]"))
    try:
        assert run.specs.estimator.provided == ("components",)
        assign_credit(run, produce(run, 1))
    finally:
        close(run, progress)
    assert calls == [1]


def test_a_turn_reward_source_is_looked_up_by_name(tmp_path, monkeypatch):
    seen = []

    def source(view):
        seen.append(len(view.episodes))
        return view.rows, {"turn/test_source": 1.0}

    monkeypatch.setitem(TURN_REWARD_SOURCES._entries, "env", source)
    run, progress = setup(_cfg(tmp_path, "rewards=[{name: exact_match}]"))
    try:
        credit = assign_credit(run, produce(run, 1))
    finally:
        close(run, progress)
    assert seen == [4] and credit.metrics["turn/test_source"] == 1.0
    assert credit_module.TURN_REWARD_SOURCES["env"] is source
