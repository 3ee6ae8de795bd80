"""`rewardlab prm label | train`: automatic step labels (Monte Carlo, binary search) and process reward model
training (`rewardlab.rm.labels`, `rewardlab.rm.prm`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rewardlab.commands.common import announce_task, check_prompts, load_inputs, load_model
from rewardlab.config import PrmLabelConfig, PrmTrainConfig, dump_config
from rewardlab.evaluation.reward_models import first_error_f1
from rewardlab.progress import stage
from rewardlab.rewards import build_reward
from rewardlab.rewards.model import check_step_tag
from rewardlab.rm.backbone import load_backbone
from rewardlab.rm.data import json_safe, load_step_rows
from rewardlab.rm.fit import FitCheckpoints, FitObjective, fit, open_fit_run
from rewardlab.rm.labels import (METHODS, PrefixEstimator, Solution, label_solutions, reference_chain,
                                 solution_steps, worst_case_rollouts)
from rewardlab.rm.prm import encode_rows, evaluate_steps, prm_loss, step_logits
from rewardlab.tasks import check_task_for_policy
from rewardlab.threads import apply_threads
from rewardlab.runs import RunDir, RunMode
from rewardlab.train_state import load_state, rng_state, save_state, set_rng_state


def label(cfg: PrmLabelConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab prm label`: sample solutions of `cfg.task` questions from `cfg.model`, split them into steps and label
    them with `cfg.label.method`; write the PRM-training JSONL.

    The questions are labelled in batches of `label.question_batch`. Writes the run directory `cfg.out`: config.yaml,
    labels.jsonl (one row per solution, see `label_solutions`; each batch's rows appended as the batch finishes),
    metrics.jsonl (one line per batch: solutions and rollouts so far), checkpoints/step-B after every
    `cfg.save_every` batches and the last one (trainer_state.pt: the next question, the RNG states, the rollouts and
    prefix evaluations spent; the `cfg.keep_checkpoints` most recent kept), summary.json (solutions, rollouts spent,
    per solution, prefix evaluations, budget, share of correct solutions, and, when the task rows have an integer
    `+`/`-` chain, the agreement of the labels' first errors with the exact ones, `reference_first_error`).

    The directory is opened with `RunDir.start` once the task, the policy and the method's needs are checked. With
    "resume", the rows written after the newest valid checkpoint are rolled back (kept in rolled_back/) and
    labelling goes on from the next question with the saved RNG states and budget, so labels.jsonl ends up equal to
    the uninterrupted run's; "overwrite" replaces the run there.

    Raises:
        ValueError: an unknown method, a chat-format policy, "reference" on a task without an integer +/- chain
            expression (see `reference_first_error`), a prompt that does not fit the model's context window with
            label.max_new_tokens (named by its FILE:LINE, `check_prompts`); `RunDirError`: the directory holds a run
            and `mode` is "new", is in use, or has nothing to resume; a resume with another
            `label.question_batch`.
    """
    p = cfg.label
    if p.method not in METHODS:
        raise ValueError(f"label.method: expected one of {METHODS}, got {p.method!r}")
    task, _ = load_inputs(cfg, model=False)
    rows = task.split(cfg.split)[: p.limit]
    if p.method == "reference":
        for i, row in enumerate(rows):
            try:
                reference_chain(row)
            except ValueError as exc:
                raise ValueError(f"{exc} (question {i} of the {cfg.split} split of {cfg.task.spec})") from None
    verifier = build_reward(task.reward)
    policy = load_model(cfg)
    check_task_for_policy(task, policy)
    check_prompts(task, policy, max_new_tokens=p.max_new_tokens, key="label.max_new_tokens")
    estimator = PrefixEstimator(policy, verifier, k=p.k, temperature=p.temperature, top_p=p.top_p,
                                max_new_tokens=p.max_new_tokens, separator=p.separator, batch_size=p.batch_size)
    announce_task(task, show_progress)
    with RunDir.start(cfg.out, mode=mode) as run:  # only once the inputs are checked
        return _label(cfg, rows, policy, estimator, run, mode == "resume", show_progress)


LABELS = "labels.jsonl"


@dataclasses.dataclass
class _Labelling:
    """Where labelling stands: the next question to label, batches done, whether the rollout budget stopped it, and
    the rows written to labels.jsonl so far."""

    next_question: int = 0
    batches: int = 0
    stopped_by_budget: bool = False
    out: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _label(cfg, rows, policy, estimator: PrefixEstimator, run: RunDir, resume: bool,
           show_progress: bool) -> dict[str, Any]:
    p = cfg.label
    run.record_config(dump_config(cfg), resume=resume, may_change=("save_every",))
    if resume:
        done = _resume_labelling(run, p.question_batch, estimator)
    else:
        (run.path / LABELS).touch()  # an empty file when no solution gets labelled
        done = _Labelling()
    t0 = time.perf_counter()
    with stage("PRM label", len(rows), enabled=show_progress) as bar:
        bar.advance(min(done.next_question, len(rows)))
        first = done.next_question
        for start in range(first, first if done.stopped_by_budget else len(rows), p.question_batch):
            chunk = rows[start : start + p.question_batch]
            solutions = _sampled_solutions(policy, chunk, p)
            if p.budget is not None:  # keep the solutions whose worst-case cost still fits the budget
                solutions, done.stopped_by_budget = _within_budget(solutions, p, p.budget - estimator.rollouts)
            labelled = label_solutions(p.method, estimator, solutions, kind=p.kind)
            done.out.extend(labelled)
            run.append_jsonl(LABELS, labelled)
            done.batches += 1
            run.log_metrics(done.batches, {"label/solutions": len(done.out), "label/rollouts": estimator.rollouts,
                                           "label/prefix_evaluations": estimator.evaluations,
                                           "time/elapsed_s": time.perf_counter() - t0})
            bar.advance(len(chunk), solutions=len(done.out), rollouts=estimator.rollouts)
            done.next_question = start + p.question_batch
            if done.batches % cfg.save_every == 0 or done.stopped_by_budget or done.next_question >= len(rows):
                _save_labelling(run, done, p.question_batch, estimator, cfg.keep_checkpoints)
            if done.stopped_by_budget:
                break
    summary = _label_summary(cfg, done, estimator, run.path / LABELS, t0)
    run.write_summary(json_safe(summary))
    return summary


def _resume_labelling(run: RunDir, question_batch: int, estimator: PrefixEstimator) -> _Labelling:
    """Where the newest valid checkpoint of `run` left labelling; restores the estimator's counts and the RNG
    states. Raises ValueError on another `label.question_batch` or a labels.jsonl that disagrees with it."""
    _, checkpoint = run.resume_checkpoint()
    state = load_state(checkpoint)
    if state["question_batch"] != question_batch:
        raise ValueError(f"--resume: {run.path} was labelled in batches of label.question_batch="
                         f"{state['question_batch']} questions; resume it with the same setting")
    out = run.read_jsonl(LABELS)
    if len(out) != state["solutions"]:
        raise ValueError(f"--resume: {run.path / LABELS} holds {len(out)} rows where its checkpoint "
                         f"{checkpoint.name} says {state['solutions']}")
    estimator.rollouts, estimator.evaluations = state["rollouts"], state["evaluations"]
    set_rng_state(state["rng"])
    return _Labelling(state["next_question"], state["batches"], state["stopped_by_budget"], out)


def _save_labelling(run: RunDir, done: _Labelling, question_batch: int, estimator: PrefixEstimator,
                    keep: int | None) -> None:
    """Checkpoint step-B (B = batches done): trainer_state.pt with `done`, the estimator's counts and RNG states."""
    state = {"next_question": done.next_question, "batches": done.batches, "question_batch": question_batch,
             "solutions": len(done.out), "rollouts": estimator.rollouts, "evaluations": estimator.evaluations,
             "stopped_by_budget": done.stopped_by_budget, "rng": rng_state()}
    run.save_checkpoint(done.batches, lambda tmp: save_state(tmp, state), keep=keep)


def _sampled_solutions(policy, chunk: list[dict[str, Any]], p: Any) -> list[Solution]:
    """`p.solutions_per_question` samples per row of `chunk`, split into steps at `p.separator`; a sample with no
    step, or the same text as an earlier sample of its row, is dropped."""
    sampled = policy.generate([r["prompt"] for r in chunk], n=p.solutions_per_question, temperature=p.temperature,
                              top_p=p.top_p, max_new_tokens=p.max_new_tokens, rows=chunk)
    solutions, seen = [], set()
    for r in sampled:
        key = (r.group, r.completion)
        steps = solution_steps(r.completion, p.separator)
        if key in seen or not steps:
            continue
        seen.add(key)
        solutions.append(Solution(prompt=chunk[r.group]["prompt"], row=chunk[r.group], steps=steps))
    return solutions


def _within_budget(solutions: list[Solution], p: Any, room: int) -> tuple[list[Solution], bool]:
    """The solutions, in order, whose worst-case rollout cost (`p.method`, `p.k`) still fits in `room` rollouts, and
    whether any was left out."""
    kept = []
    for sol in solutions:
        cost = worst_case_rollouts(p.method, len(sol.steps), p.k)
        if cost <= room:
            kept.append(sol)
            room -= cost
    return kept, len(kept) < len(solutions)


def _label_summary(cfg, done: _Labelling, estimator: PrefixEstimator, path: Path, t0: float) -> dict[str, Any]:
    """summary.json of `rewardlab prm label` (see `label`); `t0`: `time.perf_counter()` when labelling started."""
    p, out = cfg.label, done.out
    summary: dict[str, Any] = {
        "stage": "prm_label", "method": p.method, "kind": p.kind, "k": p.k, "split": cfg.split,
        "solutions": len(out), "rollouts": estimator.rollouts, "prefix_evaluations": estimator.evaluations,
        "rollouts_per_solution": estimator.rollouts / max(1, len(out)), "budget": p.budget,
        "stopped_by_budget": done.stopped_by_budget, "labels": str(path), "wall_s": time.perf_counter() - t0,
        "correct_solutions": sum(r["first_error"] == -1 for r in out) / max(1, len(out)),
    }
    with_ref = [r for r in out if "reference_first_error" in r]
    if with_ref and p.method != "reference":
        truth = [r["reference_first_error"] for r in with_ref]
        pred = [r["first_error"] for r in with_ref]
        summary["agreement_with_reference"] = {
            "first_error_accuracy": sum(a == b for a, b in zip(pred, truth)) / len(truth),
            **first_error_f1(pred, truth),
        }
    return summary


def train(cfg: PrmTrainConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab prm train`: fit a PRM on `cfg.data` step-labelled rows; evaluate on `cfg.eval_data`.

    Writes the run directory `cfg.out`: config.yaml, metrics.jsonl (`train/loss`, `train/step_accuracy`, `lr`,
    `time/step_s`, `eval/*`), checkpoints/step-K every `cfg.save_every` steps and at the end (HF format with
    `step_tag` and `step_separator` in config.json, loads with `process_reward_model`, plus trainer_state.pt; the
    `cfg.keep_checkpoints` most recent kept), plots/prm_train.png and summary.json. The directory is opened with
    `RunDir.start` once the data and backbone load; "resume" continues from its newest valid checkpoint and logs what
    the uninterrupted run logs (see `rm.fit.fit`), "overwrite" replaces the run there.

    Raises:
        ValueError / FileNotFoundError: bad data (FILE:LINE), a bad step tag, an unknown backbone, or no row that
            fits `train.max_length`; `RunDirError`: the directory holds a run and `mode` is "new", is in use, or has
            nothing to resume.
    """
    t = cfg.train
    check_step_tag(t.step_tag)
    train_rows = load_step_rows(cfg.data)
    eval_rows = load_step_rows(cfg.eval_data) if cfg.eval_data else []
    apply_threads(cfg.threads)
    model, tokenizer = load_backbone(cfg.model.path, "token", device=cfg.model.device,
                                     tiny_arch=cfg.model.tiny.model_dump(), seed=cfg.seed)
    limit = getattr(model.config, "max_position_embeddings", None)
    max_length = min(t.max_length, limit) if limit else t.max_length
    train_rows, train_enc, dropped = encode_rows(tokenizer, train_rows, t.step_tag, max_length)
    eval_rows, eval_enc, eval_dropped = encode_rows(tokenizer, eval_rows, t.step_tag, max_length)
    if not train_rows:
        raise ValueError(f"{cfg.data}: no row fits train.max_length={max_length} tokens")
    model.config.step_tag = t.step_tag
    model.config.step_separator = t.separator
    # Opened only once the data and backbone load.
    with open_fit_run(cfg, mode=mode) as (run, start_step, checkpoint, rng):
        wall0 = time.perf_counter()
        objective = _prm_objective(model, tokenizer, train_rows, train_enc, eval_rows, eval_enc, t.batch_size)
        checkpoints = FitCheckpoints(run, lambda d: (model.save_pretrained(d), tokenizer.save_pretrained(d)),
                                     save_every=cfg.save_every, keep=cfg.keep_checkpoints, resume_from=checkpoint)
        step, last, last_eval, final = fit(model, t, len(train_rows), objective, checkpoints, rng=rng,
                                           name="PRM train", show_progress=show_progress)
        run.plot(["train/loss", "train/step_accuracy", "eval/step_accuracy"], "prm_train.png")
        summary = {"stage": "prm_train", "backbone": cfg.model.path, "steps": step, "train_rows": len(train_rows),
                   "train_rows_too_long": dropped, "eval_rows": len(eval_rows), "eval_rows_too_long": eval_dropped,
                   "step_tag": t.step_tag, "wall_s": time.perf_counter() - wall0,
                   "final_train": {k: v for k, v in last.items() if not k.startswith("eval/")},
                   "final_eval": last_eval, "final_checkpoint": str(final),
                   "resumed_from": start_step if mode == "resume" else None}
        run.write_summary(summary)
    return summary


def _prm_objective(model, tokenizer, train_rows: list, train_enc: list, eval_rows: list, eval_enc: list,
                   batch_size: int) -> FitObjective:
    """What `fit` minimises for a PRM: `prm_loss` over the step tags' logits, a mean over steps; `train/step_accuracy`
    per step; `evaluate_steps` on the eval rows (no evaluation without them)."""

    def evaluate() -> dict[str, float]:
        res = evaluate_steps(model, tokenizer, eval_rows, eval_enc, batch_size=batch_size)
        return {f"eval/{k}": v for k, v in res.items()}

    def batch_loss(idx: Sequence[int]) -> tuple[torch.Tensor, tuple[int, int]]:
        z = torch.cat(step_logits(model, [train_enc[i] for i in idx], tokenizer.pad_token_id))
        y = torch.tensor([v for i in idx for v in train_rows[i].labels], device=z.device)
        return prm_loss(z, y), (int(((z.detach() >= 0) == (y >= 0.5)).sum()), int(y.numel()))

    def batch_metrics(records: list[tuple[int, int]]) -> dict[str, float]:
        return {"train/step_accuracy": sum(r for r, _ in records) / max(sum(n for _, n in records), 1)}

    def steps_of(idx: Sequence[int]) -> int:  # prm_loss is a mean over steps
        return sum(len(train_rows[i].labels) for i in idx)

    return FitObjective(batch_loss, batch_metrics, progress_key="train/step_accuracy", units=steps_of,
                        evaluate=evaluate if eval_rows else None)
