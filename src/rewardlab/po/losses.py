"""Preference losses on summed log-probs: `preference_loss(name, ...)` -> (per-example losses [B], stats).

Every loss is a pure tensor function registered under its paper name in `PREFERENCE_LOSSES` and called as

    PREFERENCE_LOSSES[name](batch: PreferenceBatch, *, <options>) -> (losses, chosen_rewards, rejected_rewards)

Conventions shared by all losses:

- Inputs are per response, **summed** over its tokens: chosen_logps, rejected_logps [B] float, log pi(y | x) under the
  policy (with gradient); ref_chosen_logps, ref_rejected_logps [B] float under the reference (no gradient needed);
  chosen_lengths, rejected_lengths [B] token counts (int or float), for the length-normalized losses. A loss that
  needs an input it was not given raises a one-line ValueError naming it.
- Log-ratios h_w = log pi(y_w) - log pi_ref(y_w), h_l likewise (summed over tokens). "avg" means divided by the
  response's token count.
- Each loss returns its per-example losses and its implicit rewards of the chosen and rejected responses (the
  quantities TRL logs as rewards/chosen and rewards/rejected; None for `sft`, which has none).
- Every option is declared; an undeclared one is a ValueError naming it (`PREFERENCE_LOSSES.check`); beta <= 0 is
  refused.
- Losses can be mixed with weights, as TRL's `loss_type` list with `loss_weights` (MPO: dpo + bco_pair + sft):
  `preference_loss(["dpo", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0], ...)` is sum_k w_k * loss_k per
  example; each option goes to the losses that declare it, and one no mixed loss declares is an error.

Convention differences from TRL 1.16 (documented, not hidden): `ipo` with lengths uses length-averaged log-ratios
(TRL always averages); `rpo`, `orpo` and `sft` take each chosen response's own per-token NLL (log-prob / length) and
average over examples, where TRL averages over all chosen tokens of the batch (equal when the lengths are equal);
`bco_pair`'s reward shift `delta` is a fixed option (TRL 1.16 uses 0; the BCO paper a running mean); TRL's `sigmoid`
is `dpo` here, and TRL's DPO loss has no label smoothing (its `robust` and `exo_pair` use it); `kto`'s reference
point comes from `kl_logratios` when given (TRL's mismatched-pair estimate), else from the batch's own log-ratios.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from rewardlab.registry import Registry

__all__ = ["PREFERENCE_LOSSES", "REFERENCE_FREE", "PreferenceBatch", "preference_loss", "register_preference_loss"]

#: The registered losses that read no reference log-probs (a run of only these loads no reference model).
REFERENCE_FREE = frozenset({"simpo", "orpo", "sft"})

#: name -> loss(batch, **options) -> (losses [B], chosen_rewards [B] | None, rejected_rewards [B] | None).
PREFERENCE_LOSSES: Registry[Callable[..., tuple[Tensor, Tensor | None, Tensor | None]]] = Registry(
    "preference loss", reserved=("batch",))


@dataclass(frozen=True)
class PreferenceBatch:
    """One batch of preference data as summed log-probs (see the module doc); the optional fields are None when not
    given."""

    chosen_logps: Tensor
    rejected_logps: Tensor
    ref_chosen_logps: Tensor | None = None
    ref_rejected_logps: Tensor | None = None
    chosen_lengths: Tensor | None = None
    rejected_lengths: Tensor | None = None

    def need(self, loss: str, *fields: str) -> tuple[Tensor, ...]:
        """The named fields, as float tensors.

        Raises:
            ValueError: one line naming the loss and the first field that is None.
        """
        out = []
        for name in fields:
            value = getattr(self, name)
            if value is None:
                raise ValueError(f"preference loss {loss!r} needs {name}")
            out.append(value.float() if value.is_floating_point() else value.to(torch.float32))
        return tuple(out)

    def log_ratios(self, loss: str) -> tuple[Tensor, Tensor]:
        """(h_w, h_l) = policy minus reference summed log-probs of the chosen and rejected responses, [B] each."""
        pc, pr, rc, rr = self.need(loss, "chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
        return pc - rc, pr - rr

    def averages(self, loss: str) -> tuple[Tensor, Tensor]:
        """Per-token average log-probs of the chosen and rejected responses, [B] each (lengths at least 1)."""
        pc, pr, lc, lr = self.need(loss, "chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths")
        return pc / lc.clamp(min=1), pr / lr.clamp(min=1)

    def chosen_nll(self) -> Tensor:
        """-log pi(y_w) per token of the chosen response (per response when no lengths are given), [B]."""
        pc = self.chosen_logps.float()
        return -pc / self.chosen_lengths.float().clamp(min=1) if self.chosen_lengths is not None else -pc


def register_preference_loss(name: str) -> Callable:
    """Register `fn(batch, *, <options>) -> (losses, chosen_rewards, rejected_rewards)` in `PREFERENCE_LOSSES`.
    Raises ValueError if taken."""
    return PREFERENCE_LOSSES.register(name)


def _check_beta(loss: str, beta: float) -> float:
    if not beta > 0:
        raise ValueError(f"preference loss {loss!r}: beta must be > 0, got {beta}")
    return float(beta)


def _dpo_terms(logits: Tensor, label_smoothing: float) -> Tensor:
    """-(1 - eps) log sigmoid(logits) - eps log sigmoid(-logits)."""
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


# ------------------------------------------------------------------------------------------------- the losses
@register_preference_loss("dpo")
def dpo(batch: PreferenceBatch, *, beta: float = 0.1, label_smoothing: float = 0.0):
    """Direct Preference Optimization (Rafailov et al., 2023, arXiv:2305.18290), with conservative DPO's label
    smoothing (Mitchell, 2023):

        loss = -(1 - eps) log sigmoid(beta (h_w - h_l)) - eps log sigmoid(-beta (h_w - h_l)),  eps = label_smoothing
        rewards: beta h_w, beta h_l

    Raises:
        ValueError: beta <= 0, label_smoothing outside [0, 0.5), a missing reference log-prob.
    """
    beta = _check_beta("dpo", beta)
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"preference loss 'dpo': label_smoothing must be in [0, 0.5), got {label_smoothing}")
    hw, hl = batch.log_ratios("dpo")
    return _dpo_terms(beta * (hw - hl), label_smoothing), beta * hw, beta * hl


@register_preference_loss("ipo")
def ipo(batch: PreferenceBatch, *, beta: float = 0.1):
    """Identity Preference Optimization (Azar et al., 2023, arXiv:2310.12036, eq. 17; beta is the paper's tau, TRL's
    name):

        loss = (h - 1 / (2 beta))^2,  h = h_w - h_l, or with lengths given h = h_w / |y_w| - h_l / |y_l| (TRL's
        convention, which its authors confirmed matches the paper's results; without lengths the summed form)
        rewards: beta h_w, beta h_l

    Raises:
        ValueError: beta <= 0, a missing reference log-prob.
    """
    beta = _check_beta("ipo", beta)
    hw, hl = batch.log_ratios("ipo")
    if batch.chosen_lengths is not None and batch.rejected_lengths is not None:
        _, _, lc, lr = batch.need("ipo", "chosen_logps", "rejected_logps", "chosen_lengths", "rejected_lengths")
        h = hw / lc.clamp(min=1) - hl / lr.clamp(min=1)
    else:
        h = hw - hl
    return (h - 1 / (2 * beta)) ** 2, beta * hw, beta * hl


@register_preference_loss("simpo")
def simpo(batch: PreferenceBatch, *, beta: float = 2.0, gamma: float = 1.0):
    """Simple Preference Optimization, reference-free (Meng et al., 2024, arXiv:2405.14734):

        loss = -log sigmoid(beta (log pi(y_w) / |y_w| - log pi(y_l) / |y_l|) - gamma)
        rewards: beta log pi(y_w) / |y_w|, beta log pi(y_l) / |y_l|

    Defaults: beta 2.0 and the margin gamma 1.0 (TRL's gamma_beta_ratio 0.5 times beta 2). The reference log-probs
    are not read.

    Raises:
        ValueError: beta <= 0, missing lengths.
    """
    beta = _check_beta("simpo", beta)
    aw, al = batch.averages("simpo")
    return -F.logsigmoid(beta * (aw - al) - gamma), beta * aw, beta * al


@register_preference_loss("kto")
def kto(batch: PreferenceBatch, *, beta: float = 0.1, desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0, kl_logratios: Tensor | None = None):
    """Kahneman-Tversky Optimization on unpaired examples (Ethayarajh et al., 2024, arXiv:2402.01306): the chosen
    responses are the desirable ones, the rejected the undesirable ones (their counts may differ).

        z0 = max(0, mean(kl_logratios)), detached: the reference point, an estimate of KL(pi || pi_ref) from
             mismatched (prompt, completion) pairs (TRL's), or, without kl_logratios, from the batch's own
             log-ratios h_w and h_l (an estimate biased by the examples' own preference)
        desirable:   loss = lambda_D (1 - sigmoid(beta (h_w - z0)))
        undesirable: loss = lambda_U (1 - sigmoid(beta (z0 - h_l)))
        rewards: beta h_w, beta h_l

    Returns:
        losses [B_w + B_l]: the desirable examples' then the undesirable ones'.
    Raises:
        ValueError: beta <= 0, a negative weight, a missing reference log-prob.
    """
    beta = _check_beta("kto", beta)
    if desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError(f"preference loss 'kto': weights must be >= 0, got desirable_weight={desirable_weight}, "
                         f"undesirable_weight={undesirable_weight}")
    hw, hl = batch.log_ratios("kto")
    source = kl_logratios.float() if kl_logratios is not None else torch.cat([hw, hl])
    z0 = source.detach().mean().clamp(min=0) if source.numel() else torch.zeros((), device=hw.device)
    losses = torch.cat([desirable_weight * (1 - torch.sigmoid(beta * (hw - z0))),
                        undesirable_weight * (1 - torch.sigmoid(beta * (z0 - hl)))])
    return losses, beta * hw, beta * hl


@register_preference_loss("orpo")
def orpo(batch: PreferenceBatch, *, beta: float = 0.1):
    """Odds Ratio Preference Optimization, reference-free (Hong et al., 2024, arXiv:2403.07691; beta is the paper's
    lambda, TRL's name):

        a_w = log pi(y_w) / |y_w|, a_l likewise; log odds(y) = a - log(1 - exp(a))
        loss = -a_w - beta log sigmoid(log odds(y_w) - log odds(y_l))     (SFT on the chosen + the odds-ratio term)
        rewards: beta a_w, beta a_l

    Raises:
        ValueError: beta <= 0, missing lengths.
    """
    beta = _check_beta("orpo", beta)
    aw, al = batch.averages("orpo")
    log_odds = (aw - al) - (torch.log1p(-torch.exp(aw)) - torch.log1p(-torch.exp(al)))
    return -aw - beta * F.logsigmoid(log_odds), beta * aw, beta * al


@register_preference_loss("rpo")
def rpo(batch: PreferenceBatch, *, beta: float = 0.1, alpha: float = 1.0, label_smoothing: float = 0.0):
    """DPO plus an NLL term on the chosen response (RPO, Pang et al., 2024, arXiv:2404.19733; TRL's rpo_alpha):

        loss = dpo + alpha * NLL(y_w),  NLL = -log pi(y_w) / |y_w| (per token; -log pi(y_w) without lengths)
        rewards: beta h_w, beta h_l

    Raises:
        ValueError: as `dpo`, alpha < 0.
    """
    if alpha < 0:
        raise ValueError(f"preference loss 'rpo': alpha must be >= 0, got {alpha}")
    losses, cw, cl = dpo(batch, beta=beta, label_smoothing=label_smoothing)
    return losses + alpha * batch.chosen_nll(), cw, cl


@register_preference_loss("bco_pair")
def bco_pair(batch: PreferenceBatch, *, beta: float = 0.1, delta: float = 0.0):
    """Binary Classifier Optimization on pairs (Jung et al., 2024, arXiv:2404.04656; TRL's bco_pair):

        r_w = beta h_w, r_l = beta h_l;  loss = -log sigmoid(r_w - delta) - log sigmoid(-(r_l - delta))
        rewards: r_w, r_l

    `delta` is the reward shift (TRL 1.16 uses 0; the paper a running mean of the rewards).

    Raises:
        ValueError: beta <= 0, a missing reference log-prob.
    """
    beta = _check_beta("bco_pair", beta)
    hw, hl = batch.log_ratios("bco_pair")
    rw, rl = beta * hw, beta * hl
    return -F.logsigmoid(rw - delta) - F.logsigmoid(-(rl - delta)), rw, rl


@register_preference_loss("sft")
def sft(batch: PreferenceBatch):
    """Supervised fine-tuning on the chosen response: loss = -log pi(y_w) / |y_w| (per token; -log pi(y_w) without
    lengths). No implicit rewards."""
    return batch.chosen_nll(), None, None


# ------------------------------------------------------------------------------------------------- the entry
def _check_options(names: list[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each loss's share of `options` (the ones it declares).

    Raises:
        ValueError: an unknown loss name, or an option no loss of `names` declares (naming it).
    """
    declared = {name: PREFERENCE_LOSSES.options(name) or () for name in names}  # also checks each name
    field = f"preference loss {names[0]!r}" if len(names) == 1 else f"preference losses {names}"
    for key in options:
        if not any(key in d for d in declared.values()):
            valid = sorted({k for d in declared.values() for k in d})
            raise ValueError(f"unknown option {key!r} for {field}; valid: {', '.join(valid) or '(none)'}")
    return {name: {k: v for k, v in options.items() if k in declared[name]} for name in names}


def preference_loss(name: str | Sequence[str], *, chosen_logps: Tensor, rejected_logps: Tensor,
                    ref_chosen_logps: Tensor | None = None, ref_rejected_logps: Tensor | None = None,
                    chosen_lengths: Tensor | None = None, rejected_lengths: Tensor | None = None,
                    **options: Any) -> tuple[Tensor, dict[str, float]]:
    """Preference loss `name` (or a weighted mix of several, with option `loss_weights`) on summed log-probs.

    Args:
        name: a key of `PREFERENCE_LOSSES` (dpo, ipo, simpo, kto, orpo, rpo, bco_pair, sft), or a list of them.
        chosen_logps, rejected_logps: [B] float summed log-probs of the responses under the policy.
        ref_chosen_logps, ref_rejected_logps: [B] float, under the reference (the losses that use a reference).
        chosen_lengths, rejected_lengths: [B] token counts (the length-normalized losses).
        **options: the losses' declared options, and `loss_weights` (a list, one weight per name of a list).
    Returns:
        (losses, stats): losses [B] float32 per example ([B_w + B_l] for kto); stats: rewards/chosen,
        rewards/rejected, rewards/margins, rewards/accuracies (mean over examples of the first implicit rewards a
        loss of the mix gives; margins and accuracies only when chosen and rejected pair up), logps/chosen,
        logps/rejected (means of the summed log-probs), and loss (the mean loss), as Python floats.
    Raises:
        ValueError: an unknown name or option (one line naming it), an option value a loss refuses, an input a loss
            needs missing, loss_weights of another length than the list of names, kto in a mix.
    """
    names = [name] if isinstance(name, str) else list(name)
    if not names:
        raise ValueError("preference loss: no loss named")
    weights = options.pop("loss_weights", None)
    if weights is None:
        weights = [1.0] * len(names)
    if len(weights) != len(names):
        raise ValueError(f"loss_weights: {len(weights)} weights for {len(names)} losses {names}")
    if len(names) > 1 and "kto" in names:
        raise ValueError("preference loss 'kto' scores unpaired examples and cannot be mixed with paired losses")
    shares = _check_options(names, options)
    batch = PreferenceBatch(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths,
                            rejected_lengths)
    total: Tensor | None = None
    rewards: tuple[Tensor, Tensor] | None = None
    for loss_name, weight in zip(names, weights):
        losses, rw, rl = PREFERENCE_LOSSES[loss_name](batch, **shares[loss_name])
        total = weight * losses if total is None else total + weight * losses
        if rewards is None and rw is not None:
            rewards = (rw, rl)
    stats = {"loss": float(total.detach().mean()), "logps/chosen": float(chosen_logps.detach().float().mean()),
             "logps/rejected": float(rejected_logps.detach().float().mean())}
    if rewards is not None:
        rw, rl = rewards[0].detach(), rewards[1].detach()
        stats.update({"rewards/chosen": float(rw.mean()), "rewards/rejected": float(rl.mean())})
        if rw.shape == rl.shape:
            stats.update({"rewards/margins": float((rw - rl).mean()),
                          "rewards/accuracies": float((rw > rl).float().mean())})
    return total.float(), stats
