"""Segment reductions (rl/segments.py) against plain Python over the rows of each id."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardlab.rl.segments import Segments, reverse_discounted_sum, segment_ids

SETTINGS = settings(max_examples=60, deadline=None)


def reference(values: list[float], ids: list[int]) -> dict[int, list[float]]:
    """id -> the values of its rows, in row order."""
    out: dict[int, list[float]] = {}
    for v, i in zip(values, ids):
        out.setdefault(i, []).append(v)
    return out


def py_std(xs: list[float], unbiased: bool) -> float:
    mean = sum(xs) / len(xs)
    d = len(xs) - 1 if unbiased else len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / max(d, 1))


ids_and_values = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-50, 50), min_size=n, max_size=n),
    st.lists(st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(-1e3, 1e3)), min_size=n, max_size=n)))


@SETTINGS
@given(ids_and_values)
def test_reductions_match_python_per_id(case):
    ids, values = case
    seg = Segments(torch.tensor(ids))
    x = torch.tensor(values, dtype=torch.float64)
    ref = reference(values, ids)
    assert seg.ids.tolist() == sorted(ref)  # ascending ids: segment s is the id ids[s]
    assert seg.segments == len(ref)
    assert seg.counts.tolist() == [len(ref[i]) for i in sorted(ref)]
    assert seg.sizes().tolist() == [len(ref[i]) for i in ids]
    assert seg.sum(x).tolist() == pytest.approx([sum(ref[i]) for i in sorted(ref)], abs=1e-9)
    assert seg.min(x).tolist() == [min(ref[i]) for i in sorted(ref)]
    assert seg.max(x).tolist() == [max(ref[i]) for i in sorted(ref)]
    assert seg.mean(x).tolist() == pytest.approx([sum(ref[i]) / len(ref[i]) for i in sorted(ref)], abs=1e-9)
    for unbiased in (True, False):
        expected = [py_std(ref[i], unbiased) for i in sorted(ref)]
        assert seg.std(x, unbiased=unbiased).tolist() == pytest.approx(expected, abs=1e-7)
    centered = seg.center(x)
    assert centered.tolist() == pytest.approx([v - sum(ref[i]) / len(ref[i]) for v, i in zip(values, ids)], abs=1e-9)
    assert seg.broadcast(seg.max(x)).tolist() == [max(ref[i]) for i in ids]
    for i in ref:  # ties give exactly 0, and a mean and min equal to the value
        if len(set(ref[i])) == 1:
            rows = [k for k, j in enumerate(ids) if j == i]
            assert centered[rows].tolist() == [0.0] * len(rows)
            s = int((seg.ids == i).nonzero()[0])
            assert seg.std(x)[s].item() == 0.0 and seg.std(x, unbiased=False)[s].item() == 0.0
            assert seg.mean(x)[s].item() == ref[i][0]


def test_unsorted_non_contiguous_ids_and_single_member_segments_by_hand():
    ids = torch.tensor([40, -3, 40, 7, -3, 40])
    x = torch.tensor([1.0, 2.0, 3.0, 9.0, 2.0, 8.0], dtype=torch.float64)
    seg = Segments(ids)
    assert seg.ids.tolist() == [-3, 7, 40] and seg.inverse.tolist() == [2, 0, 2, 1, 0, 2]
    assert seg.counts.tolist() == [2, 1, 3]
    assert seg.sum(x).tolist() == [4.0, 9.0, 12.0]
    assert seg.mean(x).tolist() == [2.0, 9.0, 4.0]
    # id 40: [1, 3, 8], mean 4: deviations -3, -1, 4 -> sum of squares 26; unbiased 26 / 2, population 26 / 3
    assert seg.std(x).tolist() == [0.0, 0.0, math.sqrt(13.0)]
    assert seg.std(x, unbiased=False).tolist() == pytest.approx([0.0, 0.0, math.sqrt(26.0 / 3.0)])
    assert seg.center(x).tolist() == [-3.0, 0.0, -1.0, 0.0, 0.0, 4.0]  # the single member (id 7) centers to 0
    assert seg.broadcast(seg.counts).tolist() == [3, 2, 3, 1, 2, 3] == seg.sizes().tolist()


def test_ties_are_exact_zeros_at_any_magnitude():
    """Large equal values: the mean is taken after subtracting the minimum, so no rounding survives."""
    x = torch.tensor([1e6 + 0.1, 1e6 + 0.1, 1e6 + 0.1, 3.3, 3.3, 0.7], dtype=torch.float64)
    seg = Segments(torch.tensor([5, 5, 5, 2, 2, 9]))
    assert seg.center(x).tolist() == [0.0] * 6
    assert seg.std(x).tolist() == [0.0, 0.0, 0.0]
    assert seg.mean(x).tolist() == [3.3, 1e6 + 0.1, 0.7]


def test_reductions_along_dim0_of_a_matrix_and_integer_values():
    x = torch.tensor([[1.0, 5.0], [3.0, 5.0], [2.0, -1.0]], dtype=torch.float64)
    seg = Segments(torch.tensor([1, 1, 0]))
    assert seg.sum(x).tolist() == [[2.0, -1.0], [4.0, 10.0]]
    assert seg.center(x).tolist() == [[-1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    assert seg.std(x).tolist() == [[0.0, 0.0], [math.sqrt(2.0), 0.0]]
    lengths = torch.tensor([4, 0, 3])
    assert seg.sum(lengths).tolist() == [3, 4] and seg.sum(lengths).dtype == torch.int64
    assert seg.min(torch.arange(3)).tolist() == [2, 0]  # each segment's first row


def test_min_max_shift_over_selected_rows():
    x = torch.tensor([4.0, -2.0, 7.0, 1.0], dtype=torch.float64)
    seg = Segments(torch.tensor([0, 0, 1, 1]))
    where = torch.tensor([True, False, False, False])
    assert seg.min(x, where).tolist() == [4.0, math.inf]  # a segment with no selected row: +inf
    assert seg.max(x, where).tolist() == [4.0, -math.inf]
    assert seg.shift(x, where).tolist() == [4.0, 4.0, 0.0, 0.0]  # ... and 0 when shifting
    big = torch.iinfo(torch.long)
    ints = torch.tensor([3, 1, 5, 6])
    assert seg.min(ints, where).tolist() == [3, big.max] and seg.max(ints, where).tolist() == [3, big.min]


def test_nan_propagates_to_its_segment_only():
    x = torch.tensor([1.0, float("nan"), 2.0, 3.0], dtype=torch.float64)
    seg = Segments(torch.tensor([0, 0, 1, 1]))
    assert math.isnan(seg.max(x)[0]) and math.isnan(seg.min(x)[0]) and math.isnan(seg.sum(x)[0])
    assert seg.max(x)[1].item() == 3.0 and seg.min(x)[1].item() == 2.0


def test_sum_carries_gradient():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    seg = Segments(torch.tensor([9, 4, 9]))
    (seg.sum(x) * torch.tensor([10.0, 100.0])).sum().backward()
    assert x.grad.tolist() == [100.0, 10.0, 100.0]


def test_empty_batch_and_bad_shapes():
    seg = Segments(torch.zeros(0, dtype=torch.long))
    assert seg.segments == 0 and seg.sum(torch.zeros(0)).shape == (0,) and seg.center(torch.zeros(0)).shape == (0,)
    with pytest.raises(ValueError, match=r"segment ids must be \[N\]"):
        Segments(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"expected a \[N = 3, ...\] tensor"):
        Segments(torch.tensor([0, 1, 1])).sum(torch.zeros(2))


def test_segment_ids_of_tuples():
    a = torch.tensor([2, 2, 0, 2, 0])
    b = torch.tensor([-1, 5, 5, -1, 5])
    # tuples (2,-1) (2,5) (0,5) (2,-1) (0,5), lexicographic order: (0,5)=0, (2,-1)=1, (2,5)=2
    assert segment_ids(a, b).tolist() == [1, 2, 0, 1, 0]
    assert segment_ids(torch.tensor([30, -4, 30])).tolist() == [1, 0, 1]
    assert segment_ids(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)).shape == (0,)
    with pytest.raises(ValueError, match="segment_ids"):
        segment_ids(a, b[:3])


def py_reverse_discounted(row: list[float], mask: list[float], gamma: float) -> list[float]:
    out, running = [], 0.0
    for v, on in zip(reversed(row), reversed(mask)):
        running = v * on + gamma * running
        out.append(running * on)
    return out[::-1]


@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_reverse_discounted_sum_matches_python(gamma):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 7, generator=gen) < 0.7).to(torch.float64)
    y = reverse_discounted_sum(x, mask, gamma)
    for i in range(4):
        assert y[i].tolist() == pytest.approx(py_reverse_discounted(x[i].tolist(), mask[i].tolist(), gamma), abs=1e-12)
    assert bool((y[mask == 0] == 0).all())
    # by hand: [1, 2, 3], all on, gamma 0.5 -> [1 + 0.5 * 3.5, 2 + 0.5 * 3, 3] = [2.75, 3.5, 3]
    ones = torch.ones(1, 3, dtype=torch.float64)
    assert reverse_discounted_sum(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64), ones, 0.5).tolist() == \
        [[2.75, 3.5, 3.0]]
