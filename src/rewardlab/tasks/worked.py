"""`worked:NAME`: a preset of `reasoning_gym:NAME` with `template="compact"` and `target="steps"` whose rows train
on the worked solution by default.

    prompt  3+4-2=
    answer  3+4=7
            7-2=5          (the row's `target`: steps separated by "\\n", `tasks.steps.worked_steps`)
    final   5              (the row's former `answer`: the number after the last "=")

Same rows, prompts, order and train/test split as `reasoning_gym:NAME` with those two options; only the fields
differ, so plain `rewardlab sft` trains on the worked solution. Steps are checked by `rewards.steps` (`check_steps`,
`first_error`), the outcome by the `worked_answer` reward.
"""

from __future__ import annotations

from typing import Any

from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task
from rewardlab.tasks.reasoning_gym import load_reasoning_gym

#: Options of `reasoning_gym:NAME` that the preset fixes.
FIXED = {"template": "compact", "target": "steps"}


def worked_row(row: Row) -> Row:
    """A `reasoning_gym:NAME` row with `target="steps"` as a `worked:NAME` row: `answer` = its `target` (the worked
    solution), `final` = its `answer` (the final number), `reference_steps` = the worked solution's lines; `target`
    is dropped, the other fields and their order are kept.

    Example: {"prompt": "3+4-2=", "answer": "5", ..., "target": "3+4=7\\n7-2=5"} -> {"prompt": "3+4-2=",
    "answer": "3+4=7\\n7-2=5", ..., "final": "5", "reference_steps": ["3+4=7", "7-2=5"]}.
    """
    rest = {k: v for k, v in row.items() if k != "target"}
    return dict(rest, final=row["answer"], answer=row["target"], reference_steps=row["target"].split("\n"))


@register_loader("worked", example="worked:NAME")
def load_worked(name: str, /, **options: Any) -> Task:
    """Load `worked:NAME` = `reasoning_gym:NAME` with `template="compact"`, `target="steps"`, rows by `worked_row`.

    Args:
        name: a reasoning-gym dataset whose `metadata.expression` is an integer `+`/`-` chain (`chain_sum`).
        **options: the options of `reasoning_gym:NAME` (size, seed, test_size and the dataset's own fields) except
            `template` and `target`, which the preset fixes.
    Returns:
        Task whose rows hold `prompt` (`3+4-2=`), `answer` (the worked solution, steps joined by "\\n": the SFT
        target), `final` (the final answer, e.g. "5"), `reference_steps` ([S] str, the worked solution's steps) and
        the reasoning-gym fields; its reward is `worked_answer`.
    Raises:
        ValueError: (one line, "task worked:NAME: ...") a `template` or `target` option, or what `reasoning_gym:NAME`
            raises: an unknown dataset, a bad option, a dataset without an integer `+`/`-` chain in
            `metadata.expression` (e.g. leg_counting).
    """
    for key, value in FIXED.items():
        if key in options:
            raise ValueError(f"task worked:{name}: option {key!r} is fixed to {value!r}")
    try:
        base = load_reasoning_gym(name, **FIXED, **options)
    except ValueError as exc:
        raise ValueError(f"task worked:{name}: {str(exc).removeprefix(f'task reasoning_gym:{name}: ')}") from None
    return Task(
        name=f"worked:{name}",
        train=[worked_row(r) for r in base.train],
        test=[worked_row(r) for r in base.test],
        reward="worked_answer",
        source=base.source,
    )
