"""SIGKILL `rm train` and `prm train` at a seeded random moment, resume, and get the uninterrupted run back."""

import hashlib
import random

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import PrmTrainConfig, RmTrainConfig, load_config
from rewardlab.commands.rm import train as run_rm_train
from rewardlab.commands.prm import train as run_prm_train
from sigkill_resume import check_resumed_like_uninterrupted, kill_midway, lines


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pairs(prompts):
    return [{"prompt": p, "chosen": f"{p}{len(p)}", "rejected": f"{p}x", "subset": "toy"} for p in prompts]


def _step_rows(n):  # a step containing "bad" is wrong (label 0), an "ok" step right (label 1)
    rows = []
    for i in range(n):
        steps = ["ok", "ok", "bad"] if i % 2 else ["ok", "bad", "bad"]
        rows.append({"prompt": f"q{i}", "steps": steps, "labels": [0.0 if s == "bad" else 1.0 for s in steps]})
    return rows


def _kill_resume_compare(tmp_path, cls, runner, fn, common, steps, save_every, seed):
    a, b = tmp_path / "a", tmp_path / "b"
    full = fn(load_config(cls, overrides=[f"out={a}", *common]), show_progress=False)
    assert full["steps"] == steps
    kill_midway(cls.__name__, [f"out={b}", *common], runner, b, rng=random.Random(seed),
                after=(save_every + 1, steps - 6))
    assert not (b / "summary.json").exists() and lines(b / "metrics.jsonl") < steps
    resumed = fn(load_config(cls, overrides=[f"out={b}", *common]), mode="resume", show_progress=False)
    assert save_every <= resumed["resumed_from"] < steps and resumed["resumed_from"] % save_every == 0
    metrics = check_resumed_like_uninterrupted(a, b, steps)
    assert resumed["final_train"]["train/loss"] == full["final_train"]["train/loss"] == metrics[-1]["train/loss"]
    assert resumed["final_eval"] == full["final_eval"] and full["final_eval"]
    final = f"checkpoints/step-{steps}/model.safetensors"
    assert _sha(b / final) == _sha(a / final)  # the same weights, byte for byte
    return metrics


def test_rm_train_killed_and_resumed_logs_what_the_uninterrupted_run_logs(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", _pairs([f"{i}+{i}=" for i in range(22)]))
    held = write_jsonl(tmp_path / "held.jsonl", _pairs([f"{i}-1=" for i in range(6)]))
    # 22 pairs in batches of 4: 6 steps per epoch (the last one of 2 pairs), 4 epochs, reshuffled at steps 7, 13, 19;
    # checkpoints every 5 steps fall inside epochs, so the resumed run must restore the epoch's order and its RNG.
    common = [f"data={train}", f"eval_data={held}", "model.path=tiny", "train.epochs=4", "train.batch_size=4",
              "train.lr=1e-2", "train.warmup_steps=2", "train.eval_every=4", "save_every=5", *TINY_OVERRIDES]
    metrics = _kill_resume_compare(tmp_path, RmTrainConfig, "rewardlab.commands.rm.train", run_rm_train,
                                   common, steps=24, save_every=5, seed=0)
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [4, 8, 12, 16, 20, 24]


def test_prm_train_killed_and_resumed_logs_what_the_uninterrupted_run_logs(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", _step_rows(10))
    held = write_jsonl(tmp_path / "held.jsonl", _step_rows(4))
    # 10 rows in batches of 3: 4 steps per epoch, 5 epochs; checkpoints every 3 steps
    common = [f"data={train}", f"eval_data={held}", "model.path=tiny", "train.epochs=5", "train.batch_size=3",
              "train.lr=1e-2", "save_every=3", "keep_checkpoints=1", *TINY_OVERRIDES]
    _kill_resume_compare(tmp_path, PrmTrainConfig, "rewardlab.commands.prm.train", run_prm_train, common,
                         steps=20, save_every=3, seed=1)
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["step-20"]  # keep_checkpoints=1
