"""Bradley–Terry reward model training (`rewardlab rm train`): a scalar head on any HF backbone, trained on
preference pairs so that P(chosen > rejected) = sigmoid(r_chosen - r_rejected) (Bradley & Terry 1952; Ouyang et al.
2022), with an optional per-pair margin (Touvron et al. 2023, Llama 2) and reward centering (Eisenstein et al. 2023).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rewardlab.rewards.model import encode_outcome
from rewardlab.rm.data import Pair


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None, center_coef: float = 0.0
) -> torch.Tensor:
    """Bradley–Terry pairwise loss with optional margin and centering.

    loss = mean_i [ -log sigmoid(r_c,i - r_r,i - m_i) ] + c * mean_i [ (r_c,i + r_r,i)^2 ]

    The margin m_i (Llama 2, Touvron et al. 2023) asks the chosen reward to exceed the rejected one by m_i; the
    centering term (Eisenstein et al. 2023, "Helping or Herding?", coefficient c, e.g. 0.01) pulls each pair's
    rewards toward a zero sum, which fixes the free offset of the BT model.

    Args:
        chosen: [B] float32 rewards of the chosen responses.
        rejected: [B] float32 rewards of the rejected responses.
        margin: [B] float32 margins (None: 0).
        center_coef: c >= 0.
    Returns:
        scalar loss (nats per pair, plus the centering penalty).
    Raises:
        ValueError: shapes differ or c < 0.
    """
    if chosen.shape != rejected.shape or (margin is not None and margin.shape != chosen.shape):
        raise ValueError(f"bradley_terry_loss: shapes differ: chosen {tuple(chosen.shape)}, rejected "
                         f"{tuple(rejected.shape)}, margin {None if margin is None else tuple(margin.shape)}")
    if center_coef < 0:
        raise ValueError(f"bradley_terry_loss: center_coef must be >= 0, got {center_coef}")
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss


def pair_stats(chosen: Sequence[float], rejected: Sequence[float]) -> dict[str, float]:
    """Pairwise accuracy (ties wrong), mean margin r_c - r_r, and mean/std of all rewards (population std)."""
    from rewardlab.evaluation.reward_models import pairwise_accuracy

    allr = list(chosen) + list(rejected)
    mean = sum(allr) / len(allr)
    return {
        "accuracy": pairwise_accuracy(chosen, rejected),
        "margin_mean": sum(c - r for c, r in zip(chosen, rejected)) / len(chosen),
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((x - mean) ** 2 for x in allr) / len(allr)),
    }


def pair_rewards(model, tokenizer, pairs: Sequence[Pair], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of the chosen and rejected responses of `pairs` in one forward pass: ([B], [B]) float32."""
    prompts = [p.prompt for p in pairs] * 2
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    enc = encode_outcome(tokenizer, prompts, texts, max_length)
    r = model(**{k: v.to(model.device) for k, v in enc.items()}).logits[:, 0].float()
    return r[: len(pairs)], r[len(pairs) :]


@torch.inference_mode()
def model_pair_stats(model, tokenizer, pairs: Sequence[Pair], *, batch_size: int = 64, max_length: int = 512) -> dict:
    """`pair_stats` of a Bradley–Terry model being trained on pairs, in eval mode (the model's mode is restored): the
    `eval/*` metrics of `rm train`. (`rm.evaluate.evaluate_pairs` evaluates any finished scorer, a `Reward`.)"""
    was = model.training
    model.eval()
    ch: list[float] = []
    rj: list[float] = []
    for s in range(0, len(pairs), batch_size):
        c, r = pair_rewards(model, tokenizer, pairs[s : s + batch_size], max_length)
        ch += c.tolist()
        rj += r.tolist()
    model.train(was)
    return pair_stats(ch, rj)
