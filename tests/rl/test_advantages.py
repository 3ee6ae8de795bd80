"""Advantage estimators: hand-computed vectors (arithmetic in comments) and hypothesis properties."""

from __future__ import annotations

import math

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


@st.composite
def grouped_batch(draw, min_group_size=1, max_groups=4):
    """Outcome-reward batch with shuffled, non-contiguous group ids; every row has >= 1 response token."""
    sizes = draw(st.lists(st.integers(min_group_size, 4), min_size=1, max_size=max_groups))
    ids = draw(st.lists(st.integers(-50, 50), min_size=len(sizes), max_size=len(sizes), unique=True))
    group = [gid for gid, n in zip(ids, sizes) for _ in range(n)]
    group = draw(st.permutations(group))
    n = len(group)
    T = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, T), min_size=n, max_size=n))
    R = draw(st.lists(quarter, min_size=n, max_size=n))
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
            total = float(seq[g == gid].sum())
            assert abs(total) < 1e-4, (name, int(gid), total)
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
    dense = draw(st.lists(quarter, min_size=N * T, max_size=N * T))
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
    assert torch.allclose(a[:, 0], b[:, 0], atol=1e-5)
    assert torch.allclose(a, b, atol=1e-5)


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
    rm = r * m
    to_go = rm.flip(1).cumsum(1).flip(1) * m
    assert torch.allclose(a, to_go, atol=1e-5)
