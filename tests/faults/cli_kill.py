"""Shared by the CLI fault tests: run `rewardlab VERB ...` in a child process, SIGKILL it at a moment a seeded
random.Random picks, and read its logs strictly."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import rewardlab


def child_env() -> dict[str, str]:
    """The environment of a child CLI process: this checkout's rewardlab first on the path, one OpenMP thread."""
    src = str(Path(rewardlab.__file__).parents[1])
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])]),
                OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


# The child is `rewardlab.cli.main(ARGS)` with a pause before each line it appends to a log (events.jsonl aside): the
# tiny model evaluates a batch in a few milliseconds, faster than a loaded machine may schedule the watching parent,
# and the pause keeps the kill inside the run. It changes when things happen, not what is computed or written.
_CHILD = """
import sys, time
from rewardlab.runs import EVENTS, RunDir
pause, append = float(sys.argv[1]), RunDir._append
def slow_append(self, name, records):
    if name != EVENTS:
        time.sleep(pause)
    return append(self, name, records)
RunDir._append = slow_append
from rewardlab.cli import main
sys.exit(main(sys.argv[2:]))
"""


def cli(args: list[str], pause: float = 0.0) -> list[str]:
    """The command line of `rewardlab ARGS --no-progress` in a child Python (see _CHILD for `pause`)."""
    return [sys.executable, "-c", _CHILD, str(pause), *args, "--no-progress"]


def count_lines(path: Path) -> int:
    """Complete lines of a file (0 when it does not exist yet)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_after_line(args: list[str], log: Path, k: int, rng: random.Random, *, ready: Callable[[], bool] = lambda: True,
                    pause: float = 0.1, timeout: float = 180.0) -> float:
    """Run the CLI with `args` (pausing `pause` seconds before each log line) and SIGKILL it once `log` holds `k`
    complete lines, plus a delay.

    The delay is drawn by `rng` from [0, d): d is the shortest time seen between two of the child's lines, so the
    kill lands anywhere in the work and pause after line k, before the line after next. Lines are counted only once
    `ready()` is true (e.g. once a resumed child has rolled its logs back).

    Returns:
        the delay in seconds. Fails the test when the child exits before the kill (it would prove nothing).
    """
    u = rng.random()
    proc = subprocess.Popen(cli(args, pause), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())
    deadline = time.monotonic() + timeout
    try:
        def alive() -> None:
            if proc.poll() is not None:
                raise AssertionError(f"the child exited ({proc.returncode}) before the kill: "
                                     f"{proc.stderr.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, f"{log}: no line {k} after {timeout} s"

        while not ready():
            alive()
            time.sleep(0.002)
        seen, stamps = count_lines(log), []
        while seen < k:
            alive()
            n = count_lines(log)
            if n > seen:
                stamps.append(time.monotonic())
                seen = n
            else:
                time.sleep(0.001)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        delay = u * min(gaps, default=pause)
        time.sleep(delay)
        alive()
        sigkill(proc)
    finally:
        reap(proc)
    return delay


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL a child that is still running and check that the signal is what ended it."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"the child ended with {proc.returncode}, not by the SIGKILL"


def reap(proc: subprocess.Popen) -> None:
    """Kill and wait for a child the test left running (after a failure), and close its stderr pipe."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
    proc.stderr.close()


def read_strict(path: Path) -> list[dict]:
    """Every line of a JSONL file as an object; fails on a line that is not one (torn or glued) or an unterminated
    last line."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path}: last line not terminated"
    out = []
    for n, line in enumerate(data.decode("utf-8").split("\n")[:-1], 1):
        obj = json.loads(line)
        assert isinstance(obj, dict), f"{path}:{n}"
        out.append(obj)
    return out


def check_every_log(run: Path) -> None:
    """Every *.jsonl of the run directory (and of rolled_back/) is valid line by line."""
    for log in [*run.glob("*.jsonl"), *(run / "rolled_back").glob("*.jsonl")]:
        read_strict(log)


def events(run: Path) -> list[str]:
    return [e["event"] for e in read_strict(run / "events.jsonl")] if (run / "events.jsonl").exists() else []
