"""`rewardlab rm eval`: evaluate any scorer — a registered reward, a Bradley–Terry model, a PRM, a judge — on
preference pairs, best-of-k rows and step-labelled solutions, with the length-bias and master-key probes.

Writes report.json, a table on stdout, and plots (score histograms of chosen vs rejected; accuracy per subset).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from rewardlab.config import dump_config
from rewardlab.evaluation.probes import MASTER_KEYS, length_bias, master_key_rate
from rewardlab.evaluation.reward_models import (
    best_of_k_accuracy,
    choose_threshold,
    first_error_f1,
    outcome_step_scores,
    pairwise_accuracy,
    per_subset,
    predict_first_error,
)
from rewardlab.modeldir import check_model_dir
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.rewards.model import ProcessRewardModel, RewardModel, is_process_model
from rewardlab.rm.data import BestOfK, Pair, StepRow, json_safe, load_eval_rows, load_step_rows, make_rollout
from rewardlab.runs import RunDir, atomic_write_text
from rewardlab.types import RewardOutput


def build_scorer(model_path: str | None, specs: Any, device: str = "cpu"):
    """The scorer: a checkpoint directory (a PRM when its config has a `step_tag`, else an outcome reward model),
    or reward specs as for `build_reward` (any registered reward, composed). Returns (Reward, description).
    Raises ValueError: a model path that is not an existing model directory (one line naming model.path)."""
    if model_path:
        check_model_dir(model_path, "model.path")  # named as the verb's key, not as the reward's `path` option
        if is_process_model(model_path):
            return ProcessRewardModel(model_path, device=device), f"process_reward_model:{model_path}"
        return RewardModel(model_path, device=device), f"reward_model:{model_path}"
    if specs is None:
        raise ValueError("rm eval: give a model directory (--model / model.path) or reward specs (scorer=...)")
    return build_reward(specs), json.dumps(specs)


def _scores(outputs: Sequence[RewardOutput]) -> list[float]:
    """Scores with errors as NaN (a NaN never wins a comparison)."""
    return [math.nan if o.error is not None else float(o.score) for o in outputs]


def _score(scorer, rollouts, batch: int) -> list[RewardOutput]:
    out: list[RewardOutput] = []
    for s in range(0, len(rollouts), batch):
        out.extend(scorer(rollouts[s : s + batch]))
    return out


def evaluate_pairs(scorer, pairs: Sequence[Pair], *, batch: int = 64, master_keys: Sequence[str] = MASTER_KEYS
                   ) -> dict[str, Any]:
    """Pairwise accuracy (overall, per subset, count-weighted mean), length bias and master keys of a scorer."""
    ch = _score(scorer, [make_rollout(p.prompt, p.chosen, p.row) for p in pairs], batch)
    rj = _score(scorer, [make_rollout(p.prompt, p.rejected, p.row) for p in pairs], batch)
    cs, rs = _scores(ch), _scores(rj)
    wins = [float(c > r) for c, r in zip(cs, rs)]
    res: dict[str, Any] = {
        "n": len(pairs),
        "accuracy": pairwise_accuracy(cs, rs),
        "ties": sum(c == r for c, r in zip(cs, rs)),
        "errors": sum(o.error is not None for o in ch + rj),
        "per_subset": per_subset(wins, [p.subset for p in pairs]),
        "length_bias": length_bias([p.chosen for p in pairs], [p.rejected for p in pairs], cs, rs),
        "chosen_scores": cs,
        "rejected_scores": rs,
    }
    if master_keys:
        first: dict[str, int] = {}
        for i, p in enumerate(pairs):
            first.setdefault(p.prompt, i)
        idx = list(first.values())
        keys = {}
        for key in master_keys:
            outs = _score(scorer, [make_rollout(pairs[i].prompt, key, pairs[i].row) for i in idx], batch)
            keys[key] = _scores(outs)
        res["master_keys"] = master_key_rate([cs[i] for i in idx], keys)
    return res


def evaluate_best_of_k(scorer, rows: Sequence[BestOfK], *, batch: int = 64) -> dict[str, Any]:
    """Best-of-k accuracy (ties shared, RewardBench 2) overall and per subset; random = mean of 1/k."""
    flat = [(i, make_rollout(r.prompt, text, r.row)) for i, r in enumerate(rows) for text in [r.chosen, *r.rejected]]
    scores = _scores(_score(scorer, [x[1] for x in flat], batch))
    per_row: list[list[float]] = [[] for _ in rows]
    for (i, _), s in zip(flat, scores):
        per_row[i].append(s)
    values = [best_of_k_accuracy([s]) for s in per_row]
    return {"n": len(rows), "accuracy": best_of_k_accuracy(per_row),
            "random": sum(1.0 / (1 + len(r.rejected)) for r in rows) / len(rows),
            "per_subset": per_subset(values, [r.subset for r in rows])}


def step_scores_of(scorer, rows: Sequence[StepRow], *, separator: str = "\n", batch: int = 64
                   ) -> tuple[list[list[float]], str, int]:
    """Step scores of solutions: the scorer's `step_scores` when it gives one per step (a process scorer), else its
    score on the last step (an outcome scorer, `outcome_step_scores`). Errored outputs score +inf everywhere (so
    they predict "no error"). Returns (scores, "process" | "outcome", errors)."""
    outs = _score(scorer, [make_rollout(r.prompt, separator.join(r.steps), r.row, step_text=r.steps) for r in rows],
                  batch)
    scores, process, errors = [], 0, 0
    for r, o in zip(rows, outs):
        if o.error is not None:
            errors += 1
            scores.append([math.inf] * len(r.steps))
        elif o.step_scores is not None and len(o.step_scores) == len(r.steps):
            process += 1
            scores.append([float(s) for s in o.step_scores])
        else:
            scores.append(outcome_step_scores(o.score, len(r.steps)))
    return scores, "process" if process else "outcome", errors


def evaluate_first_error(scorer, rows: Sequence[StepRow], dev_rows: Sequence[StepRow], *, separator: str = "\n",
                         threshold: float | None = None, batch: int = 64) -> dict[str, Any]:
    """ProcessBench first-error F1 with the threshold chosen on `dev_rows` (or the given `threshold`)."""
    scores, kind, errors = step_scores_of(scorer, rows, separator=separator, batch=batch)
    res: dict[str, Any] = {"n": len(rows), "scorer_kind": kind, "errors": errors}
    if threshold is None:
        dev_scores, _, _ = step_scores_of(scorer, dev_rows, separator=separator, batch=batch)
        threshold, dev = choose_threshold(dev_scores, [r.first_error for r in dev_rows])
        res["dev"] = {"n": len(dev_rows), **dev}
        res["threshold_from"] = "dev split"
    else:
        res["threshold_from"] = "given"
    res["threshold"] = threshold
    preds = [predict_first_error(s, threshold) for s in scores]
    labels = [r.first_error for r in rows]
    res.update(first_error_f1(preds, labels))
    subsets: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        subsets.setdefault(r.subset, []).append(i)
    res["per_subset"] = {k: first_error_f1([preds[i] for i in v], [labels[i] for i in v]) for k, v in subsets.items()}
    finite = [(k, len(subsets[k]), v["f1"]) for k, v in res["per_subset"].items() if not math.isnan(v["f1"])]
    res["f1_weighted_mean"] = sum(n * f for _, n, f in finite) / sum(n for _, n, _ in finite) if finite else math.nan
    return res


def _plots(run: RunDir, report: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    (run.path / "plots").mkdir(exist_ok=True)
    pairs = report.get("pairs")
    if pairs:
        cs = [x for x in pairs["chosen_scores"] if math.isfinite(x)]
        rs = [x for x in pairs["rejected_scores"] if math.isfinite(x)]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        bins = 40 if len(set(cs + rs)) > 2 else 5
        ax.hist([cs, rs], bins=bins, label=["chosen", "rejected"], alpha=0.8)
        ax.set_xlabel("score")
        ax.set_ylabel("responses")
        ax.set_title(f"pairwise accuracy {pairs['accuracy']:.1%} (n={pairs['n']})")
        ax.legend()
        fig.tight_layout()
        out = run.path / "plots" / "score_hist.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        made.append(str(out))
    bars = []
    for section, key in (("pairs", "pairwise"), ("best_of_k", "best-of-k")):
        if report.get(section):
            bars += [(f"{key}: {k}", v["mean"]) for k, v in report[section]["per_subset"]["subsets"].items()]
    if report.get("first_error"):
        bars += [(f"first-error F1: {k}", v["f1"]) for k, v in report["first_error"]["per_subset"].items()]
    if bars:
        fig, ax = plt.subplots(figsize=(6, 0.5 * len(bars) + 1.2))
        ax.barh([b[0] for b in bars], [0.0 if math.isnan(b[1]) else b[1] for b in bars])
        ax.set_xlim(0, 1)
        ax.set_xlabel("accuracy / F1")
        ax.invert_yaxis()
        fig.tight_layout()
        out = run.path / "plots" / "subset_accuracy.png"
        fig.savefig(out, dpi=100)
        plt.close(fig)
        made.append(str(out))
    return made


def _table(report: dict[str, Any]) -> Table:
    table = Table(title=f"rm eval: {report['scorer']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("n", justify="right")

    def pct(x: float) -> str:
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"

    if report.get("pairs"):
        p = report["pairs"]
        table.add_row("pairwise accuracy (ties wrong)", pct(p["accuracy"]), str(p["n"]))
        for k, v in p["per_subset"]["subsets"].items():
            table.add_row(f"  subset {k}", pct(v["mean"]), str(v["n"]))
        lb = p["length_bias"]
        table.add_row("length rule: longer wins", pct(lb["longer_wins_accuracy"]), str(p["n"]))
        table.add_row("accuracy where rejected is longer", pct(lb["accuracy_rejected_longer"]),
                      str(lb["n_rejected_longer"]))
        if "master_keys" in p:
            table.add_row("master-key rate (>= reference)", pct(p["master_keys"]["rate"]),
                          str(p["master_keys"]["n_prompts"]))
    if report.get("best_of_k"):
        b = report["best_of_k"]
        table.add_row(f"best-of-k accuracy (random {b['random']:.1%})", pct(b["accuracy"]), str(b["n"]))
    if report.get("first_error"):
        f = report["first_error"]
        table.add_row(f"first-error F1 ({f['scorer_kind']}, threshold {f['threshold']:.4g})", pct(f["f1"]), str(f["n"]))
        table.add_row("  accuracy on erroneous", pct(f["error_acc"]), str(f["n_error"]))
        table.add_row("  accuracy on all-correct", pct(f["correct_acc"]), str(f["n_correct"]))
    return table


def run_rm_eval(cfg, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab rm eval`: score `cfg.data` with the scorer and write report.json, plots and a table.

    The run directory `cfg.out` is opened with `RunDir.start` once the data and scorer load: one that already holds
    a run is refused unless `overwrite` (deleted first) or `resume`; a resume reruns the evaluation whole (it is
    deterministic: same settings, same report).

    Returns:
        the report: {"scorer", "data", "pairs": {...}, "best_of_k": {...}, "first_error": {...}, "wall_s"} (a
        section is None when the data has no rows of its kind; per-response scores are kept in report.json only).
    Raises:
        ValueError / FileNotFoundError: bad data (FILE:LINE), no scorer, a bad model directory or reward spec;
            RunDirError (a ValueError): `cfg.out` holds a run and neither flag is given, is in use, or `resume` with
            other settings.
    """
    data = load_eval_rows(cfg.data)
    scorer, name = build_scorer(cfg.model.path, cfg.scorer, cfg.model.device)
    with RunDir.start(cfg.out, resume=resume, overwrite=overwrite) as run:
        run.record_config(dump_config(cfg), resume=resume)
        return _rm_eval(cfg, run, data, scorer, name, show_progress)


def _rm_eval(cfg, run: RunDir, data, scorer, name: str, show_progress: bool) -> dict[str, Any]:
    e = cfg.eval
    t0 = time.perf_counter()
    report: dict[str, Any] = {"scorer": name, "data": cfg.data, "pairs": None, "best_of_k": None, "first_error": None}
    sections = [k for k in ("pair", "best_of_k", "steps") if data[k]]
    with stage("RM eval", len(sections), enabled=show_progress) as bar:
        if data["pair"]:
            report["pairs"] = evaluate_pairs(scorer, data["pair"], batch=e.batch_size,
                                             master_keys=MASTER_KEYS if e.master_keys else ())
            bar.advance(1)
        if data["best_of_k"]:
            report["best_of_k"] = evaluate_best_of_k(scorer, data["best_of_k"], batch=e.batch_size)
            bar.advance(1)
        if data["steps"]:
            rows, dev = list(data["steps"]), []
            if e.threshold is None:
                if cfg.dev_data:
                    dev = load_step_rows(cfg.dev_data)
                else:
                    random.Random(cfg.seed).shuffle(rows)
                    n_dev = max(1, round(e.dev_fraction * len(rows)))
                    if n_dev >= len(rows):
                        raise ValueError(f"eval.dev_fraction={e.dev_fraction} leaves no test rows of {len(rows)}")
                    dev, rows = rows[:n_dev], rows[n_dev:]
            report["first_error"] = evaluate_first_error(scorer, rows, dev, separator=e.separator,
                                                         threshold=e.threshold, batch=e.batch_size)
            bar.advance(1)
    report["wall_s"] = time.perf_counter() - t0
    report["plots"] = _plots(run, report)
    atomic_write_text(run.path / "report.json", json.dumps(json_safe(report), indent=2, default=str) + "\n")
    summary = {k: v for k, v in report.items() if k != "pairs"}
    if report["pairs"]:
        summary["pairs"] = {k: v for k, v in report["pairs"].items() if not k.endswith("_scores")}
    run.write_summary(json_safe(summary))
    Console().print(_table(report))
    Console().print(f"report: {run.path / 'report.json'}")
    return summary
