"""`rewardlab search`: accuracy against the sample budget N for each search method, with pass@N and greedy.

Best-of-N, majority and weighted majority are computed on nested prefixes of one pool of max(N) samples per
question (the first N samples for budget N), so their curves and pass@N come from the same samples. Beam search
and DVTS generate their own trees for each N (N >= M, M dividing N).

The work is done in units - greedy decoding, the sample pool (sampled, verified and scored), then one unit per
method and N - and each finished unit is appended to units.jsonl with what later units need and torch's RNG state
after it, so `--resume` after an interruption skips the finished units and writes the report an uninterrupted run
writes (but for wall-clock fields).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from rewardlab.config import SearchConfig, dump_config
from rewardlab.evaluation.policy import is_correct
from rewardlab.train_state import restore_rng_state, rng_state_record
from rewardlab.policy import load_policy
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.rewards.steps import final_answer
from rewardlab.registry import Registry
from rewardlab.runs import RunDir, atomic_write_text
from rewardlab.search.base import sample_solutions, score_solutions
from rewardlab.search.beam import beam, dvts
from rewardlab.search.best_of_n import best_of_n
from rewardlab.search.voting import EQUIVALENCES, VerifierEquivalence, majority, weighted_majority
from rewardlab.types import Rollout

#: The methods `rewardlab search` can compare, in table order. Meta: `display` (name in tables and plots), `style`
#: (matplotlib marker and line style), `pool` (True: `fn(rows, samples, scores, n, equivalent) -> list[SearchResult]`
#: over the first N samples of the shared pool, `info["index"]` the chosen sample; False: a tree search
#: `fn(policy, rows, scorer, *, n, ...)` run afresh for each N), `scorer` (whether it calls the scorer).
METHODS: Registry = Registry("search method")


# Pool methods: each calls the library's public function on the first n pooled samples (and scores) of each row,
# so the report's figures are that function's figures.
@METHODS.register("best_of_n", display="best-of-N", style=("o", "-"), pool=True, scorer=True)
def _pool_best_of_n(rows, samples, scores, n, equivalent):
    return best_of_n(None, rows, None, n=n, samples=samples, scores=scores)


@METHODS.register("majority", display="majority", style=("s", "-"), pool=True, scorer=False)
def _pool_majority(rows, samples, scores, n, equivalent):
    return majority(None, rows, n=n, equivalent=equivalent, extract=final_answer, samples=samples)


@METHODS.register("weighted_majority", display="weighted majority", style=("x", "--"), pool=True, scorer=True)
def _pool_weighted_majority(rows, samples, scores, n, equivalent):
    return weighted_majority(None, rows, None, n=n, equivalent=equivalent, extract=final_answer, samples=samples,
                             scores=scores)


METHODS.register("beam", display="beam search", style=("^", "-"), pool=False, scorer=True)(beam)
METHODS.register("dvts", display="DVTS", style=("D", "-"), pool=False, scorer=True)(dvts)
POOL_METHODS = tuple(m for m in METHODS if METHODS.meta(m)["pool"])
TREE_METHODS = {m: METHODS[m] for m in METHODS if not METHODS.meta(m)["pool"]}
#: The log of finished units in a search run directory (one JSON line per unit).
UNIT_LOG = "units.jsonl"


class _Memo:
    """An equivalence with its answers-pair results cached (votes over nested prefixes repeat comparisons)."""

    def __init__(self, equivalent) -> None:
        self.equivalent = equivalent
        self.cache: dict[tuple[str, str, int], bool] = {}

    def __call__(self, a: str, b: str, row=None) -> bool:
        key = (a, b, id(row))
        if key not in self.cache:
            self.cache[key] = self.equivalent(a, b, row)
        return self.cache[key]


def _correct(verifier, rollouts) -> list[bool]:
    return [is_correct(o) for o in verifier(list(rollouts))] if rollouts else []


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _enc(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # strict JSON: -inf (a failed score) as "-inf"


class _Units:
    """The finished units of a search run: skipped on resume (their records returned), logged when new.

    Units are visited in the same order on every run; before the first unit that is not in the log, torch's RNG
    state is restored from the last logged unit visited, so the remaining units draw what they would have drawn.
    """

    def __init__(self, run: RunDir, done: list[dict[str, Any]]) -> None:
        self.run = run
        self.done = {rec["unit"]: rec for rec in done}
        self.pending_rng: dict[str, Any] | None = None

    def get(self, unit: str) -> dict[str, Any] | None:
        rec = self.done.get(unit)
        if rec is not None:
            self.pending_rng = rec["rng"]
        elif self.pending_rng is not None:
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        return rec

    def put(self, unit: str, data: dict[str, Any]) -> None:
        self.run.append_jsonl(UNIT_LOG, [{"unit": unit, **data, "rng": rng_state_record()}])


def run_search(cfg: SearchConfig, *, resume: bool = False, overwrite: bool = False,
               show_progress: bool = True) -> dict[str, Any]:
    """Run every method in `cfg.search.methods` for every budget in `cfg.search.n` on `cfg.split` of `cfg.task`
    (default: the task's `eval_split`, i.e. a jsonl file whole, a generated task's held-out split).

    Writes the run directory `cfg.out` (opened with `RunDir.start`: one that already holds a run is refused unless
    `resume` or `overwrite`): config.yaml, units.jsonl (each finished unit), report.json (per method and N:
    accuracy, tokens and scorer calls per question, wall seconds; pass@N; greedy accuracy) and accuracy_vs_n.png;
    prints the table. With `resume`, the units an interrupted run with the same settings finished are not run again.

    Correctness is always judged by the task's own verifier (`task.reward`); the scorer (`cfg.scorer`, default the
    task's verifier, i.e. an oracle) only ranks candidates.

    Raises:
        ValueError: an unknown method or equivalence, bad budgets, and what `tasks.load`, `load_policy` and
            `build_reward` raise; RunDirError (a ValueError): `cfg.out` holds a run and neither flag is given, is in
            use, or `resume` with other settings.
    """
    s = cfg.search
    for m in s.methods:
        try:
            METHODS.get(m)
        except ValueError as exc:
            raise ValueError(f"search.methods: {exc}") from None
    if s.equivalence != "verifier" and s.equivalence not in EQUIVALENCES:
        raise ValueError(f"search.equivalence: expected verifier, {', '.join(EQUIVALENCES)}; got {s.equivalence!r}")
    if any(n < 1 for n in s.n):
        raise ValueError(f"search.n: each budget must be >= 1, got {s.n}")
    torch.manual_seed(cfg.seed)
    from rewardlab.tasks import load as load_task

    task = load_task(cfg.task.spec, **cfg.task.options)
    split = cfg.split or task.eval_split  # a jsonl file whole, a generated task's held-out split
    pool = task.split(split)
    rows = pool[: s.limit]
    if not rows:
        raise ValueError(f"search: the {split} split of {cfg.task.spec} has no rows")
    verifier = build_reward(task.reward)
    scorer = build_reward(cfg.scorer) if cfg.scorer is not None else verifier
    policy = load_policy(cfg.model.path, prompt_format=cfg.model.prompt_format, dtype=cfg.model.dtype,
                         device=cfg.model.device, tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)
    # Opened only once the task, rewards and model load: bad inputs create or delete nothing.
    with RunDir.start(cfg.out, resume=resume, overwrite=overwrite) as run:
        run.record_config(dump_config(cfg), resume=resume)
        units = _Units(run, run.read_jsonl(UNIT_LOG) if resume else [])
        report = _search(cfg, rows, policy, verifier, scorer, units, show_progress)
        report["split"], report["split_rows"] = split, len(pool)
        report["scorer"] = cfg.scorer if cfg.scorer is not None else f"{task.reward} (the task's verifier: an oracle)"
        report["verifier"] = task.reward
        report["plot"] = str(plot_report(report, run.path / "accuracy_vs_n.png"))
        atomic_write_text(run.path / "report.json", json.dumps(report, indent=2) + "\n")
    print_report(report, run.path / "report.json")
    return report


def _search(cfg: SearchConfig, rows, policy, verifier, scorer, units: _Units, show_progress: bool) -> dict[str, Any]:
    s = cfg.search
    ns = sorted(set(s.n))
    equivalent = _Memo(VerifierEquivalence(verifier) if s.equivalence == "verifier" else EQUIVALENCES[s.equivalence])
    common = {"separator": s.separator, "batch_size": s.batch_size}
    sampling = {"temperature": s.temperature, "top_p": s.top_p}
    results: dict[str, dict[str, dict[str, float]]] = {m: {} for m in s.methods}
    timing: dict[str, float] = {}

    # Floor: greedy decoding.
    rec = units.get("greedy")
    if rec is None:
        t0 = time.perf_counter()
        greedy = [g[0] for g in sample_solutions(policy, rows, n=1, greedy=True, max_new_tokens=s.max_new_tokens,
                                                 **common)]
        rec = {"correct": _correct(verifier, greedy), "tokens": [len(r.completion_ids) for r in greedy],
               "greedy_s": time.perf_counter() - t0}
        units.put("greedy", rec)
    greedy_correct, greedy_tokens = rec["correct"], rec["tokens"]
    timing["greedy_s"] = rec["greedy_s"]

    # One pool of max(N) samples per question for pass@N and the selection methods.
    n_max = max(ns)
    need_scores = any(m in s.methods and METHODS.meta(m)["scorer"] for m in POOL_METHODS)
    rec = units.get("pool")
    if rec is None:
        t0 = time.perf_counter()
        with stage("sampling", len(rows), enabled=show_progress) as bar:
            pool = sample_solutions(policy, rows, n=n_max, max_new_tokens=s.max_new_tokens, **sampling, **common)
            bar.advance(len(rows))
        flat = [r for g in pool for r in g]
        correct_flat = _correct(verifier, flat)
        rec = {"completions": [[r.completion for r in g] for g in pool],
               "tokens": [[len(r.completion_ids) for r in g] for g in pool],
               "correct": [correct_flat[i * n_max : (i + 1) * n_max] for i in range(len(rows))],
               "pool_sampling_s": time.perf_counter() - t0}
        if need_scores:
            t0 = time.perf_counter()
            scores_flat = score_solutions(scorer, flat, s.aggregate)
            rec["scores"] = [[_enc(x) for x in scores_flat[i * n_max : (i + 1) * n_max]] for i in range(len(rows))]
            rec["pool_scoring_s"] = time.perf_counter() - t0
        units.put("pool", rec)
    correct = rec["correct"]
    timing["pool_sampling_s"] = rec["pool_sampling_s"]
    if need_scores:
        scores = [[float(x) for x in g] for g in rec["scores"]]
        timing["pool_scoring_s"] = rec["pool_scoring_s"]
    # The pooled samples as rollouts (text only: a resumed run has their texts, not their token ids; the token
    # cost below is read from the pool's record).
    samples = [[Rollout(prompt=str(row.get("prompt", "")), prompt_ids=[], completion=c, completion_ids=[],
                        logprobs=[], row=row, group=i) for c in g]
               for i, (row, g) in enumerate(zip(rows, rec["completions"]))]
    pool_tokens = rec["tokens"]
    pass_at = {}
    for n in ns:
        pass_at[str(n)] = _mean(any(c[:n]) for c in correct)
        tokens = _mean(sum(g[:n]) for g in pool_tokens)
        for m in POOL_METHODS:
            if m not in s.methods:
                continue
            cell = units.get(f"{m}:{n}")
            if cell is None:
                t0 = time.perf_counter()
                select, uses_scorer = METHODS[m], METHODS.meta(m)["scorer"]
                out = select(rows, samples, scores if uses_scorer else None, n, equivalent)
                hits = [correct[i][r.info["index"]] for i, r in enumerate(out)]
                cell = {"result": {"accuracy": _mean(hits), "tokens_per_question": tokens,
                                   "scorer_calls_per_question": float(n) if uses_scorer else 0.0,
                                   "select_s": time.perf_counter() - t0}}
                units.put(f"{m}:{n}", cell)
            results[m][str(n)] = cell["result"]

    # Beam search and DVTS: a fresh tree search for each N.
    for m, method in TREE_METHODS.items():
        if m not in s.methods:
            continue
        budgets = [n for n in ns if n >= s.beam_width and n % s.beam_width == 0]
        with stage(m, len(budgets), enabled=show_progress) as bar:
            for n in budgets:
                cell = units.get(f"{m}:{n}")
                if cell is None:
                    t0 = time.perf_counter()
                    out = method(policy, rows, scorer, n=n, beam_width=s.beam_width, max_steps=s.max_steps,
                                 aggregate=s.aggregate, max_step_tokens=s.max_step_tokens, **sampling, **common)
                    hits = _correct(verifier, [r.best for r in out])
                    cell = {"result": {"accuracy": _mean(hits), "tokens_per_question": _mean(r.tokens for r in out),
                                       "scorer_calls_per_question": _mean(r.scorer_calls for r in out),
                                       "wall_s": time.perf_counter() - t0}}
                    units.put(f"{m}:{n}", cell)
                results[m][str(n)] = cell["result"]
                bar.advance(1, acc=cell["result"]["accuracy"])

    return {
        "task": cfg.task.spec,
        "task_options": cfg.task.options,
        "model": cfg.model.path,
        "split": None,  # filled in by run_search
        "split_rows": None,
        "questions": len(rows),
        "scorer": None,  # filled in by run_search
        "verifier": None,
        "settings": s.model_dump(),
        "greedy": {"accuracy": _mean(greedy_correct), "tokens_per_question": _mean(greedy_tokens)},
        "pass@N": pass_at,
        "methods": results,
        "timing_s": timing,
    }


def plot_report(report: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against N (log2 x axis) for each method, pass@N (dashed) and greedy (dotted) as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    ns = sorted(int(n) for n in report["pass@N"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(ns, [100 * report["pass@N"][str(n)] for n in ns], "k--", label="pass@N (ceiling)")
    ax.axhline(100 * report["greedy"]["accuracy"], color="gray", ls=":", label="greedy (floor)")
    for m, per_n in report["methods"].items():
        pts = sorted((int(n), v["accuracy"]) for n, v in per_n.items())
        if pts:  # own marker and line style per method, so coinciding curves stay visible
            marker, ls = METHODS.meta(m)["style"]
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=marker, ls=ls, ms=5, mfc="none",
                    label=METHODS.meta(m)["display"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("N (samples / beams per question)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"{report['task']}: {report['questions']} questions, scorer {report['scorer']}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_report(report: dict[str, Any], where: str | Path | None = None) -> None:
    """Print the accuracy table and the cost table (tokens and scorer calls per question) with rich."""
    ns = sorted(int(n) for n in report["pass@N"])
    methods = list(report["methods"])
    split = report.get("split", "test")
    name = {"test": "held-out accuracy", "train": "accuracy on the training split", "all": "accuracy on every row"
            }.get(split, f"accuracy on split {split}")
    acc = Table(title=f"{name}, {report['task']} ({report['questions']} questions); "
                      f"greedy {report['greedy']['accuracy']:.1%}")
    acc.add_column("N", justify="right")
    acc.add_column("pass@N", justify="right")
    for m in methods:
        acc.add_column(METHODS.meta(m)["display"], justify="right")
    cost = Table(title="cost per question: tokens generated / scorer calls")
    cost.add_column("N", justify="right")
    for m in methods:
        cost.add_column(METHODS.meta(m)["display"], justify="right")
    for n in ns:
        cells = [report["methods"][m].get(str(n)) for m in methods]
        acc.add_row(str(n), f"{report['pass@N'][str(n)]:.1%}", *(f"{c['accuracy']:.1%}" if c else "-" for c in cells))
        cost.add_row(str(n), *(f"{c['tokens_per_question']:.0f} / {c['scorer_calls_per_question']:.0f}" if c else "-"
                               for c in cells))
    out = Console()
    out.print(acc)
    out.print(cost)
    if where is not None:
        out.print(f"report: {where}  plot: {report.get('plot')}")
