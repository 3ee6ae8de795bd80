"""Stages of the benchmark scripts that chain `rewardlab` commands (benchmarks/prime_vs_grpo.py,
benchmarks/overoptimization.py): each stage is one command in its own process, with one thread
(OMP_NUM_THREADS=1), writing its own run directory; a stage whose summary.json exists is skipped and a stopped one
is resumed, so a script picks up where it stopped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rewardlab() -> list[str]:
    """The repository's `rewardlab` (.venv, `make install`), else the one on PATH."""
    venv = ROOT / ".venv" / "bin" / "rewardlab"
    return [str(venv)] if venv.exists() else ["rewardlab"]


def stage(out: Path, name: str, args: list[str]) -> Path:
    """Run `rewardlab ARGS --no-progress --out OUT/NAME` (its output appended to OUT/NAME.log, a "/" in NAME
    written "_") unless OUT/NAME/summary.json exists; resume a stopped one (its events.jsonl exists), overwrite a
    directory a command left before it logged anything. Exits naming the log when the command fails."""
    path = out / name
    if (path / "summary.json").exists():
        print(f"== {name}: done before, skipped", flush=True)
        return path
    again = ["--resume"] if (path / "events.jsonl").exists() else ["--overwrite"] if path.exists() else []
    cmd = [*rewardlab(), *args, "--no-progress", *again, "--out", str(path)]
    print(f"== {name}: {shlex.join(cmd[len(rewardlab()):])}", flush=True)
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    log = out / f"{name.replace('/', '_')}.log"
    with open(log, "a") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0:
        sys.exit(f"stage {name} failed (exit {rc}); see {log}")
    print(f"   {time.time() - t0:.0f} s", flush=True)
    return path


def last_checkpoint(run: Path) -> Path:
    """The newest checkpoint directory of a run. Exits naming the run when it has none."""
    steps = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not steps:
        sys.exit(f"{run}: no checkpoint")
    return steps[-1]


def metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl, one dict per step, each with `clock_s`: the cumulative time/step_s up to it."""
    rows, clock = [], 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        clock += m.get("time/step_s", 0.0)
        rows.append({**m, "clock_s": clock})
    return rows
