"""Bradley–Terry loss with margin and centering, against hand arithmetic."""

import math

import pytest
import torch

from rewardlab.rm.bradley_terry import bradley_terry_loss, pair_stats


def _nll(d: float) -> float:
    """-log sigmoid(d) = log(1 + e^-d)."""
    return math.log1p(math.exp(-d))


def test_plain_loss():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # differences 1 and -1: (log(1 + e^-1) + log(1 + e^1)) / 2 = (0.31326 + 1.31326) / 2 = 0.81326
    expected = (_nll(1.0) + _nll(-1.0)) / 2
    assert expected == pytest.approx(0.8132616875)
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def test_equal_rewards_cost_log_2():
    assert bradley_terry_loss(torch.zeros(3), torch.zeros(3)).item() == pytest.approx(math.log(2), rel=1e-6)


def test_margin_is_subtracted_inside_the_sigmoid():
    chosen, rejected, margin = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 1.0])
    # d - m = 0.5 and -2: (log(1 + e^-0.5) + log(1 + e^2)) / 2 = (0.47408 + 2.12693) / 2
    expected = (_nll(0.5) + _nll(-2.0)) / 2
    assert expected == pytest.approx((0.4740769842 + 2.1269280110) / 2)
    assert bradley_terry_loss(chosen, rejected, margin).item() == pytest.approx(expected, rel=1e-6)


def test_centering_adds_mean_squared_sum():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # c * mean((r_c + r_r)^2) = 0.01 * (3^2 + 1^2) / 2 = 0.05
    expected = (_nll(1.0) + _nll(-1.0)) / 2 + 0.05
    assert bradley_terry_loss(chosen, rejected, center_coef=0.01).item() == pytest.approx(expected, rel=1e-6)


def test_centering_pulls_the_offset_to_zero():
    # Shifting both rewards by s leaves the BT term unchanged; only centering sees it.
    c, r = torch.tensor([1.0]), torch.tensor([0.0])
    base = bradley_terry_loss(c, r).item()
    assert bradley_terry_loss(c + 5, r + 5).item() == pytest.approx(base, rel=1e-6)
    # 0.1 * (6 + 5)^2 = 12.1 added for the shifted pair, 0.1 * 1^2 = 0.1 for the original
    assert bradley_terry_loss(c + 5, r + 5, center_coef=0.1).item() == pytest.approx(base + 12.1, rel=1e-6)
    assert bradley_terry_loss(c, r, center_coef=0.1).item() == pytest.approx(base + 0.1, rel=1e-6)


def test_gradient_pushes_chosen_up_and_rejected_down():
    c = torch.tensor([0.0], requires_grad=True)
    r = torch.tensor([0.0], requires_grad=True)
    bradley_terry_loss(c, r).backward()
    # d/dc -log sigmoid(c - r) = -(1 - sigmoid(0)) = -0.5; d/dr = +0.5
    assert c.grad.item() == pytest.approx(-0.5) and r.grad.item() == pytest.approx(0.5)


def test_loss_rejects_mismatched_shapes_and_negative_coef():
    with pytest.raises(ValueError, match="shapes differ"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), center_coef=-1.0)


def test_pair_stats_hand_computed():
    # pairs (3, 1) win, (0, 0) tie, (1, 2) loss -> accuracy 1/3; margins 2, 0, -1 -> mean 1/3
    # rewards 3, 0, 1, 1, 0, 2: mean 7/6; population variance = (sum x^2)/6 - mean^2 = 15/6 - 49/36 = 41/36
    s = pair_stats([3.0, 0.0, 1.0], [1.0, 0.0, 2.0])
    assert s["accuracy"] == pytest.approx(1 / 3)
    assert s["margin_mean"] == pytest.approx(1 / 3)
    assert s["reward_mean"] == pytest.approx(7 / 6)
    assert s["reward_std"] == pytest.approx(math.sqrt(41 / 36))
