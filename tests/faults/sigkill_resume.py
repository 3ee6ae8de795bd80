"""Shared by the SIGKILL-and-resume fault tests: run a verb's runner in a child process, SIGKILL it at a seeded random
moment, and compare the resumed run with an uninterrupted one."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from cli_kill import check_every_log, child_env, reap, read_strict, sigkill
from cli_kill import count_lines as lines

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


def kill_midway(config: str, overrides: list[str], runner: str, out: Path, *, rng: random.Random,
                after: tuple[int, int], pause: float = 0.05, timeout: float = 120.0) -> tuple[int, float]:
    """Run `runner(load_config(config, overrides))` in a child and SIGKILL it once `out`/metrics.jsonl holds k lines
    (k drawn from `after`, inclusive) plus a delay drawn from [0, 1.5 * pause] seconds.

    Returns:
        (k, delay). Fails the test when the child exits by itself before the kill (the test would prove nothing).
    """
    k, delay = rng.randint(*after), rng.uniform(0.0, 1.5 * pause)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, config, json.dumps(overrides), runner, str(pause)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())
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
        sigkill(proc)
    finally:
        reap(proc)
    return k, delay


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def check_resumed_like_uninterrupted(uninterrupted: Path, resumed: Path, n_steps: int) -> list[dict]:
    """Every JSONL line of the resumed run valid; metrics.jsonl holds steps 1..n_steps once each, in order, equal to
    the uninterrupted run's except the time/* keys. Returns the resumed run's metrics."""
    check_every_log(resumed)
    a, b = read_strict(uninterrupted / "metrics.jsonl"), read_strict(resumed / "metrics.jsonl")
    assert [m["step"] for m in b] == list(range(1, n_steps + 1))  # none lost, none twice
    assert without_time(b) == without_time(a)
    events = [e["event"] for e in read_strict(resumed / "events.jsonl")]
    assert events[0] == "start" and "resume" in events and "resume_from" in events
    return b
