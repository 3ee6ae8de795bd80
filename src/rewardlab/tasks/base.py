"""The `Task` record and the split/de-duplication rule every task source shares."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
        reward: name of the reward in `rewardlab.rewards.REWARDS` that verifies this task's answers.
        eval_split: the split `evaluate` and `search` use when none is asked for: "test" (the held-out split) for
            generated tasks and benchmarks, "all" for a file the user gives (`jsonl:PATH`), which is evaluated whole.
        all_rows: every row in the source's order (e.g. a file's line order, duplicates dropped); None: `train`
            followed by `test`.
    """

    name: str
    train: list[Row]
    test: list[Row]
    reward: str = "exact_match"
    eval_split: str = "test"
    all_rows: list[Row] | None = None

    def split(self, name: str) -> list[Row]:
        """Rows of split `name`: "train", "test" or "all" (see `all_rows`). Raises ValueError for any other name."""
        if name == "train":
            return self.train
        if name == "test":
            return self.test
        if name == "all":
            return list(self.all_rows) if self.all_rows is not None else self.train + self.test
        raise ValueError(f"unknown split {name!r}; expected one of {', '.join(SPLITS)}")


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
        raise ValueError(f"task.test_size: expected a count of test rows (int) or a fraction in (0, 1) (float), "
                         f"got {test_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task.seed: expected an integer, got {seed!r}")
    unique: dict[str, Row] = {}
    for row in rows:
        unique.setdefault(key(row), row)
    items = list(unique.values())
    random.Random(seed).shuffle(items)
    if isinstance(test_size, float) and not isinstance(test_size, bool):
        if not 0.0 < test_size < 1.0:
            raise ValueError(f"task.test_size: a fraction must lie in (0, 1), got {test_size}")
        n_test = max(1, round(test_size * len(items)))
    else:
        n_test = int(test_size)
        if n_test < 0:
            raise ValueError(f"task.test_size: must be >= 0, got {n_test}")
    if n_test >= len(items):
        raise ValueError(
            f"task.test_size: {n_test} test rows leave no training rows out of {len(items)} unique questions"
        )
    return items[n_test:], items[:n_test]
