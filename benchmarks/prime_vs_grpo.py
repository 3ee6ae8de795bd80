"""PRIME (online implicit PRM, `rl.online_prm: prime`) against GRPO on the `worked:` steps task, at equal steps and at
equal wall time, 3 seeds (issue 35, item 6).

    python benchmarks/prime_vs_grpo.py [--out runs/prime_bench] [--seeds 0,1,2] [--steps 60] [--json FILE]

Every stage is a plain `rewardlab` command run in its own process with one thread (OMP_NUM_THREADS=1, threads=1);
a stage whose summary.json exists is skipped and a stopped one resumed, so the script picks up where it stopped.

1. SFT (once): the tiny model from fresh weights, 1,200 steps on `worked:chain_sum` (3-5 one-digit terms, the
   partial sums written one per line; 20,000 draws, 500 held out), lr 3e-3, batch 64.
2. For each seed, from that checkpoint, the same RL settings (32 prompts x 4 rollouts per step, PRIME's K = 4;
   lr 1e-4; T = 1; up to 40 new tokens; held-out greedy accuracy on 200 test questions every 10 steps):
   - grpo:  `rl.estimator: grpo`, for 2 x STEPS steps (so that its curve reaches PRIME's wall time);
   - prime: `rl.estimator: prime`, `rl.online_prm: prime` (beta 0.05, PRM lr 1e-4: see below), the paper's accuracy
     filter (`rl.filtering.group_filter: accuracy`, [0.2, 0.8], up to 3 generation rounds), for STEPS steps.
   The gold, and PRIME's outcome label, is the task's verifier (`worked_answer`: the final number).
3. The table: held-out greedy accuracy at equal steps (both at step STEPS) and at equal wall time (GRPO's last
   evaluation whose cumulative step time is within PRIME's at step STEPS), mean and each seed, with seconds per step
   and the PRM's own loss and ranking accuracy at the end.

The PRM learning rate: the paper's 1e-6 is for a 7B model trained at 5e-7; here the policy trains at 1e-4, and the
PRM gets the same rate (at 1e-6 the tiny PRM does not move in 60 steps: prm/loss stays at log 2).

Measured figures go into docs/reward-hacking.md ("PRIME") and the README; the command and its wall time are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK = ["--task", "worked:chain_sum",
        "task.options={min_terms: 3, max_terms: 5, min_digits: 1, max_digits: 1, size: 20000, test_size: 500}"]
RL = ["rl.prompts_per_step=32", "rl.group_size=4", "rl.lr=1e-4", "rl.sampling.temperature=1.0",
      "rl.sampling.max_new_tokens=40", "rl.eval.every=10", "rl.eval.n=200", "threads=1", "save_every=20"]
PRIME = ["rl.estimator=prime", "rl.online_prm=prime", "rl.online_prm_options={beta: 0.05, lr: 0.0001}",
         "rl.filtering.group_filter=accuracy", "rl.filtering.max_rounds=3"]


def rewardlab() -> list[str]:
    venv = ROOT / ".venv" / "bin" / "rewardlab"
    return [str(venv)] if venv.exists() else ["rewardlab"]


def stage(out: Path, name: str, args: list[str]) -> Path:
    """Run `rewardlab ARGS --out OUT/NAME` unless its summary.json exists; resume a stopped one."""
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
    return max((run / "checkpoints").iterdir(), key=lambda p: int(p.name.split("-")[1]))


def curve(run: Path) -> list[dict]:
    """Per step: step, cumulative step seconds, eval/accuracy (when evaluated), prm/* (PRIME)."""
    rows, clock = [], 0.0
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        clock += m.get("time/step_s", 0.0)
        rows.append({"step": m["step"], "clock_s": clock, **{k: v for k, v in m.items()
                                                             if k == "eval/accuracy" or k.startswith("prm/")}})
    return rows


def at_step(rows: list[dict], step: int) -> dict:
    return next(r for r in rows if r["step"] == step)


def at_time(rows: list[dict], seconds: float) -> dict:
    """The last evaluated step whose cumulative step time is within `seconds`."""
    evaluated = [r for r in rows if "eval/accuracy" in r and r["clock_s"] <= seconds]
    return evaluated[-1] if evaluated else rows[0]


def summarize(out: Path, seeds: list[int], steps: int, sft: Path) -> dict:
    first = json.loads((sft / "summary.json").read_text())
    table = {"steps": steps, "seeds": seeds, "sft_accuracy": first.get("final_eval_accuracy"), "runs": {}}
    for seed in seeds:
        g, p = curve(out / f"grpo_s{seed}"), curve(out / f"prime_s{seed}")
        p_end = at_step(p, steps)
        g_steps, g_time = at_step(g, steps), at_time(g, p_end["clock_s"])
        table["runs"][seed] = {
            "prime": {"accuracy": p_end["eval/accuracy"], "clock_s": p_end["clock_s"],
                      "s_per_step": p_end["clock_s"] / steps, "prm_loss": p_end.get("prm/loss"),
                      "prm_accuracy": p_end.get("prm/accuracy"),
                      "curve": [(r["step"], r["eval/accuracy"]) for r in p if "eval/accuracy" in r]},
            "grpo_equal_steps": {"accuracy": g_steps["eval/accuracy"], "clock_s": g_steps["clock_s"],
                                 "s_per_step": g_steps["clock_s"] / steps},
            "grpo_equal_time": {"accuracy": g_time["eval/accuracy"], "step": g_time["step"],
                                "clock_s": g_time["clock_s"]},
            "grpo_curve": [(r["step"], r["eval/accuracy"]) for r in g if "eval/accuracy" in r],
        }
    for key in ("prime", "grpo_equal_steps", "grpo_equal_time"):
        values = [table["runs"][s][key]["accuracy"] for s in seeds]
        table[key] = {"mean": statistics.mean(values), "each": values}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "prime_bench")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "prime_vs_grpo.json")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    sft = stage(args.out, "sft", ["sft", "--model", "tiny", *TASK, "--seed", "0", "sft.steps=1200", "sft.lr=3e-3",
                                  "sft.batch_size=64", "sft.eval_every=200", "sft.eval_n=200", "threads=1"])
    start = str(last_checkpoint(sft))
    for seed in seeds:
        stage(args.out, f"grpo_s{seed}", ["train", "--model", start, *TASK, "--seed", str(seed), *RL,
                                          f"rl.steps={2 * args.steps}"])
        stage(args.out, f"prime_s{seed}", ["train", "--model", start, *TASK, "--seed", str(seed), *RL, *PRIME,
                                           f"rl.steps={args.steps}"])
    table = summarize(args.out, seeds, args.steps, sft)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(table, indent=1))
    print(f"\nheld-out greedy accuracy (200 test questions), SFT start {table['sft_accuracy']}:")
    print(f"{'run':<28}{'mean':>8}  each seed")
    for key, label in (("prime", f"PRIME, {args.steps} steps"), ("grpo_equal_steps", f"GRPO, {args.steps} steps"),
                       ("grpo_equal_time", "GRPO, PRIME's wall time")):
        each = ", ".join(f"{v:.3f}" for v in table[key]["each"])
        print(f"{label:<28}{table[key]['mean']:>8.3f}  {each}")
    for seed in seeds:
        r = table["runs"][seed]
        print(f"seed {seed}: s/step PRIME {r['prime']['s_per_step']:.2f}, GRPO {r['grpo_equal_steps']['s_per_step']:.2f}; "
              f"GRPO at PRIME's wall time: step {r['grpo_equal_time']['step']}; PRM loss {r['prime']['prm_loss']}, "
              f"ranking accuracy {r['prime']['prm_accuracy']}")
    print(f"wrote {args.json}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
