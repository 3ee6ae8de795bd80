"""SIGKILL `po` (offline, and semi-online) and `rft` at a seeded random moment, resume it, and get the uninterrupted
run back: the same metrics line for line, the same samples and pairs (online), the same final weights."""

import hashlib
import random

from conftest import TINY_OVERRIDES, read_jsonl, write_jsonl
from rewardlab.commands.po import run as run_po
from rewardlab.config import PoConfig, load_config
from sigkill_resume import check_resumed_like_uninterrupted, kill_midway, lines

SAVE_EVERY = 3
TASK = ["task.spec=reasoning_gym:chain_sum", "task.options={size: 120, test_size: 10, min_terms: 2, max_terms: 2, "
        "min_digits: 1, max_digits: 1}"]


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _kill_and_resume(tmp_path, common, steps, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    run_po(load_config(PoConfig, overrides=[f"out={a}", *common]), show_progress=False)
    k, _ = kill_midway("PoConfig", [f"out={b}", *common], "rewardlab.commands.po.run", b, rng=random.Random(seed),
                       after=(SAVE_EVERY + 1, steps - 3))
    assert not (b / "summary.json").exists() and k <= lines(b / "metrics.jsonl") < steps
    resumed = run_po(load_config(PoConfig, overrides=[f"out={b}", *common]), mode="resume", show_progress=False)
    assert SAVE_EVERY <= resumed["resumed_from"] < steps
    check_resumed_like_uninterrupted(a, b, steps)
    assert _sha(b / "checkpoints" / f"step-{steps}" / "model.safetensors") == _sha(
        a / "checkpoints" / f"step-{steps}" / "model.safetensors")
    return a, b


def test_offline_po_killed_and_resumed_logs_what_the_uninterrupted_run_logs(tmp_path):
    rows = [{"prompt": f"{i % 7}+{i % 4}=", "chosen": str(i % 7 + i % 4), "rejected": str(i % 9) + "1"}
            for i in range(40)]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    common = [f"pairs={pairs}", "po.batch_size=4", "po.lr=0.01", "po.epochs=2", "po.lr_schedule=cosine",
              f"save_every={SAVE_EVERY}", "keep_checkpoints=2", "threads=1", *TINY_OVERRIDES]
    _kill_and_resume(tmp_path, common, 20, seed=0)


def test_semi_online_po_killed_and_resumed_samples_and_logs_what_the_uninterrupted_run_does(tmp_path):
    sync = 4  # a sampling copy that differs from the policy between syncs: restored from the checkpoint
    reward = tmp_path / "digits.py"
    reward.write_text("def digits(completion):\n    return float(sum(c.isdigit() for c in completion))\n")
    common = ["po.online=true", "po.steps=14", "po.prompts_per_step=4", "po.num_generations=4", "po.max_new_tokens=3",
              "po.lr=0.02", f"po.sync_every={sync}", f"rewards=[{reward}:digits]", f"save_every={SAVE_EVERY}",
              "keep_checkpoints=2", "threads=1", *TASK, *TINY_OVERRIDES]
    a, b = _kill_and_resume(tmp_path, common, 14, seed=sync)
    for log in ("samples.jsonl", "pairs.jsonl"):
        assert read_jsonl(b / log) == read_jsonl(a / log)


def test_rft_killed_and_resumed_samples_and_logs_what_the_uninterrupted_run_does(tmp_path):
    from rewardlab.commands.rft import run as run_rft
    from rewardlab.config import RftConfig

    reward = tmp_path / "digits.py"
    reward.write_text("def digits(completion):\n    return float(sum(c.isdigit() for c in completion))\n")
    rounds = 12
    common = [f"rft.rounds={rounds}", "rft.prompts_per_round=4", "rft.n=4", "rft.max_new_tokens=3", "rft.threshold=0",
              "rft.steps_per_round=2", "rft.batch_size=3", "rft.lr=0.02", f"rewards=[{reward}:digits]",
              f"save_every={SAVE_EVERY}", "keep_checkpoints=2", "threads=1", *TASK, *TINY_OVERRIDES]
    a, b = tmp_path / "a", tmp_path / "b"
    run_rft(load_config(RftConfig, overrides=[f"out={a}", *common]), show_progress=False)
    k, _ = kill_midway("RftConfig", [f"out={b}", *common], "rewardlab.commands.rft.run", b, rng=random.Random(5),
                       after=(SAVE_EVERY + 1, rounds - 3))
    assert not (b / "summary.json").exists() and k <= lines(b / "metrics.jsonl") < rounds
    resumed = run_rft(load_config(RftConfig, overrides=[f"out={b}", *common]), mode="resume", show_progress=False)
    assert SAVE_EVERY <= resumed["resumed_from"] < rounds
    check_resumed_like_uninterrupted(a, b, rounds)
    assert read_jsonl(b / "samples.jsonl") == read_jsonl(a / "samples.jsonl")
    assert _sha(b / "checkpoints" / f"step-{rounds}" / "model.safetensors") == _sha(
        a / "checkpoints" / f"step-{rounds}" / "model.safetensors")
