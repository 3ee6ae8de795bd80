"""SIGKILL `sft` at a seeded random moment, resume it, and get the uninterrupted run back bit for bit."""

import hashlib
import json
import random

import pytest

from conftest import CHAIN_SUM, TINY_OVERRIDES
from rewardlab.config import SFTConfig, load_config
from rewardlab.runs import RunDirError
from rewardlab.commands.sft import run as run_sft
from sigkill_resume import check_resumed_like_uninterrupted, kill_midway, lines

STEPS, SAVE_EVERY = 24, 4
COMMON = [
    f"sft.steps={STEPS}", "sft.batch_size=8", "sft.lr=3e-3", "sft.warmup_steps=3", f"save_every={SAVE_EVERY}",
    "keep_checkpoints=2", "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items())
    + ", size: 60, test_size: 4}", *TINY_OVERRIDES,
]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sft_killed_and_resumed_logs_what_the_uninterrupted_run_logs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    full = run_sft(load_config(SFTConfig, overrides=[f"out={a}", *COMMON]), show_progress=False)

    # 60 rows in batches of 8: the row sampler reshuffles in the middle of steps 8, 15 and 23.
    k, _ = kill_midway("SFTConfig", [f"out={b}", *COMMON], "rewardlab.commands.sft.run", b, rng=random.Random(0),
                       after=(SAVE_EVERY + 1, STEPS - 8))
    assert not (b / "summary.json").exists() and k <= lines(b / "metrics.jsonl") < STEPS
    resumed = run_sft(load_config(SFTConfig, overrides=[f"out={b}", *COMMON]), mode="resume", show_progress=False)

    assert SAVE_EVERY <= resumed["resumed_from"] < STEPS and resumed["resumed_from"] % SAVE_EVERY == 0
    metrics = check_resumed_like_uninterrupted(a, b, STEPS)
    assert metrics[-1]["sft/loss"] == full["final_loss"] == resumed["final_loss"]  # bit-identical loss (and lr)
    # the final weights are the same bytes, and only the keep_checkpoints=2 most recent checkpoints are left
    assert _sha(b / "checkpoints" / f"step-{STEPS}" / "model.safetensors") == _sha(
        a / "checkpoints" / f"step-{STEPS}" / "model.safetensors")
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == [f"step-{STEPS - SAVE_EVERY}", f"step-{STEPS}"]
    assert resumed["final_checkpoint"] == str(b / "checkpoints" / f"step-{STEPS}")
    assert json.loads((b / "summary.json").read_text())["steps"] == STEPS


def test_sft_refuses_a_used_directory_and_a_resume_without_checkpoint(tmp_path):
    cfg = load_config(SFTConfig, overrides=[*COMMON, f"out={tmp_path / 'r'}", "sft.steps=2", "save_every=5"])
    run_sft(cfg, show_progress=False)
    before = (tmp_path / "r" / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError, match="already holds a run; pass --resume .* or --overwrite"):
        run_sft(cfg, show_progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == before  # untouched
    again = run_sft(cfg, mode="overwrite", show_progress=False)
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count("\n") == 2 and again["resumed_from"] is None
    # a run killed before its first checkpoint has nothing to resume from
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RunDirError, match="^--resume: cannot resume .*: it has no checkpoint$"):
        run_sft(cfg.model_copy(update={"out": str(tmp_path / "early")}), mode="resume", show_progress=False)
