"""Reward-model metrics: pairwise accuracy (RewardBench), best-of-k (RewardBench 2), first-error F1 (ProcessBench).

All functions take plain Python sequences of scores or labels and return floats or dicts; they never see a model,
so any scorer (a reward function, a Bradley–Terry model, a PRM, a judge) is evaluated the same way.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float:
    """Fraction of pairs where the chosen response scores strictly higher (RewardBench, Lambert et al. 2024).

    accuracy = (1/N) sum_i [chosen_i > rejected_i]; a tie counts as wrong, and so does a NaN score.

    Args:
        chosen: [N] scores of the preferred responses.
        rejected: [N] scores of the dispreferred responses, pairwise with `chosen`.
    Returns:
        accuracy in [0, 1].
    Raises:
        ValueError: if the lengths differ or there are no pairs.
    """
    if len(chosen) != len(rejected):
        raise ValueError(f"pairwise_accuracy: {len(chosen)} chosen scores but {len(rejected)} rejected scores")
    if not chosen:
        raise ValueError("pairwise_accuracy: no pairs")
    return sum(float(c) > float(r) for c, r in zip(chosen, rejected)) / len(chosen)


def best_of_k_accuracy(scores: Sequence[Sequence[float]]) -> float:
    """Best-of-k accuracy with ties shared (RewardBench 2, Malik et al. 2025).

    Per prompt i, scores[i][0] is the chosen response and scores[i][1:] the rejected ones. The prompt scores 1/m when
    the chosen is among the m responses tied for the top score, else 0; the result is the mean over prompts.
    With 1 chosen and 3 rejected (best-of-4) a random scorer gets 0.25.

    Args:
        scores: [N][k] scores, k >= 2 per prompt (k may vary).
    Returns:
        accuracy in [0, 1].
    Raises:
        ValueError: no prompts, or a prompt with fewer than 2 scores (named by index).
    """
    if not scores:
        raise ValueError("best_of_k_accuracy: no prompts")
    total = 0.0
    for i, row in enumerate(scores):
        if len(row) < 2:
            raise ValueError(f"best_of_k_accuracy: prompt {i} has {len(row)} score(s); need the chosen and >= 1 rejected")
        vals = [float(v) for v in row]
        if any(math.isnan(v) for v in vals):
            continue  # a NaN score cannot win
        top = max(vals)
        if vals[0] == top:
            total += 1.0 / sum(v == top for v in vals)
    return total / len(scores)


def first_error_f1(predicted: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """First-error identification (ProcessBench, Zheng et al. 2024).

    A label is the index of the first wrong step, -1 when every step is correct; a prediction is right when it
    names the same index (-1 included).
    error_acc = accuracy on solutions with label >= 0; correct_acc = accuracy on solutions with label -1;
    f1 = 2 * error_acc * correct_acc / (error_acc + correct_acc) (0 when both are 0).

    Args:
        predicted: [N] predicted first-error indices (-1: no error).
        labels: [N] true first-error indices (-1: no error).
    Returns:
        {"error_acc", "correct_acc", "f1"} in [0, 1], plus "n_error" and "n_correct" (counts). An accuracy over an
        empty group is NaN, and so is the F1 then.
    Raises:
        ValueError: if the lengths differ, there are no solutions, or a label is below -1.
    """
    if len(predicted) != len(labels):
        raise ValueError(f"first_error_f1: {len(predicted)} predictions but {len(labels)} labels")
    if not labels:
        raise ValueError("first_error_f1: no solutions")
    if any(int(y) < -1 for y in labels):
        raise ValueError("first_error_f1: labels must be step indices >= 0 or -1 (no error)")
    err = [int(p) == int(y) for p, y in zip(predicted, labels) if int(y) >= 0]
    ok = [int(p) == int(y) for p, y in zip(predicted, labels) if int(y) == -1]
    error_acc = sum(err) / len(err) if err else math.nan
    correct_acc = sum(ok) / len(ok) if ok else math.nan
    if math.isnan(error_acc) or math.isnan(correct_acc):
        f1 = math.nan
    elif error_acc + correct_acc == 0:
        f1 = 0.0
    else:
        f1 = 2 * error_acc * correct_acc / (error_acc + correct_acc)
    return {"error_acc": error_acc, "correct_acc": correct_acc, "f1": f1, "n_error": len(err), "n_correct": len(ok)}


def predict_first_error(step_scores: Sequence[float], threshold: float) -> int:
    """The first step whose score is below `threshold`, or -1 when none is (how scalar step scores become labels).

    An outcome-only scorer is the case of one score on the last step: it predicts the last step when its score is
    below the threshold, else -1 (pass `[..., score]` with the earlier entries +inf, or see `outcome_step_scores`).
    """
    for i, s in enumerate(step_scores):
        if float(s) < threshold:
            return i
    return -1


def outcome_step_scores(score: float, n_steps: int) -> list[float]:
    """Step scores for an outcome-only scorer: +inf on every step but the last, which gets `score`."""
    return [math.inf] * (n_steps - 1) + [float(score)]


def choose_threshold(step_scores: Sequence[Sequence[float]], labels: Sequence[int]) -> tuple[float, dict[str, float]]:
    """The threshold on step scores that maximizes first-error F1 on a dev split, and its metrics there.

    Candidates: every midpoint between consecutive distinct finite scores, plus one below and one above all of them
    (predict "no error" everywhere / "first step" everywhere). Ties in F1 go to the smallest threshold. NaN F1
    counts as -1 in the comparison.

    Args:
        step_scores: [N][S_i] scores (higher = more likely correct).
        labels: [N] first-error labels (-1: none).
    Returns:
        (threshold, first_error_f1 dict on the dev split).
    Raises:
        ValueError: no solutions or mismatched lengths.
    """
    if len(step_scores) != len(labels) or not labels:
        raise ValueError(f"choose_threshold: {len(step_scores)} score lists and {len(labels)} labels")
    values = sorted({float(s) for row in step_scores for s in row if math.isfinite(float(s))})
    if not values:
        values = [0.0]
    candidates = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    best: tuple[float, float, dict[str, float]] | None = None
    for t in candidates:
        res = first_error_f1([predict_first_error(row, t) for row in step_scores], labels)
        key = -1.0 if math.isnan(res["f1"]) else res["f1"]
        if best is None or key > best[0]:
            best = (key, t, res)
    assert best is not None
    return best[1], best[2]


def per_subset(values: Sequence[float], subsets: Sequence[Hashable]) -> dict[str, Any]:
    """Mean of `values` per subset, the count-weighted mean (= the overall mean) and the unweighted mean of subsets.

    Returns:
        {"subsets": {name: {"n": count, "mean": value}}, "weighted_mean": sum_s n_s m_s / sum_s n_s,
         "macro_mean": (1/S) sum_s m_s, "n": total count}.
    Raises:
        ValueError: mismatched lengths or no values.
    """
    if len(values) != len(subsets) or not values:
        raise ValueError(f"per_subset: {len(values)} values and {len(subsets)} subset names")
    groups: dict[str, list[float]] = {}
    for v, s in zip(values, subsets):
        groups.setdefault(str(s), []).append(float(v))
    table = {k: {"n": len(v), "mean": sum(v) / len(v)} for k, v in sorted(groups.items())}
    n = len(values)
    return {
        "subsets": table,
        "weighted_mean": sum(t["n"] * t["mean"] for t in table.values()) / n,
        "macro_mean": sum(t["mean"] for t in table.values()) / len(table),
        "n": n,
    }
