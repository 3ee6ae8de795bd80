"""Which prompts a training step draws: the curricula (uniform, and the pass-rate curriculum of FG-ExPO).

Registry, looked up by name from the training config (`rl.filtering.curriculum`, `rl.filtering.curriculum_options`):

    CURRICULA[name](rows, seed, <options>) -> a prompt sampler with
        next_indices(k) -> list[int]; update(indices, pass_rates); state_dict(); load_state_dict(state)

Every entry declares its options by name; `make_curriculum` refuses an option it does not declare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from rewardlab.registry import Registry
from rewardlab.tasks.sampler import RowSampler

CURRICULA: Registry[Callable[..., Any]] = Registry("curriculum", reserved=("rows", "seed"))


def register_curriculum(name: str) -> Callable:
    """Register `factory(rows, seed, <options>) -> sampler` in `CURRICULA`. Raises ValueError if taken."""
    return CURRICULA.register(name)


def make_curriculum(name: str, rows: Sequence[Any], seed: int, **options: Any) -> Any:
    """The prompt sampler of curriculum `name` (see `CURRICULA`) over `rows`, seeded with `seed`.

    Raises:
        ValueError: an unknown `name` (the message lists the valid ones), an option the curriculum does not declare
            (the message names it and lists the valid ones), or what the curriculum raises for a bad value.
    """
    factory = CURRICULA.get(name)
    CURRICULA.check(name, options, field="rl.filtering.curriculum_options")
    return factory(rows, seed, **options)


@register_curriculum("uniform")
def uniform(rows: Sequence[Any], seed: int) -> RowSampler:
    """Every prompt once per epoch, in a seeded random order (no curriculum, no options)."""
    return RowSampler(list(rows), seed=seed)


@register_curriculum("pass_rate")
class PassRateCurriculum:
    """Gaussian pass-rate curriculum (FG-ExPO, Gaussian Curriculum Sampling, 2026).

    Each prompt i keeps a running pass rate p_i, an exponential moving average over the steps it was drawn in:
    p_i <- (1 - ema) * p_i + ema * (fraction of its rollouts that were correct). Prompts are drawn without
    replacement within a step with probability proportional to w_i = exp(-(p_i - mu)^2 / (2 sigma^2)), so prompts
    the policy solves about half the time (the learning frontier, largest GRPO gradient) are drawn most. A prompt
    never drawn has p_i = `initial` (default mu: unseen prompts get the largest weight).

    Args (options from `rl.filtering.curriculum_options`):
        mu: centre of the Gaussian, a pass rate in [0, 1] (default 0.5, the paper's value).
        sigma: width, > 0 (default 0.2; our choice, the paper does not fix one here).
        ema: weight of the newest pass rate in (0, 1] (default 0.5).
        initial: pass rate assumed for prompts never drawn (default mu).
    Raises:
        ValueError: an option out of range or an empty row list.
    """

    def __init__(self, rows: Sequence[Any], seed: int, *, mu: float = 0.5, sigma: float = 0.2, ema: float = 0.5,
                 initial: float | None = None) -> None:
        if not rows:
            raise ValueError("task: no training rows to sample from")
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"rl.filtering.curriculum_options.mu: expected a pass rate in [0, 1], got {mu}")
        if sigma <= 0:
            raise ValueError(f"rl.filtering.curriculum_options.sigma: expected > 0, got {sigma}")
        if not 0.0 < ema <= 1.0:
            raise ValueError(f"rl.filtering.curriculum_options.ema: expected in (0, 1], got {ema}")
        self.mu, self.sigma, self.ema = mu, sigma, ema
        self.pass_rate = torch.full((len(rows),), mu if initial is None else float(initial), dtype=torch.float64)
        self.generator = torch.Generator().manual_seed(seed)

    def weights(self) -> Tensor:
        """[R] float64 sampling weights w_i = exp(-(p_i - mu)^2 / (2 sigma^2)) (unnormalized)."""
        return torch.exp(-((self.pass_rate - self.mu) ** 2) / (2 * self.sigma**2))

    def next_indices(self, k: int) -> list[int]:
        """`k` distinct row indices (all rows, repeated as needed, when k exceeds their number)."""
        out: list[int] = []
        while len(out) < k:
            take = min(k - len(out), len(self.pass_rate))
            out += torch.multinomial(self.weights(), take, replacement=False, generator=self.generator).tolist()
        return out

    def update(self, indices: Sequence[int], pass_rates: Sequence[float]) -> None:
        """Fold the pass rates observed this step into the running averages of the drawn prompts."""
        for i, p in zip(indices, pass_rates):
            if not math.isnan(p):
                self.pass_rate[i] = (1 - self.ema) * self.pass_rate[i] + self.ema * p

    def state_dict(self) -> dict[str, Any]:
        return {"pass_rate": self.pass_rate.clone(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pass_rate = state["pass_rate"].clone()
        self.generator.set_state(state["generator"])
