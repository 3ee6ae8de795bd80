"""The update: the third phase of a step, `update(run, credit, step)` -> statistics.

rl.epochs passes over the kept episodes in shuffled minibatches of rl.minibatch_size rollouts (whole episodes: an
episode's rows are never split between minibatches): policy loss (+ beta * KL when rl.kl_in = loss, - entropy_coef *
entropy), its gradient accumulated over micro-batches of rl.micro_batch_size rollouts (`accumulate_policy_gradient`),
a clipped gradient step and the critic's step; then the learning-rate schedule steps and the reference is refreshed
every rl.ref_refresh_every steps. The loss, its aggregation and the KL estimator come from `run.specs.loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from rewardlab.policy.batch import micro_batches
from rewardlab.rl.credit import Credit
from rewardlab.rl.episodes import episode_minibatches
from rewardlab.rl.losses import (aggregate, aggregation_weights, compute_policy_loss, kl_clamped, kl_penalty,
                                 loss_tokens, per_token_policy_loss)


def update(run: Any, credit: Credit | None, step: int) -> dict[str, float]:
    """Optimize the policy (and the critic) on `credit` (see the module doc; nothing when `credit` is None), then
    step the schedule and refresh the reference when step `step` is due.

    The loss and every statistic are those of the whole minibatch, whatever the micro-batch: they are computed
    (without gradient) from the minibatch's log-probs and entropies, gathered from its micro-batches.

    Returns:
        each minibatch statistic averaged over the updates, and policy/updates (their number).
    """
    rl, policy = run.cfg.rl, run.policy
    sums: dict[str, float] = {}
    updates = 0
    n = len(credit.rows) if credit is not None else 0
    record = rl.logging.log_completions and rl.logging.log_tokens != 0  # the rollouts file logs tokens
    for epoch in range(rl.epochs if n else 0):
        for idx in episode_minibatches(credit.episode, rl.minibatch_size, n=n):
            run.optimizer.zero_grad(set_to_none=True)
            logprobs, entropy = accumulate_policy_gradient(run, credit, idx)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), rl.grad_clip)
            run.optimizer.step()
            stats, tokens = minibatch_stats(run, credit, idx, logprobs, entropy)
            if epoch == 0 and record:
                record_first_epoch(credit, idx, tokens)
            stats["policy/grad_norm"] = grad_norm.item()
            if run.critic is not None:
                ep = credit.episode[idx] if credit.episode is not None else None
                parts = micro_batches(credit.group[idx], rl.micro_batch_size, ep)
                stats.update(run.critic.update(credit.packed.select(idx), credit.returns[idx], credit.values[idx],
                                               credit.sampled[idx], rl.grad_clip, micro_batches=parts))
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
    run.scheduler.step()
    if run.reference is not None and rl.ref_refresh_every is not None and step % rl.ref_refresh_every == 0:
        run.reference.model.load_state_dict(policy.model.state_dict())
    return {**{k: v / updates for k, v in sums.items()}, "policy/updates": float(updates)}


@torch.no_grad()
def minibatch_stats(run: Any, credit: Credit, idx: torch.Tensor, logprobs: torch.Tensor,
                    entropy: torch.Tensor) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Minibatch `idx`'s loss and statistics, as one pass over it would give them, from its log-probs and entropies
    [n, T] float32: the policy loss's stats, policy/entropy (token mean), policy/loss (with the entropy bonus and the
    KL in the loss) and, for rl.kl_in = loss, policy/kl and policy/kl_clamped.

    Returns:
        (stats, tokens): tokens are the minibatch's per-token values the loss used, each [n, T]: "logprob",
        "entropy" (float32), the loss's per-token view (`losses.loss_tokens`: "ratio" float32, "clip" int8) and,
        when the reference's KL is computed, "kl" (the KL estimator's term, float32).
    """
    rl, spec = run.cfg.rl, run.specs.loss
    m = credit.loss_mask[idx]
    ep = credit.episode[idx] if credit.episode is not None else None  # an episode counts once
    loss, loss_stats = compute_policy_loss(spec.name, logprobs=logprobs, old_logprobs=credit.old_logprobs[idx],
                                           advantages=credit.advantages[idx], mask=m, agg=spec.agg, episode=ep,
                                           **spec.options)
    stats = dict(loss_stats)
    tokens = {"logprob": logprobs, "entropy": entropy, **loss_tokens(loss_stats)}
    stats["policy/entropy"] = ((entropy * m).sum() / m.sum().clamp(min=1)).item()
    if rl.entropy_coef > 0:
        loss = loss - rl.entropy_coef * aggregate(entropy, m, spec.agg, episode=ep, **spec.agg_options)
    if credit.ref_logprobs is not None and rl.kl_in == "loss":
        ref = credit.ref_logprobs[idx]
        tokens["kl"] = kl_penalty(spec.kl_estimator, logprobs, ref)
        kl = aggregate(tokens["kl"], m, spec.agg, episode=ep, **spec.agg_options)
        loss = loss + rl.beta * kl
        stats["policy/kl"] = kl.item()
        stats["policy/kl_clamped"] = float(kl_clamped(spec.kl_estimator, logprobs, ref, m))
    stats["policy/loss"] = loss.item()
    return stats, tokens


def record_first_epoch(credit: Credit, idx: torch.Tensor, tokens: dict[str, torch.Tensor]) -> None:
    """Store minibatch `idx`'s per-token values (`minibatch_stats`'s tokens, [n, T]) at its rows of
    `credit.first_epoch` ([N, T] each, created on first use): in the first epoch every row is in exactly one
    minibatch, so after it `credit.first_epoch` holds, for every training row, the values the loss used."""
    for name, values in tokens.items():
        if name not in credit.first_epoch:
            credit.first_epoch[name] = torch.zeros(credit.loss_mask.shape, dtype=values.dtype,
                                                   device=values.device)
        credit.first_epoch[name][idx.to(values.device)] = values.detach()


def accumulate_policy_gradient(run: Any, credit: Credit, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate into the policy's .grad the gradient of minibatch `idx`'s loss, one micro-batch of
    rl.micro_batch_size rollouts (whole episodes, a prompt group's together: `policy.batch.micro_batches`) at a
    time, so no forward pass holds more than one micro-batch's activations and logits.

    The minibatch's loss L = agg(l) - entropy_coef * agg(H) + beta * agg(KL) (the last for rl.kl_in = loss) is
    linear in the per-token terms, L = sum_{i,t} w_{i,t} (l - entropy_coef * H + beta * KL)_{i,t} with the token
    weights w of the minibatch's aggregation (`losses.aggregation_weights`: token-mean over all its tokens, not a
    mean of micro-batch means), so each micro-batch backpropagates its rows' part of that sum and the accumulated
    gradient equals the unsplit one up to float rounding. A policy loss reads at most its episode's rows (GSPO's
    sequence ratio), which a micro-batch holds whole.

    Returns:
        the minibatch's log-probs and entropies [n, T] float32 (detached), for its loss value and statistics.
    """
    rl, spec, policy = run.cfg.rl, run.specs.loss, run.policy
    m = credit.loss_mask[idx]
    ep = credit.episode[idx] if credit.episode is not None else None
    weights = aggregation_weights(spec.agg, m, episode=ep, **spec.agg_options)
    logprobs, entropy = torch.zeros_like(m), torch.zeros_like(m)
    for part in micro_batches(credit.group[idx], rl.micro_batch_size, ep):
        part = part.to(m.device)
        rows = idx.to(m.device)[part]
        lp, ent = policy.token_logprobs(credit.packed.select(rows), temperature=rl.sampling.temperature,
                                        with_entropy=True, entropy_grad=rl.entropy_coef > 0)
        per_token, _ = per_token_policy_loss(spec.name, logprobs=lp, old_logprobs=credit.old_logprobs[rows],
                                             advantages=credit.advantages[rows], mask=m[part], agg=spec.agg,
                                             episode=ep[part] if ep is not None else None, **spec.options)
        w = weights[part]
        objective = (per_token * w).sum()
        if rl.entropy_coef > 0:
            objective = objective - rl.entropy_coef * (ent * w).sum()
        if credit.ref_logprobs is not None and rl.kl_in == "loss":
            objective = objective + rl.beta * (kl_penalty(spec.kl_estimator, lp, credit.ref_logprobs[rows]) * w).sum()
        objective.backward()
        logprobs[part], entropy[part] = lp.detach(), ent.detach()
    return logprobs, entropy
