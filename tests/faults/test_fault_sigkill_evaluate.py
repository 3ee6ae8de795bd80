"""SIGKILL `rewardlab evaluate` twice at seeded random moments, resume it with --resume each time, and get the
uninterrupted run's batches (figures and RNG states) and summary back."""

import json
import random

from cli_kill import check_every_log, count_lines, kill_after_line, read_strict
from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main

BATCHES = 12


def _args(tmp_path, out):
    # One-digit answers and one-token completions: the fresh tiny model samples the right digit about 1 time in 100,
    # so some of the 16 samples per question are right and pass@16 depends on what was drawn.
    rows = [{"prompt": f"{a}+{b}=", "answer": str((a + b) % 10)} for a in range(10) for b in range(6)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return ["evaluate", "--model", "tiny", "--out", str(out), "--task", f"jsonl:{task}",
            f"task.options={{test_size: {2 * BATCHES}}}", "split=test", *TINY_OVERRIDES, "eval.batch_size=2",
            "eval.n=16", "eval.k=[1, 16]", "eval.max_new_tokens=1", "eval.temperature=1.5"]


def test_evaluate_killed_twice_and_resumed_gives_the_uninterrupted_summary(tmp_path):
    rng = random.Random(7)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_args(tmp_path, a), "--no-progress"]) == 0

    kill_after_line(_args(tmp_path, b), b / "batches.jsonl", rng.randint(2, 5), rng)
    done = count_lines(b / "batches.jsonl")
    kill_after_line([*_args(tmp_path, b), "--resume"], b / "batches.jsonl", rng.randint(done + 2, BATCHES - 3), rng)
    assert not (b / "summary.json").exists() and count_lines(b / "batches.jsonl") < BATCHES
    assert main([*_args(tmp_path, b), "--resume", "--no-progress"]) == 0

    check_every_log(b)
    got, expected = read_strict(b / "batches.jsonl"), read_strict(a / "batches.jsonl")
    assert [r["batch"] for r in got] == list(range(BATCHES))  # each batch once
    assert got == expected  # the same figures, and the RNG in the same state after every batch
    summary, full = json.loads((b / "summary.json").read_text()), json.loads((a / "summary.json").read_text())
    assert {k: v for k, v in summary.items() if k != "wall_s"} == {k: v for k, v in full.items() if k != "wall_s"}
    assert 0 < full["pass@16"]  # the samples matter: the RNG state had to be restored to get this back
