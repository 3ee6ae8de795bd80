"""Ctrl-C (SIGINT from outside) during `rewardlab train` and `rewardlab sft`: the first finishes the step, writes a
checkpoint and the summary, prints the --resume command and exits 130, and that command continues to the uninterrupted
run's end; a second SIGINT stops at once, with no checkpoint of the step, one line and status 130."""

import json
import shlex
import signal
import subprocess
import time

import pytest

from cli_kill import child_env, cli, count_lines, read_strict, reap
from conftest import CHAIN_SUM, TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.runs import verify_checkpoint

STEPS = 8


def _train_args(tmp_path, out):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return ["train", "--out", str(out), "--task", f"jsonl:{task}", "task.options={test_size: 5}", *TINY_OVERRIDES,
            "rewards=[{name: chrf}]", f"rl.steps={STEPS}", "rl.prompts_per_step=2", "rl.group_size=4",
            "rl.sampling.max_new_tokens=3", "rl.lr=1e-2", "save_every=100", "rl.eval.every=3", "rl.eval.n=3"]


def _sft_args(out):
    return ["sft", "--out", str(out), *TINY_OVERRIDES, f"sft.steps={STEPS}", "sft.batch_size=8", "save_every=100",
            "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items()) + ", size: 60, test_size: 4}"]


def _start(args, pause):
    return subprocess.Popen(cli(args, pause), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())


def _wait_for_lines(proc, log, k, timeout=120.0):
    deadline = time.monotonic() + timeout
    while count_lines(log) < k:
        assert proc.poll() is None, f"the child exited ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}"
        assert time.monotonic() < deadline, f"{log}: no line {k} after {timeout} s"
        time.sleep(0.005)


def test_first_sigint_checkpoints_the_step_exits_130_and_the_printed_command_resumes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_train_args(tmp_path, a), "--no-progress"]) == 0

    proc = _start(_train_args(tmp_path, b), pause=0.15)  # 0.15 s before each log line: the signal lands mid-step
    try:
        _wait_for_lines(proc, b / "metrics.jsonl", 2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        err = proc.stderr.read().decode().strip().splitlines()
    finally:
        reap(proc)
    assert proc.returncode == 130, err[-5:]
    k = count_lines(b / "metrics.jsonl")  # the step in progress at the SIGINT, finished and logged
    assert 2 <= k < STEPS
    command = shlex.join(["rewardlab", *_train_args(tmp_path, b), "--no-progress", "--resume"])
    assert err[-1] == f"rewardlab: interrupted at step {k}; checkpoint step-{k} written; continue with: {command}"
    assert any("finishing the current step" in line for line in err)
    assert [p.name for p in (b / "checkpoints").iterdir()] == [f"step-{k}"]  # save_every=100: only the interrupt's
    assert verify_checkpoint(b / "checkpoints" / f"step-{k}") is None
    summary = json.loads((b / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps_done"] == k

    assert main(shlex.split(command)[1:]) == 0  # the printed command, as the user would paste it
    got, want = read_strict(b / "metrics.jsonl"), read_strict(a / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    for g, e in zip(got, want):
        assert {x for x in g if not x.startswith("time/")} == {x for x in e if not x.startswith("time/")}
        for key in e:
            if not key.startswith("time/"):
                assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    assert json.loads((b / "summary.json").read_text())["interrupted"] is False


def test_second_sigint_stops_sft_at_once_without_a_checkpoint(tmp_path):
    out = tmp_path / "s"
    proc = _start(_sft_args(out), pause=1.0)
    try:
        _wait_for_lines(proc, out / "metrics.jsonl", 1)
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while b"finishing the current step" not in proc.stderr.readline():  # the first one was taken as a request
            assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGINT)  # within the 1 s pause before the step's metrics line
        proc.wait(timeout=60)
        rest = proc.stderr.read().decode().strip().splitlines()
    finally:
        reap(proc)
    assert proc.returncode == 130 and rest == ["rewardlab sft: interrupted (Ctrl-C); stopped at once"]  # no traceback
    assert count_lines(out / "metrics.jsonl") == 1
    # no checkpoint; a second Ctrl-C that lands while the first one's checkpoint is being written may leave its
    # hidden temp dir, which is never a checkpoint (`RunDir.save_checkpoint`)
    assert not (out / "checkpoints").exists() or all(p.name.startswith(".") for p in (out / "checkpoints").iterdir())
    assert not (out / "summary.json").exists()
