"""`rewardlab quickstart`: tiny model from scratch -> SFT -> GRPO -> held-out evaluation, offline on a CPU."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rewardlab.commands import evaluate as evaluate_command
from rewardlab.commands import sft as sft_command
from rewardlab.commands import train as train_command
from rewardlab.commands.common import open_run
from rewardlab.config import EvaluateConfig, QuickstartConfig, SFTConfig, TrainConfig
from rewardlab.runs import RunDir, warn

def _stage_mode(path: Path, resume: bool) -> dict[str, Any]:
    """How to run a stage in `path`: its summary when it finished (resume), else the runner's resume/overwrite."""
    if not resume:
        return {"resume": False, "overwrite": False}  # a new or just emptied quickstart directory
    stage_run = RunDir(path)
    if (path / "summary.json").is_file():
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        if not summary.get("interrupted"):  # an sft/train stage stopped by Ctrl-C is resumed below
            return {"summary": summary}
    if not stage_run.holds_run():
        return {"resume": False, "overwrite": False}
    if path.name in ("sft", "grpo") and not stage_run.list_checkpoints():
        warn(f"--resume: {path} was interrupted before its first checkpoint; starting that stage again")
        return {"resume": False, "overwrite": True}
    return {"resume": True, "overwrite": False}


def run(cfg: QuickstartConfig, *, resume: bool = False, overwrite: bool = False,
        show_progress: bool = True) -> dict[str, Any]:
    """Run the four stages under `cfg.out` (sft/, eval_sft/, grpo/, eval_grpo/) and write summary.json.

    `cfg.out` is opened with `RunDir.start` (config.yaml at its top): a directory that already holds a run is
    refused unless `overwrite` (the whole quickstart directory is replaced) or `resume`, which reuses each finished
    stage (summary.json present), resumes an unfinished one (from its last checkpoint; an evaluation from its last
    finished batch) and starts the missing ones. GRPO checkpoints every 25 steps so that it can be resumed.

    Returns:
        {"sft": {...}, "grpo": {...}} with held-out accuracy, pass@k and wall seconds per stage.
    Raises:
        RunDirError (a ValueError): `cfg.out` holds a run and neither flag is given, is in use, `resume` with other
            settings; and what the stages raise.
    """
    with open_run(cfg, resume=resume, overwrite=overwrite) as top:
        return _quickstart(cfg, top, resume, show_progress)


def _quickstart(cfg: QuickstartConfig, top: RunDir, resume: bool, show_progress: bool) -> dict[str, Any]:
    out = top.path
    common = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads}
    times: dict[str, float] = {}

    def stage(name: str, runner, stage_cfg) -> dict[str, Any]:
        mode = _stage_mode(out / name, resume)
        if "summary" in mode:  # finished before the interruption
            times[name] = mode["summary"].get("wall_s", 0.0)
            return mode["summary"]
        t = time.perf_counter()
        res = runner(stage_cfg, **mode, show_progress=show_progress)
        times[name] = time.perf_counter() - t
        return res

    sft = stage("sft", sft_command.run, SFTConfig(model=cfg.model, sft=cfg.sft, out=str(out / "sft"), **common))
    sft_model = cfg.model.model_copy(update={"path": sft["final_checkpoint"]})

    def evaluate(model, name: str) -> dict[str, Any]:
        return stage(name, partial(evaluate_command.run, announce=False),  # the table below names the split
                     EvaluateConfig(model=model, eval=cfg.eval, out=str(out / name), **common))

    eval_sft = evaluate(sft_model, "eval_sft")
    grpo = stage("grpo", train_command.run, TrainConfig(model=sft_model, rl=cfg.rl, out=str(out / "grpo"), **common))
    grpo_model = cfg.model.model_copy(update={"path": grpo["final_checkpoint"]})
    eval_grpo = evaluate(grpo_model, "eval_grpo")

    ks = [f"pass@{k}" for k in cfg.eval.k]
    summary = {
        "task": cfg.task.spec,
        "held_out_questions": eval_sft["n_questions"],
        "sft": {"accuracy": eval_sft["accuracy"], **{k: eval_sft[k] for k in ks}, "checkpoint": sft["final_checkpoint"]},
        "grpo": {"accuracy": eval_grpo["accuracy"], **{k: eval_grpo[k] for k in ks},
                 "checkpoint": grpo["final_checkpoint"]},
        "improvement_points": 100 * (eval_grpo["accuracy"] - eval_sft["accuracy"]),
        "stage_seconds": times,
        "total_seconds": sum(times.values()),
    }
    top.write_summary(summary)

    table = Table(title=f"held-out {cfg.task.spec} ({eval_sft['n_questions']} questions)")
    table.add_column("stage")
    table.add_column("greedy accuracy", justify="right")
    for k in ks:
        table.add_column(k, justify="right")
    table.add_column("stage time (s)", justify="right")
    table.add_row("after SFT", f"{eval_sft['accuracy']:.1%}", *(f"{eval_sft[k]:.1%}" for k in ks),
                  f"{times['sft']:.1f} (+{times['eval_sft']:.1f} eval)")
    table.add_row("after GRPO", f"{eval_grpo['accuracy']:.1%}", *(f"{eval_grpo[k]:.1%}" for k in ks),
                  f"{times['grpo']:.1f} (+{times['eval_grpo']:.1f} eval)")
    stdout = Console()
    stdout.print(table)
    stdout.print(f"summary: {out / 'summary.json'}")
    return summary
