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
from rewardlab.config import EvaluateConfig, QuickstartConfig, RLConfig, SFTConfig, TaskConfig, TrainConfig
from rewardlab.runs import RunDir, RunMode, warn

def _stage_mode(path: Path, resume: bool) -> dict[str, Any]:
    """How to run a stage in `path`: its summary when it finished (resume), else the runner's `mode`."""
    if not resume:
        return {"mode": "new"}  # a new or just emptied quickstart directory
    stage_run = RunDir(path)
    if (path / "summary.json").is_file():
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        if not summary.get("interrupted"):  # an sft/train stage stopped by Ctrl-C is resumed below
            return {"summary": summary}
    if not stage_run.holds_run():
        return {"mode": "new"}
    if path.name in ("sft", "grpo", "no_tool_sft", "no_tool_grpo") and not stage_run.list_checkpoints():
        warn(f"--resume: {path} was interrupted before its first checkpoint; starting that stage again")
        return {"mode": "overwrite"}
    return {"mode": "resume"}


def run(cfg: QuickstartConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """Run the four stages under `cfg.out` (sft/, eval_sft/, grpo/, eval_grpo/) and write summary.json.

    `cfg.out` is opened with `RunDir.start` (config.yaml at its top): a directory that already holds a run is
    refused unless `mode` is "overwrite" (the whole quickstart directory is replaced) or "resume", which reuses each
    finished stage (summary.json present), resumes an unfinished one (from its last checkpoint; an evaluation from
    its last finished batch) and starts the missing ones. GRPO checkpoints every 25 steps so that it can be resumed.

    Returns:
        {"sft": {...}, "grpo": {...}} with held-out accuracy, pass@k and wall seconds per stage.
    Raises:
        RunDirError (a ValueError): `cfg.out` holds a run and `mode` is "new", is in use, "resume" with other
            settings; and what the stages raise.
    """
    with open_run(cfg, mode=mode) as top:
        return _quickstart(cfg, top, mode == "resume", show_progress)


def _stager(out: Path, resume: bool, show_progress: bool, times: dict[str, float]):
    """`stage(name, runner, stage_cfg)`: run one stage in `out / name` (or reuse its summary on a resume), timed in
    `times[name]`."""

    def stage(name: str, runner, stage_cfg) -> dict[str, Any]:
        how = _stage_mode(out / name, resume)
        if "summary" in how:  # finished before the interruption
            times[name] = how["summary"].get("wall_s", 0.0)
            return how["summary"]
        t = time.perf_counter()
        res = runner(stage_cfg, mode=how["mode"], show_progress=show_progress)
        times[name] = time.perf_counter() - t
        return res

    return stage


def _quickstart(cfg: QuickstartConfig, top: RunDir, resume: bool, show_progress: bool) -> dict[str, Any]:
    if cfg.preset == "tools":
        return _tools_quickstart(cfg, top, resume, show_progress)
    out = top.path
    common = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads}
    times: dict[str, float] = {}
    stage = _stager(out, resume, show_progress, times)

    sft = stage("sft", sft_command.run, SFTConfig(model=cfg.model, sft=cfg.sft, out=str(out / "sft"),
                                                  report_to=cfg.report_to, **common))
    sft_model = cfg.model.model_copy(update={"path": sft["final_checkpoint"]})

    def evaluate(model, name: str) -> dict[str, Any]:
        # model.lora trains the sft and grpo stages; an evaluation loads their checkpoints, adapters merged
        # (`for_running`: the training-only keys back at their defaults)
        return stage(name, partial(evaluate_command.run, announce=False),  # the table below names the split
                     EvaluateConfig(model=model.for_running(), eval=cfg.eval, out=str(out / name), **common))

    eval_sft = evaluate(sft_model, "eval_sft")
    grpo = stage("grpo", train_command.run, TrainConfig(model=sft_model, rl=cfg.rl, out=str(out / "grpo"),
                                                        report_to=cfg.report_to, **common))
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


# ------------------------------------------------------------------------------------------------ preset "tools"
def episode_accuracy(policy: Any, rows: list[dict[str, Any]], reward_spec: Any, *, episodes: Any,
                     max_new_tokens: int, batch_size: int = 100) -> dict[str, Any]:
    """Greedy accuracy of `policy` on `rows` (`rewardlab.evaluation.evaluate_policy` with no sampled completions):
    one greedy episode per row in the environment of `episodes` (an `EpisodeSettings`; None: one greedy completion
    per row), the outcome reward called once per episode.

    Returns:
        {"accuracy", "score_mean", "n_questions", and for episodes (`evaluate_policy`'s episode figures):
        "tool_call_rate" (fraction of model turns with a call), "tool_calls_per_episode", "tool_errors_per_episode",
        "turns_mean", "terminations" {reason: fraction}}.
    """
    from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
    from rewardlab.policy import SamplingSettings
    from rewardlab.rewards import build_reward

    r = evaluate_policy(policy, rows, build_reward(reward_spec), SamplingSettings(max_new_tokens=max_new_tokens),
                        settings=EvalSettings(n=0, ks=(), batch_size=batch_size), episodes=episodes)
    out = {"accuracy": r["accuracy"], "score_mean": r["score_mean"], "n_questions": r["n_questions"]}
    if episodes is not None:
        out.update({"tool_call_rate": r["tool_call_rate"], "tool_calls_per_episode": r["tool_calls_mean"],
                    "tool_errors_per_episode": r["tool_errors_mean"], "turns_mean": r["turns_mean"],
                    "terminations": r["termination"]})
    return out


def _eval_stage(cfg: QuickstartConfig, model_path: str, *, tools: bool, out: str, mode: RunMode = "new",
                show_progress: bool = True) -> dict[str, Any]:
    """The held-out evaluation of one model (greedy episodes in the calculator environment with `tools`, else greedy
    single completions of the same questions), written to `out`/summary.json."""
    from rewardlab.commands.common import load_model
    from rewardlab.envs import close_env, load_episodes
    from rewardlab.progress import stage as progress
    from rewardlab.tasks import load as load_task
    from rewardlab.threads import apply_threads

    apply_threads(cfg.threads)
    task_cfg = cfg.task if tools else no_tool_task(cfg)
    task = load_task(task_cfg.spec, **task_cfg.options)
    rows = task.test[: cfg.eval.limit] if cfg.eval.limit else task.test
    # model.lora trains the sft and grpo stages; their checkpoints load with the adapter merged
    policy = load_model(cfg.model_copy(update={"model": cfg.model.for_running()}), model_path)
    episodes = load_episodes(task, cfg.env, policy) if tools else None  # the env keys checked, as every verb does
    t0 = time.perf_counter()
    try:
        # an unfinished evaluation runs again whole
        with RunDir.start(out, mode="new" if mode == "new" else "overwrite") as run:
            run.write_config(json.dumps({"model": model_path, "task": task_cfg.model_dump(), "episodes": tools,
                                         "eval": cfg.eval.model_dump(), "env": cfg.env.model_dump()}, indent=2))
            with progress("evaluate", 1, enabled=show_progress) as bar:
                result = episode_accuracy(policy, rows, task.reward, episodes=episodes,
                                          max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size)
                bar.advance(1, acc=result["accuracy"])
            result.update({"stage": "evaluate", "task": task_cfg.spec, "model": model_path,
                           "wall_s": time.perf_counter() - t0})
            run.write_summary(result)
    finally:
        close_env(episodes)
    return result


def no_tool_task(cfg: QuickstartConfig) -> TaskConfig:
    """The single-turn task with the calculator environment's questions, split and answers: reasoning-gym
    `chain_sum` (or `products`) with the compact template, whose prompt is the expression and "=" exactly as the
    calculator's compact prompt, and the same size, test_size, seed and term/digit options."""
    options = dict(cfg.task.options)
    dataset = options.pop("dataset", "chain_sum")
    for key in ("parser", "workers", "timeout_s"):
        options.pop(key, None)
    defaults = {"min_terms": 2, "max_terms": 3, "min_digits": 3, "max_digits": 4, "size": 5000, "test_size": 300}
    return TaskConfig(spec=f"reasoning_gym:{dataset}", options={**defaults, **options, "template": "compact"})


def _with_max_new_tokens(rl: RLConfig, max_new_tokens: int) -> RLConfig:
    """`rl` with rl.sampling.max_new_tokens set to `max_new_tokens` (the no-tool arm's single completions)."""
    return rl.model_copy(update={"sampling": rl.sampling.model_copy(update={"max_new_tokens": max_new_tokens})})


def _tools_quickstart(cfg: QuickstartConfig, top: RunDir, resume: bool, show_progress: bool) -> dict[str, Any]:
    """The `tools` preset: the calculator environment, and the same budget trained without the tool."""
    out = top.path
    times: dict[str, float] = {}
    stage = _stager(out, resume, show_progress, times)
    common = {"seed": cfg.seed, "threads": cfg.threads, "report_to": cfg.report_to}  # the sft and grpo stages'
    tools_task = {"task": cfg.task, "env": cfg.env, **common}
    plain = {"task": no_tool_task(cfg), **common}
    direct_sft = cfg.sft.model_copy(update={"tool_frac": None})

    def evaluate(model_path: str, name: str, tools: bool) -> dict[str, Any]:
        def runner(_: Any, **how: Any) -> dict[str, Any]:
            return _eval_stage(cfg, model_path, tools=tools, out=str(out / name), **how)

        return stage(name, runner, None)

    sft = stage("sft", sft_command.run, SFTConfig(model=cfg.model, sft=cfg.sft, out=str(out / "sft"), **tools_task))
    sft_model = cfg.model.model_copy(update={"path": sft["final_checkpoint"]})
    eval_sft = evaluate(sft["final_checkpoint"], "eval_sft", True)
    grpo = stage("grpo", train_command.run, TrainConfig(model=sft_model, rl=cfg.rl, out=str(out / "grpo"),
                                                        **tools_task))
    eval_grpo = evaluate(grpo["final_checkpoint"], "eval_grpo", True)
    # the same model, steps and batches without the tool: SFT on the direct answers, GRPO on single completions
    sft_nt = stage("no_tool_sft", sft_command.run, SFTConfig(model=cfg.model, sft=direct_sft,
                                                             out=str(out / "no_tool_sft"), **plain))
    nt_model = cfg.model.model_copy(update={"path": sft_nt["final_checkpoint"]})
    grpo_nt = stage("no_tool_grpo", train_command.run,
                    TrainConfig(model=nt_model, rl=_with_max_new_tokens(cfg.rl, cfg.eval.max_new_tokens),
                                out=str(out / "no_tool_grpo"), **plain))
    eval_nt = evaluate(grpo_nt["final_checkpoint"], "eval_no_tool", False)

    summary = _tools_summary(cfg, plain["task"].spec, (eval_sft, sft["final_checkpoint"]),
                             (eval_grpo, grpo["final_checkpoint"]), (eval_nt, grpo_nt["final_checkpoint"]), times)
    top.write_summary(summary)
    _print_tools_table(cfg, eval_sft, eval_grpo, eval_nt, times, out)
    return summary


def _tools_summary(cfg: QuickstartConfig, no_tool_spec: str, sft: tuple[dict[str, Any], str],
                   grpo: tuple[dict[str, Any], str], no_tool: tuple[dict[str, Any], str],
                   times: dict[str, float]) -> dict[str, Any]:
    """summary.json of the `tools` preset from each model's (evaluation, checkpoint) and the stages' seconds."""

    def figures(ev: dict[str, Any], checkpoint: str) -> dict[str, Any]:
        keep = ("accuracy", "tool_call_rate", "tool_calls_per_episode", "tool_errors_per_episode", "turns_mean",
                "terminations")
        return {**{k: ev[k] for k in keep if k in ev}, "checkpoint": checkpoint}

    return {
        "preset": "tools",
        "task": cfg.task.spec,
        "no_tool_task": no_tool_spec,
        "held_out_questions": grpo[0]["n_questions"],
        "sft": figures(*sft),
        "grpo": figures(*grpo),
        "no_tool": figures(*no_tool),
        "improvement_points": 100 * (grpo[0]["accuracy"] - sft[0]["accuracy"]),
        "over_no_tool_points": 100 * (grpo[0]["accuracy"] - no_tool[0]["accuracy"]),
        "stage_seconds": times,
        "total_seconds": sum(times.values()),
    }


def _print_tools_table(cfg: QuickstartConfig, eval_sft: dict[str, Any], eval_grpo: dict[str, Any],
                       eval_nt: dict[str, Any], times: dict[str, float], out: Path) -> None:
    """The `tools` preset's table of held-out figures per model, then the total time, on stdout."""
    table = Table(title=f"held-out {cfg.task.spec} ({eval_grpo['n_questions']} questions, greedy episodes)")
    for col in ("model", "accuracy", "tool-call rate", "tool errors / episode"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for label, ev in (("after SFT (tool traces + direct answers)", eval_sft), ("after GRPO in the environment",
                                                                                 eval_grpo),
                      ("no tool (SFT on direct answers + GRPO, same budget)", eval_nt)):
        table.add_row(label, f"{ev['accuracy']:.1%}", f"{ev['tool_call_rate']:.1%}" if "tool_call_rate" in ev else "-",
                      f"{ev['tool_errors_per_episode']:.2f}" if "tool_errors_per_episode" in ev else "-")
    stdout = Console()
    stdout.print(table)
    stdout.print(f"total {sum(times.values()):.0f} s; summary: {out / 'summary.json'}")
