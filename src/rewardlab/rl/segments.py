"""Segment reductions: statistics over the rows that share an id (prompt groups, episodes, turns), vectorised.

A segment is the set of rows i of a batch with the same id ``ids[i]``; ids are any integers, in any order, not
necessarily contiguous. ``Segments(ids)`` computes the inverse indices once (``torch.unique``); every reduction then
runs over dim 0 of a [N, ...] tensor with ``index_add_`` or ``scatter_reduce_``, with no Python loop over segments:

    seg = Segments(group)                  # ids [N] int64 -> S segments, ascending id order
    seg.sum(x), seg.mean(x), seg.std(x)    # [N, ...] -> [S, ...]
    seg.min(x), seg.max(x), seg.counts     # [S, ...], [S] int64
    seg.broadcast(seg.mean(x))             # [S, ...] -> [N, ...]: each row gets its segment's value
    seg.center(x)                          # [N, ...] -> [N, ...]: x minus its segment's mean

Means are taken after subtracting the segment's minimum, so they are computed on values in [0, range of the
segment]: a segment whose values are all equal has a mean equal to them and centers to exactly 0 (and a std of
exactly 0), and the rounding error of a mean is relative to the segment's range, not to the size of its values.
Each reduction runs in the dtype of ``x`` (the estimators pass float64). On CPU, ``index_add_`` adds a segment's
rows in row order, so a result does not depend on the other segments or on the values of the ids.

``reverse_discounted_sum`` is the discounted reward-to-go along dim 1 of a masked [N, T] tensor.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["Segments", "reverse_discounted_sum", "segment_ids"]


class Segments:
    """The segments of N rows given by their ids, and vectorised reductions over them.

    Args:
        ids: [N] int64 (any values, any order; any dtype ``torch.unique`` sorts works), the segment id of each row.
    Attributes:
        ids: [S] the distinct ids, ascending (segment s is the rows with id ``ids[s]``).
        inverse: [N] int64, the segment of each row, in 0..S-1.
        counts: [S] int64, the number of rows of each segment (each at least 1).
    Raises:
        ValueError: if ``ids`` is not 1-D; a reduction, if its x is not [N, ...].
    """

    def __init__(self, ids: Tensor):
        if ids.dim() != 1:
            raise ValueError(f"segment ids must be [N], got shape {tuple(ids.shape)}")
        self.ids, self.inverse, self.counts = torch.unique(ids, return_inverse=True, return_counts=True)

    @property
    def segments(self) -> int:
        """S, the number of segments."""
        return int(self.ids.shape[0])

    def sizes(self) -> Tensor:
        """[N] int64, the number of rows of each row's segment (``counts`` broadcast)."""
        return self.counts[self.inverse]

    def broadcast(self, per_segment: Tensor) -> Tensor:
        """Each row gets its segment's value: [S, ...] -> [N, ...] (any dtype)."""
        return per_segment[self.inverse]

    def sum(self, x: Tensor) -> Tensor:
        """Per-segment sum of x [N, ...] -> [S, ...] in x's dtype (rows added in row order; autograd flows)."""
        return torch.zeros(self._shape(x), dtype=x.dtype, device=x.device).index_add_(0, self.inverse, x)

    def min(self, x: Tensor, where: Tensor | None = None) -> Tensor:
        """Per-segment minimum of x [N, ...] over the rows where ``where`` [N] bool is true -> [S, ...]; +inf (or an
        integer dtype's largest value) for a segment without such rows. NaN propagates."""
        return self._extreme(x, where, "amin")

    def max(self, x: Tensor, where: Tensor | None = None) -> Tensor:
        """Per-segment maximum of x [N, ...] over the rows where ``where`` [N] bool is true -> [S, ...]; -inf (or an
        integer dtype's smallest value) for a segment without such rows. NaN propagates."""
        return self._extreme(x, where, "amax")

    def shift(self, x: Tensor, where: Tensor | None = None) -> Tensor:
        """The segment's minimum of x [N, ...] float over the rows where ``where`` [N] is true, broadcast to
        [N, ...]; 0 for a segment without such rows."""
        low = self.min(x, where)
        return torch.where(torch.isinf(low), 0.0, low)[self.inverse]

    def center(self, x: Tensor) -> Tensor:
        """x - its segment's mean, [N, ...] float -> [N, ...]; exactly 0 for a segment whose values are all equal.

        The mean is taken after subtracting the segment's minimum: y = x - min, then y - sum(y) / count.
        """
        y = x - self.shift(x)
        return y - (self.sum(y) / self._counts(y))[self.inverse]

    def mean(self, x: Tensor) -> Tensor:
        """Per-segment mean of x [N, ...] float -> [S, ...]: min + sum(x - min) / count, so a segment whose values
        are all equal has exactly their value as its mean."""
        low = self.min(x)
        return low + self.sum(x - low[self.inverse]) / self._counts(x)

    def std(self, x: Tensor, *, unbiased: bool = True) -> Tensor:
        """Per-segment standard deviation of x [N, ...] float -> [S, ...]; exactly 0 for a segment whose values are
        all equal.

        std = sqrt(sum(c^2) / d), c = ``center(x)``, d = count - 1 (``unbiased``, the sample std; 0 for a segment
        of one row) or d = count (the population std).
        """
        centered = self.center(x)
        counts = self._counts(x)
        var = self.sum(centered * centered) / ((counts - 1).clamp(min=1) if unbiased else counts)
        return var.sqrt()

    def _shape(self, x: Tensor) -> tuple[int, ...]:
        if x.dim() == 0 or x.shape[0] != self.inverse.shape[0]:
            raise ValueError(f"expected a [N = {self.inverse.shape[0]}, ...] tensor, got shape {tuple(x.shape)}")
        return (self.segments, *x.shape[1:])

    def _counts(self, x: Tensor) -> Tensor:
        """counts in x's dtype, shaped [S, 1, ...] to divide a [S, ...] reduction of x."""
        return self.counts.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))

    def _extreme(self, x: Tensor, where: Tensor | None, reduce: str) -> Tensor:
        shape = self._shape(x)
        if x.dtype.is_floating_point:
            fill = float("inf") if reduce == "amin" else float("-inf")
        else:
            info = torch.iinfo(x.dtype)
            fill = info.max if reduce == "amin" else info.min
        trailing = [1] * (x.dim() - 1)
        values = x if where is None else torch.where(where.view(-1, *trailing), x, fill)
        index = self.inverse.view(-1, *trailing).expand_as(x)
        out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
        return out.scatter_reduce_(0, index, values, reduce)


def segment_ids(*keys: Tensor) -> Tensor:
    """Dense segment ids of tuples of keys: rows i and j share an id exactly when ``k[i] == k[j]`` for every key k.

    Args:
        *keys: one or more [N] integer tensors.
    Returns:
        [N] int64 ids in 0..S-1, ascending in the lexicographic order of the tuples.
    Raises:
        ValueError: if no key is given or the keys are not all [N].
    """
    if not keys or any(k.dim() != 1 or k.shape != keys[0].shape for k in keys):
        raise ValueError(f"segment_ids: give [N] keys of one length, got shapes {[tuple(k.shape) for k in keys]}")
    if len(keys) == 1:
        return torch.unique(keys[0], return_inverse=True)[1]
    pairs = torch.stack(keys, dim=1)
    return torch.unique(pairs, dim=0, return_inverse=True)[1] if pairs.numel() else pairs[:, 0]


def reverse_discounted_sum(x: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Discounted sum to go along each row: y[:, t] = sum_{k >= t} gamma^(k - t) x[:, k] * mask[:, k], zeroed
    where mask is 0.

    With gamma == 1 it is a reversed cumulative sum; otherwise it loops over the T columns (never over rows).

    Args:
        x: [N, T] float.
        mask: [N, T] float 0/1 (same dtype as x), the positions that count.
        gamma: float discount.
    Returns:
        [N, T] in x's dtype, 0 where mask is 0.
    """
    x = x * mask
    if gamma == 1.0:
        y = torch.flip(torch.cumsum(torch.flip(x, dims=[1]), dim=1), dims=[1])
    else:
        y = torch.empty_like(x)
        running = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1] - 1, -1, -1):
            running = x[:, t] + gamma * running
            y[:, t] = running
    return y * mask
