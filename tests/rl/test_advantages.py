"""Advantage estimators: hand-computed vectors (arithmetic in comments) and hypothesis properties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardlab.rl.advantages import ESTIMATORS, compute_advantages, register_estimator

SETTINGS = settings(max_examples=50, deadline=None)
ATOL = 1e-5


def outcome_batch(R, lengths, T=None):
    """token_rewards with R[i] on the last response token of row i, and the matching left-contiguous mask."""
    T = T or max(lengths)
    rewards = torch.zeros(len(R), T)
    mask = torch.zeros(len(R), T, dtype=torch.bool)
    for i, (r, n) in enumerate(zip(R, lengths)):
        mask[i, :n] = True
        if n:
            rewards[i, n - 1] = r
    return rewards, mask


def close(actual, expected, atol=ATOL):
    expected = torch.as_tensor(expected, dtype=torch.float32)
    assert actual.dtype == torch.float32
    assert torch.allclose(actual, expected, atol=atol), f"\n{actual}\n!=\n{expected}"


# ------------------------------------------------------------------------------------------------ hand-computed


def test_grpo_single_group():
    # R = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt((4 * 0.25) / 3) = sqrt(1/3) = 0.57735
    # A = +-0.5 / 0.57735 = +-0.866025, broadcast over the 2 response tokens of each row.
    r, m = outcome_batch([1.0, 0.0, 0.0, 1.0], [2, 2, 2, 2])
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=torch.tensor([3, 3, 3, 3]))
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(a, [[s, s], [-s, -s], [-s, -s], [s, s]])


def test_grpo_two_groups_noncontiguous_ids_and_padding():
    # group 7 = rows 0, 2 with R = [1, 3]: mean 2, std sqrt(2) -> A = -1/sqrt2, +1/sqrt2
    # group -3 = rows 1, 3 with R = [0, 2]: mean 1, std sqrt(2) -> A = -1/sqrt2, +1/sqrt2
    # row 1 has one response token out of 3; padding gets 0.
    r, m = outcome_batch([1.0, 0.0, 3.0, 2.0], [3, 1, 2, 3])
    g = torch.tensor([7, -3, 7, -3])
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=g)
    k = 1 / (math.sqrt(2) + 1e-6)
    close(a, [[-k, -k, -k], [-k, 0, 0], [k, k, 0], [k, k, k]])


def test_grpo_scale_batch_and_none():
    # R = [1, 0, 3, 2], groups as above: centered = [-1, -1, +1, +1].
    # batch std: mean 1.5, squared deviations 0.25 + 2.25 + 2.25 + 0.25 = 5, / 3 -> std = sqrt(5/3) = 1.290994
    r, m = outcome_batch([1.0, 0.0, 3.0, 2.0], [1, 1, 1, 1])
    g = torch.tensor([7, -3, 7, -3])
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=g, scale="batch")
    k = 1 / (math.sqrt(5 / 3) + 1e-6)
    close(a, [[-k], [-k], [k], [k]])
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=g, scale="none")
    close(a, [[-1.0], [-1.0], [1.0], [1.0]])
    with pytest.raises(ValueError, match="scale"):
        compute_advantages("grpo", token_rewards=r, mask=m, group=g, scale="bogus")


def test_grpo_singleton_group_is_zero():
    # group 9 has one rollout -> 0; group 1 has R = [2, 0]: mean 1, std sqrt(2) -> +-1/sqrt2.
    r, m = outcome_batch([5.0, 2.0, 0.0], [1, 1, 1])
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=torch.tensor([9, 1, 1]))
    k = 1 / (math.sqrt(2) + 1e-6)
    close(a, [[0.0], [k], [-k]])
    # eps = 0: the singleton's 0 / 0 must still come out as 0, not NaN
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=torch.tensor([9, 1, 1]), eps=0.0)
    close(a, [[0.0], [1 / math.sqrt(2)], [-1 / math.sqrt(2)]])


def test_dr_grpo():
    # R = [1, 0, 3, 2]; group 7 (rows 0, 2) mean 2, group -3 (rows 1, 3) mean 1 -> A = [-1, -1, 1, 1]
    r, m = outcome_batch([1.0, 0.0, 3.0, 2.0], [2, 1, 2, 2])
    a = compute_advantages("dr_grpo", token_rewards=r, mask=m, group=torch.tensor([7, -3, 7, -3]))
    close(a, [[-1, -1], [-1, 0], [1, 1], [1, 1]])


def test_rloo():
    # R = [3, 0, 0] in one group: A_0 = 3 - (0 + 0)/2 = 3; A_1 = 0 - (3 + 0)/2 = -1.5; A_2 = -1.5
    r, m = outcome_batch([3.0, 0.0, 0.0], [2, 2, 1])
    a = compute_advantages("rloo", token_rewards=r, mask=m, group=torch.tensor([0, 0, 0]))
    close(a, [[3, 3], [-1.5, -1.5], [-1.5, 0]])


def test_rloo_singleton_names_group():
    r, m = outcome_batch([1.0, 0.0, 1.0], [1, 1, 1])
    with pytest.raises(ValueError, match="42"):
        compute_advantages("rloo", token_rewards=r, mask=m, group=torch.tensor([0, 0, 42]))


def test_reinforce_pp_discounted_and_whitened():
    # gamma = 0.5. Row 0: r = [1, 0, 2] -> G = [1 + .5 * 1, 0 + .5 * 2, 2] = [1.5, 1, 2]
    # Row 1: r = [0, 4, pad] -> G = [0 + .5 * 4, 4] = [2, 4]
    # Tokens 1.5, 1, 2, 2, 4: mean 10.5 / 5 = 2.1; deviations -.6, -1.1, -.1, -.1, 1.9;
    # squares .36 + 1.21 + .01 + .01 + 3.61 = 5.2; unbiased var 5.2 / 4 = 1.3.
    r = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 99.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    a = compute_advantages("reinforce_pp", token_rewards=r, mask=m, group=torch.tensor([0, 1]), gamma=0.5)
    s = math.sqrt(1.3) + 1e-6
    close(a, [[-0.6 / s, -1.1 / s, -0.1 / s], [-0.1 / s, 1.9 / s, 0.0]])


def test_reinforce_pp_baseline():
    # groups [0, 0, 1, 1], R = [1, 0, 2, 2] -> R - group mean = [.5, -.5, 0, 0]
    # broadcast over lengths [2, 2, 2, 1] -> 7 tokens: .5, .5, -.5, -.5, 0, 0, 0; mean 0;
    # sum of squares 4 * .25 = 1; unbiased var 1 / 6 -> std 0.408248; A = +-.5 / 0.408248 = +-1.224745
    r, m = outcome_batch([1.0, 0.0, 2.0, 2.0], [2, 2, 2, 1])
    a = compute_advantages("reinforce_pp_baseline", token_rewards=r, mask=m, group=torch.tensor([0, 0, 1, 1]))
    k = 0.5 / (math.sqrt(1 / 6) + 1e-6)
    close(a, [[k, k], [-k, -k], [0, 0], [0, 0]])


def test_remax():
    # A = R - b = [1 - .5, 0 - .5]
    r, m = outcome_batch([1.0, 0.0], [2, 1])
    a = compute_advantages("remax", token_rewards=r, mask=m, group=torch.tensor([0, 0]),
                           baseline=torch.tensor([0.5, 0.5]))
    close(a, [[0.5, 0.5], [-0.5, 0.0]])
    with pytest.raises(ValueError, match="baseline"):
        compute_advantages("remax", token_rewards=r, mask=m, group=torch.tensor([0, 0]))


def test_opo_length_weighted_baseline():
    # R = [1, 0], lengths L = [3, 1]: b = (3 * 1 + 1 * 0) / (3 + 1) = 0.75 -> A = [0.25, -0.75]
    r, m = outcome_batch([1.0, 0.0], [3, 1])
    a = compute_advantages("opo", token_rewards=r, mask=m, group=torch.tensor([4, 4]))
    close(a, [[0.25, 0.25, 0.25], [-0.75, 0, 0]])


def gdpo_expected_unwhitened():
    # component 0 = [1, 0, 1, 0]: mean .5, std sqrt(1/3) -> [+k, -k, +k, -k], k = .5 / sqrt(1/3) = 0.866025
    # component 1 = [2, 2, 2, 6]: mean 3, deviations [-1, -1, -1, 3], var (1+1+1+9)/3 = 4, std 2
    #   -> [-.5, -.5, -.5, 1.5]
    # weights [1, 2]: A = [k - 1, -k - 1, k - 1, -k + 3]
    k = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    j = 1 / (2 + 1e-6)
    return torch.tensor([k - 2 * j, -k - 2 * j, k - 2 * j, -k + 6 * j])


def test_gdpo():
    r, m = outcome_batch([0.0] * 4, [1, 1, 1, 1])
    comps = torch.tensor([[1.0, 2.0], [0.0, 2.0], [1.0, 2.0], [0.0, 6.0]])
    opts = dict(token_rewards=r, mask=m, group=torch.tensor([1, 1, 1, 1]), components=comps,
                weights=torch.tensor([1.0, 2.0]))
    expected = gdpo_expected_unwhitened()
    close(compute_advantages("gdpo", batch_whiten=False, **opts), expected[:, None])
    # whitened over the 4 values: mean 0 (group-centered), unbiased std = sqrt(sum(A^2) / 3)
    std = math.sqrt(float((expected**2).sum()) / 3)
    close(compute_advantages("gdpo", **opts), (expected / (std + 1e-6))[:, None])
    with pytest.raises(ValueError, match="components"):
        compute_advantages("gdpo", token_rewards=r, mask=m, group=torch.tensor([1, 1, 1, 1]))


def process_batch():
    # Row 0 (4 tokens): steps end at t=1 (p=.8) and t=3 (p=.2); outcome r=1 at t=3.
    # Row 1 (3 tokens): one step ending at t=2 (p=.5); outcome r=0.
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    p = torch.tensor([[0.0, 0.8, 0.0, 0.2], [0.0, 0.0, 0.5, 0.0]])
    sm = torch.tensor([[0, 1, 0, 1], [0, 0, 1, 0]])
    return dict(token_rewards=r, mask=m, group=torch.tensor([0, 0]), step_rewards=p, step_mask=sm)


def test_pure():
    # tau = .1: row 0 weights = softmax([-8, -2]) = [1/(1+e^6), e^6/(1+e^6)] = [0.0024726, 0.9975274]
    # p' = [.8 * 0.0024726, .2 * 0.9975274] = [0.0019781, 0.1995055]
    # G row 0: t3 = .1995055 + 1, t2 = same, t1 = t0 = 1.1995055 + .0019781 = 1.2014836
    # row 1: single step -> weight 1, p' = .5; G = [.5, .5, .5, 0]
    # baselines (leave-one-out of G_{j,0}): row 0 -> 0.5; row 1 -> 1.2014836
    w0 = 1 / (1 + math.exp(6))
    p0, p1 = 0.8 * w0, 0.2 * (1 - w0)
    g3 = p1 + 1
    g1 = g3 + p0
    a = compute_advantages("pure", **process_batch())
    close(a, [[g1 - 0.5, g1 - 0.5, g3 - 0.5, g3 - 0.5], [0.5 - g1, 0.5 - g1, 0.5 - g1, 0.0]])


def test_pure_requires_steps_and_positive_temperature():
    b = process_batch()
    with pytest.raises(ValueError, match="step_rewards"):
        compute_advantages("pure", token_rewards=b["token_rewards"], mask=b["mask"], group=b["group"])
    with pytest.raises(ValueError, match="temperature"):
        compute_advantages("pure", temperature=0.0, **b)


def test_process_sum_discounted():
    # gamma = .5. Row 0: x = p + r = [0, .8, 0, 1.2] -> G = [.55, 1.1, .6, 1.2]
    #   (t3 = 1.2; t2 = .5 * 1.2 = .6; t1 = .8 + .3 = 1.1; t0 = .55)
    # Row 1: x = [0, 0, .5] -> G = [.125, .25, .5]
    # baseline row 0 = G_{1,0} = .125; row 1 = G_{0,0} = .55
    a = compute_advantages("process_sum", gamma=0.5, **process_batch())
    close(a, [[0.425, 0.975, 0.475, 1.075], [-0.425, -0.3, -0.05, 0.0]])


def test_gae_hand_computed():
    # gamma = .5, lam = .5 (gamma * lam = .25)
    # Row 0: r = [0, 0, 1], V = [.5, .4, .6]:
    #   delta = [0 + .5*.4 - .5, 0 + .5*.6 - .4, 1 + 0 - .6] = [-.3, -.1, .4]
    #   A2 = .4; A1 = -.1 + .25 * .4 = 0; A0 = -.3 + .25 * 0 = -.3
    # Row 1 (2 tokens): r = [0, 2], V = [1, 1]: delta = [0 + .5 - 1, 2 - 1] = [-.5, 1]; A = [-.5 + .25, 1]
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    v = torch.tensor([[0.5, 0.4, 0.6], [1.0, 1.0, 5.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kw = dict(token_rewards=r, mask=m, group=torch.tensor([0, 1]), values=v, gamma=0.5, lam=0.5)
    expected = torch.tensor([[-0.3, 0.0, 0.4], [-0.25, 1.0, 0.0]])
    close(compute_advantages("gae", whiten=False, **kw), expected)
    # whitened: tokens -.3, 0, .4, -.25, 1 -> mean .85 / 5 = .17; unbiased std over 5 tokens
    tokens = torch.tensor([-0.3, 0.0, 0.4, -0.25, 1.0])
    whitened = (tokens - 0.17) / (tokens.std() + 1e-6)
    close(compute_advantages("gae", **kw), [[*whitened[:3].tolist()], [*whitened[3:].tolist(), 0.0]])
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", token_rewards=r, mask=m, group=torch.tensor([0, 1]))


def test_unknown_estimator_lists_valid_names():
    r, m = outcome_batch([1.0], [1])
    with pytest.raises(ValueError) as err:
        compute_advantages("foo", token_rewards=r, mask=m, group=torch.tensor([0]))
    message = str(err.value)
    assert "unknown advantage estimator 'foo'" in message and "\n" not in message
    assert "valid: " + ", ".join(sorted(ESTIMATORS)) in message
    for name in ("grpo", "dr_grpo", "rloo", "gae", "pure", "process_sum", "gdpo", "opo", "remax"):
        assert name in message


def test_register_duplicate_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda **_: None)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="group"):
        compute_advantages("grpo", token_rewards=torch.zeros(2, 3), mask=torch.ones(2, 3), group=torch.zeros(3))


# ------------------------------------------------------------------------------------------------ properties

quarter = st.integers(-20, 20).map(lambda x: x / 4)
#: Any finite float32 reward with |x| <= 1e6 (subnormals and signed zeros included), not only multiples of 0.25.
wide = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
#: Rewards that real reward functions give; 1.1 summed 16 times in float32 misses 16 * 1.1 by one unit.
COMMON = [0.1, 0.2, 0.3, 0.7, 1.1, 1.3, 0.01, 1 / 3, 2 / 3, 0.05, 0.9, 5.5, -0.1, 1e-7, 123.456, 1e6]


@st.composite
def group_rewards(draw, n, values=wide):
    """n rewards of one group: all equal (the case that must give exactly 0) or arbitrary."""
    if draw(st.booleans()):
        return [draw(values)] * n
    return draw(st.lists(values, min_size=n, max_size=n))


@st.composite
def grouped_batch(draw, min_group_size=1, max_groups=4, max_group_size=64):
    """Outcome-reward batch with shuffled, non-contiguous group ids; every row has >= 1 response token.

    Groups of up to 64 rollouts; each group's rewards are either all equal or arbitrary floats (|x| <= 1e6).
    """
    sizes = draw(st.lists(st.integers(min_group_size, max_group_size), min_size=1, max_size=max_groups))
    ids = draw(st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True))
    rewards = {gid: draw(group_rewards(n)) for gid, n in zip(ids, sizes)}
    group = draw(st.permutations([gid for gid, n in zip(ids, sizes) for _ in range(n)]))
    R = [rewards[gid].pop() for gid in group]
    n = len(group)
    T = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, T), min_size=n, max_size=n))
    r, m = outcome_batch(R, lengths, T)
    return r, m, torch.tensor(group, dtype=torch.int64), torch.tensor(R)


def sequence_values(a, m):
    """Value at each row's first response token (rows are left-contiguous and non-empty here)."""
    return a[:, 0]


@SETTINGS
@given(grouped_batch(min_group_size=2))
def test_group_centered_estimators_sum_to_zero(batch):
    r, m, g, _R = batch
    for name in ("grpo", "dr_grpo", "rloo"):
        a = compute_advantages(name, token_rewards=r, mask=m, group=g)
        seq = sequence_values(a, m)
        for gid in g.unique():
            values = seq[g == gid].double()
            total = float(values.sum())  # float32 rounding of each A_i is at most 2^-24 |A_i|
            assert abs(total) <= 1e-6 * float(values.abs().sum()) + 1e-12, (name, int(gid), total)
        # broadcast: the same value on every response token of a row
        assert torch.allclose(a, seq[:, None] * m.float())


@SETTINGS
@given(grouped_batch(min_group_size=1))
def test_grpo_singletons_get_zero(batch):
    r, m, g, _R = batch
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=g)
    _, inverse, counts = torch.unique(g, return_inverse=True, return_counts=True)
    single = counts[inverse] == 1
    assert torch.all(a[single] == 0)


@SETTINGS
@given(grouped_batch(min_group_size=2), st.integers(1000, 2000))
def test_rloo_singleton_error_names_group(batch, lonely):
    r, m, g, _R = batch
    r = torch.cat([r, torch.ones(1, r.shape[1])])
    m = torch.cat([m, torch.ones(1, m.shape[1], dtype=torch.bool)])
    g = torch.cat([g, torch.tensor([lonely])])
    with pytest.raises(ValueError, match=str(lonely)):
        compute_advantages("rloo", token_rewards=r, mask=m, group=g)


@st.composite
def masked_batch(draw):
    """Arbitrary (even non-contiguous) masks with NaN in every off-mask input; groups of >= 2 rollouts."""
    r, m, g, _R = draw(grouped_batch(min_group_size=2))
    N, T = r.shape
    bits = draw(st.lists(st.booleans(), min_size=N * T, max_size=N * T))
    m = torch.tensor(bits).reshape(N, T)
    dense = draw(st.lists(wide, min_size=N * T, max_size=N * T))
    r = torch.tensor(dense).reshape(N, T)
    return r, m, g


def poison(x, m):
    return torch.where(m, x, torch.full_like(x, float("nan")))


@SETTINGS
@given(masked_batch())
def test_estimators_zero_outside_mask_given_their_declared_options(batch):
    r, m, g = batch
    N, T = r.shape
    gen = torch.Generator().manual_seed(N * 100 + T)  # deterministic per example
    step_mask = torch.rand(N, T, generator=gen) < 0.5
    options = dict(
        eps=1e-6, gamma=0.9, lam=0.95, temperature=0.1,
        values=poison(torch.randn(N, T, generator=gen), m), baseline=torch.randn(N, generator=gen),
        components=torch.randn(N, 2, generator=gen), step_rewards=poison(torch.rand(N, T, generator=gen), m),
        step_mask=step_mask,
    )
    for name in ESTIMATORS:
        declared = {k: v for k, v in options.items() if k in ESTIMATORS.options(name)}
        a = compute_advantages(name, token_rewards=poison(r, m), mask=m, group=g, **declared)
        assert a.shape == (N, T) and a.dtype == torch.float32, name
        assert torch.all(a[~m] == 0), name
        assert torch.isfinite(a).all(), name


@SETTINGS
@given(grouped_batch(min_group_size=2))
def test_process_sum_outcome_only_equals_rloo(batch):
    # gamma = 1 and no process reward: G_{i,t} = R_i on every response token, so A = R_i - LOO mean = rloo.
    r, m, g, _R = batch
    zeros = torch.zeros_like(r)
    a = compute_advantages("process_sum", token_rewards=r, mask=m, group=g, step_rewards=zeros, step_mask=m)
    b = compute_advantages("rloo", token_rewards=r, mask=m, group=g)
    assert torch.allclose(a[:, 0], b[:, 0], rtol=1e-6, atol=1e-6)
    assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)


def pure_first_return(p, steps, outcome, temperature):
    """G_{0,0} of a response with step rewards p on tokens 0..steps-1 and the outcome on the last one.

    A second, empty-reward response with no steps sits in the same group, so the baseline of row 0 is 0 and
    A_{0,0} = G_{0,0}.
    """
    T = steps
    r = torch.zeros(2, T)
    r[0, T - 1] = outcome
    step_rewards = torch.zeros(2, T)
    step_rewards[0] = torch.tensor(p)
    step_mask = torch.zeros(2, T, dtype=torch.bool)
    step_mask[0] = True
    m = torch.ones(2, T, dtype=torch.bool)
    a = compute_advantages("pure", token_rewards=r, mask=m, group=torch.tensor([0, 0]),
                           step_rewards=step_rewards, step_mask=step_mask, temperature=temperature)
    return float(a[0, 0])


@SETTINGS
@given(st.integers(1, 5), quarter, quarter, st.floats(0.01, 10.0))
def test_pure_equal_step_rewards_sum_to_that_reward(steps, c, outcome, temperature):
    # All p_s = c: softmax weights are uniform (1/S), so sum_s p'_s = S * c / S = c for every temperature.
    g0 = pure_first_return([c] * steps, steps, outcome, temperature)
    assert math.isclose(g0, c + outcome, abs_tol=1e-5)


@SETTINGS
@given(st.lists(quarter, min_size=1, max_size=5, unique=True), quarter)
def test_pure_small_temperature_approaches_min(p, outcome):
    # tau -> 0: softmax(-p/tau) concentrates on the smallest p, so sum_s p'_s -> min_s p_s (the min form);
    # a large tau spreads weight evenly: sum_s p'_s -> mean_s p_s.
    cold = pure_first_return(p, len(p), outcome, temperature=1e-3)
    assert math.isclose(cold, min(p) + outcome, abs_tol=1e-4)
    hot = pure_first_return(p, len(p), outcome, temperature=1e6)
    assert math.isclose(hot, sum(p) / len(p) + outcome, abs_tol=1e-4)


@SETTINGS
@given(masked_batch())
def test_gae_lambda_one_zero_values_is_reward_to_go(batch):
    # gamma = lam = 1, V = 0: delta_t = r_t and A_t = sum_{k >= t} r_k over response tokens.
    r, m, g = batch
    a = compute_advantages("gae", token_rewards=r, mask=m, group=g, values=torch.zeros_like(r), whiten=False)
    rm = (r * m).double()
    to_go = rm.flip(1).cumsum(1).flip(1) * m
    assert torch.allclose(a.double(), to_go, rtol=1e-6, atol=1e-12)


# ------------------------------------------------------------------------------------------------ float64 reference
# Independent reference: the docstring formulas as plain Python loops. Sums, means and variances are exact
# (fractions.Fraction of the float inputs); only sqrt and the final division round. Reward-to-go sums are float64
# loops in the same order as the estimators, so the reference and the estimators see the same returns.

EPS = 1e-6


def exact_mean(xs):
    return sum((Fraction(x) for x in xs), Fraction(0)) / len(xs)


def exact_centered(xs):
    mu = exact_mean(xs)
    return [Fraction(x) - mu for x in xs]


def std_of_centered(cs):
    """Unbiased std from exactly centered values (0 for one value)."""
    return math.sqrt(float(sum((c * c for c in cs), Fraction(0)) / max(len(cs) - 1, 1)))


def scaled(c, std, eps=EPS):
    return float(c / Fraction(std + eps)) if std > 0 else 0.0


def whiten_ref(values, eps=EPS):
    """(x - mean) / (unbiased std + eps) over a flat list of floats."""
    cs = exact_centered(values)
    std = std_of_centered(cs)
    return [scaled(c, std, eps) for c in cs]


def members(g):
    out = {}
    for i, gid in enumerate(g.tolist()):
        out.setdefault(gid, []).append(i)
    return out


def reward_to_go_ref(x, m, gamma):
    """y[i][t] = x[i][t] + gamma * y[i][t + 1] over response tokens, right to left; 0 off the mask."""
    N, T = len(x), len(x[0])
    y = [[0.0] * T for _ in range(N)]
    for i in range(N):
        running = 0.0
        for t in range(T - 1, -1, -1):
            running = (x[i][t] if m[i][t] else 0.0) + gamma * running
            y[i][t] = running if m[i][t] else 0.0
    return y


def grpo_ref(R, g, scale):
    A = [0.0] * len(R)
    batch_std = std_of_centered(exact_centered(R))
    for rows in members(g).values():
        if len(rows) < 2:
            continue
        cs = exact_centered([R[i] for i in rows])
        std = {"group": std_of_centered(cs), "batch": batch_std}.get(scale)
        for i, c in zip(rows, cs):
            A[i] = float(c) if scale == "none" else scaled(c, std)
    return A


def dr_grpo_ref(R, g):
    A = [0.0] * len(R)
    for rows in members(g).values():
        for i, c in zip(rows, exact_centered([R[i] for i in rows])):
            A[i] = float(c)
    return A


def rloo_ref(R, g):
    A = [0.0] * len(R)
    for rows in members(g).values():
        total = sum((Fraction(R[j]) for j in rows), Fraction(0))
        for i in rows:
            A[i] = float(Fraction(R[i]) - (total - Fraction(R[i])) / (len(rows) - 1))
    return A


def opo_ref(R, L, g):
    A = [0.0] * len(R)
    for rows in members(g).values():
        weight = sum(L[j] for j in rows)
        b = sum((L[j] * Fraction(R[j]) for j in rows), Fraction(0)) / weight if weight else Fraction(0)
        for i in rows:
            A[i] = float(Fraction(R[i]) - b)
    return A


def rpp_baseline_ref(R, L, g):
    """Group-centered R broadcast over each row's L tokens, whitened over all tokens (exactly)."""
    c = [Fraction(0)] * len(R)
    for rows in members(g).values():
        for i, ci in zip(rows, exact_centered([R[i] for i in rows])):
            c[i] = ci
    tokens = [c[i] for i in range(len(R)) for _ in range(L[i])]
    mu = sum(tokens, Fraction(0)) / len(tokens)
    std = std_of_centered([t - mu for t in tokens])
    return [scaled(c[i] - mu, std) for i in range(len(R))]


def gdpo_ref(C, w, g, batch_whiten):
    N, K = len(C), len(w)
    A = [0.0] * N
    for rows in members(g).values():
        if len(rows) < 2:
            continue
        for k in range(K):
            cs = exact_centered([C[i][k] for i in rows])
            std = std_of_centered(cs)
            for i, c in zip(rows, cs):
                A[i] += w[k] * scaled(c, std)
    return whiten_ref(A) if batch_whiten else A


def per_row(values, m):
    """[N] values -> [N][T] rows, 0 off the mask."""
    return [[v if on else 0.0 for on in row] for v, row in zip(values, m)]


def assert_matches(actual, expected, name):
    """float32 estimator output vs the reference: within 1e-6 absolute + 1e-6 relative (float32 keeps ~6e-8)."""
    expected = torch.tensor(expected, dtype=torch.float64)
    assert actual.dtype == torch.float32, name
    a = actual.double()
    bad = (a - expected).abs() > 1e-6 + 1e-6 * expected.abs()
    assert not bool(bad.any()), f"{name}: first mismatch at {bad.nonzero()[0].tolist()}: " \
        f"{a[bad][0].item()!r} != {expected[bad][0].item()!r}"


def tied_rows(R, g):
    """Rows whose group's rewards are all equal (groups of one included)."""
    return [i for rows in members(g).values() if len({R[j] for j in rows}) == 1 for i in rows]


@settings(max_examples=40, deadline=None)
@given(grouped_batch(min_group_size=1))
def test_outcome_estimators_match_float64_reference(batch):
    r, m, g, R = batch
    R = R.tolist()
    L = m.sum(dim=1).tolist()
    mask = m.tolist()
    tied = tied_rows(R, g)
    for scale in ("group", "batch", "none"):
        a = compute_advantages("grpo", token_rewards=r, mask=m, group=g, scale=scale)
        assert_matches(a, per_row(grpo_ref(R, g, scale), mask), f"grpo scale={scale}")
        assert torch.all(a[tied] == 0), f"grpo scale={scale}: a tied group is not exactly 0"
    a = compute_advantages("dr_grpo", token_rewards=r, mask=m, group=g)
    assert_matches(a, per_row(dr_grpo_ref(R, g), mask), "dr_grpo")
    assert torch.all(a[tied] == 0), "dr_grpo: a tied group is not exactly 0"
    a = compute_advantages("opo", token_rewards=r, mask=m, group=g)
    assert_matches(a, per_row(opo_ref(R, L, g), mask), "opo")
    assert torch.all(a[tied] == 0), "opo: a tied group is not exactly 0"
    a = compute_advantages("reinforce_pp_baseline", token_rewards=r, mask=m, group=g)
    assert_matches(a, per_row(rpp_baseline_ref(R, L, g), mask), "reinforce_pp_baseline")
    if all(len(rows) >= 2 for rows in members(g).values()):
        a = compute_advantages("rloo", token_rewards=r, mask=m, group=g)
        assert_matches(a, per_row(rloo_ref(R, g), mask), "rloo")
        assert torch.all(a[tied] == 0), "rloo: a tied group is not exactly 0"


@settings(max_examples=40, deadline=None)
@given(grouped_batch(min_group_size=1), st.data())
def test_gdpo_matches_float64_reference(batch, data):
    _r, m, g, R = batch
    # Component 0 is the batch's rewards (all equal in some groups); component 1 is arbitrary.
    other = data.draw(st.lists(wide, min_size=len(R), max_size=len(R)))
    C = [[float(x), y] for x, y in zip(R.tolist(), other)]
    w = data.draw(st.lists(st.floats(-10, 10, width=32), min_size=2, max_size=2))
    for batch_whiten in (False, True):
        a = compute_advantages("gdpo", token_rewards=torch.zeros_like(_r), mask=m, group=g,
                               components=torch.tensor(C), weights=torch.tensor(w), batch_whiten=batch_whiten)
        assert_matches(a, per_row(gdpo_ref(C, w, g, batch_whiten), m.tolist()), f"gdpo batch_whiten={batch_whiten}")


@settings(max_examples=40, deadline=None)
@given(grouped_batch(min_group_size=2), st.sampled_from([1.0, 0.9]), st.data())
def test_token_level_estimators_match_float64_reference(batch, gamma, data):
    _r, m, g, _R = batch
    N, T = m.shape
    # dense token rewards and values: arbitrary floats on every response token
    dense = data.draw(st.lists(wide, min_size=N * T, max_size=N * T))
    r = torch.tensor(dense).reshape(N, T)
    x, mask = r.tolist(), m.tolist()
    tokens = lambda y: [y[i][t] for i in range(N) for t in range(T) if mask[i][t]]  # noqa: E731

    def unflatten(flat):
        it = iter(flat)
        return [[next(it) if mask[i][t] else 0.0 for t in range(T)] for i in range(N)]

    # reinforce_pp: reward-to-go, whitened over all response tokens
    G = reward_to_go_ref(x, mask, gamma)
    a = compute_advantages("reinforce_pp", token_rewards=r, mask=m, group=g, gamma=gamma)
    assert_matches(a, unflatten(whiten_ref(tokens(G))), f"reinforce_pp gamma={gamma}")

    # gae: delta_t = r_t + gamma V_{t+1} - V_t (V = 0 after the last response token), then the (gamma lam)-sum
    v = torch.tensor(data.draw(st.lists(wide, min_size=N * T, max_size=N * T))).reshape(N, T)
    V = [[v[i, t].item() if mask[i][t] else 0.0 for t in range(T)] for i in range(N)]
    delta = [[x[i][t] + gamma * (V[i][t + 1] if t + 1 < T else 0.0) - V[i][t] for t in range(T)] for i in range(N)]
    adv = reward_to_go_ref(delta, mask, gamma * 0.5)
    kw = dict(token_rewards=r, mask=m, group=g, values=v, gamma=gamma, lam=0.5)
    assert_matches(compute_advantages("gae", whiten=False, **kw), adv, "gae")
    assert_matches(compute_advantages("gae", **kw), unflatten(whiten_ref(tokens(adv))), "gae whitened")

    # process_sum: G over p + r, minus the leave-one-out mean of the other rollouts' first-token returns
    step_mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=N * T, max_size=N * T))).reshape(N, T)
    p = torch.tensor(data.draw(st.lists(wide, min_size=N * T, max_size=N * T))).reshape(N, T)
    on = (step_mask & m).tolist()
    xs = [[(p[i, t].item() if on[i][t] else 0.0) + x[i][t] for t in range(T)] for i in range(N)]
    G = reward_to_go_ref(xs, mask, gamma)
    expected = [[0.0] * T for _ in range(N)]
    for rows in members(g).values():
        total = sum((Fraction(G[j][0]) for j in rows), Fraction(0))
        for i in rows:
            base = (total - Fraction(G[i][0])) / (len(rows) - 1)
            expected[i] = [float(Fraction(G[i][t]) - base) if mask[i][t] else 0.0 for t in range(T)]
    a = compute_advantages("process_sum", token_rewards=r, mask=m, group=g, step_rewards=p, step_mask=step_mask,
                           gamma=gamma)
    assert_matches(a, expected, f"process_sum gamma={gamma}")


# ------------------------------------------------------------------------------------------------ all-equal groups


@pytest.mark.parametrize("size", [2, 3, 7, 8, 16, 33, 64])
def test_all_equal_group_gets_exactly_zero(size):
    # A group whose rollouts all got the same reward has nothing to prefer: every group-centered estimator gives
    # exactly 0 (TRL gives 0.0). In float32, 16 x 1.1 summed and divided by 16 missed 1.1 by one unit, and dividing
    # by std + 1e-6 turned that into -0.106.
    g = torch.zeros(size, dtype=torch.long)
    for v in COMMON:
        r, m = outcome_batch([v] * size, [1 + i % 3 for i in range(size)])
        zeros = torch.zeros_like(r)
        cases = {name: {} for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "opo")}
        cases["grpo eps=0"] = {"eps": 0.0}
        cases["gdpo"] = {"components": torch.full((size, 2), v), "batch_whiten": False}
        cases["process_sum"] = {"step_rewards": zeros, "step_mask": zeros}
        cases["pure"] = {"step_rewards": zeros, "step_mask": zeros}
        for label, options in cases.items():
            a = compute_advantages(label.split()[0], token_rewards=r, mask=m, group=g, **options)
            assert torch.all(a[:, 0] == 0), (label, v, size, a[:, 0].tolist()[:4])


def test_grpo_repro_sixteen_rollouts_rewarded_1_1():
    r, m = outcome_batch([1.1] * 16, [1] * 16)
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=torch.zeros(16, dtype=torch.long))
    assert a.abs().max().item() == 0.0  # was -0.106 for every rollout


@settings(max_examples=50, deadline=None)
@given(wide, st.integers(1, 8), st.integers(1, 4), st.data())
def test_whitening_equal_values_gives_exactly_zero(v, N, T, data):
    # reinforce_pp with the reward on the last token and gamma = 1: every response token's return is v;
    # gae with V = 0 and gamma = lam = 1 likewise; gdpo with equal components. Whitening equal values gives 0.
    # (Repro: 4 x 3 tokens all 1.1 gave -0.106; verl gives -0.0012.)
    lengths = data.draw(st.lists(st.integers(1, T), min_size=N, max_size=N))
    r, m = outcome_batch([v] * N, lengths, T)
    g = torch.arange(N)
    checks = {
        "reinforce_pp": compute_advantages("reinforce_pp", token_rewards=r, mask=m, group=g),
        "gae": compute_advantages("gae", token_rewards=r, mask=m, group=g, values=torch.zeros_like(r)),
        "gdpo": compute_advantages("gdpo", token_rewards=r, mask=m, group=torch.zeros(N, dtype=torch.long),
                                   components=torch.full((N, 1), v)),
        "reinforce_pp_baseline": compute_advantages("reinforce_pp_baseline", token_rewards=r, mask=m,
                                                    group=torch.zeros(N, dtype=torch.long)),
    }
    for name, a in checks.items():
        assert torch.all(a == 0), (name, v, a.tolist())


def test_repro_reinforce_pp_and_gae_whitening_four_by_three():
    r, m = outcome_batch([1.1] * 4, [3] * 4)
    g = torch.arange(4)
    assert compute_advantages("reinforce_pp", token_rewards=r, mask=m, group=g).abs().max().item() == 0.0
    a = compute_advantages("gae", token_rewards=r, mask=m, group=g, values=torch.zeros_like(r))
    assert a.abs().max().item() == 0.0  # both were -0.106 on every token


# ------------------------------------------------------------------------------------------------ non-finite inputs


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_inside_the_mask_raise(bad):
    r, m = outcome_batch([1.0, 0.0, 1.0, 0.5], [2, 2, 2, 1])
    g = torch.tensor([0, 0, 1, 1])
    zeros = torch.zeros_like(r)
    extra = {"values": zeros, "baseline": torch.zeros(4), "components": torch.zeros(4, 1),
             "step_rewards": zeros, "step_mask": m}
    poisoned = r.clone()
    poisoned[1, 1] = bad  # the last response token of row 1
    declared = lambda name: {k: v for k, v in extra.items() if k in ESTIMATORS.options(name)}  # noqa: E731
    for name in ESTIMATORS:
        with pytest.raises(ValueError, match=r"token_rewards: non-finite value .* at index \[1, 1\]"):
            compute_advantages(name, token_rewards=poisoned, mask=m, group=g, **declared(name))
    # each extra input is checked where the estimator reads it
    cases = [("gae", "values", zeros.clone().index_put_((torch.tensor(0), torch.tensor(1)), torch.tensor(bad))),
             ("remax", "baseline", torch.tensor([0.0, bad, 0.0, 0.0])),
             ("gdpo", "components", torch.tensor([[0.0], [0.0], [bad], [0.0]])),
             ("gdpo", "weights", torch.tensor([bad])),
             ("process_sum", "step_rewards", zeros.clone().index_put_((torch.tensor(3), torch.tensor(0)),
                                                                      torch.tensor(bad))),
             ("pure", "step_rewards", zeros.clone().index_put_((torch.tensor(3), torch.tensor(0)),
                                                               torch.tensor(bad)))]
    for name, key, value in cases:
        with pytest.raises(ValueError, match=f"option '{key}': non-finite value"):
            compute_advantages(name, token_rewards=r, mask=m, group=g, **{**declared(name), key: value})
    # outside the mask a NaN or inf is padding and is ignored
    padded = r.clone()
    padded[3, 1] = bad
    for name in ESTIMATORS:
        a = compute_advantages(name, token_rewards=padded, mask=m, group=g, **declared(name))
        assert torch.isfinite(a).all() and a[3, 1] == 0, name
