"""`rewardlab search`: accuracy against the sample budget N for each search method, with pass@N and greedy.

The work is done in units - greedy decoding, the sample pool (sampled, verified and scored), then one unit per
method and N - and each finished unit is appended to units.jsonl with what later units need and torch's RNG state
after it, so `--resume` after an interruption skips the finished units and writes the report an uninterrupted run
writes (but for wall-clock fields).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rewardlab.commands.common import (announce_task, check_prompts, load_inputs, load_model, open_run,
                                       with_trained_task)
from rewardlab.config import SearchConfig
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.tasks import check_task_for_policy
from rewardlab.runs import RunMode, atomic_write_text, warn
from rewardlab.search.report import METHODS, Units, check_settings, compare_methods, plot_report

#: The log of finished units in a search run directory (one JSON line per unit).
UNIT_LOG = "units.jsonl"


def run(cfg: SearchConfig, *, mode: RunMode = "new",
        show_progress: bool = True) -> dict[str, Any]:
    """Run every method in `cfg.search.methods` for every budget in `cfg.search.n` on `cfg.split` of `cfg.task`
    (default: the task's `eval_split`, i.e. a jsonl file whole, a generated task's held-out split), with
    `rewardlab.search.report.compare_methods`.

    Writes the run directory `cfg.out` (opened with `RunDir.start`: one that already holds a run is refused unless
    "resume" or "overwrite"): config.yaml, units.jsonl (each finished unit), report.json (per method and N:
    accuracy, tokens and scorer calls per question, wall seconds; pass@N; greedy accuracy) and accuracy_vs_n.png;
    prints the table. With "resume", the units an interrupted run with the same settings finished are not run again.

    Correctness is always judged by the task's own verifier (`task.reward`); the scorer (`cfg.scorer`, default the
    task's verifier, i.e. an oracle) only ranks candidates. As with `evaluate`, a checkpoint of a rewardlab run
    defaults the task to the run's (`with_trained_task`: never a MODULE:FUNCTION reward or an env:MODULE:CLASS
    environment from a run directory).

    Raises:
        ValueError: an unknown method or equivalence, bad budgets, a prompt that does not fit the model's context
            window with search.max_new_tokens (named by its FILE:LINE, `check_prompts`), and what
            `with_trained_task`, `tasks.load`, `load_policy` and `build_reward` raise; RunDirError (a ValueError):
            `cfg.out` holds a run and `mode` is "new", is in use, or "resume" with other settings.
    """
    s = cfg.search
    check_settings(s)
    cfg, trained = with_trained_task(cfg)
    task, _ = load_inputs(cfg, model=False)
    split = cfg.split or task.eval_split  # a jsonl file whole, a generated task's held-out split
    pool = task.split(split)
    rows = pool[: s.limit]
    if not rows:
        raise ValueError(f"search: the {split} split of {cfg.task.spec} has no rows")
    verifier = build_reward(task.reward)
    scorer = build_reward(cfg.scorer) if cfg.scorer is not None else verifier
    policy = load_model(cfg)
    check_task_for_policy(task, policy)
    check_prompts(task, policy, max_new_tokens=s.max_new_tokens, key="search.max_new_tokens")
    announce_task(task, show_progress)
    with open_run(cfg, mode=mode) as run:  # once the task, rewards and model load
        done = run.read_jsonl(UNIT_LOG) if mode == "resume" else []
        units = Units(lambda rec: run.append_jsonl(UNIT_LOG, [rec]), done)
        result = compare_methods(policy, rows, verifier, scorer, s, units=units,
                                 stage=partial(stage, enabled=show_progress))
        if cfg.scorer is None:
            scorer_name = f"{task.reward} (the task's verifier: an oracle)"
        elif result["scorer_reads_answer"]:
            scorer_name = f"{cfg.scorer} (reads the reference answer: an oracle)"
        else:
            scorer_name = cfg.scorer
        report = {"task": cfg.task.spec, "task_options": cfg.task.options, "model": cfg.model.path, "split": split,
                  "split_rows": len(pool), "scorer": scorer_name, "verifier": task.reward, **trained, **result}
        report["plot"] = str(plot_report(report, run.path / "accuracy_vs_n.png"))
        atomic_write_text(run.path / "report.json", json.dumps(report, indent=2) + "\n")
    print_report(report, run.path / "report.json")
    if report["scorer_reads_answer"]:
        warn(f"search: the scorer {scorer_name} reads each question's reference answer, so ranking by it is an "
             "oracle: best-of-N equals pass@N, and no method's figure is one a deployed system could reach")
    return report


def _accuracy_cell(method: str, cell: dict[str, Any] | None) -> str:
    """"46.7%", or for a tree method "46.7% (≤50.0%)": its accuracy and its own candidates' ceiling."""
    if not cell:
        return "-"
    if METHODS.meta(method)["pool"] or "ceiling" not in cell:
        return f"{cell['accuracy']:.1%}"
    return f"{cell['accuracy']:.1%} (≤{cell['ceiling']:.1%})"


def print_report(report: dict[str, Any], where: str | Path | None = None) -> None:
    """Print the accuracy table (pass@N is the ceiling of the pool methods; beam search and DVTS show their own
    candidates' ceiling) and the cost table (tokens and scorer calls per question) with rich."""
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
        acc.add_row(str(n), f"{report['pass@N'][str(n)]:.1%}", *(_accuracy_cell(m, c) for m, c in zip(methods, cells)))
        cost.add_row(str(n), *(f"{c['tokens_per_question']:.0f} / {c['scorer_calls_per_question']:.0f}" if c else "-"
                               for c in cells))
    out = Console()
    out.print(acc)
    out.print(cost)
    if where is not None:
        out.print(f"report: {where}  plot: {report.get('plot')}")
