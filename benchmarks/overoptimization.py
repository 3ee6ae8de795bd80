"""Reward over-optimization, measured (issue 35, item 5): GRPO against a learned proxy reward model on the quickstart
task, the gold being the task's verifier, with the mitigations side by side at the same budget.

    PYTHONPATH=src python benchmarks/overoptimization.py [--out runs/overopt] [--configs baseline,kl,...]
        [--seeds 0,1,2] [--report-only]

What it runs, each stage a plain `rewardlab` command (printed as it starts) writing its own directory under OUT; a
stage whose summary.json exists is skipped and a stopped one is resumed (--resume), as benchmarks/reward_models.sh
does, so the script can be stopped and started again. Threads are pinned to 1 (OMP_NUM_THREADS=1, threads=1), one
process at a time.

1. Preference pairs (`rm pairs`) from the quickstart's SFT policy (runs/quickstart/sft's step-650 checkpoint, or
   --policy): 8 samples per question at T=1, one (correct, incorrect) pair per question, labelled by the verifier;
   1,500 training pairs and every held-out question's pair (357).
2. Three Bradley-Terry reward models (`rm train`) on the SFT policy's backbone, each on a different random
   subsample of 1,000 of those pairs (seeds 0, 1, 2): limited data, so the proxy has biases a policy can exploit.
   RM 0 is the proxy of every single-RM configuration; the three are the ensemble's members.
3. The initial probe of each configuration: the monitor's probe (rewardlab.rl.monitor) of the SFT policy itself,
   step 0, KL 0, computed here with the trainer's own functions (the trainer probes from its first cadence step).
4. GRPO (`rewardlab train`) from the SFT policy, 3 seeds per configuration, the same budget for all: 60 steps x 64
   prompts x 8 completions, lr 1e-4, T=0.7, 4 new tokens; the monitor probes every 5 steps on the first 128 held-out
   questions x 4 samples, with KL to the initial policy (`rl.monitor.kl_to_init: true`). The configurations
   (CONFIGS below): the proxy alone (`baseline`); a KL penalty (`kl`, rl.beta 0.1; `kl_strong`, 1.0); PAR shaping
   against the reference answer scored by the proxy (`par`); ensembles of the 3 RMs reduced by mean, min and
   mean - std (`ens_mean`, `ens_min`, `ens_mean_minus_std`); the proxy gated by the verifier (`gated`: sigmoid(RM)
   counts only on a correct answer, else 0). Reward clipping is not among them: the `clip` shaping acts on process
   rewards' step scores and leaves an outcome RM's score unchanged; PAR is the centring one (on the reference).
5. The report: per run, from metrics.jsonl (monitor/*) and events.jsonl (monitor_alarm): gold and proxy at the
   start and the end, the gold peak (its step and sqrt KL), the final proxy - gold gap, the first alarm's step and
   its distance from the gold peak; per configuration, the mean and standard deviation over seeds. Printed as a
   table, written to benchmarks/results/overoptimization.json, and plotted in docs/img/overoptimization.png (left:
   the baseline's gold and proxy against sqrt KL, one line per seed, alarms marked; right: each configuration's gold
   at the start, peak and end).

Time: about 55 minutes on one thread of a 2-core machine shared with other work (measured: pairs and RMs 3 min; the
24 GRPO runs 52 min, 100-130 s each and 170-215 s for the ensembles). --report-only rebuilds the table, JSON and
plot from the finished runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stages import ROOT, last_checkpoint, stage  # noqa: E402  (benchmarks/stages.py)
TASK_OPTIONS = ("{min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 1, template: compact, size: 20000, "
                "test_size: 500}")
TASK = ["task.spec=reasoning_gym:chain_sum", f"task.options={TASK_OPTIONS}"]
RM_SEEDS = (0, 1, 2)
RM_PAIRS = 1000  # train.subsample of each RM: a count of the 1,500 training pairs
STEPS, PROMPTS, GROUP, LR, PROBE_EVERY, PROBE_N = 60, 64, 8, 1e-4, 5, 128
GRPO = [f"rl.steps={STEPS}", f"rl.prompts_per_step={PROMPTS}", f"rl.group_size={GROUP}", f"rl.lr={LR}",
        "rl.sampling.temperature=0.7", "rl.sampling.max_new_tokens=4", "rl.eval.every=0",
        f"rl.monitor.every={PROBE_EVERY}", f"rl.monitor.n={PROBE_N}", "rl.monitor.kl_to_init=true", "threads=1",
        f"save_every={PROBE_EVERY * 4}", "keep_checkpoints=1"]


def rm_spec(path: str) -> str:
    return f"{{name: reward_model, path: {path}}}"


def config_overrides(name: str, rms: Sequence[str]) -> list[str]:
    """The `rewardlab train` overrides of configuration `name` (beyond GRPO and TASK), with `rms` the reward models'
    checkpoint directories (rms[0]: the proxy). Raises KeyError: an unknown name."""
    proxy = rm_spec(rms[0])
    members = ", ".join(rm_spec(p) for p in rms)

    def ensemble(reduce: str) -> str:
        return f"{{compose: ensemble, reduce: {reduce}, lam: 1.0, members: [{members}]}}"

    return {
        "baseline": [f"rewards=[{proxy}]"],
        "kl": [f"rewards=[{proxy}]", "rl.beta=0.1"],
        "kl_strong": [f"rewards=[{proxy}]", "rl.beta=1.0"],
        "par": [f"rewards=[{{shape: par, ref_completion_field: answer, reward: {proxy}}}]"],
        "ens_mean": [f"rewards=[{ensemble('mean')}]"],
        "ens_min": [f"rewards=[{ensemble('min')}]"],
        "ens_mean_minus_std": [f"rewards=[{ensemble('mean_minus_std')}]"],
        "gated": ["rewards=[{compose: gated, gate: {name: reasoning_gym}, gate_weight: 0.0, threshold: 1.0, "
                  f"reward: {{shape: par, ref: 0.0, reward: {proxy}}}}}]"],
    }[name]


CONFIGS = ("baseline", "kl", "kl_strong", "par", "ens_mean", "ens_min", "ens_mean_minus_std", "gated")
DESCRIPTIONS = {
    "baseline": "RM 0 alone",
    "kl": "RM 0, KL penalty rl.beta 0.1 (k3, in the loss)",
    "kl_strong": "RM 0, KL penalty rl.beta 1.0",
    "par": "PAR: sigmoid(RM 0 - RM 0 of the reference answer)",
    "ens_mean": "3 RMs, mean",
    "ens_min": "3 RMs, min (worst case)",
    "ens_mean_minus_std": "3 RMs, mean - 1.0 std",
    "gated": "sigmoid(RM 0) only when the verifier passes, else 0",
}


# ------------------------------------------------------------------------------------------------- the figures
def run_figures(probes: Sequence[Mapping[str, float]], initial: Mapping[str, float] | None = None,
                alarm_steps: Sequence[int] = ()) -> dict[str, Any]:
    """The figures of one run from its monitor probes.

    Args:
        probes: metrics.jsonl lines that hold `monitor/gold` (each with `step`, `monitor/proxy`, `monitor/gold`,
            `monitor/gap`, `monitor/sqrt_kl`), in step order.
        initial: the step-0 probe (`step` 0, sqrt_kl 0) put before them, or None.
        alarm_steps: the steps at which the monitor's alarm was raised (events.jsonl `monitor_alarm`).
    Returns:
        {gold_start, proxy_start, gold_end, proxy_end, gap_end, sqrt_kl_end, gold_peak, gold_peak_step,
        gold_peak_sqrt_kl, proxy_rise (end - start), gold_change (end - start), alarm_step (first, or None),
        alarm_after_peak (alarm_step - gold_peak_step, or None), gold_at_alarm and sqrt_kl_at_alarm (the alarm's
        probe, or None), curve: [{step, sqrt_kl, proxy, gold}]}.
    Raises:
        ValueError: no probe.
    """
    points = [dict(initial)] if initial is not None else []
    points += [dict(p) for p in probes]
    if not points:
        raise ValueError("probes: the run has no monitor probe (rl.monitor off, or no step reached a probe)")
    curve = [{"step": int(p["step"]), "sqrt_kl": float(p.get("monitor/sqrt_kl", math.nan)),
              "proxy": float(p["monitor/proxy"]), "gold": float(p["monitor/gold"])} for p in points]
    peak = max(curve, key=lambda c: c["gold"])  # the first of equal maxima
    first, last = curve[0], curve[-1]
    alarm = min(alarm_steps) if alarm_steps else None
    at = next((c for c in curve if c["step"] == alarm), None)
    return {
        "gold_start": first["gold"], "proxy_start": first["proxy"],
        "gold_end": last["gold"], "proxy_end": last["proxy"], "gap_end": last["proxy"] - last["gold"],
        "sqrt_kl_end": last["sqrt_kl"],
        "gold_peak": peak["gold"], "gold_peak_step": peak["step"], "gold_peak_sqrt_kl": peak["sqrt_kl"],
        "proxy_rise": last["proxy"] - first["proxy"], "gold_change": last["gold"] - first["gold"],
        "alarm_step": alarm, "alarm_after_peak": None if alarm is None else alarm - peak["step"],
        "gold_at_alarm": None if at is None else at["gold"], "sqrt_kl_at_alarm": None if at is None else at["sqrt_kl"],
        "curve": curve,
    }


AGGREGATED = ("gold_start", "gold_end", "gold_peak", "gold_peak_step", "gold_peak_sqrt_kl", "proxy_start",
              "proxy_end", "gap_end", "proxy_rise", "gold_change", "sqrt_kl_end")


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and sample standard deviation (0 for one run) over seeds of each figure in AGGREGATED, as
    {figure: {"mean", "sd"}}, plus `seeds` (the count), `alarms` (each run's first alarm step or None) and
    `gold_at_alarms` (the gold at it, or None).

    Raises:
        ValueError: no run.
    """
    if not runs:
        raise ValueError("runs: nothing to aggregate")
    out: dict[str, Any] = {"seeds": len(runs), "alarms": [r["alarm_step"] for r in runs],
                           "gold_at_alarms": [r["gold_at_alarm"] for r in runs]}
    for key in AGGREGATED:
        values = [float(r[key]) for r in runs]
        out[key] = {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}
    return out


def _pm(figure: Mapping[str, float], digits: int = 3) -> str:
    return f"{figure['mean']:.{digits}f} ± {figure['sd']:.{digits}f}"


def table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The per-configuration table (Markdown), one row per configuration in `summary` ({name: aggregate(...)})."""
    head = ("| configuration | gold start | gold peak (step, √KL) | gold end | proxy start → end | gap end "
            "(proxy − gold) | √KL end | first alarm: step (gold there), per seed |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, s in summary.items():
        alarms = ", ".join("—" if a is None else f"{a} ({g:.3f})" for a, g in zip(s["alarms"], s["gold_at_alarms"]))
        lines.append(
            f"| {name} | {_pm(s['gold_start'])} | {_pm(s['gold_peak'])} ({s['gold_peak_step']['mean']:.0f}, "
            f"{s['gold_peak_sqrt_kl']['mean']:.2f}) | {_pm(s['gold_end'])} | {s['proxy_start']['mean']:.3f} → "
            f"{_pm(s['proxy_end'])} | {_pm(s['gap_end'])} | {_pm(s['sqrt_kl_end'], 2)} | {alarms} |")
    return "\n".join(lines)


def read_run(rundir: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(monitor probes from metrics.jsonl, alarm steps from events.jsonl) of a run directory."""
    probes = [d for d in map(json.loads, (rundir / "metrics.jsonl").read_text().splitlines())
              if "monitor/gold" in d]
    alarms = []
    events = rundir / "events.jsonl"
    if events.exists():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            if e.get("event") == "monitor_alarm" or e.get("type") == "monitor_alarm":
                alarms.append(int(e["step"]))
    if not alarms:  # the metric is authoritative when the event's layout differs
        alarms = [int(d["step"]) for d in probes if d.get("monitor/alarm", 0) >= 1]
    return probes, sorted(set(alarms))


# ------------------------------------------------------------------------------------------------- the stages
def initial_probe(out: Path, name: str, overrides: Sequence[str]) -> dict[str, Any]:
    """The monitor's probe of the initial (SFT) policy under configuration `name`, at step 0 (cached in
    OUT/initial/NAME.json): the same probe rows, samples, streams (seed 0, step 0) and rewards as the run's probes."""
    path = out / "initial" / f"{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    from rewardlab.config import TrainConfig
    from rewardlab.config.loader import load_config
    from rewardlab.policy import load_policy
    from rewardlab.rl.monitor import make_monitor, parse_gold, probe_rows
    from rewardlab.rl.trainer import check_config, load_task_and_reward
    from rewardlab.threads import apply_threads

    cfg = load_config(TrainConfig, None, [*overrides, "seed=0"])
    specs = check_config(cfg, "new")
    apply_threads(cfg.threads)
    task, reward = load_task_and_reward(cfg, specs)
    policy = load_policy(cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())
    reference = None
    if cfg.rl.beta > 0:  # the KL reference would be the initial weights: KL 0 either way
        reference = policy
    monitor = make_monitor(cfg, probe_rows(cfg, task), task, reward, parse_gold(cfg), policy, reference)
    metrics, _ = monitor(policy, 0)
    result = {"step": 0, **{k: v for k, v in metrics.items() if k.startswith("monitor/")}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def plot(summary: Mapping[str, Any], runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    twin = left.twinx()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs.get("baseline", [])):
        c = colors[i % len(colors)]
        xs = [p["sqrt_kl"] for p in r["curve"]]
        left.plot(xs, [p["gold"] for p in r["curve"]], "-o", color=c, ms=3, label=f"gold, seed {r['seed']}")
        twin.plot(xs, [p["proxy"] for p in r["curve"]], "--", color=c, alpha=0.7, label=f"proxy, seed {r['seed']}")
        if r["alarm_step"] is not None:
            at = next(p for p in r["curve"] if p["step"] == r["alarm_step"])
            left.plot([at["sqrt_kl"]], [at["gold"]], "x", color="red", ms=12, mew=2.5)
            left.annotate(f"alarm (step {at['step']})", (at["sqrt_kl"], at["gold"]), textcoords="offset points",
                          xytext=(4, 8), fontsize=8, color="red")
        peak = next(p for p in r["curve"] if p["step"] == r["gold_peak_step"])
        left.plot([peak["sqrt_kl"]], [peak["gold"]], "*", color=c, ms=12)
    left.set_xlabel("√KL(π ‖ π₀), nats/token (monitor/sqrt_kl)")
    left.set_ylabel("gold: verifier accuracy on the probes (solid)")
    twin.set_ylabel("proxy: RM 0 score (dashed)")
    left.set_title("baseline: GRPO on RM 0 (★ gold peak, × alarm)")
    lines = left.get_legend_handles_labels()
    lines2 = twin.get_legend_handles_labels()
    left.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="lower left")
    names = list(summary)
    width = 0.27
    for j, (key, label) in enumerate((("gold_start", "gold at start"), ("gold_peak", "gold peak"),
                                      ("gold_end", "gold at end"))):
        xs = [i + (j - 1) * width for i in range(len(names))]
        right.bar(xs, [summary[n][key]["mean"] for n in names], width, yerr=[summary[n][key]["sd"] for n in names],
                  capsize=3, label=label)
    right.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    right.set_ylabel("gold (verifier accuracy), mean ± sd over seeds")
    right.set_title(f"the same budget ({STEPS} steps × {PROMPTS} prompts × {GROUP}), each mitigation")
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/overopt"))
    parser.add_argument("--policy", default="runs/quickstart/sft/checkpoints/step-650",
                        help="the SFT checkpoint (pairs, RM backbone, initial policy)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--report-only", action="store_true", help="only the table, JSON and plot of finished runs")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/overoptimization.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs/img/overoptimization.png")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out, configs, seeds = args.out, args.configs.split(","), [int(s) for s in args.seeds.split(",")]
    for name in configs:
        if name not in CONFIGS:
            sys.exit(f"--configs: unknown configuration {name!r}; valid: {', '.join(CONFIGS)}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    task = [f"--task={TASK[0].split('=', 1)[1]}", TASK[1]]
    if not args.report_only:
        stage(out, "pairs_train", ["rm", "pairs", "--model", args.policy, *task, "split=train", "pairs.n=8",
                                   "pairs.pairs_per_question=1", "pairs.max_pairs=1500", "pairs.max_new_tokens=4"])
        stage(out, "pairs_test", ["rm", "pairs", "--model", args.policy, *task, "split=test", "pairs.n=8",
                                  "pairs.pairs_per_question=1", "pairs.max_new_tokens=4"])
        for s in RM_SEEDS:
            stage(out, f"rm{s}", ["rm", "train", "--model", args.policy, "--data",
                                  str(out / "pairs_train/pairs.jsonl"), f"eval_data={out / 'pairs_test/pairs.jsonl'}",
                                  f"seed={s}", f"train.subsample={RM_PAIRS}", "train.epochs=4", "train.batch_size=32",
                                  "train.lr=1e-4", "train.warmup_steps=5"])
    rms = [str(last_checkpoint(out / f"rm{s}")) for s in RM_SEEDS]
    rm_eval = {f"rm{s}": json.loads((out / f"rm{s}/summary.json").read_text())["final_eval"]["eval/accuracy"]
               for s in RM_SEEDS}
    runs: dict[str, list[dict[str, Any]]] = {}
    commands: dict[str, str] = {}
    overrides = {name: [f"model.path={args.policy}", *TASK, *GRPO, *config_overrides(name, rms)] for name in configs}
    if not args.report_only:
        for name in configs:
            initial_probe(out, name, overrides[name])
        for s in seeds:  # seed by seed, so that a sweep stopped early has every configuration at its first seeds
            for name in configs:
                stage(out, f"{name}/seed{s}", ["train", *overrides[name], f"seed={s}"])
    for name in configs:
        commands[name] = shlex.join(["rewardlab", "train", *overrides[name], "seed=S"])
        if not (out / "initial" / f"{name}.json").exists():
            continue  # --report-only before the configuration ran
        initial = json.loads((out / "initial" / f"{name}.json").read_text())
        for s in seeds:
            rundir = out / name / f"seed{s}"
            if not (rundir / "summary.json").exists():
                continue
            probes, alarms = read_run(rundir)
            runs.setdefault(name, []).append({"seed": s, **run_figures(probes, initial, alarms)})
    summary = {name: aggregate(rs) for name, rs in runs.items()}
    print()
    print(table(summary))
    result = {"task": "reasoning_gym:chain_sum, 2-3 one-digit terms (the quickstart)", "policy": args.policy,
              "budget": {"steps": STEPS, "prompts_per_step": PROMPTS, "group_size": GROUP, "lr": LR,
                         "probe_every": PROBE_EVERY, "probe_prompts": PROBE_N, "probe_samples": 4},
              "reward_models": {"pairs": RM_PAIRS, "heldout_pairwise_accuracy": rm_eval},
              "descriptions": {n: DESCRIPTIONS[n] for n in summary}, "commands": commands,
              "summary": summary, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    plot(summary, runs, args.plot)
    print(f"\n{args.json}, {args.plot} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
