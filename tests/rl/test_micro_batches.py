"""rl.micro_batch_size is a memory switch: the gradient accumulated over micro-batches equals the gradient of the whole
minibatch's loss (every policy loss x every aggregation, single completions and split episodes, entropy bonus and KL
in the loss), and a short run gives the same metrics with and without micro-batches."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_ARCH, TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.policy import load_policy, rollout_batch
from rewardlab.policy.batch import micro_batches
from rewardlab.rl.losses import (AGGREGATIONS, POLICY_LOSSES, aggregate, aggregation_weights, compute_policy_loss,
                                 kl_penalty, register_aggregation)
from rewardlab.rl.specs import LossSpec
from rewardlab.rl.trainer import train
from rewardlab.rl.update import accumulate_policy_gradient

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(2)]  # 6 prompts


def _setup(seed: int, *, episodes: bool):
    torch.manual_seed(seed)
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=seed)
    policy.model.train()
    rollouts = policy.generate([r["prompt"] for r in ROWS], n=3, rows=ROWS, max_new_tokens=6, temperature=1.5)
    packed, old = rollout_batch(policy, rollouts)
    N, T = packed.mask.shape
    gen = torch.Generator().manual_seed(seed)
    sampled = packed.mask * (torch.rand(N, T, generator=gen) > 0.2).float()  # some "environment" tokens
    group = torch.tensor([r.group for r in rollouts])
    # episodes: consecutive rows of a group form one episode (2 rows, then 1), as a rewritten chat template splits one
    episode = torch.tensor([3 * g + (k // 2) for g in range(len(ROWS)) for k in range(3)]) if episodes else None
    credit = SimpleNamespace(packed=packed, old_logprobs=old + 0.05 * torch.randn(N, T, generator=gen) * packed.mask,
                             advantages=torch.randn(N, T, generator=gen) * sampled, loss_mask=sampled,
                             episode=episode, group=group,
                             ref_logprobs=(old - 0.1 * torch.rand(N, T, generator=gen)) * packed.mask)
    return policy, credit


def _state(policy, loss: str, agg: str, micro: int | None, *, entropy_coef=0.01, beta=0.05):
    rl = SimpleNamespace(loss=loss, agg=agg, micro_batch_size=micro, sampling=SimpleNamespace(temperature=1.0),
                         entropy_coef=entropy_coef, kl_in="loss", beta=beta, kl_estimator="k3")
    options = {"max_len": 6} if agg == "seq-mean-token-sum-norm" else {}
    return SimpleNamespace(cfg=SimpleNamespace(rl=rl), policy=policy, loss_options=dict(options),
                           agg_options=dict(options), specs=SimpleNamespace(loss=LossSpec(loss, agg, "k3", options,
                                                                                          options)))


def _unsplit_gradient(state, credit, idx):
    """The minibatch's loss in one pass, as the trainer computed it before micro-batches existed."""
    rl, policy = state.cfg.rl, state.policy
    m = credit.loss_mask[idx]
    ep = credit.episode[idx] if credit.episode is not None else None
    lp, ent = policy.token_logprobs(credit.packed.select(idx), with_entropy=True, entropy_grad=True)
    loss, _ = compute_policy_loss(rl.loss, logprobs=lp, old_logprobs=credit.old_logprobs[idx],
                                  advantages=credit.advantages[idx], mask=m, agg=rl.agg, episode=ep,
                                  **state.loss_options)
    loss = loss - rl.entropy_coef * aggregate(ent, m, rl.agg, episode=ep, **state.agg_options)
    kl = kl_penalty(rl.kl_estimator, lp, credit.ref_logprobs[idx])
    loss = loss + rl.beta * aggregate(kl, m, rl.agg, episode=ep, **state.agg_options)
    policy.model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in policy.model.parameters()]


def _accumulated(state, credit, idx):
    state.policy.model.zero_grad(set_to_none=True)
    lp, ent = accumulate_policy_gradient(state, credit, idx)
    return [p.grad.clone() for p in state.policy.model.parameters()], lp


@pytest.mark.parametrize("episodes", [False, True])
@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_micro_batches_accumulate_the_gradient_of_the_whole_minibatch(loss, agg, episodes):
    policy, credit = _setup(0, episodes=episodes)
    n = credit.loss_mask.shape[0]
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(1))[: n - 3] if not episodes else torch.arange(n)
    expected = _unsplit_gradient(_state(policy, loss, agg, None), credit, idx)
    scale = max(float(g.abs().max()) for g in expected)
    assert scale > 0
    for micro in (None, 1, 4):
        got, lp = _accumulated(_state(policy, loss, agg, micro), credit, idx)
        worst = max(float((a - b).abs().max()) for a, b in zip(got, expected))
        assert worst <= 1e-5 * scale, (micro, worst, scale)
        assert torch.equal(lp == 0, credit.packed.mask[idx] == 0)  # log-probs gathered back in row order


def test_a_wrong_weighting_would_be_caught():
    """The check above can fail: a mean of micro-batch means (what gradient accumulation gives when each micro-batch
    is aggregated on its own) differs from token-mean over the minibatch when micro-batches have unequal tokens."""
    policy, credit = _setup(0, episodes=False)
    idx = torch.arange(credit.loss_mask.shape[0])
    state = _state(policy, "ppo_clip", "token-mean", None, entropy_coef=0.0, beta=0.0)
    expected = _unsplit_gradient(state, credit, idx)
    policy.model.zero_grad(set_to_none=True)
    parts = micro_batches(credit.group, 4)
    for part in parts:
        lp, _ = policy.token_logprobs(credit.packed.select(part))
        loss, _ = compute_policy_loss("ppo_clip", logprobs=lp, old_logprobs=credit.old_logprobs[part],
                                      advantages=credit.advantages[part], mask=credit.loss_mask[part])
        (loss / len(parts)).backward()
    naive = [p.grad.clone() for p in policy.model.parameters()]
    scale = max(float(g.abs().max()) for g in expected)
    assert max(float((a - b).abs().max()) for a, b in zip(naive, expected)) > 1e-3 * scale


def test_micro_batches_hold_whole_episodes_and_groups_without_random_draws():
    group = torch.tensor([2, 0, 2, 1, 0, 1, 2])
    episode = torch.tensor([7, 3, 7, 5, 4, 5, 8])
    before = torch.get_rng_state()
    parts = micro_batches(group, 2, episode)
    assert torch.equal(torch.get_rng_state(), before)
    assert sorted(torch.cat(parts).tolist()) == list(range(7))
    for part in parts:
        eps = set(episode[part].tolist())
        assert len(eps) <= 2
        for e in eps:  # every row of an episode is in its micro-batch
            assert set((episode == e).nonzero().squeeze(1).tolist()) <= set(part.tolist())
    # episodes ordered by group: 3, 4 (group 0), 5 (group 1), then 7, 8 (group 2)
    assert [sorted(set(episode[p].tolist())) for p in parts] == [[3, 4], [5, 7], [8]]
    assert [p.tolist() for p in micro_batches(group, None)] == [list(range(7))]
    with pytest.raises(ValueError, match="micro_batch_size"):
        micro_batches(group, 0)


def test_a_nonlinear_aggregation_is_refused_for_micro_batches():
    name = "test-median-of-tokens"
    if name not in AGGREGATIONS:
        @register_aggregation(name)
        def _median(*, per_token_loss, mask, episode=None):
            return per_token_loss[mask > 0].median()

    with pytest.raises(ValueError, match="not linear.*rl.micro_batch_size"):
        aggregation_weights(name, torch.ones(2, 3))


def _run(tmp_path, name, *overrides):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    cfg = load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / name}", *TINY_OVERRIDES,
        "rl.prompts_per_step=4", "rl.group_size=4", "rl.sampling.max_new_tokens=4", "rl.lr=1e-3", "rl.steps=2",
        "rl.beta=0.05", "rl.entropy_coef=0.01", *overrides])
    train(cfg, show_progress=False)
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_a_run_with_micro_batches_logs_what_the_run_without_them_logs(tmp_path):
    plain = _run(tmp_path, "plain")
    micro = _run(tmp_path, "micro", "rl.micro_batch_size=3")
    assert len(plain) == len(micro) == 2
    # the same rollouts (micro-batching draws no random numbers), so the same rewards; the losses and gradient norms
    # equal to float rounding
    for a, b in zip(plain, micro):
        assert a["reward/mean"] == b["reward/mean"]
        for key in ("policy/loss", "policy/grad_norm", "policy/kl", "policy/entropy", "policy/clip_frac"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
