"""`rewardlab rm train | eval | pairs`: Bradley–Terry reward models, the reward-model evaluation suite, and
preference pairs (`rewardlab.rm`, `rewardlab.evaluation.reward_models`)."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rewardlab.commands.common import announce_task, check_prompts, load_inputs, load_model, open_run
from rewardlab.config import RmEvalConfig, RmPairsConfig, RmTrainConfig
from rewardlab.evaluation.probes import MASTER_KEYS, length_bias
from rewardlab.policy.settings import SamplingSettings
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.rm.backbone import load_backbone
from rewardlab.rm.bradley_terry import bradley_terry_loss, model_pair_stats, pair_rewards, pair_stats
from rewardlab.rm.data import json_safe, load_eval_rows, load_pairs, load_step_rows
from rewardlab.rm.evaluate import build_scorer, evaluate_best_of_k, evaluate_first_error, evaluate_pairs
from rewardlab.rm.fit import FitCheckpoints, FitObjective, fit, open_fit_run
from rewardlab.rm.pairs import PairSettings, check_code_rows, code_row_gap, generate_pairs, mutant_pairs
from rewardlab.threads import apply_threads
from rewardlab.runs import RunDir, RunMode, atomic_write_text
from rewardlab.tasks import check_task_for_policy


def train(cfg: RmTrainConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab rm train`: fit a Bradley–Terry reward model on `cfg.data` pairs; evaluate on `cfg.eval_data`.

    Writes the run directory `cfg.out`: config.yaml, metrics.jsonl (`train/loss`, `train/accuracy`,
    `train/margin_mean`, `train/reward_mean`, `train/reward_std`, `lr`, `time/step_s`, and `eval/*` every
    `train.eval_every` steps and at the end), checkpoints/step-K every `cfg.save_every` steps and at the end (HF
    format, loads with `reward_model`, plus trainer_state.pt; the `cfg.keep_checkpoints` most recent kept),
    plots/rm_train.png and summary.json. The directory is opened with `RunDir.start` once the data and backbone
    load; "resume" continues from its newest valid checkpoint and logs what the uninterrupted run logs (see
    `rm.fit.fit`), "overwrite" replaces the run there.

    Returns:
        the summary: steps, pairs, wall seconds, final train and eval metrics, `final_checkpoint`, `resumed_from`.
    Raises:
        ValueError / FileNotFoundError: bad data files (naming FILE:LINE), an unknown backbone; `RunDirError`: the
            directory holds a run and `mode` is "new", is in use, or has nothing to resume.
    """
    t = cfg.train
    train_pairs = subsample_pairs(load_pairs(cfg.data), t.subsample, cfg.seed)
    eval_pairs = load_pairs(cfg.eval_data) if cfg.eval_data else []
    apply_threads(cfg.threads)
    model, tokenizer = load_backbone(cfg.model.path, "sequence", device=cfg.model.device,
                                     tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)
    # Opened only once the data and backbone load.
    with open_fit_run(cfg, mode=mode) as (run, start_step, checkpoint, rng):

        def evaluate() -> dict[str, float]:
            res = model_pair_stats(model, tokenizer, eval_pairs, batch_size=t.batch_size, max_length=t.max_length)
            return {f"eval/{k}": v for k, v in res.items()}

        def batch_loss(idx: Sequence[int]) -> tuple[torch.Tensor, tuple[list[float], list[float]]]:
            batch = [train_pairs[i] for i in idx]
            chosen, rejected = pair_rewards(model, tokenizer, batch, t.max_length)
            margin = torch.tensor([p.margin for p in batch], device=chosen.device) if t.use_margin else None
            return (bradley_terry_loss(chosen, rejected, margin, t.center_coef),
                    (chosen.detach().tolist(), rejected.detach().tolist()))

        def batch_metrics(records: list[tuple[list[float], list[float]]]) -> dict[str, float]:
            stats = pair_stats([c for cs, _ in records for c in cs], [r for _, rs in records for r in rs])
            return {f"train/{k}": v for k, v in stats.items()}

        wall0 = time.perf_counter()
        objective = FitObjective(batch_loss, batch_metrics, progress_key="train/accuracy",
                                 evaluate=evaluate if eval_pairs else None)
        checkpoints = FitCheckpoints(run, lambda d: (model.save_pretrained(d), tokenizer.save_pretrained(d)),
                                     save_every=cfg.save_every, keep=cfg.keep_checkpoints, resume_from=checkpoint)
        step, last, last_eval, final = fit(model, t, len(train_pairs), objective, checkpoints, rng=rng,
                                           name="RM train", show_progress=show_progress)
        run.plot(["train/loss", "train/accuracy", "eval/accuracy"], "rm_train.png")
        summary = {"stage": "rm_train", "loss": "bradley_terry", "backbone": cfg.model.path, "steps": step,
                   "train_pairs": len(train_pairs), "subsample": t.subsample, "eval_pairs": len(eval_pairs),
                   "wall_s": time.perf_counter() - wall0,
                   "final_train": {k: v for k, v in last.items() if not k.startswith("eval/")},
                   "final_eval": last_eval, "final_checkpoint": str(final),
                   "resumed_from": start_step if mode == "resume" else None}
        run.write_summary(summary)
    return summary


def subsample_pairs(pairs: list[Any], subsample: float | None, seed: int) -> list[Any]:
    """`pairs`, or a subset of them drawn with `random.Random(seed)` in file order: `subsample` a fraction in (0, 1)
    (round(f * n) pairs, at least 1) or a count (a whole number >= 1).

    Raises:
        ValueError: a count that is not whole or exceeds the pairs, naming train.subsample.
    """
    if subsample is None:
        return pairs
    n = len(pairs)
    if subsample < 1:
        k = max(1, round(subsample * n))
    elif float(subsample).is_integer() and subsample <= n:
        k = int(subsample)
    else:
        raise ValueError(f"train.subsample: a fraction in (0, 1) or a whole count of at most {n} pairs, got "
                         f"{subsample:g}")
    return [pairs[i] for i in sorted(random.Random(seed).sample(range(n), k))]


def _plots(run: RunDir, report: dict[str, Any]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    (run.path / "plots").mkdir(exist_ok=True)

    def save(fig, name: str) -> str:
        fig.tight_layout()
        out = run.path / "plots" / name
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return str(out)

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
        made.append(save(fig, "score_hist.png"))
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
        made.append(save(fig, "subset_accuracy.png"))
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


def evaluate(cfg: RmEvalConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab rm eval`: score `cfg.data` with the scorer and write report.json, plots and a table.

    The run directory `cfg.out` is opened with `RunDir.start` once the data and scorer load: one that already holds
    a run is refused unless "overwrite" (deleted first) or "resume"; a resume reruns the evaluation whole (it is
    deterministic: same settings, same report).

    Returns:
        the report: {"scorer", "data", "pairs": {...}, "best_of_k": {...}, "first_error": {...}, "wall_s"} (a
        section is None when the data has no rows of its kind; per-response scores are kept in report.json only).
    Raises:
        ValueError / FileNotFoundError: bad data (FILE:LINE), no scorer, a bad model directory or reward spec;
            RunDirError (a ValueError): `cfg.out` holds a run and `mode` is "new", is in use, or "resume" with
            other settings.
    """
    apply_threads(cfg.threads)
    data = load_eval_rows(cfg.data)
    scorer, name = build_scorer(cfg.model.path, cfg.scorer, cfg.model.device)
    with open_run(cfg, mode=mode) as run:
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
    if e.hacks:
        report["hacks"] = _hack_probes(cfg)
    report["wall_s"] = time.perf_counter() - t0
    report["plots"] = _plots(run, report)
    atomic_write_text(run.path / "report.json", json.dumps(json_safe(report), indent=2, default=str) + "\n")
    summary = {k: v for k, v in report.items() if k != "pairs"}
    if report["pairs"]:
        summary["pairs"] = {k: v for k, v in report["pairs"].items() if not k.endswith("_scores")}
    run.write_summary(json_safe(summary))
    Console().print(_table(report))
    if e.hacks:
        from rewardlab.evaluation.hacks import ProbeResult, probe_table

        results = [ProbeResult(**r) for r in report["hacks"]]
        print(probe_table(results) if results else "hack probes: none apply to this scorer")
    Console().print(f"report: {run.path / 'report.json'}")
    return summary


def _hack_probes(cfg: RmEvalConfig) -> list[dict[str, Any]]:
    """The hack probe suite (`rewardlab.evaluation.hacks.run_probes`) against each of `cfg.scorer`'s top-level
    reward specs that has probes; [] for a model.path scorer or specs without probes."""
    from dataclasses import asdict

    from rewardlab.evaluation.hacks import probes_for, run_probes

    if cfg.model.path or cfg.scorer is None:
        return []
    specs = cfg.scorer if isinstance(cfg.scorer, list) else [cfg.scorer]
    leaves = [s for s in specs if isinstance(s, str) or (isinstance(s, dict) and "name" in s)]
    return [asdict(r) for spec in leaves if probes_for(spec if isinstance(spec, str) else str(spec["name"]))
            for r in run_probes(spec)]


def pairs(cfg: RmPairsConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab rm pairs`: preference pairs for `cfg.split` questions of `cfg.task`, from one of two sources
    (`cfg.pairs.source`):

    - "policy" (default): `cfg.model`'s samples judged by the task's verifier, a correct vs an incorrect completion
      of the same question (`generate_pairs`).
    - "mutants": no model; a row's canonical solution vs sandbox-confirmed failing mutants of it (`mutant_pairs`),
      for tasks whose rows carry a canonical solution and tests, e.g. `humaneval`.

    Writes `cfg.out`: config.yaml, pairs.jsonl (RewardBench format with the task `row`; written atomically at the
    end), summary.json (source, questions, pairs, the source's own counts - samples, sample accuracy and questions
    with both outcomes; or questions with no failing mutant and sandbox counts -, mean lengths in characters of
    chosen and rejected, the accuracy of the rule "longer wins" on these pairs (a tie in length is wrong) with the
    counts of pairs whose chosen / rejected response is strictly longer, and wall_s in seconds).

    The run directory is opened with `RunDir.start` once the task and model load: one that already holds a run is
    refused unless "overwrite" (deleted first) or "resume"; a resume reruns the generation whole (seeded: same
    settings, same pairs).

    Raises:
        ValueError: what `tasks.load` and `load_policy` raise; with source "policy", a prompt that does not fit the
            model's context window with pairs.max_new_tokens (named by its FILE:LINE, `check_prompts`); with source
            "mutants", a row without a canonical solution or tests; no pairs made (the policy is always or never
            right; no mutant fails);
            RunDirError (a ValueError): `cfg.out` holds a run and `mode` is "new", is in use, or "resume"
            with other settings.
    """
    prepared = _prepare_pairs(cfg)
    announce_task(prepared[0], show_progress)
    with open_run(cfg, mode=mode) as run:
        return _rm_pairs(cfg, run, show_progress, *prepared)


def _prepare_pairs(cfg: RmPairsConfig):
    p = cfg.pairs
    task, _ = load_inputs(cfg, model=False)
    rows = task.split(cfg.split)[: p.limit]
    policy = verifier = None
    if p.source == "mutants":
        try:
            check_code_rows(rows)
        except ValueError as exc:
            raise ValueError(f"rm pairs: pairs.source=mutants needs a canonical solution and tests in every row: "
                             f"task {cfg.task.spec}, {cfg.split} {exc}") from None
    else:
        torch.manual_seed(cfg.seed)
        verifier = build_reward(task.reward)
        policy = load_model(cfg)
        check_task_for_policy(task, policy)
        check_prompts(task, policy, max_new_tokens=p.max_new_tokens, key="pairs.max_new_tokens")
    return task, rows, policy, verifier


def _rm_pairs(cfg: RmPairsConfig, run: RunDir, show_progress: bool, task, rows, policy, verifier) -> dict[str, Any]:
    p = cfg.pairs
    t0 = time.perf_counter()
    with stage("RM pairs", len(rows), enabled=show_progress) as bar:
        if p.source == "mutants":
            pairs, stats = mutant_pairs(
                rows, pairs_per_question=p.pairs_per_question, subset=task.name, batch_size=p.batch_size,
                max_pairs=p.max_pairs, seed=cfg.seed, on_batch=lambda n, fields: bar.advance(n, **fields),
            )
        else:
            sampling = SamplingSettings(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p)
            settings = PairSettings(pairs_per_question=p.pairs_per_question, subset=task.name,
                                    batch_size=p.batch_size, max_pairs=p.max_pairs, seed=cfg.seed)
            pairs, stats = generate_pairs(policy, rows, verifier, sampling, n=p.n, settings=settings,
                                          on_batch=lambda n, fields: bar.advance(n, **fields))
    if not pairs and p.source == "mutants":
        raise ValueError(f"rm pairs: no pairs from {stats['questions']} questions ({stats['canonical_failures']} "
                         f"canonical solutions failed their tests, {stats['questions_no_failing_mutant']} had no "
                         "failing mutant)")
    if not pairs:
        hint = ""
        if rows and not code_row_gap(rows[0]):
            hint = "; for canonical-vs-mutant pairs with no policy, use --source mutants (pairs.source=mutants)"
        raise ValueError(f"rm pairs: no pairs from {stats['questions']} questions (sample accuracy "
                         f"{stats['sample_accuracy']:.1%}): the policy needs both right and wrong answers{hint}")
    path = run.path / "pairs.jsonl"
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pairs))
    chosen, rejected = [r["chosen"] for r in pairs], [r["rejected"] for r in pairs]
    lb = length_bias(chosen, rejected, [0.0] * len(pairs), [0.0] * len(pairs))
    summary = {"stage": "rm_pairs", "task": cfg.task.spec, "split": cfg.split, "source": p.source, **stats,
               "pairs_file": str(path), "chosen_len_mean": sum(map(len, chosen)) / len(pairs),
               "rejected_len_mean": sum(map(len, rejected)) / len(pairs),
               "longer_wins_accuracy": lb["longer_wins_accuracy"], "chosen_longer": lb["n_chosen_longer"],
               "rejected_longer": lb["n_rejected_longer"], "wall_s": time.perf_counter() - t0}
    run.write_summary(summary)
    return summary
