"""Each switch of the trainer changes what it names, checked on one step of the tiny model against a computation of
the test's own: rl.mask_truncated (the loss weight of truncated rollouts), rl.kl_in (the KL in the token rewards or
not), rl.filtering.curriculum (the prompt sampler and its pass rates), rl.filtering.group_filter (the groups kept),
rl.epochs and rl.minibatch_size (the optimizer steps an update takes).

`tests/mutation_check.py` breaks each switch in a copy of the source and names the test that fails (docs/layout.md,
"Tests that catch what they name"); these are the tests for the switches no other non-slow test caught.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards import REWARDS, reward
from rewardlab.rl import trainer
from rewardlab.rl.credit import assign_credit, reward_tensors
from rewardlab.rl.rollouts import produce
from rewardlab.rl.update import accumulate_policy_gradient, update
from rewardlab.rl.advantages import ESTIMATORS
from rewardlab.rl.curricula import make_curriculum
from rewardlab.rl.losses import kl_penalty

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]  # 30 distinct prompts

if "test_switch_any_digit" not in REWARDS:  # the module may be imported twice

    @reward(name="test_switch_any_digit")
    def _any_digit(completion):
        """1 when the completion holds a digit (about one tiny-model rollout in four at 2-4 tokens), else 0."""
        return float(any(c.isdigit() for c in completion))


@pytest.fixture
def make_state(tmp_path):
    """`make_state(*overrides)`: a set-up run (`trainer.setup`, its `TrainRun`) of the tiny model on ROWS, closed
    after the test."""
    states = []
    task = write_jsonl(tmp_path / "task.jsonl", ROWS)

    def make(*overrides):
        cfg = load_config(TrainConfig, None, [
            f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / f'run{len(states)}'}",
            *TINY_OVERRIDES, "rl.prompts_per_step=4", "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.steps=2",
            "rewards=[{name: test_switch_any_digit}]", "threads=1", *overrides])
        states.append(trainer.setup(cfg))
        return states[-1][0]

    yield make
    for run, progress in states:
        trainer.close(run, progress)


def _gradient(state, credit, idx):
    """The policy's gradient of minibatch `idx`'s loss, as the update accumulates it."""
    state.policy.model.zero_grad(set_to_none=True)
    accumulate_policy_gradient(state, credit, idx)
    return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in state.policy.model.parameters()]


@pytest.mark.parametrize("setting, weight", [("true", 0.0), ("{max_new_tokens: 0.25}", 0.25)])
def test_mask_truncated_weighs_the_loss_of_truncated_rollouts(make_state, setting, weight):
    # max_new_tokens 2: the untrained tiny model rarely ends a completion that early, so most are truncated
    state = make_state(f"rl.mask_truncated={setting}", "rl.sampling.max_new_tokens=2")
    credit = assign_credit(state, produce(state, 1))
    truncated = torch.tensor([r.truncated for r in credit.rows])
    assert truncated.any()
    expected = credit.sampled * torch.where(truncated, weight, 1.0)[:, None]
    assert torch.equal(credit.loss_mask, expected)
    if weight == 0.0:  # the truncated rollouts' loss has no gradient, though their advantages are not 0
        idx = truncated.nonzero().squeeze(1)
        assert credit.advantages[idx].abs().sum() > 0
        assert all(not g.any() for g in _gradient(state, credit, idx))
        unmasked = _gradient(state, replace(credit, loss_mask=credit.sampled), idx)
        assert any(g.any() for g in unmasked)  # the same rows weighed 1 would move the policy


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_kl_in_reward_subtracts_beta_times_the_kl_from_the_token_rewards(make_state, kl_in):
    beta = 0.5
    state = make_state(f"rl.beta={beta}", f"rl.kl_in={kl_in}", "rl.kl_estimator=k3")
    with torch.no_grad():  # a reference away from the policy, so the KL is not 0
        gen = torch.Generator().manual_seed(0)
        for p in state.reference.model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    credit = assign_credit(state, produce(state, 1))
    with torch.no_grad():
        ref, _ = state.reference.token_logprobs(credit.packed)
    assert torch.allclose(credit.ref_logprobs, ref, atol=1e-5)
    outcome, group = reward_tensors(credit.rows, credit.outputs, credit.sampled)
    kl = kl_penalty("k3", credit.old_logprobs, ref) * credit.sampled
    with_kl = ESTIMATORS["grpo"](token_rewards=outcome - beta * kl, mask=credit.sampled, group=group)
    without = ESTIMATORS["grpo"](token_rewards=outcome, mask=credit.sampled, group=group)
    assert (with_kl - without).abs().max() > 1e-2  # the KL moves the advantages
    assert torch.allclose(credit.advantages, with_kl if kl_in == "reward" else without, atol=1e-5)
    assert ("policy/kl_reward" in credit.metrics) == (kl_in == "reward")


def test_the_pass_rate_curriculum_draws_the_prompts_and_learns_their_pass_rates(make_state):
    ema, initial = 0.5, 0.5
    state = make_state("rl.filtering.curriculum=pass_rate",
                       f"rl.filtering.curriculum_options={{ema: {ema}, initial: {initial}}}", "rl.prompts_per_step=8")
    drawn = state.sampler.state_dict()
    batch = produce(state, 1)
    index = {row["prompt"]: i for i, row in enumerate(state.task.train)}
    correct: dict[int, list[float]] = {}
    for e in batch.episodes:
        correct.setdefault(index[e.last.row["prompt"]], []).append(float(e.output.correct))
    expected = torch.full((len(state.task.train),), initial, dtype=torch.float64)
    for i, values in correct.items():
        expected[i] = (1 - ema) * initial + ema * sum(values) / len(values)
    assert len(correct) == 8 and (expected != initial).any()
    assert torch.allclose(state.sampler.state_dict()["pass_rate"], expected)
    # the prompts are the curriculum's draws: its sampler, from its state before the batch, draws the same 8
    sampler = make_curriculum("pass_rate", state.task.train, seed=0, ema=ema, initial=initial)
    sampler.load_state_dict(drawn)
    assert sorted(sampler.next_indices(8)) == sorted(correct)


def test_the_group_filter_keeps_exactly_the_groups_whose_metric_varies(make_state):
    state = make_state("rl.filtering.group_filter=dapo", "rl.filtering.max_rounds=1",
                       "rl.filtering.filter_metric=score", "rl.group_size=2")
    batch = produce(state, 1)
    scores: dict[int, set[float]] = {}
    for e in batch.episodes:
        scores.setdefault(e.last.group, set()).add(e.output.score)
    varied = {g for g, s in scores.items() if len(s) > 1}
    assert len(varied) < len(scores)  # some group is tied (group size 2, a reward of 0 or 1): the check can fail
    assert {e.last.group for e in batch.trained} == varied
    assert batch.metrics["filter/dropped_groups"] == len(scores) - len(varied)


@pytest.mark.parametrize("epochs, minibatch_size", [(1, None), (2, None), (1, 5), (3, 6)])
def test_an_update_takes_epochs_times_ceil_n_over_minibatch_size_optimizer_steps(make_state, epochs, minibatch_size):
    overrides = [f"rl.epochs={epochs}"] + ([f"rl.minibatch_size={minibatch_size}"] if minibatch_size else [])
    state = make_state(*overrides)
    credit = assign_credit(state, produce(state, 1))
    n = len(credit.rows)
    stats = update(state, credit, 1)
    steps = epochs * math.ceil(n / (minibatch_size or n))
    assert stats["policy/updates"] == steps
    # AdamW's own step counter: the optimizer stepped that many times
    counters = {int(s["step"]) for s in state.optimizer.state.values()}
    assert counters == {steps}
