"""SIGKILL `prm label` at a seeded random moment, resume, and get the uninterrupted run's labels back, byte for byte."""

import json
import random

from conftest import TINY_OVERRIDES
from rewardlab.config import PrmLabelConfig, load_config
from rewardlab.commands.prm import label as run_prm_label
from sigkill_resume import check_resumed_like_uninterrupted, kill_midway, lines, read_strict

# 24 questions in batches of 3 (8 batches), 3 solutions each, Monte Carlo labels with k = 2 continuations per step
# prefix, a checkpoint every 2 batches. The fresh tiny model writes few newlines, so most solutions are one step; the
# budget of 17 rollouts runs out in batch 7 (16 spent after batch 6, and batch 7 has a 2-step solution left out),
# so the resumed run must also have restored the rollouts already spent.
COMMON = [
    "task.spec=worked:chain_sum",
    "task.options={min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, size: 60, test_size: 4}",
    "label.method=mc", "label.limit=24", "label.question_batch=3", "label.solutions_per_question=3",
    "label.max_new_tokens=16", "label.k=2", "label.budget=17", "save_every=2", *TINY_OVERRIDES,
]


def test_prm_label_killed_and_resumed_writes_what_the_uninterrupted_run_writes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    full = run_prm_label(load_config(PrmLabelConfig, overrides=[f"out={a}", *COMMON]), show_progress=False)
    batches = read_strict(a / "metrics.jsonl")
    assert full["stopped_by_budget"] and len(batches) == 7 and full["rollouts"] <= 17
    assert [m["label/rollouts"] for m in batches][5:] == [16, 16]  # the budget binds after the kill window below

    kill_midway("PrmLabelConfig", [f"out={b}", *COMMON], "rewardlab.commands.prm.label", b,
                rng=random.Random(2), after=(3, 5), pause=0.1)
    assert not (b / "summary.json").exists() and lines(b / "metrics.jsonl") < 7
    resumed = run_prm_label(load_config(PrmLabelConfig, overrides=[f"out={b}", *COMMON]), mode="resume",
                            show_progress=False)

    check_resumed_like_uninterrupted(a, b, 7)
    # no labelled solution lost or written twice: the same rows in the same order, byte for byte
    assert (b / "labels.jsonl").read_bytes() == (a / "labels.jsonl").read_bytes()
    assert len(read_strict(b / "labels.jsonl")) == full["solutions"] == 62
    drop = {"wall_s", "labels"}
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    summary = json.loads((b / "summary.json").read_text())
    assert summary["solutions"] == 62 and summary["rollouts"] == full["rollouts"]
