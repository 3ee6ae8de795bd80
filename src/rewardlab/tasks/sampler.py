"""Seeded epoch-wise sampling of task rows, with a state that checkpoints can save and restore."""

from __future__ import annotations

import random
from typing import Any

from rewardlab.tasks.base import Row


class RowSampler:
    """Draws rows without replacement within an epoch, reshuffling (seeded) at each epoch boundary.

    Raises:
        ValueError: on an empty row list.
    """

    def __init__(self, rows: list[Row], seed: int) -> None:
        if not rows:
            raise ValueError("task: no training rows to sample from")
        self.rows = rows
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.pos = 0

    def next(self, k: int) -> list[Row]:
        """The next `k` rows."""
        return [self.rows[i] for i in self.next_indices(k)]

    def next_indices(self, k: int) -> list[int]:
        """Indices into `rows` of the next `k` rows."""
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
                self.pos = 0
            out.append(self.order[self.pos])
            self.pos += 1
        return out

    def update(self, indices: list[int], pass_rates: list[float]) -> None:
        """Uniform sampling ignores outcomes (the curriculum interface; see `rewardlab.rl.curricula`)."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.getstate(), "order": list(self.order), "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.order = list(state["order"])
        self.pos = int(state["pos"])
