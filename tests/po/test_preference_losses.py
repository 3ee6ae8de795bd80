"""The preference losses (issue 36): each pinned on hand vectors, their options checked, mixing, the stats."""

import math

import pytest
import torch

from rewardlab.po.losses import PREFERENCE_LOSSES, preference_loss


def _sig(x):
    return 1 / (1 + math.exp(-x))


def _logsig(x):
    return math.log(_sig(x))


# two pairs: policy and reference summed log-probs, and lengths
PC, PR = torch.tensor([-4.0, -6.0]), torch.tensor([-7.0, -5.0])
RC, RR = torch.tensor([-5.0, -6.5]), torch.tensor([-6.0, -5.5])
LC, LR = torch.tensor([4, 3]), torch.tensor([7, 2])
HW, HL = [1.0, 0.5], [-1.0, 0.5]  # policy minus reference


def _loss(name, **options):
    return preference_loss(name, chosen_logps=PC, rejected_logps=PR, ref_chosen_logps=RC, ref_rejected_logps=RR,
                           chosen_lengths=LC, rejected_lengths=LR, **options)


def test_every_registered_loss_is_pinned_here():
    assert set(PREFERENCE_LOSSES) == {"dpo", "ipo", "simpo", "kto", "orpo", "rpo", "bco_pair", "sft"}


def test_dpo_by_hand_with_and_without_label_smoothing():
    losses, stats = _loss("dpo", beta=0.5)
    want = [-_logsig(0.5 * (hw - hl)) for hw, hl in zip(HW, HL)]  # 0.5 * 2 = 1 and 0
    assert losses.tolist() == pytest.approx(want)
    smoothed, _ = _loss("dpo", beta=0.5, label_smoothing=0.1)
    want = [-0.9 * _logsig(0.5 * (hw - hl)) - 0.1 * _logsig(-0.5 * (hw - hl)) for hw, hl in zip(HW, HL)]
    assert smoothed.tolist() == pytest.approx(want)
    assert stats["rewards/chosen"] == pytest.approx(0.5 * (1.0 + 0.5) / 2)
    assert stats["rewards/rejected"] == pytest.approx(0.5 * (-1.0 + 0.5) / 2)
    assert stats["rewards/margins"] == pytest.approx(0.5)
    assert stats["rewards/accuracies"] == pytest.approx(0.5)  # the second pair ties
    assert stats["logps/chosen"] == pytest.approx(-5.0) and stats["logps/rejected"] == pytest.approx(-6.0)
    assert stats["loss"] == pytest.approx(float(losses.mean()))


def test_ipo_averages_the_log_ratios_per_token_when_lengths_are_given():
    losses, _ = _loss("ipo", beta=0.25)  # 1 / (2 tau) = 2
    h = [HW[0] / 4 - HL[0] / 7, HW[1] / 3 - HL[1] / 2]
    assert losses.tolist() == pytest.approx([(x - 2) ** 2 for x in h])
    summed, _ = preference_loss("ipo", chosen_logps=PC, rejected_logps=PR, ref_chosen_logps=RC,
                                ref_rejected_logps=RR, beta=0.25)
    assert summed.tolist() == pytest.approx([(hw - hl - 2) ** 2 for hw, hl in zip(HW, HL)])


def test_simpo_is_reference_free_and_length_normalized():
    losses, stats = _loss("simpo", beta=2.0, gamma=0.5)
    a = [(-4 / 4, -7 / 7), (-6 / 3, -5 / 2)]
    assert losses.tolist() == pytest.approx([-_logsig(2 * (aw - al) - 0.5) for aw, al in a])
    assert stats["rewards/chosen"] == pytest.approx(2 * (-1 - 2) / 2)
    free, _ = preference_loss("simpo", chosen_logps=PC, rejected_logps=PR, chosen_lengths=LC, rejected_lengths=LR,
                              beta=2.0, gamma=0.5)
    assert torch.equal(free, losses)


def test_kto_by_hand_with_the_batch_and_a_given_reference_point():
    # the batch's own log-ratios average (1 + 0.5 - 1 + 0.5) / 4 = 0.25
    losses, _ = _loss("kto", beta=1.0, desirable_weight=2.0)
    z0 = 0.25
    want = [2 * (1 - _sig(hw - z0)) for hw in HW] + [1 - _sig(z0 - hl) for hl in HL]
    assert losses.tolist() == pytest.approx(want)
    # a negative KL estimate is clamped to 0
    given, _ = _loss("kto", beta=1.0, kl_logratios=torch.tensor([-3.0, -1.0]))
    assert given.tolist() == pytest.approx([1 - _sig(hw) for hw in HW] + [1 - _sig(-hl) for hl in HL])


def test_kto_takes_unpaired_examples():
    losses, stats = preference_loss("kto", chosen_logps=PC, rejected_logps=PR[:1], ref_chosen_logps=RC,
                                    ref_rejected_logps=RR[:1])
    assert losses.shape == (3,) and "rewards/margins" not in stats


def test_orpo_by_hand():
    losses, _ = _loss("orpo", beta=0.2)
    want = []
    for aw, al in [(-4 / 4, -7 / 7), (-6 / 3, -5 / 2)]:
        log_odds = (aw - al) - (math.log(1 - math.exp(aw)) - math.log(1 - math.exp(al)))
        want.append(-aw - 0.2 * _logsig(log_odds))
    assert losses.tolist() == pytest.approx(want)


def test_rpo_is_dpo_plus_the_chosen_per_token_nll():
    dpo, _ = _loss("dpo", beta=0.5)
    rpo, _ = _loss("rpo", beta=0.5, alpha=0.3)
    assert rpo.tolist() == pytest.approx((dpo + 0.3 * torch.tensor([4 / 4, 6 / 3])).tolist())


def test_bco_pair_and_sft_by_hand():
    losses, _ = _loss("bco_pair", beta=0.5, delta=0.1)
    want = [-_logsig(0.5 * hw - 0.1) - _logsig(-(0.5 * hl - 0.1)) for hw, hl in zip(HW, HL)]
    assert losses.tolist() == pytest.approx(want)
    sft, stats = _loss("sft")
    assert sft.tolist() == pytest.approx([1.0, 2.0]) and "rewards/chosen" not in stats
    summed, _ = preference_loss("sft", chosen_logps=PC, rejected_logps=PR)
    assert summed.tolist() == pytest.approx([4.0, 6.0])


def test_mixed_losses_are_the_weighted_sum_and_share_options():
    mixed, stats = _loss(["dpo", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0], beta=0.5)
    parts = [_loss(n, beta=0.5)[0] if n != "sft" else _loss(n)[0] for n in ("dpo", "bco_pair", "sft")]
    assert mixed.tolist() == pytest.approx((0.8 * parts[0] + 0.2 * parts[1] + parts[2]).tolist())
    assert stats["rewards/chosen"] == pytest.approx(_loss("dpo", beta=0.5)[1]["rewards/chosen"])


def test_gradients_flow_to_the_policy_log_probs():
    pc = PC.clone().requires_grad_(True)
    losses, _ = preference_loss("dpo", chosen_logps=pc, rejected_logps=PR, ref_chosen_logps=RC,
                                ref_rejected_logps=RR)
    losses.mean().backward()
    assert (pc.grad < 0).all()  # raising the chosen log-prob lowers the loss


@pytest.mark.parametrize("call, message", [
    (lambda: _loss("dpo", gamma=1.0), "unknown option 'gamma' for preference loss 'dpo'; valid: beta, label_smoothing"),
    (lambda: _loss("cpo"), "unknown preference loss 'cpo'"),
    (lambda: _loss("dpo", beta=0.0), "beta must be > 0"),
    (lambda: _loss("ipo", beta=-1.0), "beta must be > 0"),
    (lambda: _loss("dpo", label_smoothing=0.5), r"label_smoothing must be in \[0, 0.5\)"),
    (lambda: preference_loss("dpo", chosen_logps=PC, rejected_logps=PR), "'dpo' needs ref_chosen_logps"),
    (lambda: preference_loss("simpo", chosen_logps=PC, rejected_logps=PR), "'simpo' needs chosen_lengths"),
    (lambda: _loss(["dpo", "sft"], loss_weights=[1.0]), "loss_weights: 1 weights for 2 losses"),
    (lambda: _loss(["dpo", "kto"]), "cannot be mixed"),
    (lambda: _loss(["dpo", "sft"], alpha=1.0), "unknown option 'alpha' for preference losses"),
])
def test_bad_names_options_and_inputs_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()
