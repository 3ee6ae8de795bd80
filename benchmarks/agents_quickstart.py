"""The agents demo's figures: `rewardlab quickstart --preset tools` for seeds 0, 1 and 2.

    PYTHONPATH=src python benchmarks/agents_quickstart.py [--seeds 0,1,2] [--out runs/agents_quickstart]
                                                          [-- key=value ...]

Each seed runs the whole preset as its own command (`python -m rewardlab.cli quickstart --preset tools --seed S
--out OUT/seed-S --overwrite`, overrides after `--` passed on), timed by wall clock. Per seed it prints and writes
(OUT/figures.json) the held-out greedy accuracy after SFT, after GRPO and of the no-tool comparison (the same model
and budget trained without the tool: SFT on direct answers, GRPO on single completions of the same questions), the
tool-call rate (fraction of model turns with a call) and the tool errors per episode of the SFT and GRPO models,
and the wall time; then the issue's targets: GRPO >= no-tool + 30 points and GRPO >= SFT + 15 points on seed 0, GRPO
> SFT on the other seeds, the whole preset <= 12 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run_seed(seed: int, out: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "rewardlab.cli", "quickstart", "--preset", "tools", "--seed", str(seed), "--out",
           str(out / f"seed-{seed}"), "--overwrite", "--no-progress", *overrides]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    s = json.loads((out / f"seed-{seed}" / "summary.json").read_text(encoding="utf-8"))
    return {"seed": seed, "sft_accuracy": s["sft"]["accuracy"], "grpo_accuracy": s["grpo"]["accuracy"],
            "no_tool_accuracy": s["no_tool"]["accuracy"],
            "sft_tool_call_rate": s["sft"]["tool_call_rate"], "grpo_tool_call_rate": s["grpo"]["tool_call_rate"],
            "sft_tool_errors_per_episode": s["sft"]["tool_errors_per_episode"],
            "grpo_tool_errors_per_episode": s["grpo"]["tool_errors_per_episode"],
            "held_out_questions": s["held_out_questions"], "wall_s": wall, "stage_seconds": s["stage_seconds"],
            "command": " ".join(cmd[1:])}


def targets(rows: list[dict]) -> list[tuple[str, bool]]:
    out = []
    for r in rows:
        gap_nt = 100 * (r["grpo_accuracy"] - r["no_tool_accuracy"])
        gap_sft = 100 * (r["grpo_accuracy"] - r["sft_accuracy"])
        if r["seed"] == 0:
            out.append((f"seed 0: GRPO >= no-tool + 30 points ({gap_nt:+.1f})", gap_nt >= 30))
            out.append((f"seed 0: GRPO >= SFT + 15 points ({gap_sft:+.1f})", gap_sft >= 15))
        else:
            out.append((f"seed {r['seed']}: GRPO > SFT ({gap_sft:+.1f} points)", gap_sft > 0))
        out.append((f"seed {r['seed']}: whole preset <= 12 min ({r['wall_s'] / 60:.1f} min)", r["wall_s"] <= 720))
    return out


def main() -> int:
    argv = sys.argv[1:]
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--out", default="runs/agents_quickstart", help="directory of the runs and figures.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        rows.append(run_seed(seed, out, overrides))
        (out / "figures.json").write_text(json.dumps({"seeds": rows, "overrides": overrides}, indent=2) + "\n",
                                          encoding="utf-8")
    print(f"\n{'seed':>4} {'SFT':>7} {'GRPO':>7} {'no-tool':>8} {'calls SFT':>10} {'calls GRPO':>11} "
          f"{'err/ep SFT':>11} {'err/ep GRPO':>12} {'wall':>8}")
    for r in rows:
        print(f"{r['seed']:>4} {r['sft_accuracy']:>7.1%} {r['grpo_accuracy']:>7.1%} {r['no_tool_accuracy']:>8.1%} "
              f"{r['sft_tool_call_rate']:>10.1%} {r['grpo_tool_call_rate']:>11.1%} "
              f"{r['sft_tool_errors_per_episode']:>11.2f} {r['grpo_tool_errors_per_episode']:>12.2f} "
              f"{r['wall_s'] / 60:>6.1f} m")
    for text, ok in targets(rows):
        print(f"  {'met ' if ok else 'MISS'}  {text}")
    print(f"figures: {out / 'figures.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
