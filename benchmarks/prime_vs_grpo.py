"""PRIME (online implicit PRM, `rl.online_prm: prime`) against GRPO on the `worked:` steps task, at equal steps and at
equal wall time, 3 seeds (issue 35, item 6).

    python benchmarks/prime_vs_grpo.py [--out runs/prime_bench] [--seeds 0,1,2] [--steps 40] [--json FILE]

Every stage is a plain `rewardlab` command run in its own process with one thread (benchmarks/stages.py); a stage
whose summary.json exists is skipped and a stopped one resumed, so the script picks up where it stopped.

1. SFT (once): the tiny model from fresh weights, 1,200 steps on `worked:chain_sum` (3-5 one-digit terms, the
   partial sums written one per line; 20,000 draws, 500 held out), lr 3e-3, batch 64; evaluated greedily on the first
   200 test questions (`eval_sft`).
2. For each seed, from that checkpoint, the same RL settings (32 prompts x 4 rollouts per step, PRIME's K = 4;
   lr 1e-4; T = 1; up to 40 new tokens; held-out greedy accuracy on the same 200 test questions every 10 steps):
   - grpo: `rl.estimator: grpo`, for 2 x STEPS steps, so that its curve reaches PRIME's wall time;
   - prime: as the paper and verl's recipe set it (`rl.estimator: prime`, `rl.online_prm: prime` with its defaults:
     beta 0.05, PRM lr 1e-6, update before, batch norm; the accuracy filter [0.2, 0.8], up to 3 generation rounds),
     for STEPS steps;
   - prime_outcome_only: the same run with the process term weighted 0 (`rl.estimator_options.process_coef: 0`):
     the PRM still trains, the outcome's leave-one-out advantage, the filter and the whitening remain. It tells
     whether a difference comes from the process rewards or from the rest of the recipe.
   The gold, and PRIME's outcome label, is the task's verifier (`worked_answer`: the final number).
3. The table: held-out greedy accuracy at equal steps (all at step STEPS) and at equal wall time (GRPO's last
   evaluation whose cumulative step time, time/step_s summed, is within PRIME's at step STEPS), mean and each seed;
   seconds per step; the PRM's loss at the end and its ranking accuracy within groups over the run.

Measured figures go into docs/reward-hacking.md ("PRIME") and the README.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stages import ROOT, last_checkpoint, metrics, stage  # noqa: E402  (benchmarks/stages.py)

TASK = ["--task", "worked:chain_sum",
        "task.options={min_terms: 3, max_terms: 5, min_digits: 1, max_digits: 1, size: 20000, test_size: 500}"]
RL = ["rl.prompts_per_step=32", "rl.group_size=4", "rl.lr=1e-4", "rl.sampling.temperature=1.0",
      "rl.sampling.max_new_tokens=40", "rl.eval.every=10", "rl.eval.n=200", "threads=1", "save_every=20"]
#: PRIME as the paper and verl's recipe set it: implicit PRM beta 0.05, PRM lr 1e-6, update before, batch norm, the
#: leave-one-out baselines, the accuracy filter [0.2, 0.8].
PRIME = ["rl.estimator=prime", "rl.online_prm=prime", "rl.filtering.group_filter=accuracy",
         "rl.filtering.max_rounds=3"]
#: The ablation: the same run with the process term weighted 0 (its outcome part, the filter and the whitening only).
OUTCOME_ONLY = [*PRIME, "rl.estimator_options={process_coef: 0.0}"]


def curve(run: Path) -> list[dict]:
    """Per step: step, cumulative step seconds, eval/accuracy (when evaluated), prm/* (PRIME)."""
    return [{"step": m["step"], "clock_s": m["clock_s"],
             **{k: v for k, v in m.items() if k == "eval/accuracy" or k.startswith("prm/")}} for m in metrics(run)]


def at_step(rows: list[dict], step: int) -> dict:
    return next(r for r in rows if r["step"] == step)


def at_time(rows: list[dict], seconds: float) -> dict:
    """The last evaluated step whose cumulative step time is within `seconds`."""
    evaluated = [r for r in rows if "eval/accuracy" in r and r["clock_s"] <= seconds]
    return evaluated[-1] if evaluated else rows[0]


def final(rows: list[dict], step: int) -> dict:
    """What a run logged at `step`: accuracy, cumulative seconds, seconds per step, the PRM's loss and accuracy."""
    r = at_step(rows, step)
    return {"accuracy": r["eval/accuracy"], "step": step, "clock_s": r["clock_s"], "s_per_step": r["clock_s"] / step,
            "prm_loss": r.get("prm/loss"), "prm_accuracy": r.get("prm/accuracy")}


def summarize(out: Path, seeds: list[int], steps: int) -> dict:
    """The figures of the finished runs (see the module doc)."""
    base = json.loads((out / "eval_sft" / "summary.json").read_text())
    table = {"steps": steps, "seeds": seeds, "sft_accuracy": base["accuracy"], "runs": {}}
    for seed in seeds:
        g, p, o = (curve(out / f"{name}_s{seed}") for name in ("grpo", "prime", "prime_outcome_only"))
        p_end = final(p, steps)
        g_time = at_time(g, p_end["clock_s"])
        table["runs"][seed] = {
            "prime": {**p_end, "curve": [(r["step"], r["eval/accuracy"]) for r in p if "eval/accuracy" in r],
                      "prm_accuracy_mean": statistics.mean(r["prm/accuracy"] for r in p if "prm/accuracy" in r)},
            "prime_outcome_only": final(o, steps),
            "grpo_equal_steps": final(g, steps),
            "grpo_equal_time": {"accuracy": g_time["eval/accuracy"], "step": g_time["step"],
                                "clock_s": g_time["clock_s"]},
            "grpo_curve": [(r["step"], r["eval/accuracy"]) for r in g if "eval/accuracy" in r],
        }
    for key in ("prime", "prime_outcome_only", "grpo_equal_steps", "grpo_equal_time"):
        values = [table["runs"][s][key]["accuracy"] for s in seeds]
        table[key] = {"mean": statistics.mean(values), "each": values}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "prime_bench")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "prime_vs_grpo.json")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    sft = stage(args.out, "sft", ["sft", "--model", "tiny", *TASK, "--seed", "0", "sft.steps=1200", "sft.lr=3e-3",
                                  "sft.batch_size=64", "sft.eval_every=200", "sft.eval_n=200", "threads=1"])
    start = str(last_checkpoint(sft))
    stage(args.out, "eval_sft", ["evaluate", "--model", start, *TASK, "split=test", "eval.limit=200", "eval.n=1",
                                 "eval.k=[1]", "eval.max_new_tokens=40", "threads=1"])
    for seed in seeds:
        common = ["train", "--model", start, *TASK, "--seed", str(seed), *RL]
        stage(args.out, f"grpo_s{seed}", [*common, f"rl.steps={2 * args.steps}"])
        stage(args.out, f"prime_s{seed}", [*common, *PRIME, f"rl.steps={args.steps}"])
        stage(args.out, f"prime_outcome_only_s{seed}", [*common, *OUTCOME_ONLY, f"rl.steps={args.steps}"])
    table = summarize(args.out, seeds, args.steps)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(table, indent=1))
    print(f"\nheld-out greedy accuracy (first 200 test questions); SFT start {table['sft_accuracy']:.3f}")
    print(f"{'run':<44}{'mean':>7}  each seed")
    for key, label in (("grpo_equal_steps", f"GRPO, {args.steps} steps"),
                       ("prime", f"PRIME, {args.steps} steps"),
                       ("prime_outcome_only", f"PRIME without its process term, {args.steps} steps"),
                       ("grpo_equal_time", "GRPO at PRIME's wall time")):
        each = ", ".join(f"{v:.3f}" for v in table[key]["each"])
        print(f"{label:<44}{table[key]['mean']:>7.3f}  {each}")
    for seed in seeds:
        r = table["runs"][seed]
        print(f"seed {seed}: s/step GRPO {r['grpo_equal_steps']['s_per_step']:.2f}, "
              f"PRIME {r['prime']['s_per_step']:.2f} (GRPO at PRIME's wall time: step "
              f"{r['grpo_equal_time']['step']}); PRIME's PRM: loss {r['prime']['prm_loss']:.3f} at the end, ranking accuracy {r['prime']['prm_accuracy_mean']:.3f} on "
              "average over the steps")
    print(f"wrote {args.json}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
