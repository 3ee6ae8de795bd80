"""The `Task` record and the split/de-duplication rule every task source shares."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]

#: Split names: `all` (every row), `train`, `test` (held out).
SPLITS = ("all", "train", "test")


@dataclass
class Task:
    """Prompts with reference answers, split into train and held-out test rows.

    Attributes:
        name: the spec it was loaded from, e.g. `reasoning_gym:chain_sum`.
        train: rows used for SFT and RL. Each row has at least `prompt` (str) and `answer` (str); other fields are
            passed to rewards by name.
        test: held-out rows; no prompt of `test` occurs in `train`.
        reward: the reward that verifies this task's answers: a name in `rewardlab.rewards.REWARDS`, or a spec with
            options that `rewardlab.rewards.build_reward` reads ({"name": "code", "fenced": True}: an environment
            task's outcome reward).
        eval_split: the split `evaluate` and `search` use when none is asked for: "test" (the held-out split) for
            generated tasks and benchmarks, "all" for a file the user gives (`jsonl:PATH`), which is evaluated whole.
        all_rows: every row in the source's order (e.g. a file's line order, duplicates dropped); None: `train`
            followed by `test`.
        source: where the rows come from and how the held-out rows were chosen, one phrase for `describe_task`
            (e.g. "both from data.jsonl (300 rows; the 30 held out are task.options.test_size=0.1 of its unique
            prompts, split seed 0)"); "" when unknown.
        origins: `row_key(row)` -> where each row comes from: "PATH:LINE" of its line for tasks read from files
            (HumanEval: its task id); empty for generated tasks. Errors about a row name it (`where`).
        env: for an environment task (spec env:NAME), {"name": NAME, "options": the environment's options}: the
            verbs build it with `rewardlab.envs.episode_settings` and run episodes in it; None for a single-turn task.
    """

    name: str
    train: list[Row]
    test: list[Row]
    reward: str | dict[str, Any] = "exact_match"
    eval_split: str = "test"
    all_rows: list[Row] | None = None
    source: str = ""
    origins: dict[str, str] = field(default_factory=dict)
    env: dict[str, Any] | None = None

    def where(self, row: Row, index: int | None = None) -> str:
        """Where `row` comes from, for error messages: its "PATH:LINE" when the task was read from a file,
        otherwise "<name> row <index>" (index into `split("all")`) or "<name>"."""
        try:
            origin = self.origins.get(row_key(row))
        except (KeyError, TypeError):
            origin = None
        if origin is not None:
            return origin
        return f"{self.name} row {index}" if index is not None else self.name

    def split(self, name: str) -> list[Row]:
        """Rows of split `name`: "train", "test" or "all" (see `all_rows`). Raises ValueError for any other name."""
        if name == "train":
            return self.train
        if name == "test":
            return self.test
        if name == "all":
            return list(self.all_rows) if self.all_rows is not None else self.train + self.test
        raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")


def row_key(row: Row) -> str:
    """The text that identifies a question of a file task: its `prompt`, or for a chat row (one with `messages`)
    the conversation up to and including its last user turn as JSON, so two rows that ask the same last question
    after different system prompts or earlier turns are different questions. A row of an environment task (spec
    env:NAME) is identified by its `row_id` ("env:NAME/SPLIT/INDEX"): such rows may share a prompt and differ in
    their answer (guess_number's secret). Only a `row_id` of that form counts, so a file's own row_id column
    changes nothing."""
    row_id = row.get("row_id")
    if isinstance(row_id, str) and row_id.startswith("env:"):
        return row_id
    if "messages" in row:
        return json.dumps(row["messages"], ensure_ascii=False, sort_keys=True)
    return row["prompt"]


def describe_task(task: Task) -> str:
    """One line on what a run trains on: "task NAME: trains on N rows and holds out M" followed by `task.source`.

    Example: "task jsonl:data.jsonl: trains on 270 rows and holds out 30, both from data.jsonl (300 rows; the 30
    held out are task.options.test_size=0.1 of its unique prompts, split seed 0)".
    """
    line = f"task {task.name}: trains on {len(task.train)} rows and holds out {len(task.test)}"
    return f"{line}, {task.source}" if task.source else line


def dedup_and_split(
    rows: Iterable[Row], *, key: Callable[[Row], str], test_size: int | float, seed: int
) -> tuple[list[Row], list[Row]]:
    """De-duplicate rows by `key` (first occurrence wins) and split them into disjoint train/test lists.

    Args:
        rows: task rows in generation order.
        key: the text that identifies a question (two rows with the same key are the same question).
        test_size: number of test rows (int >= 1) or fraction of unique rows (0 < float < 1).
        seed: seed of the shuffle that assigns questions to splits.
    Returns:
        (train, test), each in a seeded random order; no key occurs in both.
    Raises:
        ValueError: when `test_size` is not a number, is out of range or leaves no training rows, or `seed` is not an
            integer.
    """
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)):
        raise ValueError(f"task.options.test_size: expected a count of test rows (int) or a fraction in (0, 1) "
                         f"(float), got {test_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task.options.seed: expected an integer, got {seed!r}")
    unique: dict[str, Row] = {}
    for row in rows:
        unique.setdefault(key(row), row)
    items = list(unique.values())
    random.Random(seed).shuffle(items)
    if isinstance(test_size, float) and not isinstance(test_size, bool):
        if not 0.0 < test_size < 1.0:
            raise ValueError(f"task.options.test_size: a fraction must lie in (0, 1), got {test_size}")
        n_test = max(1, round(test_size * len(items)))
    else:
        n_test = int(test_size)
        if n_test < 0:
            raise ValueError(f"task.options.test_size: must be >= 0, got {n_test}")
    if n_test >= len(items):
        raise ValueError(
            f"task.options.test_size: {n_test} test rows leave no training rows out of {len(items)} unique questions"
        )
    return items[n_test:], items[:n_test]
