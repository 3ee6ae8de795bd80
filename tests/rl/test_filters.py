"""Group filters (DAPO dynamic sampling) and prompt curricula (FG-ExPO pass-rate curriculum), by hand."""

import math

import pytest
import torch

from rewardlab.rl.curricula import CURRICULA, PassRateCurriculum, make_curriculum
from rewardlab.rl.filters import GROUP_FILTERS, filter_groups
from rewardlab.tasks.sampler import RowSampler


def test_dapo_keeps_only_groups_with_spread():
    metric = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 7.0])
    group = torch.tensor([0, 0, 1, 1, 2, 3, 3, 4])
    keep = GROUP_FILTERS["dapo"](metric=metric, group=group)
    # group 0 = [1, 1] tied; group 1 = [1, 0] spread; group 2 = [1] alone; group 3 = [.5, .5] tied; group 4 alone
    assert keep.tolist() == [False, False, True, True, False, False, False, False]


def test_pass_rate_weights_and_ema_by_hand():
    cur = PassRateCurriculum(list(range(3)), seed=0, mu=0.5, sigma=0.2, ema=0.5)
    assert cur.pass_rate.tolist() == [0.5, 0.5, 0.5]  # unseen prompts start at mu
    cur.update([0, 1], [1.0, 0.25])
    # p0 = 0.5 * 0.5 + 0.5 * 1.0 = 0.75; p1 = 0.5 * 0.5 + 0.5 * 0.25 = 0.375; p2 untouched
    assert cur.pass_rate.tolist() == pytest.approx([0.75, 0.375, 0.5])
    # w = exp(-(p - 0.5)^2 / (2 * 0.04)): (0.25)^2 / 0.08 = 0.78125; (0.125)^2 / 0.08 = 0.1953125; 0
    assert cur.weights().tolist() == pytest.approx([math.exp(-0.78125), math.exp(-0.1953125), 1.0])
    cur.update([2], [float("nan")])  # no information -> unchanged
    assert cur.pass_rate[2].item() == 0.5


def test_pass_rate_sampling_prefers_the_frontier():
    cur = PassRateCurriculum(["solved", "frontier"], seed=0, sigma=0.2, ema=1.0)
    cur.update([0, 1], [1.0, 0.5])
    # weights: exp(-0.25 / 0.08) = exp(-3.125) ~ 0.0439 and 1 -> frontier drawn with probability 1 / 1.0439 ~ 0.958
    draws = [cur.next_indices(1)[0] for _ in range(2000)]
    frac = draws.count(1) / len(draws)
    assert frac == pytest.approx(1 / (1 + math.exp(-3.125)), abs=0.02)
    assert sorted(cur.next_indices(2)) == [0, 1]  # within a step, without replacement
    five = cur.next_indices(5)  # more than the rows: every row once per pass of 2, then 1 more
    assert len(five) == 5 and five.count(0) >= 2 and five.count(1) >= 2


def test_pass_rate_state_round_trip_reproduces_draws():
    a = PassRateCurriculum(list(range(10)), seed=3)
    a.update([1, 2, 3], [0.0, 1.0, 0.5])
    state = a.state_dict()
    first = a.next_indices(4)
    b = PassRateCurriculum(list(range(10)), seed=99)
    b.load_state_dict(state)
    assert b.next_indices(4) == first


@pytest.mark.parametrize("option, value", [("mu", 1.5), ("sigma", 0.0), ("ema", 0.0)])
def test_pass_rate_rejects_bad_options(option, value):
    with pytest.raises(ValueError, match=f"rl.filtering.curriculum_options.{option}"):
        CURRICULA["pass_rate"](list(range(3)), seed=0, **{option: value})


def test_uniform_is_the_row_sampler_and_takes_no_options():
    sampler = CURRICULA["uniform"](list("abcd"), seed=0)
    assert isinstance(sampler, RowSampler)
    assert sorted(sampler.next_indices(4)) == [0, 1, 2, 3]  # one epoch visits every row once
    with pytest.raises(ValueError) as err:
        make_curriculum("uniform", list("ab"), seed=0, mu=0.5)
    assert str(err.value) == ("rl.filtering.curriculum_options: unknown option 'mu' for curriculum 'uniform'; "
                              "valid: (none)")


def test_curriculum_and_filter_options_are_checked_by_name():
    # a misspelt option was swallowed before (uniform's **options, dapo's **_); now it is named with the valid ones
    with pytest.raises(ValueError) as err:
        make_curriculum("pass_rate", list("ab"), seed=0, sigmaa=0.3)
    assert str(err.value) == ("rl.filtering.curriculum_options: unknown option 'sigmaa' for curriculum 'pass_rate'; "
                              "valid: ema, initial, mu, sigma")
    assert make_curriculum("pass_rate", list("ab"), seed=0, sigma=0.3).sigma == 0.3
    metric, group = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    assert filter_groups("dapo", metric=metric, group=group).tolist() == [True, True, False, False]
    with pytest.raises(ValueError, match="unknown option 'min_std' for group filter 'dapo'; valid: \\(none\\)"):
        filter_groups("dapo", metric=metric, group=group, min_std=0.1)
    with pytest.raises(ValueError, match="unknown group filter 'x'; valid: accuracy, dapo"):
        filter_groups("x", metric=metric, group=group)
