"""Process reward model training (`rewardlab prm train`): binary classification of each step at its step tag.

The input format is `rewardlab.rewards.model.encode_process` (the same function scores at inference); the model is an
`AutoModelForTokenClassification` with one label whose logit at a step's tag is log-odds that the step is correct.
Loss: binary cross-entropy with (possibly soft) labels, averaged over the labelled steps of a batch (Math-Shepherd,
Wang et al. 2024; Lightman et al. 2023):

    loss = -(1/S) sum_s [ y_s log sigmoid(z_s) + (1 - y_s) log(1 - sigmoid(z_s)) ],  y_s in [0, 1].
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rewardlab.rewards.model import check_step_tag, encode_process, pad_batch
from rewardlab.rm.backbone import load_backbone
from rewardlab.rm.data import StepRow, load_step_rows
from rewardlab.rm.fit import fit, open_fit_run


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


def run_prm_train(cfg, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab prm train`: fit a PRM on `cfg.data` step-labelled rows; evaluate on `cfg.eval_data`.

    Writes the run directory `cfg.out`: config.yaml, metrics.jsonl (`train/loss`, `train/step_accuracy`, `lr`,
    `time/step_s`, `eval/*`), checkpoints/step-K every `cfg.save_every` steps and at the end (HF format with
    `step_tag` and `step_separator` in config.json, loads with `process_reward_model`, plus trainer_state.pt; the
    `cfg.keep_checkpoints` most recent kept), plots/prm_train.png and summary.json. The directory is opened with
    `RunDir.start` once the data and backbone load; `resume` continues from its newest valid checkpoint and logs what
    the uninterrupted run logs (see `rm.fit.fit`), `overwrite` replaces the run there.

    Raises:
        ValueError / FileNotFoundError: bad data (FILE:LINE), a bad step tag, an unknown backbone, or no row that
            fits `train.max_length`; `RunDirError`: the directory holds a run and neither `resume` nor `overwrite` is
            given, is in use, or has nothing to resume.
    """
    t = cfg.train
    check_step_tag(t.step_tag)
    train_rows = load_step_rows(cfg.data)
    eval_rows = load_step_rows(cfg.eval_data) if cfg.eval_data else []
    model, tokenizer = load_backbone(cfg.model.path, "token", device=cfg.model.device,
                                     tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)
    limit = getattr(model.config, "max_position_embeddings", None)
    max_length = min(t.max_length, limit) if limit else t.max_length
    train_rows, train_enc, dropped = encode_rows(tokenizer, train_rows, t.step_tag, max_length)
    eval_rows, eval_enc, eval_dropped = encode_rows(tokenizer, eval_rows, t.step_tag, max_length)
    if not train_rows:
        raise ValueError(f"{cfg.data}: no row fits train.max_length={max_length} tokens")
    model.config.step_tag = t.step_tag
    model.config.step_separator = t.separator
    # Opened only once the data and backbone load.
    with open_fit_run(cfg, model, resume=resume, overwrite=overwrite) as (run, start_step, checkpoint, rng):

        def evaluate() -> dict[str, float]:
            res = evaluate_steps(model, tokenizer, eval_rows, eval_enc, batch_size=t.batch_size)
            return {f"eval/{k}": v for k, v in res.items()}

        def batch_loss(idx: Sequence[int]) -> tuple[torch.Tensor, dict[str, float]]:
            z = torch.cat(step_logits(model, [train_enc[i] for i in idx], tokenizer.pad_token_id))
            y = torch.tensor([v for i in idx for v in train_rows[i].labels], device=z.device)
            acc = ((z.detach() >= 0) == (y >= 0.5)).float().mean().item()
            return prm_loss(z, y), {"train/step_accuracy": acc}

        wall0 = time.perf_counter()
        step, last, last_eval, final = fit(
            model, t, len(train_rows), batch_loss, rng=rng, run=run, name="PRM train",
            progress_key="train/step_accuracy",
            save_model=lambda d: (model.save_pretrained(d), tokenizer.save_pretrained(d)),
            save_every=cfg.save_every, keep_checkpoints=cfg.keep_checkpoints, resume_from=checkpoint,
            evaluate=evaluate if eval_rows else None, show_progress=show_progress)
        run.plot(["train/loss", "train/step_accuracy", "eval/step_accuracy"], "prm_train.png")
        summary = {"stage": "prm_train", "backbone": cfg.model.path, "steps": step, "train_rows": len(train_rows),
                   "train_rows_too_long": dropped, "eval_rows": len(eval_rows), "eval_rows_too_long": eval_dropped,
                   "step_tag": t.step_tag, "wall_s": time.perf_counter() - wall0,
                   "final_train": {k: v for k, v in last.items() if not k.startswith("eval/")},
                   "final_eval": last_eval, "final_checkpoint": str(final),
                   "resumed_from": start_step if resume else None}
        run.write_summary(summary)
    return summary
