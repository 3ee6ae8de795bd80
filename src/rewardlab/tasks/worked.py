"""Worked solutions: reasoning-gym tasks whose target writes the reasoning out as steps, one per line.

`worked:chain_sum` is reasoning-gym `chain_sum` with the compact prompt (`3+4-2=`) and, as the target, the running
partial sums, one step per line:

    prompt  3+4-2=
    answer  3+4=7
            7-2=5          (steps separated by "\\n"; the final answer is the number after the last "=")

Each step is checkable on its own, so a solution's first wrong step is known exactly (`first_error`). Reward models
use this for process labels with a ground truth; SFT on it gives a policy whose completions have steps.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task
from rewardlab.tasks.reasoning_gym import load_reasoning_gym

_TERM = re.compile(r"([+-]?)\s*(\d+)")


def chain_sum_steps(expression: str) -> list[str]:
    """The partial-sum steps of a chain sum, e.g. "3 + 4 - 2" -> ["3+4=7", "7-2=5"].

    Step i is `{s_i}{op}{t}={s_(i+1)}` where s_1 is the first term and s_(i+1) = s_i op t (integers).
    A one-term expression has the single step "t=t".

    Raises:
        ValueError: if `expression` is not terms joined by + and -.
    """
    text = expression.replace(" ", "")
    if not text or not re.fullmatch(r"[+-]?\d+([+-]\d+)*", text):
        raise ValueError(f"chain_sum expression {expression!r}: expected integers joined by + and -")
    terms = [(sign or "+", int(num)) for sign, num in _TERM.findall(text)]
    total = terms[0][1] * (-1 if terms[0][0] == "-" else 1)
    if len(terms) == 1:
        return [f"{total}={total}"]
    steps = []
    for op, t in terms[1:]:
        new = total + t if op == "+" else total - t
        steps.append(f"{total}{op}{t}={new}")
        total = new
    return steps


#: dataset name -> function(row) returning the reference steps.
WORKED: dict[str, Callable[[Row], list[str]]] = {
    "chain_sum": lambda row: chain_sum_steps(row["metadata"]["expression"]),
}


def _norm(step: str) -> str:
    return re.sub(r"\s+", "", step)


def first_error(reference_steps: Sequence[str], steps: Sequence[str]) -> int:
    """Index of the first wrong step of a worked solution, -1 when every step is right (ProcessBench convention).

    Step i is right when it equals reference step i (whitespace ignored): a step with a wrong result, a wrong term,
    or a left operand that is not the previous partial sum is wrong. A solution that stops early has its last step
    wrong (it states a wrong final answer); one that goes on past the reference has its first extra step wrong.

    Raises:
        ValueError: if `steps` is empty (a solution without steps has no step to blame).
    """
    if not steps:
        raise ValueError("first_error: the solution has no steps")
    for i, step in enumerate(steps):
        if i >= len(reference_steps) or _norm(step) != _norm(reference_steps[i]):
            return i
    return len(steps) - 1 if len(steps) < len(reference_steps) else -1


def final_number(text: str) -> str:
    """The final answer of a worked solution: the text after the last "=", stripped (the whole text if none)."""
    return text.rsplit("=", 1)[-1].strip()


@register_loader("worked")
def load_worked(name: str, **options: Any) -> Task:
    """Load `worked:NAME`: reasoning-gym dataset NAME with compact prompts and worked-solution targets.

    Args:
        name: a dataset with a worked-solution writer in `WORKED` (only `chain_sum` now).
        **options: the options of `reasoning_gym:NAME` (size, seed, test_size and the dataset's own fields);
            `template` is always "compact".
    Returns:
        Task whose rows hold `prompt` (`3+4-2=`), `answer` (the worked solution, steps joined by "\\n": the SFT
        target), `final` (the final answer, e.g. "5"), `reference_steps` and the reasoning-gym fields; its reward is
        `worked_answer`.
    Raises:
        ValueError: an unknown dataset, a `template` option, or what `reasoning_gym:NAME` raises.
    """
    if name not in WORKED:
        raise ValueError(f"task worked:{name}: no worked-solution writer; valid: {', '.join(sorted(WORKED))}")
    if "template" in options:
        raise ValueError(f"task worked:{name}: option 'template' is fixed to 'compact'")
    base = load_reasoning_gym(name, template="compact", **options)

    def convert(row: Row) -> Row:
        steps = WORKED[name](row)
        return dict(row, final=row["answer"], answer="\n".join(steps), reference_steps=steps)

    return Task(
        name=f"worked:{name}",
        train=[convert(r) for r in base.train],
        test=[convert(r) for r in base.test],
        reward="worked_answer",
        info=dict(base.info, template="compact", target="worked"),
    )
