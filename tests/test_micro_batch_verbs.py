"""sft.micro_batch_size and train.micro_batch_size (rm train, prm train) are memory switches: the gradient accumulated
over micro-batches is the whole batch's (a mean over its tokens, pairs or steps, not a mean of micro-batch means),
so runs log the same losses and metrics with and without them."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY_ARCH, write_jsonl
from rewardlab.commands.prm import train as run_prm_train
from rewardlab.commands.rm import train as run_rm_train
from rewardlab.config import PrmTrainConfig, RmTrainConfig
from rewardlab.policy import load_policy
from rewardlab.sft import sft_gradient, sft_loss


def _sft_rows(policy):
    rows = []
    for i, target in enumerate(["1", "22", "333", "4444", "5", "66666", "7"]):
        prompt = policy.encode_prompt(f"{i}+{i}=")
        ids = policy.encode_target(target)
        mask = [1] * len(ids) if i % 3 else [int(k % 2 == 0) for k in range(len(ids))]  # some trace-like masks
        rows.append((prompt, ids, mask if i % 2 else None))
    return rows


def _grads(policy):
    return [p.grad.clone() for p in policy.model.parameters()]


def test_sft_micro_batches_accumulate_the_gradient_of_the_batch_mean():
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    rows = _sft_rows(policy)
    policy.model.zero_grad(set_to_none=True)
    loss, _ = sft_loss(policy, [p for p, _, _ in rows], [t for _, t, _ in rows], [m for _, _, m in rows])
    loss.backward()
    expected = _grads(policy)
    scale = max(float(g.abs().max()) for g in expected)
    for micro in (None, 1, 3):
        policy.model.zero_grad(set_to_none=True)
        value, tokens = sft_gradient(policy, rows, micro)
        assert value == pytest.approx(loss.item(), rel=1e-5)
        assert max(float((a - b).abs().max()) for a, b in zip(_grads(policy), expected)) <= 1e-5 * scale
    # the check can fail: averaging the micro-batches' own means weighs a short row's tokens more
    policy.model.zero_grad(set_to_none=True)
    parts = [rows[:3], rows[3:]]
    for part in parts:
        part_loss, _ = sft_loss(policy, [p for p, _, _ in part], [t for _, t, _ in part], [m for _, _, m in part])
        (part_loss / len(parts)).backward()
    assert max(float((a - b).abs().max()) for a, b in zip(_grads(policy), expected)) > 1e-3 * scale
    with pytest.raises(ValueError, match="sft.micro_batch_size"):
        sft_gradient(policy, rows, 0)


def _metrics(summary):
    run = summary["final_checkpoint"].rsplit("/checkpoints/", 1)[0]
    return [json.loads(line) for line in open(f"{run}/metrics.jsonl")]


def _same_metrics(a, b, keys):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in keys:
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), (x["step"], k)


def test_rm_train_with_micro_batches_logs_the_same_losses(tmp_path):
    pairs = [{"prompt": f"{i}+{i}=", "chosen": "yes" * (1 + i % 3), "rejected": "no"} for i in range(12)]
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    runs = []
    for micro in (None, 3):
        cfg = RmTrainConfig(data=str(data), out=str(tmp_path / f"rm{micro}"), model={"path": "tiny", "tiny": TINY_ARCH},
                            train={"epochs": 1, "batch_size": 8, "lr": 1e-2, "micro_batch_size": micro})
        runs.append(_metrics(run_rm_train(cfg, show_progress=False)))
    _same_metrics(*runs, ["train/loss", "train/accuracy", "train/margin_mean", "train/reward_std"])


def test_prm_train_with_micro_batches_weighs_each_step_once(tmp_path, monkeypatch):
    # The token-classification head has dropout (p = 0.1): its masks are drawn per forward pass, so micro-batches
    # draw other masks (from the same distribution). Turned off here to compare the arithmetic.
    import rewardlab.commands.prm as prm_command

    load = prm_command.load_backbone

    def without_dropout(*args, **kwargs):
        model, tokenizer = load(*args, **kwargs)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model, tokenizer

    monkeypatch.setattr(prm_command, "load_backbone", without_dropout)
    rows = []
    for i in range(10):  # 1 to 4 steps per row: a mean per row would weigh them differently
        steps = ["ok", "bad", "ok", "ok"][: 1 + i % 4]
        rows.append({"prompt": f"q{i}", "steps": steps, "labels": [0.0 if s == "bad" else 1.0 for s in steps]})
    data = write_jsonl(tmp_path / "steps.jsonl", rows)
    runs = []
    for micro in (None, 3):
        cfg = PrmTrainConfig(data=str(data), out=str(tmp_path / f"prm{micro}"), model={"path": "tiny", "tiny": TINY_ARCH},
                             train={"epochs": 1, "batch_size": 8, "lr": 1e-2, "micro_batch_size": micro})
        runs.append(_metrics(run_prm_train(cfg, show_progress=False)))
    _same_metrics(*runs, ["train/loss", "train/step_accuracy"])
