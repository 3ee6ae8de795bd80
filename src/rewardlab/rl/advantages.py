"""Advantage estimators: rewards on tokens -> per-token credit.

Every estimator is a pure tensor function registered under its paper name in ``ESTIMATORS`` and called as

    ESTIMATORS[name](token_rewards=[N, T], mask=[N, T], group=[N], **options) -> [N, T] float32

Conventions shared by all estimators:

- ``token_rewards`` [N, T] float: rewards on response tokens; the outcome reward sits on the last response token.
- ``mask`` [N, T] bool or 0/1: response tokens (rows hold only the completion, right-padded).
- ``group`` [N] int64: prompt-group id of each rollout; any integers, not necessarily contiguous.
- R_i = sum_t token_rewards[i, t] * mask[i, t] is the sequence reward of rollout i.
- "std" is the unbiased sample standard deviation; ``eps`` defaults to 1e-6.
- Sequence-level advantages are broadcast to every response token; outputs are 0 wherever ``mask`` is 0.
- Process rewards arrive as options ``step_rewards`` [N, T] (a step's reward on its last token) and ``step_mask``
  [N, T] (1 on each step's last token).
- Every estimator declares its options by name; ``compute_advantages`` refuses an option the estimator does not
  declare (a ValueError naming it and listing the valid ones), so nothing is silently ignored.

Group statistics are computed with ``torch.unique(return_inverse=True)`` and ``index_add_``: no Python loop over
rollouts. Reverse discounted sums loop over the T time steps only when gamma != 1.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from rewardlab.registry import Registry

__all__ = ["ESTIMATORS", "INPUTS", "register_estimator", "compute_advantages"]

#: The inputs every estimator takes; everything else it declares is an option.
INPUTS = ("token_rewards", "mask", "group")
#: name -> estimator. ``ESTIMATORS.meta(name)["needs"]``: the options it needs beyond token_rewards/mask/group that
#: only a trainer can compute (a trainer supplies them by these names).
ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("advantage estimator", reserved=INPUTS)

DEFAULT_EPS = 1e-6


def register_estimator(name: str, needs: tuple[str, ...] = (), **meta: Any) -> Callable[[Callable], Callable]:
    """Register an advantage estimator in ``ESTIMATORS`` under ``name``.

    The decorated function must have the signature ``fn(*, token_rewards, mask, group, <options>) -> Tensor`` with
    every option declared by name (no ``**kwargs``). ``needs`` names the options it requires that only a trainer
    can compute (e.g. ``baseline``, ``values``, ``step_rewards``); they are recorded as ``meta(name)["needs"]``,
    with any further ``meta``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return ESTIMATORS.register(name, needs=tuple(needs), **meta)


def compute_advantages(name: str, *, token_rewards: Tensor, mask: Tensor, group: Tensor, **options: Any) -> Tensor:
    """Look up the estimator ``name`` in ``ESTIMATORS`` and apply it.

    Args:
        name: registered estimator name, e.g. ``"grpo"``.
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        **options: estimator options; each must be declared by the estimator.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``name`` is not registered (the message lists the valid names), an option is not one the
            estimator declares (the message names it and lists the valid ones), or whatever the estimator raises
            for invalid inputs.
    """
    fn = ESTIMATORS.get(name)
    ESTIMATORS.check(name, options)
    return fn(token_rewards=token_rewards, mask=mask, group=group, **options)


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _check_inputs(token_rewards: Tensor, mask: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Validate shapes; return (rewards, mask) as float32 with rewards zeroed outside the mask."""
    if token_rewards.dim() != 2:
        raise ValueError(f"token_rewards must be [N, T], got shape {tuple(token_rewards.shape)}")
    if mask.shape != token_rewards.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != token_rewards shape {tuple(token_rewards.shape)}")
    if group.shape != token_rewards.shape[:1]:
        raise ValueError(f"group must be [N] = [{token_rewards.shape[0]}], got shape {tuple(group.shape)}")
    m = mask.to(torch.float32)
    r = torch.where(m > 0, token_rewards.to(torch.float32), 0.0)
    return r, m


def _check_like(name: str, x: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"option {name!r} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    return x.to(torch.float32)


def _require(options: dict, key: str, estimator: str) -> Tensor:
    value = options.get(key)
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} requires option {key!r}")
    return value


class _Groups:
    """Index structure for per-group reductions over the N rollouts."""

    def __init__(self, group: Tensor):
        self.ids, self.inverse, counts = torch.unique(group, return_inverse=True, return_counts=True)
        self.counts = counts.to(torch.float32)
        self.size = self.counts[self.inverse]  # [N] size of each rollout's group

    def sum(self, x: Tensor) -> Tensor:
        """Per-group sum of x [N] -> [G]."""
        out = torch.zeros(self.ids.shape[0], dtype=x.dtype, device=x.device)
        return out.index_add_(0, self.inverse, x)

    def mean(self, x: Tensor) -> Tensor:
        """Group mean of x [N], gathered back to [N]."""
        return (self.sum(x) / self.counts)[self.inverse]

    def std(self, x: Tensor) -> Tensor:
        """Unbiased group std of x [N], gathered back to [N]; 0 for groups of size 1."""
        centered = x - self.mean(x)
        var = self.sum(centered * centered) / (self.counts - 1).clamp(min=1)
        return var.sqrt()[self.inverse]

    def leave_one_out_mean(self, x: Tensor, estimator: str) -> Tensor:
        """mean_{j in g(i), j != i} x_j for each i; needs every group to have at least 2 members."""
        small = self.counts < 2
        if bool(small.any()):
            bad = ", ".join(str(int(g)) for g in self.ids[small][:5].tolist())
            more = "" if int(small.sum()) <= 5 else ", ..."
            raise ValueError(
                f"advantage estimator {estimator!r} needs at least 2 rollouts per group; "
                f"group(s) {bad}{more} have 1"
            )
        return (self.sum(x)[self.inverse] - x) / (self.size - 1)


def _sequence_reward(r: Tensor) -> Tensor:
    """R_i = sum_t r[i, t] (r already masked): [N, T] -> [N]."""
    return r.sum(dim=1)


def _broadcast(a: Tensor, m: Tensor) -> Tensor:
    """Broadcast a sequence value [N] to response tokens: [N] -> [N, T], 0 outside the mask."""
    return a[:, None] * m


def _reverse_discounted_sum(x: Tensor, m: Tensor, gamma: float) -> Tensor:
    """y[:, t] = sum_{k >= t} gamma^(k - t) x[:, k] * m[:, k], then zeroed outside the mask. [N, T] -> [N, T]."""
    x = x * m
    if gamma == 1.0:
        y = torch.flip(torch.cumsum(torch.flip(x, dims=[1]), dim=1), dims=[1])
    else:
        y = torch.empty_like(x)
        running = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1] - 1, -1, -1):
            running = x[:, t] + gamma * running
            y[:, t] = running
    return y * m


def _whiten_tokens(x: Tensor, m: Tensor, eps: float) -> Tensor:
    """(x - masked mean) / (unbiased masked std + eps) over all response tokens of the batch; 0 outside the mask."""
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1)
    centered = (x - mean) * m
    var = (centered * centered).sum() / (n - 1).clamp(min=1)
    return centered / (var.sqrt() + eps)


def _std(x: Tensor) -> Tensor:
    """Unbiased std over the N entries of x [N] (0 when N == 1)."""
    centered = x - x.mean()
    return ((centered * centered).sum() / max(x.shape[0] - 1, 1)).sqrt()


def _whiten_vector(x: Tensor, eps: float) -> Tensor:
    """(x - mean) / (unbiased std + eps) over the N entries of x [N]."""
    return (x - x.mean()) / (_std(x) + eps)


def _first_token_value(g: Tensor, m: Tensor) -> Tensor:
    """g at each row's first response token: [N, T] -> [N] (0 for rows without response tokens)."""
    first = m.argmax(dim=1)  # index of the first maximal value, i.e. the first 1
    return g.gather(1, first[:, None]).squeeze(1) * (m.sum(dim=1) > 0)


def _step_rewards(options: dict, m: Tensor, estimator: str) -> tuple[Tensor, Tensor]:
    """Return (p, sm): step rewards on steps' last tokens and the step mask, both [N, T] float32, 0 off-response."""
    step_rewards = _check_like("step_rewards", _require(options, "step_rewards", estimator), m.shape)
    step_mask = _check_like("step_mask", _require(options, "step_mask", estimator), m.shape)
    sm = (step_mask > 0).to(torch.float32) * m
    p = torch.where(sm > 0, step_rewards, 0.0)
    return p, sm


# ----------------------------------------------------------------------------------------------------------------
# outcome-reward estimators


@register_estimator("grpo")
def grpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, eps: float = DEFAULT_EPS,
         scale: str = "group") -> Tensor:
    """Group Relative Policy Optimization advantage (Shao et al., 2024, DeepSeekMath).

    A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps), R_i = sum_t token_rewards[i, t],
    broadcast over response tokens. std is unbiased; a group of size 1 gets A = 0.
    ``scale="batch"`` divides by (std of R over the whole batch + eps) instead; ``scale="none"`` does not divide
    (then A is the Dr. GRPO advantage).

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        eps: float, added to the std (default 1e-6).
        scale: "group" (default), "batch" or "none".
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch or an unknown ``scale``.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = _Groups(group)
    R = _sequence_reward(r)
    centered = R - groups.mean(R)
    if scale == "group":
        a = centered / (groups.std(R) + eps)
    elif scale == "batch":
        a = centered / (_std(R) + eps)
    elif scale == "none":
        a = centered
    else:
        raise ValueError(f"grpo: unknown scale {scale!r}; valid: batch, group, none")
    a = torch.where(groups.size > 1, a, torch.zeros_like(a))
    return _broadcast(a, m)


@register_estimator("dr_grpo")
def dr_grpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """GRPO Done Right (Liu et al., 2025, "Understanding R1-Zero-Like Training").

    A_i = R_i - mean_{j in g(i)} R_j, broadcast over response tokens (no std division). A group of size 1 gets 0.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = _Groups(group)
    R = _sequence_reward(r)
    return _broadcast(R - groups.mean(R), m)


@register_estimator("rloo")
def rloo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024, "Back to Basics").

    A_i = R_i - mean_{j in g(i), j != i} R_j, with R_i = sum_t token_rewards[i, t], broadcast over response tokens.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if a group has fewer than 2 rollouts (the message names the group id), or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = _Groups(group)
    R = _sequence_reward(r)
    return _broadcast(R - groups.leave_one_out_mean(R, "rloo"), m)


@register_estimator("reinforce_pp")
def reinforce_pp(*, token_rewards: Tensor, mask: Tensor, group: Tensor, gamma: float = 1.0,
                 eps: float = DEFAULT_EPS) -> Tensor:
    """REINFORCE++ (Hu, 2025): discounted reward-to-go, whitened over the batch.

    G_{i,t} = sum_{k >= t} gamma^(k - t) r_{i,k}; A = (G - mean) / (std + eps), where mean and the unbiased std
    are taken over all response tokens of the batch. ``group`` is not used.

    Args:
        token_rewards: [N, T] float, rewards on response tokens (a per-token KL penalty may already be folded in).
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, accepted for a uniform signature; ignored.
        gamma: float discount (default 1.0).
        eps: float, added to the std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    return _whiten_tokens(_reverse_discounted_sum(r, m, float(gamma)), m, eps)


@register_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline(*, token_rewards: Tensor, mask: Tensor, group: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """REINFORCE++ with a group-mean baseline (Hu, 2025).

    A_i = R_i - mean_{j in g(i)} R_j broadcast over response tokens, then whitened over all response tokens of
    the batch: A <- (A - mean) / (unbiased std + eps).

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        eps: float, added to the std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = _Groups(group)
    R = _sequence_reward(r)
    return _whiten_tokens(_broadcast(R - groups.mean(R), m), m, eps)


@register_estimator("remax", needs=("baseline",))
def remax(*, token_rewards: Tensor, mask: Tensor, group: Tensor, baseline: Tensor | None = None) -> Tensor:
    """ReMax (Li et al., 2023): REINFORCE with the greedy rollout's reward as baseline.

    A_i = R_i - b_i, b_i = reward of the greedy (argmax) completion of rollout i's prompt; broadcast over tokens.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, accepted for a uniform signature; ignored.
        baseline: [N] float, required.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``baseline`` is missing or not [N], or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if baseline is None:
        raise ValueError("advantage estimator 'remax' requires option 'baseline' ([N] greedy-rollout rewards)")
    b = _check_like("baseline", baseline, (r.shape[0],))
    return _broadcast(_sequence_reward(r) - b, m)


@register_estimator("opo")
def opo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """On-Policy RL with Optimal reward Baseline (Hao et al., 2025).

    A_i = R_i - sum_{j in g(i)} L_j R_j / sum_{j in g(i)} L_j, L_j = number of response tokens of rollout j
    (the length-weighted group mean), broadcast over response tokens. A group whose rollouts are all empty uses
    a baseline of 0.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = _Groups(group)
    R = _sequence_reward(r)
    L = m.sum(dim=1)
    b = groups.sum(L * R)[groups.inverse] / groups.sum(L)[groups.inverse].clamp(min=1)
    return _broadcast(R - b, m)


@register_estimator("gdpo", needs=("components", "weights"))
def gdpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, components: Tensor | None = None,
         weights: Tensor | None = None, batch_whiten: bool = True, eps: float = DEFAULT_EPS) -> Tensor:
    """Group reward-Decoupled normalization Policy Optimization (NVIDIA, 2025, GDPO).

    Each reward component is group-normalized on its own, then the normalized components are summed:
    Ahat_{ik} = (r_{ik} - mean_{j in g(i)} r_{jk}) / (std_{j in g(i)} r_{jk} + eps)   (0 for a group of size 1),
    A_i = sum_k w_k Ahat_{ik}; if ``batch_whiten``, A <- (A - mean_i A) / (unbiased std_i A + eps) over the N
    values. Broadcast over response tokens. ``token_rewards`` is not used beyond shape checks.

    Args:
        token_rewards: [N, T] float, rewards on response tokens (shape only).
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        components: [N, K] float, required; reward component k of rollout i.
        weights: [K] float, default all ones.
        batch_whiten: bool (default True).
        eps: float, added to each std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``components`` is missing or not [N, K], ``weights`` is not [K], or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if components is None:
        raise ValueError("advantage estimator 'gdpo' requires option 'components' ([N, K] reward components)")
    if components.dim() != 2 or components.shape[0] != r.shape[0]:
        raise ValueError(f"option 'components' must be [N={r.shape[0]}, K], got {tuple(components.shape)}")
    c = components.to(torch.float32)
    k = c.shape[1]
    if weights is None:
        w = torch.ones(k, dtype=torch.float32, device=c.device)
    else:
        w = _check_like("weights", weights, (k,))
    groups = _Groups(group)
    # Group statistics of all K components at once: index_add_ works on [N, K] along dim 0.
    sums = torch.zeros(groups.ids.shape[0], k, dtype=torch.float32, device=c.device).index_add_(0, groups.inverse, c)
    mean = (sums / groups.counts[:, None])[groups.inverse]
    centered = c - mean
    sq = torch.zeros_like(sums).index_add_(0, groups.inverse, centered * centered)
    std = (sq / (groups.counts[:, None] - 1).clamp(min=1)).sqrt()[groups.inverse]
    normalized = torch.where(groups.size[:, None] > 1, centered / (std + eps), torch.zeros_like(centered))
    a = normalized @ w.to(c.device)
    if batch_whiten:
        a = _whiten_vector(a, eps)
    return _broadcast(a, m)


# ----------------------------------------------------------------------------------------------------------------
# process-reward estimators


@register_estimator("pure", needs=("step_rewards", "step_mask"))
def pure(*, token_rewards: Tensor, mask: Tensor, group: Tensor, step_rewards: Tensor | None = None,
         step_mask: Tensor | None = None, temperature: float = 0.1) -> Tensor:
    """PURE min-form credit assignment (Cheng et al., 2025, "Stop Summation").

    Per response i with step rewards p_s (step_rewards where step_mask = 1):
    p'_s = softmax(-p / tau)_s * p_s (softmax over the steps of that response, tau = ``temperature``), so that
    sum_s p'_s approaches min_s p_s as tau -> 0. With p' placed on each step's last token and r = token_rewards:
    G_{i,t} = sum_{k >= t} (p'_{i,k} + r_{i,k}) and A_{i,t} = G_{i,t} - mean_{j in g(i), j != i} G_{j,0}, where
    G_{j,0} is the return at j's first response token. A response without steps has p' = 0.

    Args:
        token_rewards: [N, T] float, rewards on response tokens (outcome reward on the last one).
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        step_rewards: [N, T] float, required; a step's process reward on its last token.
        step_mask: [N, T] bool/0-1, required; 1 on each step's last token (only response tokens count).
        temperature: float > 0 (default 0.1).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``step_rewards``/``step_mask`` are missing or misshapen, ``temperature`` <= 0, a group has
            fewer than 2 rollouts (naming the group id), or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    p, sm = _step_rewards({"step_rewards": step_rewards, "step_mask": step_mask}, m, "pure")
    if not temperature > 0:
        raise ValueError(f"pure: temperature must be > 0, got {temperature}")
    logits = torch.where(sm > 0, -p / temperature, torch.full_like(p, float("-inf")))
    weights = torch.softmax(logits, dim=1)
    weights = torch.where(sm > 0, weights, torch.zeros_like(weights))  # rows without steps: NaN -> 0
    g = _reverse_discounted_sum(weights * p + r, m, 1.0)
    groups = _Groups(group)
    baseline = groups.leave_one_out_mean(_first_token_value(g, m), "pure")
    return (g - baseline[:, None]) * m


@register_estimator("process_sum", needs=("step_rewards", "step_mask"))
def process_sum(*, token_rewards: Tensor, mask: Tensor, group: Tensor, step_rewards: Tensor | None = None,
                step_mask: Tensor | None = None, gamma: float = 1.0) -> Tensor:
    """Summation-form process credit, the canonical baseline that PURE (Cheng et al., 2025) compares against.

    G_{i,t} = sum_{k >= t} gamma^(k - t) (p_{i,k} + r_{i,k}), p = step_rewards on steps' last tokens, r =
    token_rewards; A_{i,t} = G_{i,t} - mean_{j in g(i), j != i} G_{j,0} (G_{j,0}: return at j's first response
    token).

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        step_rewards: [N, T] float, required.
        step_mask: [N, T] bool/0-1, required; 1 on each step's last token.
        gamma: float discount (default 1.0).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``step_rewards``/``step_mask`` are missing or misshapen, a group has fewer than 2 rollouts
            (naming the group id), or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    p, _sm = _step_rewards({"step_rewards": step_rewards, "step_mask": step_mask}, m, "process_sum")
    g = _reverse_discounted_sum(p + r, m, float(gamma))
    groups = _Groups(group)
    baseline = groups.leave_one_out_mean(_first_token_value(g, m), "process_sum")
    return (g - baseline[:, None]) * m


# ----------------------------------------------------------------------------------------------------------------
# critic-based


@register_estimator("gae", needs=("values",))
def gae(*, token_rewards: Tensor, mask: Tensor, group: Tensor, values: Tensor | None = None, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True, eps: float = DEFAULT_EPS) -> Tensor:
    """Generalized Advantage Estimation (Schulman et al., 2016).

    delta_t = r_t + gamma * V_{t+1} - V_t, with V after the last response token = 0;
    A_t = sum_{l >= 0} (gamma * lam)^l delta_{t+l}. If ``whiten``, A <- (A - mean) / (unbiased std + eps) over all
    response tokens of the batch. ``group`` is not used.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, accepted for a uniform signature; ignored.
        values: [N, T] float, required; critic values V_t of response tokens.
        gamma: float discount (default 1.0).
        lam: float GAE lambda (default 1.0).
        whiten: bool (default True).
        eps: float, added to the std when whitening (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``values`` is missing or not [N, T], or on shape mismatch.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if values is None:
        raise ValueError("advantage estimator 'gae' requires option 'values' ([N, T] critic values)")
    v = _check_like("values", values, r.shape).detach()
    v = torch.where(m > 0, v, 0.0)
    v_next = torch.zeros_like(v)
    v_next[:, :-1] = v[:, 1:]  # 0 after the last response token because v is 0 off the mask
    delta = r + float(gamma) * v_next - v
    a = _reverse_discounted_sum(delta, m, float(gamma) * float(lam))
    return _whiten_tokens(a, m, eps) if whiten else a
