"""`rewardlab evaluate`: greedy accuracy and pass@k of a policy on a task's rows."""

from __future__ import annotations

import json
import time
from typing import Any

from rewardlab.commands.common import announce_task, check_prompts, load_inputs, open_run, with_trained_task
from rewardlab.envs import load_episodes
from rewardlab.envs.sampling import close_env, turn_budget_warning
from rewardlab.config import EvaluateConfig
from rewardlab.evaluation.policy import EvalProgress, EvalSettings, describe_rows, evaluate_policy
from rewardlab.policy import SamplingSettings
from rewardlab.progress import console, stage
from rewardlab.rewards import build_reward
from rewardlab.runs import RunDir, RunMode, atomic_write_text, warn

#: The log of finished evaluation batches in an `evaluate` run directory (one JSON line per batch).
BATCH_LOG = "batches.jsonl"
#: One JSON line per evaluated question: question, answer, greedy prediction, correct, the n samples and rewards.
PREDICTIONS = "predictions.jsonl"


def run(cfg: EvaluateConfig, *, mode: RunMode = "new",
        show_progress: bool = True, announce: bool = True) -> dict[str, Any]:
    """`rewardlab evaluate`: greedy accuracy and pass@k of `cfg.model` on `cfg.split` of `cfg.task`.

    The split defaults to the task's `eval_split`: a `jsonl:PATH` file is evaluated whole, a generated task on its
    held-out test split (see `EvaluateConfig.split`). Writes the run directory `cfg.out` (opened with
    `RunDir.start`, so one that already holds a run is refused unless "resume" or "overwrite"): config.yaml,
    batches.jsonl (each finished batch, see `evaluate_policy`), predictions.jsonl (one line per question: question,
    answer, greedy prediction, correct, score, error and the n samples with their rewards; written at the end) and
    summary.json (the result of `evaluate_policy` plus
    model, task, `split` (the split used), `split_rows` (rows in it; `n_questions` of them evaluated, fewer with
    `eval.limit`) and wall seconds). For an environment task (task.spec env:NAME) every completion is an episode
    under the env section's budgets (eval.max_new_tokens per model turn; one line on stderr warns when it is below
    the environment's `min_turn_tokens`, `turn_budget_warning`): predictions.jsonl also holds each greedy
    episode's messages, termination, turns and tool calls, and the summary its episode figures (turns_mean,
    termination fractions, tool_call_rate, tool_errors_mean; `evaluate_policy`). With `mode="resume"`, the batches
    logged by an interrupted run with the same settings are not evaluated again and the summary equals the
    uninterrupted run's (but for wall_s). When `cfg.model` is a checkpoint of a rewardlab run and no task is given,
    the task (and its options) is the run's, unless its reward is MODULE:FUNCTION code or its spec an environment
    class env:MODULE:CLASS, which a run directory is never trusted to run (refused); a task that differs from it is
    warned about; summary.json records `trained_on`, `task_differs` and `task_from` (`with_trained_task`). With
    `announce`, one line on stderr says how many rows of which split were evaluated.

    Raises:
        RunDirError (a ValueError): `cfg.out` holds a run and `mode` is "new", is in use, or "resume" with other
            settings; ValueError: the split has no rows; a prompt that does not fit the model's context window with
            eval.max_new_tokens, named by its FILE:LINE (`check_prompts`; eval.max_prompt_length cuts long prompts
            instead); and what `with_trained_task`, `tasks.load`, `load_policy` and `evaluate_policy` raise.
    """
    cfg, trained = with_trained_task(cfg)
    task, policy = load_inputs(cfg)
    split = cfg.split or task.eval_split
    pool = task.split(split)
    rows = pool[: cfg.eval.limit]
    if not rows:
        raise ValueError(f"split: the {split} split of {cfg.task.spec} has no rows")
    reward = build_reward(task.reward)
    check_prompts(task, policy, max_new_tokens=cfg.eval.max_new_tokens, key="eval.max_new_tokens",
                  max_prompt_length=cfg.eval.max_prompt_length, prompt_key="eval.max_prompt_length")
    episodes = load_episodes(task, cfg.env, policy)
    short = turn_budget_warning(episodes, policy, cfg.eval.max_new_tokens, key="eval.max_new_tokens")
    if short is not None:  # the environment's own turns would be cut
        warn(short)
    announce_task(task, show_progress)
    try:
        with open_run(cfg, mode=mode) as run:  # once the inputs load
            done = run.read_jsonl(BATCH_LOG) if mode == "resume" else []
            t0 = time.perf_counter()
            result = _evaluate_rows(cfg, run, policy, rows, reward, episodes, done, show_progress)
            _write_predictions(run, result.pop("predictions"))
            result = {"model": cfg.model.path, "task": cfg.task.spec, "split": split, "split_rows": len(pool),
                      "wall_s": time.perf_counter() - t0, **result, **trained, "predictions_file": PREDICTIONS}
            run.write_summary(result)
    finally:
        close_env(episodes)
    if announce:
        console.print(f"evaluated {describe_rows(len(rows), len(pool), split, cfg.task.spec)}", highlight=False,
                      markup=False, soft_wrap=True)
    return result


def _evaluate_rows(cfg: EvaluateConfig, run: RunDir, policy: Any, rows: list[dict[str, Any]], reward: Any,
                   episodes: Any, done: list[dict[str, Any]], show_progress: bool) -> dict[str, Any]:
    """`evaluate_policy` on `rows` with the eval section's settings, skipping the batches in `done` and appending
    each new one to `run`'s batches.jsonl; returns its result (predictions included)."""
    e = cfg.eval
    sampling = SamplingSettings(max_new_tokens=e.max_new_tokens, temperature=e.temperature, top_p=e.top_p,
                                max_prompt_length=e.max_prompt_length)
    with stage("evaluate", len(rows), enabled=show_progress) as bar:
        progress = EvalProgress(done=done, on_batch=lambda rec: run.append_jsonl(BATCH_LOG, [rec]), bar=bar)
        return evaluate_policy(policy, rows, reward, sampling, episodes=episodes, progress=progress,
                               settings=EvalSettings(n=e.n, ks=e.k, batch_size=e.batch_size, seed=cfg.seed))


def _write_predictions(run: RunDir, predictions: list[dict[str, Any]]) -> None:
    """predictions.jsonl in `run`, one JSON line per question, written atomically."""
    atomic_write_text(run.path / PREDICTIONS, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))


