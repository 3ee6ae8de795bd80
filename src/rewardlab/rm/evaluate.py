"""`rewardlab rm eval`: evaluate any scorer — a registered reward, a Bradley–Terry model, a PRM, a judge — on
preference pairs, best-of-k rows and step-labelled solutions, with the length-bias and master-key probes.

Writes report.json, a table on stdout, and plots (score histograms of chosen vs rejected; accuracy per subset).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any


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
from rewardlab.rewards import build_reward
from rewardlab.rewards.model import ProcessRewardModel, RewardModel, is_process_model
from rewardlab.rm.data import BestOfK, Pair, StepRow, make_rollout
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
