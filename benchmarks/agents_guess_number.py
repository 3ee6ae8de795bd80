"""guess_number (N = 64): success rate and mean turns after SFT and after GRPO with `grpo`, `turn_grpo` and `gigpo` at
equal steps, per seed.

    python benchmarks/agents_guess_number.py --out runs/bench_guess --seeds 0 1 2 [--rl-steps 40] [--lr 1e-4]
                                             [--temperature 0.7] [--parallel 3]

One SFT warm start on binary-search traces (stopped early, so RL has room), evaluated with greedy episodes on the
300 held-out secrets; then, for each seed and estimator, GRPO from that checkpoint and the same evaluation. Runs go
through the CLI, each in its own run directory under --out; `figures.json` there holds every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ENV = ["env.max_turns=8", "env.max_episode_tokens=200"]
TASK = ["--task", "env:guess_number"]


def run(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rewardlab.cli", *args, "--no-progress", "--overwrite"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def evaluate(model: str, out: Path) -> dict:
    run(["evaluate", "--model", model, *TASK, "--out", str(out), *ENV, "eval.max_new_tokens=10", "eval.n=1",
         "eval.k=[1]", "split=test", "threads=1"])
    s = json.loads((out / "summary.json").read_text())
    return {"success": s["accuracy"], "turns_mean": s["turns_mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_guess")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-4, help="GRPO learning rate (3e-4 wrecks the early-stopped start)")
    ap.add_argument("--temperature", type=float, default=0.7, help="GRPO sampling temperature")
    ap.add_argument("--parallel", type=int, default=3, help="GRPO runs at once (each with threads=1)")
    a = ap.parse_args()
    out = Path(a.out)
    figures: dict = {"settings": vars(a)}
    sft = out / "sft"
    # the episode budgets apply to sft's traces too; these keep every binary search whole (at most 7 guesses)
    figures["sft_s"] = run(["sft", "--model", "tiny", *TASK, "--out", str(sft), f"sft.steps={a.sft_steps}", *ENV,
                            "threads=2"])
    start = str(sft / "checkpoints" / f"step-{a.sft_steps}")
    figures["sft"] = evaluate(start, out / "eval_sft")
    print(f"after SFT ({a.sft_steps} steps): {figures['sft']}", flush=True)

    def grpo(job: tuple[int, str]) -> tuple[str, dict]:
        seed, estimator = job
        run_dir = out / f"{estimator}_seed{seed}"
        wall = run(["train", "--model", start, *TASK, "--out", str(run_dir), "--seed", str(seed), *ENV,
                    f"rl.estimator={estimator}", f"rl.steps={a.rl_steps}", "rl.prompts_per_step=8",
                    "rl.group_size=8", "rl.sampling.max_new_tokens=10", f"rl.lr={a.lr}",
                    f"rl.sampling.temperature={a.temperature}",
                    "threads=1"])
        ev = evaluate(str(run_dir / "checkpoints" / f"step-{a.rl_steps}"), out / f"eval_{estimator}_seed{seed}")
        return f"{estimator}/seed{seed}", {**ev, "train_s": wall}

    jobs = [(s, e) for s in a.seeds for e in ("grpo", "turn_grpo", "gigpo")]
    with ThreadPoolExecutor(a.parallel) as pool:
        for name, fig in pool.map(grpo, jobs):
            figures[name] = fig
            print(f"{name}: {fig}", flush=True)
            (out / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
