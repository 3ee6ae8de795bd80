"""Policy losses, KL estimators and aggregation: hand-computed vectors (arithmetic in comments) and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardlab.rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate,
    compute_policy_loss,
    kl_clamped,
    kl_penalty,
)

SETTINGS = settings(max_examples=50, deadline=None)
STAT_KEYS = {
    "policy/clip_frac_low", "policy/clip_frac_high", "policy/clip_frac_dual", "policy/clip_frac",
    "policy/approx_kl", "policy/ratio_mean", "policy/ratio_min", "policy/ratio_max", "policy/ratio_std",
    "policy/log_ratio_clamped",
}


def close(actual, expected, atol=1e-5):
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert torch.allclose(actual.detach().float(), expected, atol=atol), f"\n{actual}\n!=\n{expected}"


def ppo_batch():
    """Five response tokens (row 1 is padded) with chosen ratios rho and advantages A.

    token  rho   A    -rho*A   -clip(rho, .8, 1.2)*A   max (plain ppo)   clip that decides
    a      1.5   +1   -1.5     -1.2                    -1.2              high
    b      0.5   -1   +0.5     +0.8                    +0.8              low
    c      0.5   +1   -0.5     -0.8                    -0.5              none
    d      5.0   -1   +5.0     +1.2                    +5.0              none (dual clip c=3 -> min(5, 3) = 3)
    e      1.1   +2   -2.2     -2.2                    -2.2              none
    """
    rho = torch.tensor([[1.5, 0.5, 0.5], [5.0, 1.1, 1.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    old = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.7, -1.0]])
    logprobs = (old + rho.log()).requires_grad_(True)
    return dict(logprobs=logprobs, old_logprobs=old, advantages=adv, mask=mask)


def test_ppo_clip_values_gradients_and_stats():
    b = ppo_batch()
    per_token, stats = POLICY_LOSSES["ppo_clip"](**b)
    close(per_token, [[-1.2, 0.8, -0.5], [5.0, -2.2, 0.0]])
    # d l / d logprobs = -A * rho where the unclipped term is chosen, 0 where a clip decides:
    # a: 0, b: 0, c: -1 * .5 = -.5, d: +1 * 5 = 5, e: -2 * 1.1 = -2.2
    per_token.sum().backward()
    close(b["logprobs"].grad, [[0.0, 0.0, -0.5], [5.0, -2.2, 0.0]])
    assert set(stats) == STAT_KEYS and all(isinstance(v, float) for v in stats.values())
    assert stats["policy/clip_frac_low"] == pytest.approx(1 / 5)
    assert stats["policy/clip_frac_high"] == pytest.approx(1 / 5)
    assert stats["policy/clip_frac_dual"] == 0.0
    assert stats["policy/clip_frac"] == pytest.approx(2 / 5)
    # ratios over the 5 response tokens: (1.5 + .5 + .5 + 5 + 1.1) / 5 = 1.72, min .5, max 5
    assert stats["policy/ratio_mean"] == pytest.approx(1.72, abs=1e-5)
    assert stats["policy/ratio_min"] == pytest.approx(0.5, abs=1e-6)
    assert stats["policy/ratio_max"] == pytest.approx(5.0, abs=1e-5)
    # population std: sqrt(mean((rho - 1.72)^2)) = sqrt((.0484 + 1.4884 + 1.4884 + 10.7584 + .3844) / 5)
    assert stats["policy/ratio_std"] == pytest.approx(math.sqrt(14.168 / 5), abs=1e-5)
    # approx_kl = mean(rho - 1 - log rho) (k3 of KL(old || new))
    rhos = [1.5, 0.5, 0.5, 5.0, 1.1]
    expected_kl = sum(r - 1 - math.log(r) for r in rhos) / 5
    assert stats["policy/approx_kl"] == pytest.approx(expected_kl, abs=1e-5)


def test_ppo_clip_dual_clip_and_token_mean():
    b = ppo_batch()
    loss, stats = compute_policy_loss("ppo_clip", dual_clip=3.0, **b)
    # token d: min(5, -3 * -1) = 3. Sum = -1.2 + .8 - .5 + 3 - 2.2 = -.1; token-mean over 5 tokens = -.02
    assert loss.dim() == 0
    assert loss.item() == pytest.approx(-0.02, abs=1e-5)
    assert stats["policy/clip_frac_dual"] == pytest.approx(1 / 5)
    assert stats["policy/clip_frac"] == pytest.approx(3 / 5)
    loss.backward()
    # gradient of d is now 0 (constant -c*A); others as before, divided by 5 tokens
    close(b["logprobs"].grad, [[0.0, 0.0, -0.1], [0.0, -0.44, 0.0]])
    # without dual clip: (-1.2 + .8 - .5 + 5 - 2.2) / 5 = 1.9 / 5 = .38
    loss, _ = compute_policy_loss("ppo_clip", **ppo_batch())
    assert loss.item() == pytest.approx(0.38, abs=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        compute_policy_loss("ppo_clip", dual_clip=0.5, **ppo_batch())


def test_ppo_clip_higher():
    # clip_high = .28 (DAPO): token a -> -clip(1.5, .8, 1.28) * 1 = -1.28
    per_token, _ = POLICY_LOSSES["ppo_clip"](clip_high=0.28, **ppo_batch())
    assert per_token[0, 0].item() == pytest.approx(-1.28, abs=1e-6)


def gspo_batch():
    # Row 0: log-ratios [.1, .3] -> mean .2, s = e^.2 = 1.221403; A = 1 on both tokens.
    # Row 1: log-ratios [0, 0, pad] -> s = 1; A = -2.
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, 0.0]])
    log_ratio = torch.tensor([[0.1, 0.3, 0.0], [0.0, 0.0, 9.0]])
    logprobs = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    return dict(logprobs=logprobs, old_logprobs=old, advantages=adv, mask=mask)


def test_gspo_default_clip_range():
    # defaults (3e-4, 4e-4): row 0 clipped, -min(1.2214 * 1, 1.0004 * 1) = -1.0004 per token, no gradient;
    # row 1: -min(1 * -2, 1 * -2) = 2 per token (l = -A * s with ds/dlp_t = s / L = 1 / 2).
    b = gspo_batch()
    per_token, stats = POLICY_LOSSES["gspo"](**b)
    close(per_token, [[-1.0004, -1.0004, 0.0], [2.0, 2.0, 0.0]])
    per_token.sum().backward()
    # d/d lp_t of sum over row 1's 2 tokens of (-A s) = 2 * (2 * s / 2) = 2
    close(b["logprobs"].grad, [[0.0, 0.0, 0.0], [2.0, 2.0, 0.0]])
    assert stats["policy/clip_frac_high"] == pytest.approx(2 / 4)  # row 0's two tokens
    assert stats["policy/clip_frac_low"] == 0.0
    # ratio stats are of s_i: (1.221403 * 2 + 1 * 2) / 4
    assert stats["policy/ratio_mean"] == pytest.approx((2 * math.exp(0.2) + 2) / 4, abs=1e-5)
    assert stats["policy/ratio_max"] == pytest.approx(math.exp(0.2), abs=1e-5)


def test_gspo_unclipped_gradient():
    # clip .3: row 0 unclipped, l = -A * s = -1.221403 on each of 2 tokens;
    # d(sum of row 0)/d lp_t = 2 * (-A * s / L) = 2 * (-1.221403 / 2) = -1.221403
    b = gspo_batch()
    per_token, _ = POLICY_LOSSES["gspo"](clip_low=0.3, clip_high=0.3, **b)
    s = math.exp(0.2)
    close(per_token[0], [-s, -s, 0.0])
    per_token.sum().backward()
    close(b["logprobs"].grad[0], [-s, -s, 0.0])


def test_cispo():
    # rho = [1.5, .5], A = [1, -1], logprobs = [-.5, -1]; clip_high = .2 -> weights sg(min(rho, 1.2)) = [1.2, .5]
    # l = -w * A * logprobs = [-1.2 * 1 * -.5, -.5 * -1 * -1] = [.6, -.5]; gradient -w * A = [-1.2, .5]
    lp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    old = lp.detach() - torch.tensor([[math.log(1.5), math.log(0.5)]])
    b = dict(logprobs=lp, old_logprobs=old, advantages=torch.tensor([[1.0, -1.0]]), mask=torch.ones(1, 2))
    per_token, stats = POLICY_LOSSES["cispo"](**b)
    close(per_token, [[0.6, -0.5]])
    per_token.sum().backward()
    close(lp.grad, [[-1.2, 0.5]])
    assert stats["policy/clip_frac_high"] == pytest.approx(0.5)
    assert stats["policy/clip_frac_low"] == 0.0
    # optional lower bound 1 - .3 = .7: token 1 weight .7 -> l = -.7 * -1 * -1 = -.7
    per_token, stats = POLICY_LOSSES["cispo"](clip_low=0.3, **{**b, "logprobs": lp.detach()})
    close(per_token, [[0.6, -0.7]])
    assert stats["policy/clip_frac_low"] == pytest.approx(0.5)


def test_reinforce():
    # l = -A * logprobs = [-2 * -.5, -(-1) * -1] = [1, -1]; gradient -A = [-2, 1]; padding 0
    lp = torch.tensor([[-0.5, -1.0, -3.0]], requires_grad=True)
    b = dict(logprobs=lp, old_logprobs=lp.detach(), advantages=torch.tensor([[2.0, -1.0, 5.0]]),
             mask=torch.tensor([[1, 1, 0]]))
    per_token, stats = POLICY_LOSSES["reinforce"](**b)
    close(per_token, [[1.0, -1.0, 0.0]])
    per_token.sum().backward()
    close(lp.grad, [[-2.0, 1.0, 0.0]])
    assert stats["policy/clip_frac"] == 0.0 and stats["policy/ratio_mean"] == pytest.approx(1.0)


def test_kl_estimators():
    # d = [0, 1, -1]
    # k1 = d; k2 = d^2 / 2 = [0, .5, .5]; k3 = e^-d + d - 1 = [1 + 0 - 1, e^-1 + 0, e + -1 - 1] = [0, .367879, .718282]
    lp = torch.tensor([[0.0, 1.0, -1.0]])
    ref = torch.zeros(1, 3)
    close(kl_penalty("k1", lp, ref), [[0.0, 1.0, -1.0]])
    close(kl_penalty("k2", lp, ref), [[0.0, 0.5, 0.5]])
    close(kl_penalty("k3", lp, ref), [[0.0, math.exp(-1), math.e - 2]])
    # same d from nonzero inputs: shift both by -2
    close(kl_penalty("k3", lp - 2, ref - 2), [[0.0, math.exp(-1), math.e - 2]])


def extreme_batch():
    """Row 0 (A = +1) and row 1 (A = -1), 3 tokens each; old log-prob -inf on token 1 of each row (a token the
    behaviour policy could not have sampled, e.g. after a tokenizer mismatch); current log-probs all -1."""
    old = torch.full((2, 3), -1.0)
    old[:, 1] = float("-inf")
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    return old, adv, torch.ones(2, 3, dtype=torch.bool)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_minus_inf_old_logprob_gives_finite_loss_and_gradients(name):
    # d = logprobs - old = +inf on the two -inf tokens, 0 elsewhere; it is clamped to 20 (rho = e^20 = 4.85e8).
    # Before the clamp: ppo_clip and gspo gave loss inf (the A < 0 row takes the unclipped -A * rho = +inf) and
    # NaN gradients.
    old, adv, mask = extreme_batch()
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    loss, stats = compute_policy_loss(name, logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    loss.backward()
    assert math.isfinite(float(loss)), float(loss)
    assert torch.isfinite(lp.grad).all(), lp.grad
    assert all(math.isfinite(v) for v in stats.values()), stats
    assert stats["policy/log_ratio_clamped"] == 2.0  # the two -inf tokens, out of 6
    rho = math.exp(20.0)
    if name == "ppo_clip":
        # per token: row 0 -min(rho, 1.2) = -1.2 on the clamped token, -1 elsewhere; row 1 max(rho, .8) = rho, 1, 1
        assert float(loss) == pytest.approx((-1.2 - 2 + rho + 2) / 6, rel=1e-6)
        assert stats["policy/ratio_max"] == pytest.approx(rho, rel=1e-6)
        # the clamped tokens get no gradient; the others -A * rho / 6 = -+1/6
        close(lp.grad, [[-1 / 6, 0.0, -1 / 6], [1 / 6, 0.0, 1 / 6]])
    if name == "gspo":
        # s_i = exp(mean(0, 20, 0)) = e^(20/3) for both rows; row 0 clipped at 1 + 4e-4, row 1 unclipped (A < 0)
        s = math.exp(20 / 3)
        assert float(loss) == pytest.approx((-(1 + 4e-4) + s) / 2, rel=1e-5)
    if name == "cispo":
        # weight = min(e^20, 1.2) = 1.2 on the clamped tokens, 1 elsewhere; l = -w * A * logprobs
        assert float(loss) == pytest.approx((3.2 - 3.2) / 6, abs=1e-6)
        close(lp.grad, [[-1 / 6, -1.2 / 6, -1 / 6], [1 / 6, 1.2 / 6, 1 / 6]])


def test_log_ratio_clamp_bounds_and_stat():
    # d = 19.5 is kept (not counted), d = -25 and +30 are clamped to -20 and +20 (counted); padding is not counted.
    old = torch.tensor([[-19.5, 5.0, -30.0, 99.0]])
    lp = torch.zeros(1, 4)
    adv = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    _loss, stats = POLICY_LOSSES["reinforce"](logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert stats["policy/log_ratio_clamped"] == 1.0  # only -30 -> d = 30; d = -5 and 19.5 are inside the bound
    old[0, 1] = 25.0  # d = -25
    _loss, stats = POLICY_LOSSES["reinforce"](logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
    assert stats["policy/log_ratio_clamped"] == 2.0
    assert stats["policy/ratio_min"] == pytest.approx(math.exp(-20), rel=1e-5)
    assert stats["policy/ratio_max"] == pytest.approx(math.exp(20), rel=1e-5)


def test_kl_estimators_clamp_extreme_log_ratios():
    # d = logprobs - ref = [50, -50, 15, -3, 1]. d is clamped to [-20, 20]:
    #   k1 = [20, -20, 15, -3, 1]; k2 = d^2 / 2 = [200, 200, 112.5, 4.5, .5]
    #   k3 = exp(-d) + d - 1 clamped to [-10, 10]: d = 20 -> 19.000000002 -> 10; d = -20 -> e^20 - 21 -> 10;
    #        d = 15 -> 14.0000003 -> 10; d = -3 -> e^3 - 4 = 16.09 -> 10; d = 1 -> e^-1 = 0.367879
    lp = torch.tensor([[50.0, -50.0, 15.0, -3.0, 1.0]])
    ref = torch.zeros(1, 5)
    close(kl_penalty("k1", lp, ref), [[20.0, -20.0, 15.0, -3.0, 1.0]])
    close(kl_penalty("k2", lp, ref), [[200.0, 200.0, 112.5, 4.5, 0.5]], atol=1e-4)
    k3 = kl_penalty("k3", lp, ref)
    close(k3, [[10.0, 10.0, 10.0, 10.0, math.exp(-1)]])
    # the same from ref = -inf / logprobs = -inf: finite, no NaN
    inf = float("inf")
    k3 = kl_penalty("k3", torch.tensor([[0.0, -inf]]), torch.tensor([[-inf, 0.0]]))
    close(k3, [[10.0, 10.0]])
    # counts: every token but d = 1 is clamped for k3; only |d| > 20 for k1/k2; padding (mask 0) is not counted
    mask = torch.tensor([[1, 1, 1, 1, 1]])
    assert kl_clamped("k3", lp, ref, mask) == 4
    assert kl_clamped("k1", lp, ref, mask) == 2 and kl_clamped("k2", lp, ref, mask) == 2
    assert kl_clamped("k3", lp, ref, torch.tensor([[0, 1, 0, 0, 1]])) == 1


def test_k3_gradient_is_finite_for_extreme_log_ratios():
    lp = torch.tensor([[50.0, -50.0, -200.0, 0.5]], requires_grad=True)
    kl_penalty("k3", lp, torch.zeros(1, 4)).sum().backward()
    # clamped tokens get 0; d = .5: d/dd (e^-d + d - 1) = 1 - e^-.5 = 0.393469
    close(lp.grad, [[0.0, 0.0, 0.0, 1 - math.exp(-0.5)]])


def test_aggregations():
    # l = [[1, 2, 3], [4, 5, 6]], m = [[1, 1, 0], [1, 0, 0]] -> masked values 1, 2 | 4
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(aggregate(loss, m, "token-mean")) == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert float(aggregate(loss, m, "seq-mean-token-mean")) == pytest.approx(2.75)  # ((1+2)/2 + 4/1) / 2
    assert float(aggregate(loss, m, "seq-mean-token-sum")) == pytest.approx(3.5)  # (3 + 4) / 2
    assert float(aggregate(loss, m, "seq-mean-token-sum-norm")) == pytest.approx(7 / 6)  # 7 / (N=2 * T=3)
    assert float(aggregate(loss, m, "seq-mean-token-sum-norm", max_len=7)) == pytest.approx(0.5)  # 7 / (2 * 7)


def test_aggregations_empty_mask_is_zero_not_nan():
    loss = torch.full((2, 3), float("nan"))
    m = torch.zeros(2, 3)
    for mode in AGGREGATIONS:
        assert float(aggregate(loss, m, mode)) == 0.0, mode


def test_compute_policy_loss_passes_options_to_aggregation():
    # reinforce on the batch of test_reinforce: masked per-token [1, -1] sums to 0; use A = [2, 1] instead:
    # l = [-2 * -.5, -1 * -1] = [1, 1]; seq-mean-token-sum-norm with max_len 4: 2 / (1 * 4) = .5
    lp = torch.tensor([[-0.5, -1.0, 0.0]])
    loss, stats = compute_policy_loss("reinforce", logprobs=lp, old_logprobs=lp,
                                      advantages=torch.tensor([[2.0, 1.0, 0.0]]), mask=torch.tensor([[1, 1, 0]]),
                                      agg="seq-mean-token-sum-norm", max_len=4)
    assert float(loss) == pytest.approx(0.5)
    assert set(stats) == STAT_KEYS


@pytest.mark.parametrize(
    "call, kind, registry",
    [
        (lambda b: compute_policy_loss("foo", **b), "policy loss", POLICY_LOSSES),
        (lambda b: compute_policy_loss("ppo_clip", agg="foo", **b), "aggregation mode", AGGREGATIONS),
        (lambda b: aggregate(torch.zeros(1, 1), torch.ones(1, 1), "foo"), "aggregation mode", AGGREGATIONS),
        (lambda b: kl_penalty("foo", torch.zeros(1, 1), torch.zeros(1, 1)), "KL estimator", KL_ESTIMATORS),
    ],
)
def test_unknown_names_list_valid_names(call, kind, registry):
    with pytest.raises(ValueError) as err:
        call(ppo_batch())
    message = str(err.value)
    assert f"unknown {kind} 'foo'; valid: " + ", ".join(sorted(registry)) == message


# ------------------------------------------------------------------------------------------------ properties

small = st.floats(-3.0, 3.0, allow_nan=False, width=32)


@st.composite
def token_batch(draw, on_policy=False):
    N = draw(st.integers(1, 4))
    T = draw(st.integers(1, 5))
    grid = lambda: torch.tensor(draw(st.lists(small, min_size=N * T, max_size=N * T))).reshape(N, T)  # noqa: E731
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=N * T, max_size=N * T))).reshape(N, T)
    old = grid() - 2.0
    logprobs = old.clone() if on_policy else old + 0.3 * grid()
    return logprobs, old, grid(), mask


@SETTINGS
@given(token_batch(on_policy=True), st.sampled_from(sorted(AGGREGATIONS)), st.sampled_from([None, 2.0, 3.0]))
def test_ppo_clip_equals_reinforce_on_policy(batch, agg, dual):
    # At rho = 1: ppo_clip = -A * 1 in value, and its gradient -A * rho * dlogp = -A dlogp is REINFORCE's.
    # (reinforce's value is -A * logprobs, so the values agree only up to that factor.)
    logprobs, old, adv, mask = batch
    lp1 = logprobs.clone().requires_grad_(True)
    lp2 = logprobs.clone().requires_grad_(True)
    ppo, _ = compute_policy_loss("ppo_clip", logprobs=lp1, old_logprobs=old, advantages=adv, mask=mask, agg=agg,
                                 dual_clip=dual)
    rf, _ = compute_policy_loss("reinforce", logprobs=lp2, old_logprobs=old, advantages=adv, mask=mask, agg=agg)
    per_token, _ = POLICY_LOSSES["ppo_clip"](logprobs=logprobs, old_logprobs=old, advantages=adv, mask=mask)
    assert torch.allclose(per_token, -adv * mask, atol=1e-6)
    assert torch.allclose(ppo, aggregate(-adv * mask, mask, agg), atol=1e-6)
    ppo.backward()
    rf.backward()
    assert torch.allclose(lp1.grad, lp2.grad, atol=1e-6)
    # cispo at rho = 1 (weight 1) is reinforce exactly, value and gradient
    lp3 = logprobs.clone().requires_grad_(True)
    ci, _ = compute_policy_loss("cispo", logprobs=lp3, old_logprobs=old, advantages=adv, mask=mask, agg=agg)
    ci.backward()
    assert torch.allclose(ci, rf, atol=1e-6) and torch.allclose(lp3.grad, lp2.grad, atol=1e-6)


@SETTINGS
@given(token_batch())
def test_losses_zero_outside_mask(batch):
    logprobs, old, adv, mask = batch
    # padding may hold anything: -inf log-probs, NaN advantages
    lp = torch.where(mask, logprobs, torch.full_like(logprobs, float("-inf"))).requires_grad_(True)
    old = torch.where(mask, old, torch.full_like(old, float("nan")))
    adv = torch.where(mask, adv, torch.full_like(adv, float("nan")))
    for name in POLICY_LOSSES:
        lp.grad = None
        options = {"dual_clip": 3.0} if name == "ppo_clip" else {}
        per_token, stats = POLICY_LOSSES[name](logprobs=lp, old_logprobs=old, advantages=adv, mask=mask, **options)
        assert per_token.shape == mask.shape, name
        assert torch.all(per_token[~mask] == 0), name
        assert torch.isfinite(per_token).all(), name
        per_token.sum().backward()
        assert torch.all(lp.grad[~mask] == 0) and torch.isfinite(lp.grad).all(), name
        assert set(stats) == STAT_KEYS and all(math.isfinite(v) for v in stats.values()), name
        assert 0.0 <= stats["policy/clip_frac"] <= 1.0


@SETTINGS
@given(token_batch())
def test_kl_estimators_nonnegative_where_expected(batch):
    logprobs, ref, _adv, _mask = batch
    d = logprobs - ref
    assert torch.allclose(kl_penalty("k1", logprobs, ref), d)
    assert (kl_penalty("k2", logprobs, ref) >= 0).all()
    assert (kl_penalty("k3", logprobs, ref) >= -1e-7).all()
