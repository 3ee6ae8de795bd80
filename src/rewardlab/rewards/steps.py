"""Step-checking rewards: a worked arithmetic solution judged step by step (a process reward without a model); and
`STEP_AGGREGATIONS`, the reductions of a solution's step scores to one score (shared by the PRM reward and search).

One implementation for the worked `+`/`-` chains of `reasoning_gym:NAME` with `target="steps"` and of its preset
`worked:NAME`: `check_steps` scores the steps, `final_answer` / `answer_correct` the outcome, `first_error` turns
the two into the index of the first wrong step (`rm.labels`, label.method=reference). Rewards: `arithmetic_steps`
(step scores and outcome) and `worked_answer` (outcome only).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from rewardlab.registry import Registry
from rewardlab.rewards.base import reward
from rewardlab.rewards.extract import extract_tagged_answer
from rewardlab.tasks.steps import parse_chain
from rewardlab.types import RewardOutput, split_steps

#: Step-score aggregations for whole solutions (Snell et al. 2024; search-and-learn, Beeching et al. 2024):
#: min over steps, the last step's score, the product over steps, the mean over steps. `fn(scores) -> float`.
#: Used by `process_reward_model` (its `aggregate` option) and by search (`search.aggregate`).
STEP_AGGREGATIONS: Registry[Callable[[Sequence[float]], float]] = Registry("step-score aggregation",
                                                                           reserved=("scores",))


@STEP_AGGREGATIONS.register("min")
def _min(scores: Sequence[float]) -> float:
    return float(min(scores))


@STEP_AGGREGATIONS.register("last")
def _last(scores: Sequence[float]) -> float:
    return float(scores[-1])


@STEP_AGGREGATIONS.register("prod")
def _prod(scores: Sequence[float]) -> float:
    return float(math.prod(scores))


@STEP_AGGREGATIONS.register("mean")
def _mean(scores: Sequence[float]) -> float:
    return float(sum(scores) / len(scores))


def aggregate_steps(scores: Sequence[float], how: str) -> float:
    """One score from step scores with `STEP_AGGREGATIONS[how]`: `min`, `last`, `prod` (product) or `mean`.

    Raises:
        ValueError: an unknown `how`, or no scores.
    """
    if how not in STEP_AGGREGATIONS:
        raise ValueError(f"aggregate: expected one of {tuple(STEP_AGGREGATIONS)}, got {how!r}")
    if not scores:
        raise ValueError("aggregate: no step scores")
    return STEP_AGGREGATIONS[how](scores)


_STEP = re.compile(r"(-?\d+)([+-])(\d+)=(-?\d+)")
_INT = re.compile(r"-?\d+")


def final_answer(completion: str) -> str:
    """The final answer of a completion: the last `<answer>` tag's content if there is one; otherwise the text
    after the last "=" of the last non-blank line, else that whole line; stripped.

    Examples: "3+4=7\\n7-2=5" -> "5"; "12" -> "12"; "so x = 1/2" -> "1/2"; "" -> "".
    """
    if "<answer>" in completion:
        return extract_tagged_answer(completion)
    lines = [line for line in completion.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1].rpartition("=")[2].strip()


def row_expression(row: dict[str, Any]) -> str:
    """The integer `+`/`-` chain a row asks for: its `expression` field, else its `metadata.expression`.

    Raises:
        KeyError: when the row has neither.
    """
    if "expression" in row:
        return str(row["expression"])
    meta = row.get("metadata")
    if isinstance(meta, dict) and "expression" in meta:
        return str(meta["expression"])
    raise KeyError("the row has neither 'expression' nor 'metadata.expression'")


def row_final(row: dict[str, Any]) -> Any:
    """The final answer of a row: its `final` field when it has one (`worked:NAME` rows, whose `answer` is the worked
    solution), else its `answer` (`reasoning_gym:NAME` rows, with or without `target="steps"`).

    Raises:
        KeyError: when the row has neither.
    """
    if "final" in row:
        return row["final"]
    if "answer" in row:
        return row["answer"]
    raise KeyError("the row has neither 'final' nor 'answer'")


def answer_correct(completion: str, answer: Any) -> bool:
    """True when the completion's `final_answer` equals `answer` as an integer; a side that is not an integer makes
    it False (not an error).

    Examples: ("3+4=7\\n7-2=5", "5") -> True; ("3+4=7\\n7-2=5", 6) -> False; ("7-2=x", "5") -> False.
    """
    try:
        return int(final_answer(completion)) == int(str(answer).strip())
    except ValueError:
        return False


def check_steps(steps: list[str], expression: str, cumulative: bool = True) -> list[float]:
    """1.0/0.0 per step of a worked `+`/`-` chain (the format of `tasks.steps.worked_steps`).

    Step k (0-based) is right when, with whitespace removed, it reads `a<op>b=c` where `a` is the previous step's
    written result (the chain's first term for k = 0: continuity), `<op>b` is term k+1 of the chain, and
    c = a <op> b (arithmetic). A one-term chain has one step, the term itself ("8"). A step past the chain's last
    term is wrong. With `cumulative` (default) a step is scored 1 only when it and every step before it are right
    (the first-error convention of PRM800K, Lightman et al. 2023, and Math-Shepherd, Wang et al. 2024: a solution
    that went wrong stays wrong); otherwise each step is judged on its own.

    Example: expression "3 + 4 - 2", steps ["3+4=8\\n", "8-2=6"] -> [0.0, 0.0] (cumulative) or [0.0, 1.0].

    Raises:
        ValueError: when `expression` is not an integer `+`/`-` chain.
    """
    first, terms = parse_chain(expression)
    scores: list[float] = []
    previous: int | None = first
    ok_so_far = True
    for k, text in enumerate(steps):
        compact = re.sub(r"\s+", "", text)
        m = _STEP.fullmatch(compact)
        ok = False
        if m is not None and k < len(terms):
            a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
            ok = a == previous and (op, b) == terms[k] and c == (a + b if op == "+" else a - b)
        elif not terms and k == 0:  # a one-term chain is worked as the term itself ("8", as `worked_steps` writes it)
            ok = _INT.fullmatch(compact) is not None and int(compact) == first
        previous = int(m.group(4)) if m is not None else None
        ok_so_far = ok_so_far and ok
        scores.append(float(ok_so_far if cumulative else ok))
    return scores


def first_error(step_scores: Sequence[float], correct: bool) -> int:
    """Index of the first wrong step of a solution, -1 when it has none (the ProcessBench label, Zheng et al. 2024).

    The first step whose score is 0 (`check_steps` scores, cumulative or not: the first 0 is the same); when no step
    scores 0 but the outcome is wrong (a solution that stops early: every step it wrote is right, its final answer
    is not), its last step, which states the wrong answer; -1 when no step scores 0 and the outcome is right.

    Examples: ([1, 0, 0], False) -> 1; ([1, 1], False) -> 1; ([1, 1], True) -> -1.

    Args:
        step_scores: [S] floats, 1.0 (right) or 0.0 (wrong) per step.
        correct: whether the solution's outcome is right.
    Raises:
        ValueError: when `step_scores` is empty (a solution without steps has no step to blame).
    """
    if not step_scores:
        raise ValueError("first_error: the solution has no steps")
    wrong = next((i for i, s in enumerate(step_scores) if s <= 0.0), -1)
    return wrong if wrong >= 0 or correct else len(step_scores) - 1


@reward(name="arithmetic_steps", row_fields=(("expression", "metadata"),))
def arithmetic_steps(
    completion: str, answer: Any, row: dict, steps: list[str], cumulative: bool = True, separator: str = "\n"
) -> RewardOutput:
    """Check a worked `+`/`-` chain step by step (rows of `reasoning_gym:chain_sum` with `target="steps"` or of
    `worked:chain_sum`, or any row with an `expression` field such as "3 + 4 - 2").

    Steps are the rollout's `step_text` when marked (`Policy.mark_steps`), else `split_steps(completion,
    separator)`. `step_scores` = `check_steps(steps, expression, cumulative)` (1/0 per step). `score` = `correct` =
    1.0 when the final answer (`final_answer`: the result after the last "=") equals the row's final answer
    (`row_final`: `final` when the row has it, else `answer`) as an integer (`answer_correct`). Components:
    `correct`, `steps_correct` (fraction of step scores equal to 1; 0 with no steps), `n_steps`. A row without an
    expression is an error ("arithmetic_steps: KeyError: ...").
    """
    if not steps:
        steps = [completion[a:b] for a, b in split_steps(completion, separator)]
    step_scores = check_steps(steps, row_expression(row), cumulative)
    correct = float(answer_correct(completion, row.get("final", answer)))
    components = {
        "correct": correct,
        "steps_correct": sum(step_scores) / len(step_scores) if step_scores else 0.0,
        "n_steps": float(len(step_scores)),
    }
    return RewardOutput(score=correct, components=components, step_scores=step_scores)


@reward(name="worked_answer", row_fields=(("final", "answer"),))
def worked_answer(completion: str, row: dict) -> dict:
    """The outcome half of `arithmetic_steps`: 1.0 when the completion's final answer equals the row's final answer
    (`row_final`: `final`, else `answer`) as an integer (`answer_correct`), else 0.0; no step scores.

    The verifier of `worked:NAME` tasks (whose `answer` is the worked solution and `final` the number); it reads
    `reasoning_gym:NAME` rows too. A final answer that is not an integer scores 0 (not an error); a row with neither
    `final` nor `answer` is an error. Components: `correct` (same value).
    """
    value = float(answer_correct(completion, row_final(row)))
    return {"score": value, "correct": value}
