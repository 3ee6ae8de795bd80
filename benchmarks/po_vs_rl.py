"""RL or preference optimization? GRPO against the DPO family and rejection sampling on the quickstart task, at equal
sampled completions and at equal wall-clock time (issue 36).

    PYTHONPATH=src python benchmarks/po_vs_rl.py --tune [--policy CKPT] [--out runs/po_vs_rl] [--seeds 1,2,3]
        [--methods grpo_g8,...] [--steps 200] [--jobs 2] [--report-only]

Every method starts from the quickstart's SFT checkpoint (runs/quickstart/sft's step-650, or --policy), trains on the
quickstart task's training rows (1-digit chain sums of 2-3 terms, compact prompts) against its verifier (1 for the
right answer, else 0) and is evaluated on the same 500 held-out questions. Each gets the same number of sampled
completions, B = steps x 64 prompts x 8 = 102,400 at the default 200 steps, at T 0.7 and 4 new tokens:

- grpo_g8: GRPO, 64 prompts x G 8 per step (the quickstart's GRPO settings but for the prompts per step);
- grpo_g2: 2-GRPO, G = 2 with 256 prompts per step (Wu et al. 2025, "It Takes Two: Your GRPO Is Secretly DPO",
  arXiv:2510.00977);
- dpo_offline: `rm pairs` draws the budget from the SFT policy up front: the training split has only 3,371 distinct
  questions, so round(B / 3,371) samples of each (30 at the default budget: 101,130 samples, 1.2% under B), and up
  to 4 (correct, incorrect) pairs of each question that has both; then DPO (beta 0.1) over those pairs, one epoch
  in batches of 32 (pairs with an empty completion, which `po` refuses unless told to skip them, are skipped:
  `skip_invalid=true`, counted in the run's summary);
- simpo_offline: SimPO (beta 2, gamma 1) on the same pairs;
- dpo_semi: semi-online DPO (Lanchantin et al. 2025, arXiv:2506.21495), 64 prompts x 8 per step, the sampling copy
  synced every 10 steps, each prompt's best vs worst completion;
- dpo_online: the same, synced every step (online DPO);
- rft: rejection-sampling fine-tuning (RAFT), 64 prompts x 8 per round, the first correct completion of each prompt
  kept, one SFT step per round.

Learning rates (`--tune`): each method runs the whole budget at seed 0 for each rate of its grid (`LR_GRID`: three
rates around its usual one, and a fourth below them where the lowest of the three won), and the rate with the best
final held-out accuracy is kept (benchmarks/results/po_vs_rl_tuning.json); the reported seeds (1, 2, 3) are not the
tuning seed, though the held-out questions are the same. Each stage is a plain `rewardlab` command (printed; its log beside its run directory), two at
a time (--jobs 2), one thread each, so every run shares the 2-core machine with one other; a finished stage is
skipped and a stopped one resumed.

The report (benchmarks/results/po_vs_rl.json, docs/img/po_vs_rl.png, a printed table): per method, mean and
standard deviation over the seeds of, at the end of the budget, held-out greedy accuracy, pass@8 (T 1, n 8), mean
completion length (tokens), mean per-token entropy (nats) and KL(policy || SFT) per completion (nats, the mean of
sum_t log pi(y_t) - log pi_sft(y_t) over 4 samples at T 1 of each held-out prompt); the held-out accuracy curve
(eval/accuracy every tenth of the budget) against sampled completions and against training wall-clock seconds (the
steps' time, plus the pair generation for the offline methods; evaluation time excluded), and the accuracy each
reaches within the wall-clock time of the fastest method.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stages import ROOT, last_checkpoint, stage  # noqa: E402  (benchmarks/stages.py)

TASK_OPTIONS = ("{min_terms: 2, max_terms: 3, min_digits: 1, max_digits: 1, template: compact, size: 20000, "
                "test_size: 500}")
TASK = ["task.spec=reasoning_gym:chain_sum", f"task.options={TASK_OPTIONS}"]
PROMPTS, K, TEMPERATURE, NEW_TOKENS = 64, 8, 0.7, 4
#: Each method's learning-rate grid (`--tune`: seed 0, the budget, the final held-out accuracy decides).
#: Three rates around each method's usual one, and one more below where the lowest won the first pass.
LR_GRID = {"grpo_g8": ("0.00003", "0.0001", "0.0003", "0.001"), "grpo_g2": ("0.00003", "0.0001", "0.0003", "0.001"),
           "dpo_offline": ("0.000003", "0.00001", "0.00003", "0.0001"),
           "simpo_offline": ("0.000003", "0.00001", "0.00003", "0.0001"),
           "dpo_semi": ("0.00001", "0.00003", "0.0001"), "dpo_online": ("0.00003", "0.0001", "0.0003"),
           "rft": ("0.00003", "0.0001", "0.0003", "0.001")}
TUNING = Path(__file__).resolve().parent / "results" / "po_vs_rl_tuning.json"
OFFLINE_BATCH = 32
#: The task's training split holds 3,371 distinct questions (rm pairs' `questions`): the offline methods' budget is
#: drawn as round(B / 3,371) samples of each, and up to PAIRS_PER_QUESTION (correct, incorrect) pairs kept per question.
TRAIN_QUESTIONS = 3371
PAIRS_PER_QUESTION = 4
EVAL = ["po.eval_n=500", "po.eval_max_new_tokens=4"]
METHODS = ("grpo_g8", "grpo_g2", "dpo_offline", "simpo_offline", "dpo_semi", "dpo_online", "rft")


def method_stages(method: str, seed: int, policy: str, steps: int, out: Path, lr: str
                  ) -> list[tuple[str, list[str]]]:
    """The (name, rewardlab arguments) of `method`'s stages at `seed` and learning rate `lr`, in order: its training
    (after its pairs, for the offline methods), then the held-out evaluation of its last checkpoint (added by the
    caller)."""
    every = max(steps // 10, 1)
    run = f"{method}/lr{lr}/s{seed}"
    common = ["--model", policy, *TASK, "threads=1", f"seed={seed}"]
    if method.startswith("grpo"):
        g = 8 if method == "grpo_g8" else 2
        return [(run, ["train", *common, f"rl.steps={steps}", f"rl.prompts_per_step={PROMPTS * K // g}",
                                       f"rl.group_size={g}", f"rl.lr={lr}",
                                       f"rl.sampling.temperature={TEMPERATURE}",
                                       f"rl.sampling.max_new_tokens={NEW_TOKENS}", f"rl.eval.every={every}",
                                       "rl.eval.n=500", f"save_every={steps}"])]
    if method in ("dpo_offline", "simpo_offline"):
        n = max(2, round(steps * PROMPTS * K / TRAIN_QUESTIONS))  # the budget, over every training question
        pairs = [(f"pairs/s{seed}", ["rm", "pairs", *common, "split=train", f"pairs.n={n}",
                                     f"pairs.pairs_per_question={PAIRS_PER_QUESTION}",
                                     f"pairs.temperature={TEMPERATURE}",
                                     f"pairs.max_new_tokens={NEW_TOKENS}", "pairs.batch_size=256"])]
        loss = ["po.loss_type=dpo"] if method == "dpo_offline" else ["po.loss_type=simpo"]
        n_pairs = _pair_count(out / f"pairs/s{seed}")
        offline_every = max((n_pairs or steps * PROMPTS // 2) // OFFLINE_BATCH // 10, 1)
        return pairs + [(run, ["po", *common, "--pairs", str(out / f"pairs/s{seed}/pairs.jsonl"),
                                                *loss, "skip_invalid=true", f"po.lr={lr}",
                                                f"po.batch_size={OFFLINE_BATCH}",
                                                f"po.eval_every={offline_every}", *EVAL, "save_every=100000"])]
    if method in ("dpo_semi", "dpo_online"):
        sync = 10 if method == "dpo_semi" else 1
        return [(run, ["po", "--online", *common, f"po.steps={steps}", f"po.prompts_per_step={PROMPTS}",
                                       f"po.num_generations={K}", f"po.temperature={TEMPERATURE}",
                                       f"po.max_new_tokens={NEW_TOKENS}", f"po.sync_every={sync}", f"po.lr={lr}",
                                       f"po.eval_every={every}", *EVAL, f"save_every={steps}"])]
    if method == "rft":
        return [(run, ["rft", *common, f"rft.rounds={steps}", f"rft.prompts_per_round={PROMPTS}",
                                  f"rft.n={K}", f"rft.temperature={TEMPERATURE}", f"rft.max_new_tokens={NEW_TOKENS}",
                                  "rft.keep=best", "rft.steps_per_round=1", f"rft.batch_size={PROMPTS}",
                                  f"rft.lr={lr}", f"rft.eval_every={every}", "rft.eval_n=500",
                                  f"save_every={steps}"])]
    raise SystemExit(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def _pair_count(run: Path) -> int | None:
    path = run / "summary.json"
    return json.loads(path.read_text())["pairs"] if path.exists() else None


def eval_stage(train_run: Path, name: str) -> tuple[str, list[str]]:
    """`rewardlab evaluate` of a run's last checkpoint: greedy accuracy and pass@1/pass@8 (T 1, n 8) on the 500
    held-out questions."""
    return (f"{name}/eval", ["evaluate", "--model", str(last_checkpoint(train_run)), *TASK, "threads=1",
                             "eval.n=8", "eval.k=[1,8]", f"eval.max_new_tokens={NEW_TOKENS}"])


def run_method(method: str, seed: int, policy: str, steps: int, out: Path, lr: str, *, evaluate: bool = True) -> None:
    """All stages of one method, seed and learning rate, in order (the offline methods' pairs stage first, then its
    trainer, then with `evaluate` the final evaluation)."""
    first = method_stages(method, seed, policy, steps, out, lr)
    for name, args in first[:-1]:
        stage(out, name, args)
    name, args = method_stages(method, seed, policy, steps, out, lr)[-1]  # the pair count is known now
    train_run = stage(out, name, args)
    if evaluate:
        eval_name, eval_args = eval_stage(train_run, name)
        stage(out, eval_name, eval_args)


# ------------------------------------------------------------------------------------------------- diagnostics
def policy_diagnostics(checkpoint: Path, reference: str, *, samples: int = 4, seed: int = 0) -> dict[str, float]:
    """Mean completion length (tokens), mean per-token entropy (nats) and KL(policy || reference) per completion
    (nats, k1: the mean over samples of sum_t log pi(y_t) - log pi_ref(y_t)), over `samples` completions at T 1 of
    each of the 500 held-out questions, drawn from fixed random streams."""
    import torch

    from rewardlab.policy import load_policy
    from rewardlab.tasks import load as load_task

    task = load_task("reasoning_gym:chain_sum", min_terms=2, max_terms=3, min_digits=1, max_digits=1,
                     template="compact", size=20000, test_size=500)
    policy = load_policy(str(checkpoint), seed=seed)
    ref = load_policy(reference, seed=seed)
    rows = list(task.test)
    streams = [(seed, 9_999, k, 0) for k in range(len(rows) * samples)]
    rollouts = policy.generate([r["prompt"] for r in rows], n=samples, temperature=1.0, max_new_tokens=NEW_TOKENS,
                               rows=rows, streams=streams)
    lengths, entropies, kls, tokens = [], [], [], 0
    with torch.no_grad():
        for a in range(0, len(rollouts), 256):
            part = rollouts[a:a + 256]
            batch = policy.collate([r.prompt_ids for r in part], [r.completion_ids for r in part])
            logp, ent = policy.token_logprobs(batch, with_entropy=True)
            ref_logp, _ = ref.token_logprobs(ref.collate([r.prompt_ids for r in part],
                                                         [r.completion_ids for r in part]))
            kls += (logp - ref_logp).sum(-1).tolist()
            entropies.append(float(ent.sum()))
            tokens += int(batch.mask.sum())
            lengths += [len(r.completion_ids) for r in part]
    return {"completion_length": statistics.fmean(lengths), "entropy": sum(entropies) / max(tokens, 1),
            "kl_to_sft": statistics.fmean(kls)}


# ------------------------------------------------------------------------------------------------- the report
def curve(run: Path, per_step_samples: int, offset_s: float = 0.0, offset_samples: int = 0) -> list[dict[str, float]]:
    """A run's held-out accuracy points: {step, samples (sampled completions so far), clock_s (training seconds so
    far: the steps' time, plus `offset_s`), accuracy}. A step's time is time/step_s, or (rft) time/sample_s +
    time/train_s."""
    points, clock = [], offset_s
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        clock += m["time/step_s"] if "time/step_s" in m else m.get("time/sample_s", 0.0) + m.get("time/train_s", 0.0)
        if "eval/accuracy" in m:
            points.append({"step": m["step"], "samples": offset_samples + m["step"] * per_step_samples,
                           "clock_s": clock, "accuracy": m["eval/accuracy"]})
    return points


def read_run(out: Path, method: str, seed: int, policy: str, steps: int, lr: str) -> dict[str, Any]:
    """One method and seed's figures (the final evaluation, the diagnostics, the accuracy curve) and commands."""
    stages = method_stages(method, seed, policy, steps, out, lr)
    train = out / stages[-1][0]
    ev = json.loads((out / f"{stages[-1][0]}/eval" / "summary.json").read_text())
    offset_s = offset_samples = 0
    per_step = PROMPTS * K
    if method.endswith("_offline"):
        pairs = json.loads((out / f"pairs/s{seed}" / "summary.json").read_text())
        offset_s, offset_samples, per_step = pairs["wall_s"], pairs["samples"], 0
    diag_file = train / "diagnostics.json"
    if not diag_file.exists():
        diag_file.write_text(json.dumps(policy_diagnostics(last_checkpoint(train), policy, seed=seed)))
    return {"accuracy": ev["accuracy"], "pass@8": ev["pass@8"], **json.loads(diag_file.read_text()),
            "curve": curve(train, per_step, offset_s, offset_samples),
            "commands": [f"rewardlab {' '.join(args)} --out {out / name}" for name, args in stages]}


def at_clock(points: Sequence[Mapping[str, float]], seconds: float) -> float | None:
    """The accuracy of the last evaluation within `seconds` of training time (None: none that early)."""
    done = [p for p in points if p["clock_s"] <= seconds + 1e-9]
    return done[-1]["accuracy"] if done else None


def aggregate(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per method: mean and sd over seeds of each final figure; the mean accuracy curve; the accuracy within the
    fastest method's training time (`wall_budget_s`, the smallest of the methods' mean total clocks)."""
    totals = {m: statistics.fmean(r["curve"][-1]["clock_s"] for r in rs) for m, rs in runs.items()}
    budget = min(totals.values())
    out: dict[str, Any] = {"wall_budget_s": budget, "methods": {}}
    for m, rs in runs.items():
        figs = {}
        for key in ("accuracy", "pass@8", "completion_length", "entropy", "kl_to_sft"):
            vals = [r[key] for r in rs]
            figs[key] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0}
        reached = [at_clock(r["curve"], budget) for r in rs]
        figs["accuracy_at_wall_budget"] = (statistics.fmean(v for v in reached if v is not None)
                                           if all(v is not None for v in reached) else None)
        figs["train_clock_s"] = totals[m]
        figs["curve"] = [{"samples": p["samples"], "clock_s": statistics.fmean(r["curve"][i]["clock_s"] for r in rs),
                          "accuracy": statistics.fmean(r["curve"][i]["accuracy"] for r in rs)}
                         for i, p in enumerate(rs[0]["curve"]) if all(i < len(r["curve"]) for r in rs)]
        figs["commands"] = [r["commands"] for r in rs]
        out["methods"][m] = figs
    return out


def table(summary: Mapping[str, Any]) -> str:
    head = (f"| method | greedy accuracy | pass@8 | length (tokens) | entropy (nats/token) | KL to SFT (nats) | "
            f"accuracy within {summary['wall_budget_s']:.0f} s | training time (s) |\n"
            "|---|---|---|---|---|---|---|---|\n")
    rows = []
    for m, f in summary["methods"].items():
        def pm(key: str, scale: float = 1.0, digits: int = 1) -> str:
            return f"{f[key]['mean'] * scale:.{digits}f} ± {f[key]['sd'] * scale:.{digits}f}"

        at = f["accuracy_at_wall_budget"]
        rows.append(f"| {m} | {pm('accuracy', 100)}% | {pm('pass@8', 100)}% | {pm('completion_length', 1, 2)} | "
                    f"{pm('entropy', 1, 3)} | {pm('kl_to_sft', 1, 3)} | "
                    f"{'-' if at is None else f'{at * 100:.1f}%'} | {f['train_clock_s']:.0f} |")
    return head + "\n".join(rows) + "\n"


def plot(summary: Mapping[str, Any], start: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for m, f in summary["methods"].items():
        xs = [p["samples"] for p in f["curve"]]
        if len(set(xs)) == 1:  # an offline method draws every sample before it trains: its end point only
            axes[0].plot(xs[-1:], [f["curve"][-1]["accuracy"]], marker="s", ms=6, ls="none", label=f"{m} (end)")
        else:
            axes[0].plot([0] + xs, [start] + [p["accuracy"] for p in f["curve"]], marker="o", ms=3, label=m)
        axes[1].plot([0] + [p["clock_s"] for p in f["curve"]], [start] + [p["accuracy"] for p in f["curve"]],
                     marker="o", ms=3, label=m)
    axes[0].set_xlabel("sampled completions")
    axes[1].set_xlabel("training wall-clock seconds (one thread; evaluation excluded)")
    for ax in axes:
        ax.set_ylabel("held-out greedy accuracy")
        ax.grid(alpha=0.3)
    axes[1].axvline(summary["wall_budget_s"], color="grey", ls=":", lw=1)
    axes[0].legend(fontsize=8)
    fig.suptitle("RL or preference optimization: quickstart task from its SFT checkpoint (mean of seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def make_pairs(out: Path, methods: Sequence[str], seeds: Sequence[int], policy: str, steps: int, jobs: int) -> None:
    """The offline methods of a seed share its pairs: made first, before those methods run."""
    offline = [m for m in methods if m.endswith("_offline")]
    if offline:
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda s: stage(out, *method_stages(offline[0], s, policy, steps, out, "x")[0]), seeds))


def tune(out: Path, methods: Sequence[str], policy: str, steps: int, jobs: int) -> dict[str, str]:
    """Each method at each learning rate of its grid (`LR_GRID`), seed 0, the whole budget; the learning rate whose
    last held-out evaluation (eval/accuracy on the 500 questions at the budget's end) is highest wins. Writes
    benchmarks/results/po_vs_rl_tuning.json and returns {method: chosen learning rate}."""
    make_pairs(out, methods, [0], policy, steps, jobs)
    grid = [(m, lr) for m in methods for lr in LR_GRID[m]]
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda job: run_method(job[0], 0, policy, steps, out, job[1], evaluate=False), grid))
    found: dict[str, dict[str, float]] = {}
    for m, lr in grid:
        train = out / method_stages(m, 0, policy, steps, out, lr)[-1][0]
        points = [json.loads(line) for line in (train / "metrics.jsonl").read_text().splitlines()]
        found.setdefault(m, {})[lr] = [p["eval/accuracy"] for p in points if "eval/accuracy" in p][-1]
    chosen = {m: max(accs, key=accs.get) for m, accs in found.items()}
    TUNING.parent.mkdir(parents=True, exist_ok=True)
    TUNING.write_text(json.dumps({"seed": 0, "final_eval_accuracy": found, "chosen": chosen}, indent=1) + "\n")
    for m, accs in found.items():
        print(f"{m}: " + ", ".join(f"lr {lr}: {a * 100:.1f}%" for lr, a in accs.items()) + f" -> {chosen[m]}")
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="runs/quickstart/sft/checkpoints/step-650")
    ap.add_argument("--out", default="runs/po_vs_rl")
    ap.add_argument("--seeds", default="1,2,3", help="the reported seeds (seed 0 tunes the learning rates)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=200, help="steps (rounds) of each online method: the budget")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--tune", action="store_true", help="(re)choose the learning rates on seed 0 first")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    policy = str((ROOT / args.policy).resolve())
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    if args.tune and not args.report_only:
        tune(out, methods, policy, args.steps, args.jobs)
    if not TUNING.exists():
        sys.exit(f"{TUNING}: no learning rates chosen yet; run with --tune")
    lrs = json.loads(TUNING.read_text())["chosen"]
    if not args.report_only:
        make_pairs(out, methods, seeds, policy, args.steps, args.jobs)
        jobs = [(m, s) for s in seeds for m in methods]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: run_method(job[0], job[1], policy, args.steps, out, lrs[job[0]]), jobs))
        stage(out, "sft/eval", ["evaluate", "--model", policy, *TASK, "threads=1", "eval.n=8", "eval.k=[1,8]",
                                f"eval.max_new_tokens={NEW_TOKENS}"])
    runs = {m: [read_run(out, m, s, policy, args.steps, lrs[m]) for s in seeds] for m in methods}
    summary = aggregate(runs)
    start = json.loads((out / "sft/eval/summary.json").read_text())
    summary["sft"] = {"accuracy": start["accuracy"], "pass@8": start["pass@8"]}
    summary["budget_samples"] = args.steps * PROMPTS * K
    summary["seeds"] = seeds
    summary["learning_rates"] = {m: lrs[m] for m in methods}
    results = ROOT / "benchmarks" / "results" / "po_vs_rl.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, start["accuracy"], ROOT / "docs" / "img" / "po_vs_rl.png")
    print(f"SFT start: greedy {start['accuracy'] * 100:.1f}%, pass@8 {start['pass@8'] * 100:.1f}%; budget "
          f"{summary['budget_samples']:,} sampled completions per method")
    print(table(summary))


if __name__ == "__main__":
    main()
