"""Stages of the benchmark scripts that chain `rewardlab` commands (benchmarks/prime_vs_grpo.py,
benchmarks/overoptimization.py): each stage is one command in its own process, with one thread
(OMP_NUM_THREADS=1), writing its own run directory; a stage whose summary.json exists is skipped and a stopped one
is resumed, so a script picks up where it stopped."""

from __future__ import annotations

import json
import os
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
    """Run `rewardlab ARGS --no-progress --out OUT/NAME` (its output appended to OUT/NAME.log) unless
    OUT/NAME/summary.json exists; resume a stopped one. Exits naming the log when the command fails."""
    path = out / name
    if (path / "summary.json").exists():
        print(f"== {name}: done before, skipped", flush=True)
        return path
    again = ["--resume"] if (path / "events.jsonl").exists() else []
    cmd = [*rewardlab(), *args, "--no-progress", *again, "--out", str(path)]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(out / f"{name}.log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0:
        sys.exit(f"stage {name} failed (exit {rc}); see {out / (name + '.log')}")
    print(f"   {time.time() - t0:.0f} s", flush=True)
    return path


def last_checkpoint(run: Path) -> Path:
    """The newest checkpoint directory of a run."""
    return max((run / "checkpoints").iterdir(), key=lambda p: int(p.name.split("-")[1]))


def metrics(run: Path) -> list[dict]:
    """A run's metrics.jsonl, one dict per step, each with `clock_s`: the cumulative time/step_s up to it."""
    rows, clock = [], 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        clock += m.get("time/step_s", 0.0)
        rows.append({**m, "clock_s": clock})
    return rows
