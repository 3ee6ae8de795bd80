"""Which groups a batch keeps (DAPO dynamic sampling). Which prompts are drawn (curricula) is `rl.curricula`.

Registry, looked up by name from the training config:

    GROUP_FILTERS[name](metric=[N] float, group=[N] int64, <options>) -> keep [N] bool

Every entry declares its options by name; `filter_groups` refuses an option it does not declare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from rewardlab.registry import Registry
from rewardlab.rl.segments import Segments

GROUP_FILTERS: Registry[Callable[..., Tensor]] = Registry("group filter", reserved=("metric", "group"))


def register_group_filter(name: str) -> Callable:
    """Register `fn(*, metric, group, <options>) -> keep [N] bool` in `GROUP_FILTERS`. Raises ValueError if taken."""
    return GROUP_FILTERS.register(name)


def filter_groups(name: str, *, metric: Tensor, group: Tensor, **options: Any) -> Tensor:
    """Apply group filter `name` (see `GROUP_FILTERS`): [N] float metric, [N] int64 group -> keep [N] bool.

    Raises:
        ValueError: an unknown `name` (the message lists the valid ones), or an option the filter does not declare
            (the message names it and lists the valid ones).
    """
    fn = GROUP_FILTERS.get(name)
    GROUP_FILTERS.check(name, options, field="rl.filtering.group_filter_options")
    return fn(metric=metric, group=group, **options)


@register_group_filter("dapo")
def dapo(*, metric: Tensor, group: Tensor) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025): keep only groups whose metric is not constant.

    A group whose G rollouts all score the same has zero group-normalized advantage and contributes no gradient, so
    it is dropped and replaced by newly generated groups (the trainer keeps generating until `prompts_per_step`
    groups are kept or `max_rounds` is reached).

    keep_i = std_{j in g(i)} metric_j > 0 (population std; a group of one is never kept).

    Args:
        metric: [N] float, the raw per-rollout metric (default the reward before shaping).
        group: [N] int64, prompt-group ids.
    Returns:
        [N] bool, True for rollouts of kept groups.
    """
    groups = Segments(group)
    values = metric.double()
    varies = (groups.counts > 1) & ((groups.max(values) - groups.min(values)) > 0)  # NaN in a group: not kept
    return groups.broadcast(varies)


@register_group_filter("accuracy")
def accuracy(*, metric: Tensor, group: Tensor, low: float = 0.2, high: float = 0.8) -> Tensor:
    """PRIME's accuracy filter (Cui et al., 2025, arXiv:2502.01456): keep the groups whose mean metric (the pass
    rate, for a 0/1 verifier) lies in [low, high]; prompts the policy always or never solves are dropped and
    replaced by newly generated groups, as `dapo` does.

    keep_i = low <= mean_{j in g(i)} metric_j <= high.

    Args:
        metric: [N] float, the per-rollout metric (default the reward before shaping).
        group: [N] int64, prompt-group ids.
        low, high: float bounds of the kept group means, inclusive (default 0.2 and 0.8, the paper's).
    Returns:
        [N] bool, True for rollouts of kept groups.
    Raises:
        ValueError: low > high (naming both).
    """
    if not low <= high:
        raise ValueError(f"rl.filtering.group_filter_options: accuracy needs low <= high, got low={low}, high={high}")
    groups = Segments(group)
    mean = groups.mean(metric.double())
    return groups.broadcast((mean >= low) & (mean <= high))  # NaN in a group: not kept
