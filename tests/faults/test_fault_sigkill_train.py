"""SIGKILL `rewardlab train` twice at seeded random moments, resume it with --resume each time, and get the
uninterrupted run's steps back: none lost, none twice, the same metrics (but time/*), the same completions."""

import json
import random

import pytest

from cli_kill import check_every_log, count_lines, events, kill_after_line, read_strict
from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main

STEPS, SAVE_EVERY = 12, 2


def _args(tmp_path, out):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    # chrF gives partial credit, so rewards vary and every step moves the model; two epochs of minibatches of 4
    # make the update draw from the torch RNG as well.
    return ["train", "--out", str(out), "--task", f"jsonl:{task}", "task.options={test_size: 5}", *TINY_OVERRIDES,
            "rewards=[{name: chrf}]", f"rl.steps={STEPS}", "rl.prompts_per_step=2", "rl.group_size=4",
            "rl.sampling.max_new_tokens=3", "rl.lr=1e-2", "rl.epochs=2", "rl.minibatch_size=4",
            f"save_every={SAVE_EVERY}", "keep_checkpoints=2"]


def _latest_checkpoint(run):
    return max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))


def test_train_killed_twice_and_resumed_logs_what_the_uninterrupted_run_logs(tmp_path):
    rng = random.Random(12)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_args(tmp_path, a), "--no-progress"]) == 0

    # First kill: after metrics line k (so step SAVE_EVERY's checkpoint exists) plus a fraction of a step.
    kill_after_line(_args(tmp_path, b), b / "metrics.jsonl", rng.randint(SAVE_EVERY + 1, 6), rng)
    first = _latest_checkpoint(b)
    # Second kill, of the resumed child: its lines count once it has rolled its logs back to that checkpoint.
    k2 = rng.randint(first + 2, STEPS - 3)
    kill_after_line([*_args(tmp_path, b), "--resume"], b / "metrics.jsonl", k2, rng,
                    ready=lambda: events(b).count("resume_from") == 1)
    assert not (b / "summary.json").exists() and count_lines(b / "metrics.jsonl") < STEPS
    second = _latest_checkpoint(b)
    assert main([*_args(tmp_path, b), "--resume", "--no-progress"]) == 0

    check_every_log(b)
    got, expected = read_strict(b / "metrics.jsonl"), read_strict(a / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))  # none lost, none twice
    for g, e in zip(got, expected):
        assert {k for k in g if not k.startswith("time/")} == {k for k in e if not k.startswith("time/")}
        for key in e:
            if not key.startswith("time/"):
                assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    samples = [(s["step"], s["prompt"], s["completion"], s["reward"]) for s in read_strict(b / "samples.jsonl")]
    assert samples == [(s["step"], s["prompt"], s["completion"], s["reward"]) for s in read_strict(a / "samples.jsonl")]
    resumed_from = [e["step"] for e in read_strict(b / "events.jsonl") if e["event"] == "resume_from"]
    assert resumed_from == [first, second]
    summary, full = json.loads((b / "summary.json").read_text()), json.loads((a / "summary.json").read_text())
    assert summary["resumed_from"] == second and summary["steps_done"] == full["steps_done"] == STEPS
    assert summary["final_checkpoint"] == str(b / "checkpoints" / f"step-{STEPS}")
