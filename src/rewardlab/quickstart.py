"""`rewardlab quickstart`: tiny model from scratch -> SFT -> GRPO -> held-out evaluation, offline on a CPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rewardlab.config import EvaluateConfig, QuickstartConfig, SFTConfig, TrainConfig
from rewardlab.evaluation.policy import run_evaluate
from rewardlab.rl.trainer import train
from rewardlab.runs import RunDir
from rewardlab.sft import run_sft


def run_quickstart(cfg: QuickstartConfig, *, show_progress: bool = True) -> dict[str, Any]:
    """Run the four stages under `cfg.out` (sft/, eval_sft/, grpo/, eval_grpo/) and write summary.json.

    Returns:
        {"sft": {...}, "grpo": {...}} with held-out accuracy, pass@k and wall seconds per stage.
    """
    out = Path(cfg.out)
    common = {"task": cfg.task, "seed": cfg.seed}
    times: dict[str, float] = {}

    t = time.perf_counter()
    sft = run_sft(SFTConfig(model=cfg.model, sft=cfg.sft, out=str(out / "sft"), **common), show_progress=show_progress)
    times["sft"] = time.perf_counter() - t
    sft_model = cfg.model.model_copy(update={"path": sft["final_checkpoint"]})

    def evaluate(model, name: str) -> dict[str, Any]:
        t = time.perf_counter()
        res = run_evaluate(EvaluateConfig(model=model, eval=cfg.eval, out=str(out / name), **common),
                           show_progress=show_progress, announce=False)  # the table below names the split
        times[name] = time.perf_counter() - t
        return res

    eval_sft = evaluate(sft_model, "eval_sft")
    t = time.perf_counter()
    grpo = train(TrainConfig(model=sft_model, rl=cfg.rl, out=str(out / "grpo"), save_every=max(1, cfg.rl.steps),
                             **common), show_progress=show_progress)
    times["grpo"] = time.perf_counter() - t
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
    RunDir(out).write_summary(summary)

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
