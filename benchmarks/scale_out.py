"""Scale-out figures for `rl.engine: ray` (docs/scale-out.md): Ray's overhead per step, steps/s and rewards/s with an
expensive reward on 1 and 2 reward workers and with `rl.ray.max_staleness=1`, a measured cost model checked against
those runs, and accuracy at equal wall time for asynchronous against synchronous training.

    python benchmarks/scale_out.py --steps 10 --repeats 3 --budget 90   # the README's figures (15 min on 2 cores)
    python benchmarks/scale_out.py --parts overhead,expensive       # throughput and the cost model only
    python benchmarks/scale_out.py --parts accuracy --budget 60 --seeds 0,1,2

It benchmarks the rewardlab of this checkout (src/ next to benchmarks/) unless PYTHONPATH is set, offline, with the
tiny model. Every training run is a fresh Python process (this script re-runs itself with --child), so no run pays
for another's imports or Ray cluster; each Ray run starts its own local cluster, whose start-up is outside the timed
steps. Every run of a part uses the same `threads` (torch threads of the driver and of every worker).

Parts:

- overhead: the quickstart's RL step (`rewardlab quickstart`: 128 prompts x 8 rollouts, 4 new tokens, its task and
  verifier), fresh tiny weights, on engine local and on engine ray with 1 rollout and 1 reward worker (one chunk, the
  default), `--steps` steps each, the first two not counted; local and ray alternate over `--repeats`. Overhead =
  ray's median step time / local's - 1 (target: at most 15%).
- expensive: the `code` reward (the sandbox, one process per completion, one at a time per reward instance:
  `workers: 1`) on HumanEval-style rows (a program `def f(): return a+b(+c)==` that the completion finishes, and
  `check(candidate)` asserting it returns True), 16 prompts x 8 rollouts of 8 tokens in 4 chunks of 32. Runs: local;
  ray 1 rollout + 1 reward worker; ray 1 + 2; ray 1 + 2 with max_staleness=1. Reported: steps/s and rewards/s
  (scored rollouts per second) over the counted steps, and each step's parts (median): rollout (`time/gen_s`),
  reward (`time/reward_s`), learner (the rest of the step: credit, update, publishing the weights) and
  `ray/weights_bytes`.
- model: the cost model. From the 1-reward-worker run's parts (G rollout, R reward, L learner seconds per step,
  B weight bytes per publication) it predicts the step time with Nr rollout and Nw reward workers and C chunks:
      synchronous     T = L + G / min(Nr, C) + R / min(Nw, C) + Nr * B / bandwidth
      max_staleness>0 T = max(L + Nr * B / bandwidth, G / min(Nr, C) + R / min(Nw, C), W / cores)
  where W = L + G + R is the step's CPU work, which `cores` bound (2 here; unbounded on a cluster with a node per
  worker). It checks the prediction against the measured 2-worker and asynchronous runs twice: with R / N (a core per
  reward worker) and with R scaled as the reward itself scales on this machine (the `code` reward alone, no Ray,
  scoring one step's 128 rollouts with 1 and with 2 sandboxes at a time); it projects steps/s to N reward workers on
  a cluster and says which part stops scaling first. The bandwidth (object store between nodes) is an assumption,
  `--bandwidth-gbit` (default 10); on one machine the object store shares memory and B costs nothing measurable.
- accuracy: GRPO from the quickstart's SFT checkpoint (trained once here, the quickstart's SFT settings, seed 0) for
  `--budget` seconds of wall clock per run, synchronous (engine ray, max_staleness 0) against max_staleness=1, seeds
  `--seeds`; greedy accuracy on the 500 held-out questions when the budget runs out, and the steps done.

Results go to stdout and, with --out, to a JSON file (every run's per-step figures included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(HERE.parent / "src"))

# The expensive part's step: PROMPTS x GROUP rollouts of TOKENS new tokens, in chunks of CHUNK (4 chunks).
PROMPTS, GROUP, TOKENS, CHUNK = 16, 8, 8, 32


# ---------------------------------------------------------------------------------------------- one run (child)
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration (`spec`: the TrainConfig as a dict, and `budget_s`); returns its metrics lines and
    summary."""
    import torch

    from rewardlab.config import TrainConfig
    from rewardlab.rl.trainer import train

    torch.set_num_threads(spec["config"]["threads"])
    cfg = TrainConfig(**spec["config"])
    summary = train(cfg, mode="overwrite", show_progress=False, time_budget_s=spec.get("budget_s"))
    metrics = [json.loads(line) for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "metrics": metrics}


def run(name: str, config: dict[str, Any], work: Path, budget_s: float | None = None) -> dict[str, Any]:
    """`child(config)` in a fresh interpreter; prints one line when it is done."""
    config = dict(config, out=str(work / name), save_every=10**9, keep_checkpoints=1)
    spec_path, result_path = work / f"{name}.spec.json", work / f"{name}.result.json"
    spec_path.write_text(json.dumps({"config": config, "budget_s": budget_s}))
    env = dict(os.environ)
    if "PYTHONPATH" not in env:
        env["PYTHONPATH"] = str(HERE.parent / "src")
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--child", str(spec_path), "--result", str(result_path)], check=True,
                   env=env)
    result = json.loads(result_path.read_text())
    result["process_s"] = time.perf_counter() - t
    print(f"  {name}: {len(result['metrics'])} steps, process {result['process_s']:.1f} s", flush=True)
    return result


# ---------------------------------------------------------------------------------------------- figures
def counted(metrics: list[dict[str, Any]], skip: int) -> list[dict[str, Any]]:
    return metrics[skip:]


def throughput(result: dict[str, Any], skip: int) -> dict[str, float]:
    """steps/s and rewards/s over the counted steps (from `time/elapsed_s`, the loop's own clock, so that an
    asynchronous step's overlap counts), and the median parts of a step."""
    m = result["metrics"]
    start = m[skip - 1]["time/elapsed_s"] if skip else 0.0
    wall = m[-1]["time/elapsed_s"] - start
    rows = counted(m, skip)
    scored = sum(x["rollout/generated"] for x in rows)
    med = {k: statistics.median(x[k] for x in rows) for k in ("time/step_s", "time/gen_s", "time/reward_s")}
    return {
        "steps": len(rows), "wall_s": wall, "steps_per_s": len(rows) / wall, "rewards_per_s": scored / wall,
        "step_s": med["time/step_s"], "rollout_s": med["time/gen_s"], "reward_s": med["time/reward_s"],
        "learner_s": statistics.median(x["time/step_s"] - x["time/gen_s"] - x["time/reward_s"] for x in rows),
        "weights_bytes": rows[-1].get("ray/weights_bytes", 0.0),
    }


def predict(parts: dict[str, float], *, rollout_workers: int, reward_workers: int, chunks: int, lag: int,
            cores: float, bandwidth_bytes_s: float) -> float:
    """The cost model's seconds per step (see the module docstring)."""
    L, G, R, B = parts["learner_s"], parts["rollout_s"], parts["reward_s"], parts["weights_bytes"]
    broadcast = rollout_workers * B / bandwidth_bytes_s
    produce = G / min(rollout_workers, chunks) + R / min(reward_workers, chunks)
    if lag == 0:
        return L + broadcast + produce
    return max(L + broadcast, produce, (L + G + R) / cores)


# ---------------------------------------------------------------------------------------------- parts
def quickstart_config(threads: int, seed: int = 0) -> dict[str, Any]:
    from rewardlab.config import QuickstartConfig

    q = QuickstartConfig()
    rl = q.rl.model_dump()
    rl["eval"].update(every=0)
    return {"model": q.model.model_dump(), "task": q.task.model_dump(), "rl": rl, "threads": threads, "seed": seed}


def part_overhead(args, work: Path) -> dict[str, Any]:
    print(f"overhead: the quickstart's step ({args.steps} steps, first 2 not counted), local vs ray 1+1, "
          f"{args.repeats} repeats", flush=True)
    base = quickstart_config(args.threads)
    base["rl"].update(steps=args.steps)
    ray = {**base, "rl": {**base["rl"], "engine": "ray", "ray": {"rollout_workers": 1, "reward_workers": 1}}}
    steps: dict[str, list[float]] = {"local": [], "ray": []}
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    for r in range(args.repeats):
        for arm in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
            res = run(f"overhead-{arm}-{r}", base if arm == "local" else ray, work)
            runs[arm].append(throughput(res, 2))
            steps[arm] += [x["time/step_s"] for x in counted(res["metrics"], 2)]
    local, ray_s = statistics.median(steps["local"]), statistics.median(steps["ray"])
    out = {"local_step_s": local, "ray_step_s": ray_s, "overhead": ray_s / local - 1, "runs": runs,
           "rollouts_per_step": base["rl"]["prompts_per_step"] * base["rl"]["group_size"]}
    print(f"  median step: local {local:.3f} s, ray (1 rollout + 1 reward worker) {ray_s:.3f} s: overhead "
          f"{100 * out['overhead']:+.1f}% (target <= 15%)", flush=True)
    return out


def code_rows(path: Path, n: int = 2000) -> Path:
    import random

    rng = random.Random(0)
    with path.open("w") as fh:
        for _ in range(n):
            terms = [rng.randint(0, 9) for _ in range(rng.randint(2, 3))]
            fh.write(json.dumps({"prompt": "def f():\n    return " + "+".join(map(str, terms)) + "==",
                                 "answer": str(sum(terms)), "entry_point": "f",
                                 "test": "def check(candidate):\n    assert candidate()\n"}) + "\n")
    return path


EXPENSIVE_RUNS = [  # name, rollout workers, reward workers, max_staleness (None: engine local)
    ("local", 1, 1, None),
    ("ray 1 reward worker", 1, 1, 0),
    ("ray 2 reward workers", 1, 2, 0),
    ("ray 1 reward worker, max_staleness=1", 1, 1, 1),
    ("ray 2 reward workers, max_staleness=1", 1, 2, 1),
]


def part_expensive(args, work: Path) -> dict[str, Any]:
    print(f"expensive: the code reward (sandbox) on HumanEval-style rows, {args.steps} steps per run, first 2 not "
          "counted", flush=True)
    rows = code_rows(work / "code_rows.jsonl")
    base = {"task": {"spec": f"jsonl:{rows}", "options": {"reward": "code", "test_size": 100}},
            "rewards": [{"name": "code", "workers": 1}], "threads": args.threads, "seed": 0,
            "rl": {"steps": args.steps, "prompts_per_step": PROMPTS, "group_size": GROUP, "lr": 1e-4,
                   "sampling": {"max_new_tokens": TOKENS, "temperature": 1.0, "rollout_chunk": CHUNK}}}
    out: dict[str, Any] = {}
    for name, nr, nw, lag in EXPENSIVE_RUNS:
        rl = dict(base["rl"])
        if lag is not None:
            rl.update(engine="ray", ray={"rollout_workers": nr, "reward_workers": nw, "max_staleness": lag})
        res = run("expensive-" + name.replace(" ", "_").replace(",", "").replace("=", ""), {**base, "rl": rl}, work)
        out[name] = throughput(res, 2) | {"rollout_workers": nr, "reward_workers": nw, "max_staleness": lag or 0,
                                          "engine": "local" if lag is None else "ray"}
    print(f"  {'run':40s} {'steps/s':>8s} {'rewards/s':>10s} {'rollout s':>10s} {'reward s':>9s} {'learner s':>10s}")
    for name, f in out.items():
        if f["max_staleness"]:  # the batch is produced in the prefetch thread: the step holds no rollout or reward
            f["learner_s"] = None
        learner = "n/a" if f["learner_s"] is None else f"{f['learner_s']:.3f}"
        print(f"  {name:40s} {f['steps_per_s']:8.3f} {f['rewards_per_s']:10.1f} {f['rollout_s']:10.3f} "
              f"{f['reward_s']:9.3f} {learner:>10s}")
    return out


def broadcast_s(parts: dict[str, float], bandwidth_bytes_s: float) -> float:
    """Seconds to send one publication's weights to one node."""
    return parts["weights_bytes"] / bandwidth_bytes_s


def reward_scaling_here(rows_path: Path, repeats: int = 3) -> dict[int, float]:
    """Seconds the expensive part's reward takes for one step's 128 rollouts on this machine, scored by the reward
    itself (no Ray) with 1 and with 2 sandboxes at a time (`workers`): how far two reward workers can go here."""
    import random

    from rewardlab.rewards.code import CodeReward
    from rewardlab.types import Rollout

    rng = random.Random(0)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()[:PROMPTS]]
    rollouts = [Rollout(prompt=rows[i // GROUP]["prompt"], prompt_ids=[], completion="".join(
        rng.choice("0123456789 +=()") for _ in range(TOKENS)), completion_ids=[], logprobs=[], row=rows[i // GROUP],
        group=i // GROUP) for i in range(PROMPTS * GROUP)]
    out = {}
    for workers in (1, 2):
        reward = CodeReward(workers=workers)
        reward(rollouts[:4])  # the launcher starts
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            reward(rollouts)
            times.append(time.perf_counter() - t)
        out[workers] = statistics.median(times)
    return out


def part_model(args, expensive: dict[str, Any], work: Path) -> dict[str, Any]:
    base = expensive["ray 1 reward worker"]
    scaling = reward_scaling_here(work / "code_rows.jsonl")
    print(f"model: the code reward alone on this machine, {PROMPTS * GROUP} rollouts: {scaling[1]:.3f} s with 1 "
          f"sandbox at a time, {scaling[2]:.3f} s with 2 ({scaling[1] / scaling[2]:.2f}x on {os.cpu_count()} cores)",
          flush=True)
    chunks = PROMPTS * GROUP // CHUNK
    bandwidth = args.bandwidth_gbit * 1e9 / 8
    here = os.cpu_count() or 1
    checks = {}
    print(f"model: parts of a step at 1 reward worker: rollout G {base['rollout_s']:.3f} s, reward R "
          f"{base['reward_s']:.3f} s, learner L {base['learner_s']:.3f} s, weights B {base['weights_bytes'] / 1e6:.2f} "
          f"MB per publication", flush=True)
    for name in [run[0] for run in EXPENSIVE_RUNS if run[2] > 1 or run[3]]:  # the runs the 1-worker parts predict
        f = expensive[name]
        nw = f["reward_workers"]
        # ideal: R / N (a node per reward worker); here: R scaled as the reward itself scales on this machine's cores
        local = dict(base, reward_s=base["reward_s"] * scaling[nw] / scaling[1] * nw)
        ideal, host = (predict(parts, rollout_workers=f["rollout_workers"], reward_workers=nw, chunks=chunks,
                               lag=f["max_staleness"], cores=here, bandwidth_bytes_s=bandwidth)
                       for parts in (base, local))
        checks[name] = {"predicted_ideal_steps_per_s": 1 / ideal, "predicted_here_steps_per_s": 1 / host,
                        "measured_steps_per_s": f["steps_per_s"], "error_ideal": f["steps_per_s"] * ideal - 1,
                        "error_here": f["steps_per_s"] * host - 1}
        print(f"  {name:40s} measured {f['steps_per_s']:.3f} steps/s; predicted {1 / ideal:.3f} with R / N "
              f"({100 * checks[name]['error_ideal']:+.1f}%), {1 / host:.3f} with this machine's reward scaling "
              f"({100 * checks[name]['error_here']:+.1f}%)")
    projection = []
    for n in (1, 2, 4, 8, 16, 32):
        row = {"reward_workers": n}
        for lag in (0, 1):
            row[f"lag{lag}_steps_per_s"] = 1 / predict(base, rollout_workers=1, reward_workers=n, chunks=n, lag=lag,
                                                       cores=float("inf"), bandwidth_bytes_s=bandwidth)
        projection.append(row)
    L, G, R = base["learner_s"], base["rollout_s"], base["reward_s"]
    print("  projected on a cluster (a node per worker, chunks >= workers, 1 rollout worker):")
    for row in projection:
        print(f"    {row['reward_workers']:3d} reward workers: synchronous {row['lag0_steps_per_s']:.2f} steps/s, "
              f"max_staleness=1 {row['lag1_steps_per_s']:.2f} steps/s")
    n10 = -(-R // (0.1 * (L + G)))  # reward workers that bring R / N under 10% of L + G
    first = (f"synchronous: the learner and generation, L + G = {L + G:.3f} s a step, never overlap the scoring; "
             f"at most {(L + G + R) / (L + G):.1f}x the 1-worker steps/s, and R / N is under 10% of L + G from "
             f"N = {n10:.0f}. max_staleness=1: generation and scoring overlap the learner, which alone bounds the "
             f"step (L = {L:.3f} s, {1 / L:.1f} steps/s) "
             + (f"once G + R / N <= L, from N = {-(-R // (L - G)):.0f}" if L > G else "never: G >= L, so generation "
                "bounds it; add rollout workers")
             + ". Weights: N_r x B / bandwidth per step, "
             f"{1e3 * broadcast_s(base, bandwidth):.1f} ms per rollout node here")
    print(f"  stops scaling first: {first}")
    return {"parts": {"rollout_s": G, "reward_s": R, "learner_s": L, "weights_bytes": base["weights_bytes"]},
            "reward_scaling_here": scaling,
            "chunks": chunks, "cores": here, "bandwidth_gbit": args.bandwidth_gbit, "checks": checks,
            "projection": projection, "stops_scaling_first": first}


def part_accuracy(args, work: Path) -> dict[str, Any]:
    from rewardlab.config import QuickstartConfig

    print(f"accuracy: GRPO from the quickstart's SFT checkpoint, {args.budget:.0f} s of wall clock per run, seeds "
          f"{args.seeds}", flush=True)
    q = QuickstartConfig()
    sft_out = work / "sft"
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(HERE.parent / "src")))
    subprocess.run([sys.executable, "-m", "rewardlab.cli", "sft", "--out", str(sft_out), "--overwrite",
                    f"threads={args.threads}", f"sft.steps={args.sft_steps or q.sft.steps}",
                    f"sft.batch_size={q.sft.batch_size}",
                    f"sft.lr={q.sft.lr}", f"task.spec={q.task.spec}", f"task.options={json.dumps(q.task.options)}"],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    checkpoint = json.loads((sft_out / "summary.json").read_text())["final_checkpoint"]
    out: dict[str, Any] = {"checkpoint": checkpoint, "budget_s": args.budget, "runs": {}}
    for seed in args.seeds:
        for lag in (0, 1):
            cfg = quickstart_config(args.threads, seed)
            cfg["model"]["path"] = checkpoint
            cfg["rl"].update(steps=10**6, eval={"every": 10**6, "n": 500}, engine="ray",
                             ray={"rollout_workers": 1, "reward_workers": 1, "max_staleness": lag})
            res = run(f"accuracy-seed{seed}-lag{lag}", cfg, work, budget_s=args.budget)
            last = res["metrics"][-1]
            out["runs"][f"seed{seed}-lag{lag}"] = {"seed": seed, "max_staleness": lag, "steps": len(res["metrics"]),
                                                   "accuracy": last.get("eval/accuracy"),
                                                   "elapsed_s": last["time/elapsed_s"]}
    print(f"  {'seed':>4s} {'max_staleness':>13s} {'steps':>6s} {'held-out accuracy':>18s}")
    for r in out["runs"].values():
        print(f"  {r['seed']:4d} {r['max_staleness']:13d} {r['steps']:6d} {100 * r['accuracy']:17.1f}%")
    for lag in (0, 1):
        accs = [r["accuracy"] for r in out["runs"].values() if r["max_staleness"] == lag]
        steps = [r["steps"] for r in out["runs"].values() if r["max_staleness"] == lag]
        out[f"lag{lag}"] = {"accuracy_mean": statistics.mean(accs), "steps_mean": statistics.mean(steps)}
        print(f"  max_staleness={lag}: mean accuracy {100 * statistics.mean(accs):.1f}%, mean steps "
              f"{statistics.mean(steps):.1f}")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="overhead,expensive,model,accuracy",
                   help="comma-separated: overhead, expensive, model (needs expensive), accuracy")
    p.add_argument("--steps", type=int, default=10, help="steps per throughput run, the first 2 not counted")
    p.add_argument("--repeats", type=int, default=2, help="repeats of the overhead pair (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the driver and of every worker")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of wall clock per accuracy run")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the accuracy runs")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps of the accuracy part's checkpoint "
                   "(default: the quickstart's)")
    p.add_argument("--bandwidth-gbit", type=float, default=10.0, help="the cost model's network bandwidth")
    p.add_argument("--work", type=Path, default=None, help="directory for the runs (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        args.result.write_text(json.dumps(child(json.loads(args.child.read_text()))))
        return {}
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(parts) - {"overhead", "expensive", "model", "accuracy"}
    if unknown:
        p.error(f"--parts: unknown part(s) {sorted(unknown)}; valid: overhead, expensive, model, accuracy")
    if "model" in parts and "expensive" not in parts:
        p.error("--parts: model needs expensive (its runs are the model's measurements)")
    if args.steps < 3:
        p.error(f"--steps: must be >= 3 (the first 2 are not counted), got {args.steps}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, Any] = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                               "cpu_count": os.cpu_count(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        if "overhead" in parts:
            results["overhead"] = part_overhead(args, work)
        if "expensive" in parts:
            results["expensive"] = part_expensive(args, work)
        if "model" in parts:
            results["model"] = part_model(args, results["expensive"], work)
        if "accuracy" in parts:
            results["accuracy"] = part_accuracy(args, work)
        results["wall_s"] = time.perf_counter() - t
    results["load_after"] = os.getloadavg()
    print(f"load average before {results['load_before'][0]:.2f}, after {results['load_after'][0]:.2f}; "
          f"{results['wall_s']:.0f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
