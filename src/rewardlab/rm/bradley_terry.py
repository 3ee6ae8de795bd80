"""Bradley–Terry reward model training (`rewardlab rm train`): a scalar head on any HF backbone, trained on
preference pairs so that P(chosen > rejected) = sigmoid(r_chosen - r_rejected) (Bradley & Terry 1952; Ouyang et al.
2022), with an optional per-pair margin (Touvron et al. 2023, Llama 2) and reward centering (Eisenstein et al. 2023).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rewardlab.rewards.model import encode_outcome
from rewardlab.rm.backbone import load_backbone
from rewardlab.rm.data import Pair, load_pairs
from rewardlab.rm.fit import fit, open_fit_run


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


def run_rm_train(cfg, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab rm train`: fit a Bradley–Terry reward model on `cfg.data` pairs; evaluate on `cfg.eval_data`.

    Writes the run directory `cfg.out`: config.yaml, metrics.jsonl (`train/loss`, `train/accuracy`,
    `train/margin_mean`, `train/reward_mean`, `train/reward_std`, `lr`, `time/step_s`, and `eval/*` every
    `train.eval_every` steps and at the end), checkpoints/step-K every `cfg.save_every` steps and at the end (HF
    format, loads with `reward_model`, plus trainer_state.pt; the `cfg.keep_checkpoints` most recent kept),
    plots/rm_train.png and summary.json. The directory is opened with `RunDir.start` once the data and backbone
    load; `resume` continues from its newest valid checkpoint and logs what the uninterrupted run logs (see
    `rm.fit.fit`), `overwrite` replaces the run there.

    Returns:
        the summary: steps, pairs, wall seconds, final train and eval metrics, `final_checkpoint`, `resumed_from`.
    Raises:
        ValueError / FileNotFoundError: bad data files (naming FILE:LINE), an unknown backbone; `RunDirError`: the
            directory holds a run and neither `resume` nor `overwrite` is given, is in use, or has nothing to resume.
    """
    t = cfg.train
    train_pairs = load_pairs(cfg.data)
    eval_pairs = load_pairs(cfg.eval_data) if cfg.eval_data else []
    model, tokenizer = load_backbone(cfg.model.path, "sequence", device=cfg.model.device,
                                     tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)
    # Opened only once the data and backbone load.
    with open_fit_run(cfg, model, resume=resume, overwrite=overwrite) as (run, start_step, checkpoint, rng):

        def evaluate() -> dict[str, float]:
            res = model_pair_stats(model, tokenizer, eval_pairs, batch_size=t.batch_size, max_length=t.max_length)
            return {f"eval/{k}": v for k, v in res.items()}

        def batch_loss(idx: Sequence[int]) -> tuple[torch.Tensor, dict[str, float]]:
            batch = [train_pairs[i] for i in idx]
            chosen, rejected = pair_rewards(model, tokenizer, batch, t.max_length)
            margin = torch.tensor([p.margin for p in batch], device=chosen.device) if t.use_margin else None
            stats = pair_stats(chosen.detach().tolist(), rejected.detach().tolist())
            return (bradley_terry_loss(chosen, rejected, margin, t.center_coef),
                    {f"train/{k}": v for k, v in stats.items()})

        wall0 = time.perf_counter()
        step, last, last_eval, final = fit(
            model, t, len(train_pairs), batch_loss, rng=rng, run=run, name="RM train", progress_key="train/accuracy",
            save_model=lambda d: (model.save_pretrained(d), tokenizer.save_pretrained(d)),
            save_every=cfg.save_every, keep_checkpoints=cfg.keep_checkpoints, resume_from=checkpoint,
            evaluate=evaluate if eval_pairs else None, show_progress=show_progress)
        run.plot(["train/loss", "train/accuracy", "eval/accuracy"], "rm_train.png")
        summary = {"stage": "rm_train", "loss": "bradley_terry", "backbone": cfg.model.path, "steps": step,
                   "train_pairs": len(train_pairs), "eval_pairs": len(eval_pairs),
                   "wall_s": time.perf_counter() - wall0,
                   "final_train": {k: v for k, v in last.items() if not k.startswith("eval/")},
                   "final_eval": last_eval, "final_checkpoint": str(final),
                   "resumed_from": start_step if resume else None}
        run.write_summary(summary)
    return summary
