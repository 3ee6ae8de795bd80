"""Process reward model training (`rewardlab prm train`): binary classification of each step at its step tag.

The input format is `rewardlab.rewards.model.encode_process` (the same function scores at inference); the model is an
`AutoModelForTokenClassification` with one label whose logit at a step's tag is log-odds that the step is correct.
Loss: binary cross-entropy with (possibly soft) labels, averaged over the labelled steps of a batch (Math-Shepherd,
Wang et al. 2024; Lightman et al. 2023):

    loss = -(1/S) sum_s [ y_s log sigmoid(z_s) + (1 - y_s) log(1 - sigmoid(z_s)) ],  y_s in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rewardlab.rewards.model import encode_process, pad_batch
from rewardlab.rm.data import StepRow


def step_logits(model, batch: Sequence[tuple[list[int], list[int]]], pad_id: int) -> list[torch.Tensor]:
    """Logits at each step tag for `encode_process` outputs: one [S_i] float32 tensor per solution."""
    ids, att = pad_batch([b[0] for b in batch], pad_id)
    logits = model(input_ids=ids.to(model.device), attention_mask=att.to(model.device)).logits[..., 0].float()
    return [logits[i, torch.tensor(b[1], device=logits.device)] for i, b in enumerate(batch)]


def prm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy over steps: [S] logits, [S] labels in [0, 1] -> scalar (nats per step)."""
    return F.binary_cross_entropy_with_logits(logits, labels)


def encode_rows(tokenizer, rows: Sequence[StepRow], step_tag: str, max_length: int):
    """(kept rows, their `encode_process` outputs, number dropped for being longer than `max_length` tokens)."""
    kept, enc, dropped = [], [], 0
    for r in rows:
        try:
            enc.append(encode_process(tokenizer, r.prompt, r.steps, step_tag, max_length))
            kept.append(r)
        except ValueError as exc:
            if "max_length" not in str(exc):
                raise
            dropped += 1
    return kept, enc, dropped


@torch.inference_mode()
def evaluate_steps(model, tokenizer, rows: Sequence[StepRow], encoded, *, batch_size: int = 64) -> dict[str, float]:
    """Held-out loss, step accuracy (P >= 0.5 vs label >= 0.5) and first-error F1 at threshold 0.5.

    The first-error prediction is the first step with P(correct) < 0.5 (-1 if none), against `StepRow.first_error`.
    """
    from rewardlab.evaluation.reward_models import first_error_f1, predict_first_error

    was = model.training
    model.eval()
    losses, hits, n_steps, preds = 0.0, 0, 0, []
    for s in range(0, len(rows), batch_size):
        logits = step_logits(model, encoded[s : s + batch_size], tokenizer.pad_token_id)
        for row, z in zip(rows[s : s + batch_size], logits):
            y = torch.tensor(row.labels, device=z.device)
            losses += F.binary_cross_entropy_with_logits(z, y, reduction="sum").item()
            p = torch.sigmoid(z)
            hits += int(((p >= 0.5) == (y >= 0.5)).sum())
            n_steps += len(row.labels)
            preds.append(predict_first_error(p.tolist(), 0.5))
    model.train(was)
    fe = first_error_f1(preds, [r.first_error for r in rows])
    return {"loss": losses / n_steps, "step_accuracy": hits / n_steps, "first_error_f1@0.5": fe["f1"],
            "error_acc@0.5": fe["error_acc"], "correct_acc@0.5": fe["correct_acc"]}
