"""Automatic step labels (`rewardlab prm label`): Monte Carlo estimation and binary search for the first error.

- Monte Carlo estimation (Wang et al. 2024, "Math-Shepherd"): the value of step i of a solution is estimated by
  sampling k completions from the policy after the prefix steps[0..i]; soft label = fraction of the k completions
  whose final answer is correct, hard label = 1 if any is.
- Binary search (Luo et al. 2024, "OmegaPRM"): assuming a prefix's value stays 0 once a wrong step is in it, the first
  step whose prefix has Monte Carlo value 0 is found with ceil(log2 S) prefix evaluations instead of S - 1.

The last step's prefix is the whole solution: its value is the verifier's verdict on it (no rollouts). Rollouts are
counted (`PrefixEstimator.rollouts`), so the two methods' costs can be compared and a budget enforced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


from rewardlab.rewards.steps import answer_correct, check_steps, first_error, row_expression, row_final
from rewardlab.rm.data import make_rollout
from rewardlab.tasks.steps import parse_chain
from rewardlab.types import split_steps

METHODS = ("mc", "binary", "reference")


@dataclass
class Solution:
    """A solution to label: the task prompt, its task row (for the verifier), and its steps (texts without the
    separator; `separator.join(steps)` is the solution text)."""

    prompt: str
    row: dict[str, Any]
    steps: list[str]
    rollouts: int = 0
    values: dict[int, float] = field(default_factory=dict)


def solution_steps(completion: str, separator: str = "\n") -> list[str]:
    """Steps of a completion for labelling: the `split_steps` pieces, each without one trailing separator.

    Example: solution_steps("3+4=7\\n7-2=5") -> ["3+4=7", "7-2=5"]; `separator.join` gives the text back (a
    trailing separator aside).
    """
    pieces = [completion[a:b] for a, b in split_steps(completion, separator)]
    return [p[: -len(separator)] if p.endswith(separator) else p for p in pieces]


class PrefixEstimator:
    """Monte Carlo value of solution prefixes under a policy and a verifier.

    value(solution, i) = (1/k) sum_{j=1..k} correct(steps[0..i] + continuation_j), continuation_j ~ policy(. | prompt,
    steps[0..i]); for the last step, value = correct(solution) (no sampling).

    Args:
        policy: anything with `generate(prompts, n=, temperature=, top_p=, max_new_tokens=, rows=)` returning
            Rollouts prompt-major (`n` per prompt) whose `completion` continues the given text; the prompt passed
            is the task prompt followed by the prefix (so the policy must format prompts as raw text).
        verifier: a Reward; a text is correct when its output is `correct`.
        k: continuations per prefix.
        separator: step separator; a prefix is `separator.join(steps[:i+1]) + separator`.
        batch_size: prefixes per `generate` call.
    Attributes:
        rollouts: continuations sampled so far; evaluations: prefixes evaluated by sampling so far.
    Raises:
        ValueError: k < 1, or a policy whose prompts go through a chat template (a partial assistant turn cannot be
            continued through `Policy.generate`).
    """

    def __init__(self, policy, verifier, *, k: int, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 32, separator: str = "\n", batch_size: int = 64) -> None:
        if k < 1:
            raise ValueError(f"label.k: must be >= 1, got {k}")
        if getattr(policy, "prompt_format", "raw") == "chat":
            raise ValueError("prm label: the policy formats prompts with a chat template; Monte Carlo continuation "
                             "of a partial solution needs model.prompt_format=raw")
        self.policy, self.verifier, self.k = policy, verifier, k
        self.gen = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens}
        self.separator, self.batch_size = separator, batch_size
        self.rollouts = 0
        self.evaluations = 0

    def _correct(self, rollouts) -> list[bool]:
        return [o.correct for o in self.verifier(rollouts)]

    def values(self, items: Sequence[tuple[Solution, int]]) -> list[float]:
        """Values of prefixes (solution, step index), in order; also stored in `solution.values[i]`."""
        out: list[float | None] = [None] * len(items)
        last = [j for j, (sol, i) in enumerate(items) if i == len(sol.steps) - 1]
        if last:
            verdicts = self._correct([make_rollout(items[j][0].prompt, self.separator.join(items[j][0].steps),
                                                   items[j][0].row) for j in last])
            for j, ok in zip(last, verdicts):
                out[j] = float(ok)
        todo = [j for j in range(len(items)) if out[j] is None]
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s : s + self.batch_size]
            prefixes = [self.separator.join(items[j][0].steps[: items[j][1] + 1]) + self.separator for j in chunk]
            rollouts = self.policy.generate([items[j][0].prompt + p for j, p in zip(chunk, prefixes)], n=self.k,
                                            rows=[items[j][0].row for j in chunk], **self.gen)
            full = [dataclasses.replace(r, completion=prefixes[q // self.k] + r.completion)
                    for q, r in enumerate(rollouts)]
            ok = self._correct(full)
            for q, j in enumerate(chunk):
                out[j] = sum(ok[q * self.k : (q + 1) * self.k]) / self.k
                items[j][0].rollouts += self.k
            self.rollouts += self.k * len(chunk)
            self.evaluations += len(chunk)
        for (sol, i), v in zip(items, out):
            sol.values[i] = v  # type: ignore[assignment]
        return out  # type: ignore[return-value]


def monte_carlo_labels(estimator: PrefixEstimator, solutions: Sequence[Solution]) -> list[list[float]]:
    """Math-Shepherd labels: the Monte Carlo value of every step prefix of each solution ([S_i] floats in [0, 1]).

    Cost: k * (S_i - 1) rollouts per solution (the last step is verified directly).
    """
    items = [(sol, i) for sol in solutions for i in range(len(sol.steps))]
    values = estimator.values(items)
    out, pos = [], 0
    for sol in solutions:
        out.append(values[pos : pos + len(sol.steps)])
        pos += len(sol.steps)
    return out


def first_zero(values: Sequence[float]) -> int:
    """The first step whose value is 0 (the full scan's first error), -1 when none is: `rewards.steps.first_error`
    with the outcome taken as right (an MC value of 0 is the only sign of an error here)."""
    return first_error(values, True) if values else -1


def search_cost(n_steps: int) -> int:
    """Most prefix evaluations the binary search spends on an S-step solution: ceil(log2 S) (0 for S = 1)."""
    return math.ceil(math.log2(n_steps)) if n_steps > 1 else 0


def binary_search_first_errors(estimator: PrefixEstimator, solutions: Sequence[Solution]) -> list[int]:
    """OmegaPRM's binary search for the first step whose prefix has Monte Carlo value 0; -1 when the solution is
    correct (the whole-solution prefix has value > 0).

    Invariant: value(prefix lo) > 0 (lo = -1 is the empty prefix, assumed solvable) and value(prefix hi) = 0; each
    round evaluates mid = (lo + hi) // 2 and moves one end, until hi = lo + 1; then hi is the first error. All
    solutions advance in lockstep so each round is one batched generation. At most ceil(log2 S) sampled prefix
    evaluations per solution (k rollouts each), against S - 1 for the full scan.
    """
    finals = estimator.values([(sol, len(sol.steps) - 1) for sol in solutions])
    bounds = {j: [-1, len(sol.steps) - 1] for j, (sol, v) in enumerate(zip(solutions, finals)) if v <= 0.0}
    result = [-1] * len(solutions)
    while True:
        active = [j for j, (lo, hi) in bounds.items() if hi - lo > 1]
        if not active:
            break
        mids = {j: (bounds[j][0] + bounds[j][1]) // 2 for j in active}
        values = estimator.values([(solutions[j], mids[j]) for j in active])
        for j, v in zip(active, values):
            bounds[j][0 if v > 0.0 else 1] = mids[j]
    for j, (_, hi) in bounds.items():
        result[j] = hi
    return result


def reference_first_error(row: dict[str, Any], steps: Sequence[str]) -> int:
    """The exact first error of a worked `+`/`-` chain solution to `row` (`rewards.steps.first_error`), -1 if none.

    Step scores are `check_steps(steps, expression, cumulative=True)` on the row's `expression` or
    `metadata.expression`; the outcome is right when the last step's final answer equals the row's final answer
    (`row_final`: `final`, else `answer`) and the solution has as many steps as the worked solution (one per term
    after the first; one for a one-term chain). So a wrong result, term or left operand is the first error, a
    solution that stops early is wrong at its last step (even when a partial sum equals the answer, as "3+4=7" for
    3+4-0), and one that goes on past the end is wrong at its first extra step.

    Example: row of "3 + 4 - 2" (final "5"): ["3+4=7", "7-2=5"] -> -1; ["3+4=7", "8-2=6"] -> 1; ["3+4=7"] -> 0.

    Raises:
        ValueError: (one line, naming label.method=reference) a row without an expression or a final answer, an
            expression that is not an integer `+`/`-` chain, or no steps.
    """
    expression, final, n_worked = reference_chain(row)
    try:
        scores = check_steps(list(steps), expression, cumulative=True)
        return first_error(scores, len(steps) == n_worked and answer_correct(steps[-1], final))
    except ValueError as exc:
        raise ValueError(f"label.method=reference: {exc}") from None


def reference_chain(row: dict[str, Any]) -> tuple[str, Any, int]:
    """What `reference_first_error` reads from a row: (its `+`/`-` chain expression, its final answer, the number of
    steps of the worked solution).

    Raises:
        ValueError: (one line, naming label.method=reference) no expression or final answer, or an expression that
            is not an integer `+`/`-` chain.
    """
    try:
        expression, final = row_expression(row), row_final(row)
    except KeyError as exc:
        raise ValueError(f"label.method=reference: {exc.args[0]}; it needs rows with an integer +/- chain, e.g. "
                         "reasoning_gym:chain_sum with target: steps, or worked:chain_sum") from None
    try:
        return expression, final, max(1, len(parse_chain(expression)[1]))
    except ValueError as exc:
        raise ValueError(f"label.method=reference: {exc}") from None


def labels_from_first_error(n_steps: int, first: int) -> list[float]:
    """Hard labels from a first-error index: 1 before it, 0 from it on; all 1 when first is -1."""
    return [1.0] * n_steps if first < 0 else [1.0] * first + [0.0] * (n_steps - first)


def label_solutions(method: str, estimator: PrefixEstimator | None, solutions: Sequence[Solution], *,
                    kind: str = "soft") -> list[dict[str, Any]]:
    """Label solutions with `method`; one PRM-training row per solution.

    - "mc": every step gets its Monte Carlo value (`kind` "soft") or 1 if it is > 0 (`kind` "hard").
    - "binary": steps up to the first error (found by binary search) are kept, labelled 1 ... 1, 0; a correct
      solution keeps all its steps, labelled 1 (OmegaPRM labels no step after the first error).
    - "reference": exact labels from the step checker (`reference_first_error`: `check_steps` on the row's
      expression, the outcome from its final answer); no rollouts. Rows of `reasoning_gym:chain_sum` with
      `target: steps` and of `worked:chain_sum`.

    Returns:
        rows {prompt, steps, labels, method, first_error, rollouts, values (the Monte Carlo values computed, by
        step index), row}, plus `reference_first_error` (the exact first error of the whole solution) when the row
        has an integer `+`/`-` chain as its expression.
    Raises:
        ValueError: unknown method or kind; "reference" on a row without such an expression (see
            `reference_first_error`).
    """
    if method not in METHODS:
        raise ValueError(f"label.method: expected one of {METHODS}, got {method!r}")
    if kind not in ("soft", "hard"):
        raise ValueError(f"label.kind: expected 'soft' or 'hard', got {kind!r}")
    rows = []
    if method == "reference":
        for sol in solutions:
            first = reference_first_error(sol.row, sol.steps)
            rows.append({"steps": sol.steps, "labels": labels_from_first_error(len(sol.steps), first), "first_error": first})
    elif method == "mc":
        assert estimator is not None
        for sol, values in zip(solutions, monte_carlo_labels(estimator, solutions)):
            labels = values if kind == "soft" else [float(v > 0.0) for v in values]
            rows.append({"steps": sol.steps, "labels": labels, "first_error": first_zero(values)})
    else:
        assert estimator is not None
        for sol, first in zip(solutions, binary_search_first_errors(estimator, solutions)):
            steps = sol.steps if first < 0 else sol.steps[: first + 1]
            rows.append({"steps": steps, "labels": labels_from_first_error(len(steps), first), "first_error": first})
    out = []
    for sol, r in zip(solutions, rows):
        extra = {}
        if method == "reference":
            extra["reference_first_error"] = r["first_error"]
        else:  # the exact first error of the whole solution, for comparison, where the row has a +/- chain
            try:
                extra["reference_first_error"] = reference_first_error(sol.row, sol.steps)
            except ValueError:
                pass
        out.append(dict(prompt=sol.prompt, method=method, rollouts=sol.rollouts,
                        values={str(i): v for i, v in sorted(sol.values.items())}, **r, **extra, row=sol.row))
    return out


def worst_case_rollouts(method: str, n_steps: int, k: int) -> int:
    """Most rollouts `method` spends on an S-step solution: k(S-1) for "mc", k ceil(log2 S) for "binary", 0 else."""
    if method == "mc":
        return k * (n_steps - 1)
    if method == "binary":
        return k * search_cost(n_steps)
    return 0
