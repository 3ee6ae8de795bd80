"""Shared by the SIGKILL-and-resume fault tests: run a verb's runner in a child process, SIGKILL it at a seeded random
moment, and compare the resumed run with an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import rewardlab

# The child runs the runner with a pause before each metrics line, so that a run of a few dozen tiny steps lasts long
# enough for the kill to land mid-run (in a step, in a checkpoint write or between them) whatever the machine's
# speed; the pause changes when things happen, not what is computed.
_CHILD = """
import importlib, json, sys, time
import torch
torch.set_num_threads(1)
from rewardlab.runs import RunDir
_log = RunDir.log_metrics
def _slow(self, *args, **kwargs):
    time.sleep(float(sys.argv[4]))
    return _log(self, *args, **kwargs)
RunDir.log_metrics = _slow
import rewardlab.config as C
cfg = C.load_config(getattr(C, sys.argv[1]), overrides=json.loads(sys.argv[2]))
module, name = sys.argv[3].rsplit(".", 1)
getattr(importlib.import_module(module), name)(cfg, show_progress=False)
"""


def lines(path: Path) -> int:
    """Complete lines in a file (0 when it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_midway(config: str, overrides: list[str], runner: str, out: Path, *, rng: random.Random,
                after: tuple[int, int], pause: float = 0.05, timeout: float = 120.0) -> tuple[int, float]:
    """Run `runner(load_config(config, overrides))` in a child and SIGKILL it once `out`/metrics.jsonl holds k lines
    (k drawn from `after`, inclusive) plus a delay drawn from [0, 1.5 * pause] seconds.

    Returns:
        (k, delay). Fails the test when the child exits by itself before the kill (the test would prove nothing).
    """
    k, delay = rng.randint(*after), rng.uniform(0.0, 1.5 * pause)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(rewardlab.__file__).parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, config, json.dumps(overrides), runner, str(pause)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + timeout
    try:
        while lines(out / "metrics.jsonl") < k:
            if proc.poll() is not None:
                raise AssertionError(f"the child exited ({proc.returncode}) before its metrics line {k}: "
                                     f"{proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no metrics line {k} after {timeout} s")
            time.sleep(0.005)
        time.sleep(delay)
        assert proc.poll() is None, f"the child finished before the kill (line {k} + {delay:.3f} s)"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    return k, delay


def read_strict(path: Path) -> list[dict]:
    """Every line of a JSONL file as an object; fails on any line that is not one (a torn or glued line)."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n")[:-1], 1):
        obj = json.loads(line)  # raises on an invalid line
        assert isinstance(obj, dict), f"{path}:{n}"
        out.append(obj)
    assert path.read_bytes().endswith(b"\n") or path.stat().st_size == 0, f"{path}: last line not terminated"
    return out


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def check_resumed_like_uninterrupted(uninterrupted: Path, resumed: Path, n_steps: int) -> list[dict]:
    """Every JSONL line of the resumed run valid; metrics.jsonl holds steps 1..n_steps once each, in order, equal to
    the uninterrupted run's except the time/* keys. Returns the resumed run's metrics."""
    for log in [*resumed.glob("*.jsonl"), *(resumed / "rolled_back").glob("*.jsonl")]:
        read_strict(log)
    a, b = read_strict(uninterrupted / "metrics.jsonl"), read_strict(resumed / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, n_steps + 1))  # none lost, none twice
    assert without_time(b) == without_time(a)
    events = [e["event"] for e in read_strict(resumed / "events.jsonl")]
    assert events[0] == "start" and "resume" in events and "resume_from" in events
    return b
