"""The per-step rollouts file (rewardlab.rollout_log): what the trainer writes is what the loss used, the clip codes,
rl.logging.log_tokens / log_completions, TRL's completions table, and the resume rollback."""

import json

import pandas as pd
import pytest
import torch

import rewardlab.rl.update as update_module
from rewardlab import rollout_log
from rewardlab.rl.losses import CLIP_DUAL, CLIP_HIGH, CLIP_LOW, CLIP_NONE, kl_penalty, loss_tokens, ppo_clip
from rewardlab.rl.trainer import train
from rewardlab.runs import RunDir
from rl.test_trainer import _config


def test_ppo_clip_reports_each_tokens_ratio_and_active_clip():
    """Hand-made ratios: 1.5 with A > 0 is clipped high, 0.5 with A < 0 low, 5 with A < 0 hits the dual clip
    (c = 3), 1.0 nothing; a masked token has code 0 and ratio 0."""
    ratios = torch.tensor([[1.5, 0.5, 5.0, 1.0, 1.5]])
    old = torch.zeros_like(ratios)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.float32)
    _, stats = ppo_clip(logprobs=ratios.log(), old_logprobs=old, advantages=adv, mask=mask, dual_clip=3.0)
    tokens = loss_tokens(stats)
    assert tokens["clip"].tolist() == [[CLIP_HIGH, CLIP_LOW, CLIP_DUAL, CLIP_NONE, CLIP_NONE]]
    assert tokens["ratio"] == pytest.approx(torch.tensor([[1.5, 0.5, 5.0, 1.0, 0.0]]), abs=1e-6)
    assert stats["policy/clip_frac"] == pytest.approx(3 / 4)  # the codes are the counted clips
    assert all(isinstance(v, float) for v in stats.values())


def _capture_loss_inputs(monkeypatch):
    """Record every call of the update's `compute_policy_loss` (one per minibatch): its inputs and per-token view."""
    calls = []
    real = update_module.compute_policy_loss

    def spy(name, **kw):
        loss, stats = real(name, **kw)
        calls.append({k: kw[k].detach().clone() for k in ("logprobs", "old_logprobs", "advantages", "mask")}
                     | {f"token/{k}": v.clone() for k, v in loss_tokens(stats).items()})
        return loss, stats

    monkeypatch.setattr(update_module, "compute_policy_loss", spy)
    return calls


def _viewer_api(run):
    """A client of `rewardlab view`'s app over `run`, or None without the view extra."""
    try:
        from starlette.testclient import TestClient

        from rewardlab.view import create_app
    except ImportError:
        return None
    return TestClient(create_app([run], quiet=True))


def test_logged_tokens_are_the_values_the_loss_used(tmp_path, monkeypatch):
    """Two steps, two epochs of two minibatches, beta > 0: every logged row's advantages, behaviour and trained
    log-probs, ratio and clip codes equal the ones the loss read and computed in the step's first epoch (found by
    the row's behaviour log-probs), its KL term is the estimator's on the logged log-probs; only the first
    rl.logging.log_tokens episodes carry tokens; and the viewer's API serves those same advantages and log-probs."""
    calls = _capture_loss_inputs(monkeypatch)
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.epochs=2", "rl.minibatch_size=8", "rl.beta=0.1",
                  "rl.logging.log_tokens=5")
    train(cfg, show_progress=False)
    run = tmp_path / "run"
    api = _viewer_api(run)
    assert rollout_log.logged_steps(run) == [1, 2] and len(calls) == 8  # 2 steps x 2 epochs x 2 minibatches
    table = rollout_log.read_step(run, 2)
    assert table.num_rows == 16 and table["index"].to_pylist() == list(range(16))
    first_epoch = calls[4:6]  # step 2, epoch 1's two minibatches
    checked = 0
    for i in range(16):
        rec = rollout_log.read_rollout(run, 2, i)
        if i >= 5:
            assert rec["token_ids"] is None and rec["advantages"] is None
            continue
        n = len(rec["token_ids"])
        old = torch.tensor(rec["logprob_old"])
        where = [(c, j) for c in first_epoch for j in range(c["old_logprobs"].shape[0])
                 if torch.equal(c["old_logprobs"][j, :n], old)]
        assert where, f"record {i}: no minibatch row has its behaviour log-probs"
        c, j = where[0]
        assert rec["advantages"] == c["advantages"][j, :n].tolist()
        assert rec["logprob"] == c["logprobs"][j, :n].tolist()
        assert rec["ratio"] == c["token/ratio"][j, :n].tolist()
        assert rec["clip"] == c["token/clip"][j, :n].tolist()
        assert rec["loss_mask"] == c["mask"][j, :n].int().tolist()
        expected_kl = kl_penalty("k3", torch.tensor([rec["logprob"]]), torch.tensor([rec["ref_logprob"]]))
        assert rec["kl"] == pytest.approx(expected_kl[0].tolist(), abs=1e-6)
        sampled = [a for a, m in zip(rec["advantages"], rec["loss_mask"]) if m]
        assert rec["advantage"] == pytest.approx(sum(sampled) / len(sampled))
        assert rec["kept"] and rec["staleness"] == 0 and rec["policy_version"] == 1
        if api is not None:  # what `rewardlab view` serves is what the loss used
            served = api.get(f"/api/runs/0/steps/2/rollouts/{i}").json()
            assert served["advantages"] == c["advantages"][j, :n].tolist()
            assert served["logprob"] == c["logprobs"][j, :n].tolist() and served["loss_mask"] == rec["loss_mask"]
        checked += 1
    assert checked == 5
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if '"step": 2' in x]
    assert [s["reward"] for s in samples] == table["reward"].to_pylist()
    assert [s["completion"] for s in samples] == table["completion"].to_pylist()


def test_trls_completions_table_and_the_switches(tmp_path):
    """completions/completions_NNNNN.parquet holds TRL's columns (step, prompt, completion, each reward component,
    advantage) for every rollout; log_tokens=all logs every episode's tokens; log_completions=false writes neither
    file; a bad log_tokens names the key."""
    train(_config(tmp_path, "all", "rl.steps=1", "rl.logging.log_tokens=all"), show_progress=False)
    frame = pd.read_parquet(rollout_log.completions_path(tmp_path / "all", 1))
    assert list(frame.columns) == ["step", "prompt", "completion", "test_digit_frac", "advantage"]
    table = rollout_log.read_step(tmp_path / "all", 1)
    assert frame["completion"].tolist() == table["completion"].to_pylist()
    assert frame["test_digit_frac"].tolist() == table["reward/test_digit_frac"].to_pylist()
    assert all(ids is not None for ids in table["token_ids"].to_pylist())
    metrics = json.loads((tmp_path / "all" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["time/log_s"] > 0

    train(_config(tmp_path, "off", "rl.steps=1", "rl.logging.log_completions=false"), show_progress=False)
    assert not (tmp_path / "off" / "rollouts").exists() and not (tmp_path / "off" / "completions").exists()
    from rewardlab.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="rl.logging.log_tokens"):
        _config(tmp_path, "bad", "rl.logging.log_tokens=-1")


def test_resume_rolls_the_step_files_back_to_the_checkpoint(tmp_path):
    """Files of steps after the checkpoint a run resumes from move to rolled_back/ (nothing deleted), a temp file a
    crash left mid-write is removed, and a name that is not a step file is refused."""
    run = RunDir.start(tmp_path / "run")
    try:
        rows = [{"episode": 0, "row": 0, "prompt": "p", "completion": "c", "reward": 1.0}]
        for step in (1, 2, 3):
            rollout_log.write_step(run, step, rows)
            if step == 2:
                run.save_checkpoint(2, lambda p: (p / "weights").write_text("w"))
        (run.path / "rollouts" / ".step-000004.parquet.tmp").write_bytes(b"half")
        assert rollout_log.logged_steps(run.path) == [1, 2, 3]
        run.resume_checkpoint()
        assert rollout_log.logged_steps(run.path) == [1, 2]
        assert sorted(p.name for p in (run.path / "rollouts").iterdir()) == ["step-000001.parquet",
                                                                            "step-000002.parquet"]
        assert (run.path / "rolled_back" / "rollouts" / "step-000003.parquet").is_file()
        assert (run.path / "rolled_back" / "completions" / "completions_00003.parquet").is_file()
        with pytest.raises(ValueError, match="not a per-step file"):
            run.write_step_file("rollouts/notes.txt", lambda p: p.write_text("x"))
    finally:
        run.close()
    with pytest.raises(IndexError, match="has 1 rollout records; no index 5"):
        rollout_log.read_rollout(tmp_path / "run", 1, 5)
    with pytest.raises(FileNotFoundError, match="step 9 has no rollouts file"):
        rollout_log.read_rollout(tmp_path / "run", 9, 0)
