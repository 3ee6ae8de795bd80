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
- Multi-turn episodes: the turn-level estimators (``turn_grpo``, ``gigpo``) also take trainer-supplied inputs,
  ``turn_rewards`` [N, T] (each turn's reward on its last sampled token), ``turn_index`` [N, T] int64 (each sampled
  token's turn, from 0) and ``turn_key`` [N, T] int64 (the id of the state each turn acted in); they are declared
  with ``register_estimator(inputs=...)``, so they are never user options (``ESTIMATORS.inputs(name)``). Each row
  is one whole episode: an episode split into several rows goes through ``rewardlab.rl.episodes
  .episode_advantages``, which runs any estimator on the episode view (the sampled tokens of its rows,
  concatenated) and scatters the result back.
- Every estimator declares its options by name; ``compute_advantages`` refuses an option the estimator does not
  declare (a ValueError naming it and listing the valid ones), so nothing is silently ignored.
- Inputs are upcast to float64 and every statistic (sums, means, stds, whitening) is computed in float64; the
  result is cast to float32. Means are taken after subtracting the group's (or batch's) minimum, so a group whose
  rewards are all equal gets exactly 0 from every group-centered estimator, and whitening equal values gives
  exactly 0.
- A NaN or inf in ``token_rewards``, ``values``, ``step_rewards``, ``baseline``, ``components`` or ``weights`` at a
  position the estimator reads (inside the mask) is a ValueError naming the input and index; values outside the
  mask are ignored.
- ``ESTIMATORS.meta(name)["min_group_size"]`` is the fewest rollouts a group needs to carry any signal: 2 for
  every group-relative estimator (the leave-one-out ones, rloo, pure and process_sum, raise on a group of one; grpo,
  dr_grpo, reinforce_pp_baseline, opo and gdpo give it an advantage of exactly 0, so a run with one rollout per
  group would never learn), 1 for those that do not compare within a group (reinforce_pp, remax, gae).

Group statistics are computed with ``rewardlab.rl.segments.Segments`` (``torch.unique(return_inverse=True)``,
``index_add_`` and ``scatter_reduce_``): no Python loop over rollouts or groups. Reverse discounted sums
(``segments.reverse_discounted_sum``) loop over the T time steps (or K turns) only when gamma != 1.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from rewardlab.registry import Registry
from rewardlab.rl.segments import Segments, reverse_discounted_sum, segment_ids

__all__ = ["ESTIMATORS", "INPUTS", "register_estimator", "compute_advantages"]

#: The inputs every estimator takes; everything else it declares is an option.
INPUTS = ("token_rewards", "mask", "group")
#: name -> estimator. ``ESTIMATORS.meta(name)["needs"]``: the options it needs beyond token_rewards/mask/group that
#: only a trainer can compute (a trainer supplies them by these names); ``["min_group_size"]``: the fewest rollouts
#: a prompt group needs (a trainer drops smaller groups, e.g. after skipping errored rollouts).
ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("advantage estimator", reserved=INPUTS)

DEFAULT_EPS = 1e-6


def register_estimator(name: str, needs: tuple[str, ...] = (), *, inputs: tuple[str, ...] = (),
                       min_group_size: int = 1, **meta: Any) -> Callable[[Callable], Callable]:
    """Register an advantage estimator in ``ESTIMATORS`` under ``name``.

    The decorated function must have the signature ``fn(*, token_rewards, mask, group, <options>) -> Tensor`` with
    every option declared by name (no ``**kwargs``). ``needs`` names the options it requires that only a trainer
    can compute (e.g. ``baseline``, ``values``, ``step_rewards``); they are recorded as ``meta(name)["needs"]``.
    ``inputs`` names the trainer-supplied inputs that are never user options (e.g. ``turn_index``,
    ``turn_rewards``), recorded as ``meta(name)["inputs"]`` (``ESTIMATORS.inputs(name)``), so that
    ``ESTIMATORS.options``/``check``/``validate`` leave them out and refuse them as user options. Unlike ``needs``,
    an estimator must run without them, giving them their single-turn meaning (one turn per row, no turn rewards):
    a trainer supplies them for multi-turn episodes and may leave them out for single-turn rollouts.
    ``min_group_size`` (int >= 1, default 1) is the fewest rollouts per prompt group the estimator accepts,
    recorded as ``meta(name)["min_group_size"]``; any further ``meta`` is recorded too.

    Raises:
        ValueError: if ``name`` is already registered or ``min_group_size`` < 1.
    """
    if isinstance(min_group_size, bool) or not isinstance(min_group_size, int) or min_group_size < 1:
        raise ValueError(f"advantage estimator {name!r}: min_group_size must be an int >= 1, got {min_group_size!r}")
    return ESTIMATORS.register(name, needs=tuple(needs), inputs=tuple(inputs), min_group_size=min_group_size, **meta)


def compute_advantages(name: str, *, token_rewards: Tensor, mask: Tensor, group: Tensor, **options: Any) -> Tensor:
    """Look up the estimator ``name`` in ``ESTIMATORS`` and apply it.

    Args:
        name: registered estimator name, e.g. ``"grpo"``.
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        **options: estimator options, each declared by the estimator, and its trainer-supplied inputs
            (``ESTIMATORS.inputs(name)``, e.g. ``turn_index``).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``name`` is not registered (the message lists the valid names), an option is not one the
            estimator declares (the message names it and lists the valid ones), or whatever the estimator raises
            for invalid inputs.
    """
    fn = ESTIMATORS.get(name)
    inputs = ESTIMATORS.inputs(name)
    ESTIMATORS.check(name, {k: v for k, v in options.items() if k not in inputs})
    return fn(token_rewards=token_rewards, mask=mask, group=group, **options)


# ----------------------------------------------------------------------------------------------------------------
# helpers


#: dtype of every intermediate statistic; inputs are upcast to it and results cast back to float32.
_COMPUTE = torch.float64


def _check_finite(name: str, x: Tensor, where: Tensor | None = None) -> None:
    """Raise ValueError naming ``name`` and the first index where x is NaN or +-inf (only where ``where`` is true)."""
    bad = ~torch.isfinite(x)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        index = tuple(bad.nonzero()[0].tolist())
        scope = " inside the mask" if where is not None else ""
        raise ValueError(f"{name}: non-finite value {x[index].item()} at index {list(index)}{scope}; rewards, values "
                         "and components must be finite (a reward that gives NaN or inf is a reward error)")


def _check_inputs(token_rewards: Tensor, mask: Tensor, group: Tensor) -> tuple[Tensor, Tensor]:
    """Validate shapes and finiteness; return (rewards, mask) as float64 with rewards zeroed outside the mask.

    Raises:
        ValueError: on a shape mismatch, or a NaN/inf reward on a response token (values outside the mask are
            ignored).
    """
    if token_rewards.dim() != 2:
        raise ValueError(f"token_rewards must be [N, T], got shape {tuple(token_rewards.shape)}")
    if mask.shape != token_rewards.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != token_rewards shape {tuple(token_rewards.shape)}")
    if group.shape != token_rewards.shape[:1]:
        raise ValueError(f"group must be [N] = [{token_rewards.shape[0]}], got shape {tuple(group.shape)}")
    m = mask.to(_COMPUTE)
    _check_finite("token_rewards", token_rewards, m > 0)
    r = torch.where(m > 0, token_rewards.to(_COMPUTE), 0.0)
    return r, m


def _check_like(name: str, x: Tensor, shape: torch.Size | tuple[int, ...], where: Tensor | None = None) -> Tensor:
    """Check an option's shape and finiteness (only where ``where`` is true, if given); return it as float64."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"option {name!r} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    _check_finite(f"option {name!r}", x, where)
    return x.to(_COMPUTE)


def _require(options: dict, key: str, estimator: str) -> Tensor:
    value = options.get(key)
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} requires option {key!r}")
    return value


def _leave_one_out_mean(groups: Segments, x: Tensor, estimator: str) -> Tensor:
    """mean_{j in g(i), j != i} x_j for each i of x [N] float64 -> [N]; the mean is taken after subtracting the
    group's minimum (equal values -> exactly that value).

    Raises:
        ValueError: naming ``estimator`` and the first group ids if a group has fewer than 2 members.
    """
    small = groups.counts < 2
    if bool(small.any()):
        bad = ", ".join(str(int(g)) for g in groups.ids[small][:5].tolist())
        more = "" if int(small.sum()) <= 5 else ", ..."
        raise ValueError(
            f"advantage estimator {estimator!r} needs at least 2 rollouts per group; "
            f"group(s) {bad}{more} have 1"
        )
    s = groups.shift(x)
    y = x - s
    return s + (groups.broadcast(groups.sum(y)) - y) / (groups.sizes().to(_COMPUTE) - 1)


def _scaled(centered: Tensor, std: Tensor, eps: float) -> Tensor:
    """centered / (std + eps), and exactly 0 where std is 0 (then centered is 0 too; this keeps eps = 0 finite)."""
    return torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))


def _sequence_reward(r: Tensor) -> Tensor:
    """R_i = sum_t r[i, t] (r already masked): [N, T] -> [N]."""
    return r.sum(dim=1)


def _broadcast(a: Tensor, m: Tensor) -> Tensor:
    """Broadcast a sequence value [N] to response tokens: [N] -> [N, T], 0 outside the mask."""
    return a[:, None] * m


def _whiten_tokens(x: Tensor, m: Tensor, eps: float) -> Tensor:
    """(x - masked mean) / (unbiased masked std + eps) over all response tokens of the batch; 0 outside the mask.

    The mean is taken after subtracting the masked minimum, so equal values whiten to exactly 0.
    """
    on = m > 0
    if not bool(on.any()):
        return torch.zeros_like(x)
    n = m.sum()
    y = (x - x[on].min()) * m
    centered = (y - y.sum() / n) * m
    var = (centered * centered).sum() / (n - 1).clamp(min=1)
    return _scaled(centered, var.sqrt(), eps)


def _std(x: Tensor) -> Tensor:
    """Unbiased std over the N entries of x [N] (0 when N == 1)."""
    centered = _center(x)
    return ((centered * centered).sum() / max(x.shape[0] - 1, 1)).sqrt()


def _center(x: Tensor) -> Tensor:
    """x - mean over the N entries of x [N], with the mean taken after subtracting the minimum (equal -> 0)."""
    if x.numel() == 0:
        return x
    y = x - x.min()
    return y - y.mean()


def _whiten_vector(x: Tensor, eps: float) -> Tensor:
    """(x - mean) / (unbiased std + eps) over the N entries of x [N]; exactly 0 when all entries are equal."""
    return _scaled(_center(x), _std(x), eps)


def _first_token_value(g: Tensor, m: Tensor) -> Tensor:
    """g at each row's first response token: [N, T] -> [N] (0 for rows without response tokens)."""
    first = m.argmax(dim=1)  # index of the first maximal value, i.e. the first 1
    return g.gather(1, first[:, None]).squeeze(1) * (m.sum(dim=1) > 0)


def _step_rewards(options: dict, m: Tensor, estimator: str) -> tuple[Tensor, Tensor]:
    """Return (p, sm): step rewards on steps' last tokens and the step mask, both [N, T] float64, 0 off-response.

    Raises ValueError on a NaN/inf step reward on a step's last response token.
    """
    raw_rewards = _require(options, "step_rewards", estimator)
    step_mask = _check_like("step_mask", _require(options, "step_mask", estimator), m.shape)
    sm = (step_mask > 0).to(_COMPUTE) * m
    step_rewards = _check_like("step_rewards", raw_rewards, m.shape, sm > 0)
    p = torch.where(sm > 0, step_rewards, 0.0)
    return p, sm


# ----------------------------------------------------------------------------------------------------------------
# outcome-reward estimators


@register_estimator("grpo", min_group_size=2)
def grpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, eps: float = DEFAULT_EPS,
         scale: str = "group") -> Tensor:
    """Group Relative Policy Optimization advantage (Shao et al., 2024, DeepSeekMath).

    A_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps), R_i = sum_t token_rewards[i, t],
    broadcast over response tokens. std is unbiased; a group of size 1 gets A = 0, and so does a group whose
    rewards are all equal (exactly, also with eps = 0). Statistics are computed in float64.
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
        ValueError: on shape mismatch, an unknown ``scale``, or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = Segments(group)
    R = _sequence_reward(r)
    centered = groups.center(R)
    if scale == "group":
        a = _scaled(centered, groups.broadcast(groups.std(R)), eps)
    elif scale == "batch":
        a = _scaled(centered, _std(R).expand_as(centered), eps)
    elif scale == "none":
        a = centered
    else:
        raise ValueError(f"grpo: unknown scale {scale!r}; valid: batch, group, none")
    a = torch.where(groups.sizes() > 1, a, torch.zeros_like(a))
    return _broadcast(a, m).float()


@register_estimator("dr_grpo", min_group_size=2)
def dr_grpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """GRPO Done Right (Liu et al., 2025, "Understanding R1-Zero-Like Training").

    A_i = R_i - mean_{j in g(i)} R_j, broadcast over response tokens (no std division). A group of size 1, or one
    whose rewards are all equal, gets exactly 0. Statistics are computed in float64.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = Segments(group)
    R = _sequence_reward(r)
    return _broadcast(groups.center(R), m).float()


@register_estimator("rloo", min_group_size=2)
def rloo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al., 2024, "Back to Basics").

    A_i = R_i - mean_{j in g(i), j != i} R_j, with R_i = sum_t token_rewards[i, t], broadcast over response tokens.
    A group whose rewards are all equal gets exactly 0. Statistics are computed in float64.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if a group has fewer than 2 rollouts (the message names the group id), on shape mismatch,
            or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = Segments(group)
    R = _sequence_reward(r)
    return _broadcast(R - _leave_one_out_mean(groups, R, "rloo"), m).float()


@register_estimator("reinforce_pp")
def reinforce_pp(*, token_rewards: Tensor, mask: Tensor, group: Tensor, gamma: float = 1.0,
                 eps: float = DEFAULT_EPS) -> Tensor:
    """REINFORCE++ (Hu, 2025): discounted reward-to-go, whitened over the batch.

    G_{i,t} = sum_{k >= t} gamma^(k - t) r_{i,k}; A = (G - mean) / (std + eps), where mean and the unbiased std
    are taken over all response tokens of the batch (in float64); equal G everywhere gives exactly 0. ``group``
    is not used.

    Args:
        token_rewards: [N, T] float, rewards on response tokens (a per-token KL penalty may already be folded in).
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, accepted for a uniform signature; ignored.
        gamma: float discount (default 1.0).
        eps: float, added to the std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    return _whiten_tokens(reverse_discounted_sum(r, m, float(gamma)), m, eps).float()


@register_estimator("reinforce_pp_baseline", min_group_size=2)
def reinforce_pp_baseline(*, token_rewards: Tensor, mask: Tensor, group: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """REINFORCE++ with a group-mean baseline (Hu, 2025).

    A_i = R_i - mean_{j in g(i)} R_j broadcast over response tokens, then whitened over all response tokens of
    the batch: A <- (A - mean) / (unbiased std + eps). A group whose rewards are all equal has A_i = 0 exactly
    before whitening; a batch whose rewards are all equal gets exactly 0. Statistics are computed in float64.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        eps: float, added to the std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = Segments(group)
    R = _sequence_reward(r)
    return _whiten_tokens(_broadcast(groups.center(R), m), m, eps).float()


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
        ValueError: if ``baseline`` is missing, not [N] or not finite, on shape mismatch, or a NaN/inf reward
            inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if baseline is None:
        raise ValueError("advantage estimator 'remax' requires option 'baseline' ([N] greedy-rollout rewards)")
    b = _check_like("baseline", baseline, (r.shape[0],))
    return _broadcast(_sequence_reward(r) - b, m).float()


@register_estimator("opo", min_group_size=2)
def opo(*, token_rewards: Tensor, mask: Tensor, group: Tensor) -> Tensor:
    """On-Policy RL with Optimal reward Baseline (Hao et al., 2025).

    A_i = R_i - sum_{j in g(i)} L_j R_j / sum_{j in g(i)} L_j, L_j = number of response tokens of rollout j
    (the length-weighted group mean), broadcast over response tokens. A group whose rollouts are all empty uses
    a baseline of 0; a group whose non-empty rollouts all have the same reward gets exactly 0. Computed in
    float64.

    Args:
        token_rewards: [N, T] float, rewards on response tokens.
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch or a NaN/inf input inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    groups = Segments(group)
    R = _sequence_reward(r)
    L = m.sum(dim=1)
    y = R - groups.shift(R, where=L > 0)  # shift-invariant: A = y - weighted mean of y
    b = groups.broadcast(groups.sum(L * y)) / groups.broadcast(groups.sum(L)).clamp(min=1)
    return _broadcast(y - b, m).float()


@register_estimator("gdpo", needs=("components", "weights"), min_group_size=2)
def gdpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, components: Tensor | None = None,
         weights: Tensor | None = None, batch_whiten: bool = True, eps: float = DEFAULT_EPS) -> Tensor:
    """Group reward-Decoupled normalization Policy Optimization (NVIDIA, 2025, GDPO).

    Each reward component is group-normalized on its own, then the normalized components are summed:
    Ahat_{ik} = (r_{ik} - mean_{j in g(i)} r_{jk}) / (std_{j in g(i)} r_{jk} + eps)   (0 for a group of size 1),
    A_i = sum_k w_k Ahat_{ik}; if ``batch_whiten``, A <- (A - mean_i A) / (unbiased std_i A + eps) over the N
    values. Broadcast over response tokens. ``token_rewards`` is not used beyond shape checks. A component whose
    values are all equal within a group gives Ahat = 0 exactly there, and whitening N equal values gives exactly 0.
    Statistics are computed in float64.

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
        ValueError: if ``components`` is missing or not [N, K], ``weights`` is not [K], on shape mismatch, or if
            ``components`` or ``weights`` hold NaN/inf.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if components is None:
        raise ValueError("advantage estimator 'gdpo' requires option 'components' ([N, K] reward components)")
    if components.dim() != 2 or components.shape[0] != r.shape[0]:
        raise ValueError(f"option 'components' must be [N={r.shape[0]}, K], got {tuple(components.shape)}")
    c = _check_like("components", components, components.shape)
    k = c.shape[1]
    if weights is None:
        w = torch.ones(k, dtype=_COMPUTE, device=c.device)
    else:
        w = _check_like("weights", weights, (k,))
    groups = Segments(group)
    # Group statistics of all K components at once: the Segments reductions work on [N, K] along dim 0.
    normalized = _scaled(groups.center(c), groups.broadcast(groups.std(c)), eps)
    normalized = torch.where(groups.sizes()[:, None] > 1, normalized, torch.zeros_like(normalized))
    a = normalized @ w.to(c.device)
    if batch_whiten:
        a = _whiten_vector(a, eps)
    return _broadcast(a, m).float()


# ----------------------------------------------------------------------------------------------------------------
# process-reward estimators


@register_estimator("pure", needs=("step_rewards", "step_mask"), min_group_size=2)
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
            fewer than 2 rollouts (naming the group id), on shape mismatch, or a NaN/inf reward or step reward
            inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    p, sm = _step_rewards({"step_rewards": step_rewards, "step_mask": step_mask}, m, "pure")
    if not temperature > 0:
        raise ValueError(f"pure: temperature must be > 0, got {temperature}")
    logits = torch.where(sm > 0, -p / temperature, torch.full_like(p, float("-inf")))
    weights = torch.softmax(logits, dim=1)
    weights = torch.where(sm > 0, weights, torch.zeros_like(weights))  # rows without steps: NaN -> 0
    g = reverse_discounted_sum(weights * p + r, m, 1.0)
    groups = Segments(group)
    baseline = _leave_one_out_mean(groups, _first_token_value(g, m), "pure")
    return ((g - baseline[:, None]) * m).float()


@register_estimator("process_sum", needs=("step_rewards", "step_mask"), min_group_size=2)
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
            (naming the group id), on shape mismatch, or a NaN/inf reward or step reward inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    p, _sm = _step_rewards({"step_rewards": step_rewards, "step_mask": step_mask}, m, "process_sum")
    g = reverse_discounted_sum(p + r, m, float(gamma))
    groups = Segments(group)
    baseline = _leave_one_out_mean(groups, _first_token_value(g, m), "process_sum")
    return ((g - baseline[:, None]) * m).float()


@register_estimator("prime", needs=("step_rewards", "step_mask"), min_group_size=2)
def prime(*, token_rewards: Tensor, mask: Tensor, group: Tensor, step_rewards: Tensor | None = None,
          step_mask: Tensor | None = None, baseline_type: str = "rloo", gamma: float = 1.0,
          process_coef: float = 1.0, outcome_coef: float = 1.0, whiten: bool = True,
          eps: float = DEFAULT_EPS) -> Tensor:
    """PRIME's advantage (Cui et al., 2025, "Process Reinforcement through Implicit Rewards", arXiv:2502.01456):
    the process and the outcome rewards each against their own baseline, then their returns added.

    With p_{i,s} the process reward of step s of rollout i (step_rewards where step_mask is 1; with the online
    implicit PRM, `rl.online_prm: prime`, every sampled token is a step), pbar_i = mean_s p_{i,s} (0 for a rollout
    without steps) and R_i = sum_t token_rewards[i, t]:

        baseline_type "rloo" (the paper's): q_{i,s} = p_{i,s} - mean_{j in g(i), j != i} pbar_j
                                       o_i = R_i - mean_{j in g(i), j != i} R_j
        baseline_type "grpo":          q_{i,s} = (p_{i,s} - mean_{j in g(i)} pbar_j) / (std_{j in g(i)} pbar_j + eps)
                                       o_i = (R_i - mean_{j in g(i)} R_j) / (std_{j in g(i)} R_j + eps)
        G_{i,t} = sum_{s >= t} gamma^(s - t) q_{i,s}      (over the steps of rollout i; t, s in tokens)
        A_{i,t} = process_coef * G_{i,t} + outcome_coef * o_i

    and with ``whiten`` (the default, as verl's PRIME recipe) A is whitened over every response token of the batch:
    (A - mean) / (std + eps). The paper's eq.: A_t = sum_{s>=t} gamma^(s-t) [r_phi(y_s) - 1/(K-1) sum_{j!=i}
    r_phi(y^j)] + r_o(y) - 1/(K-1) sum_{j!=i} r_o(y^j), r_phi(y^j) the averaged implicit process reward. (verl's
    recipe applies the leave-one-out per token as p_{i,s} K/(K-1) - sum_j pbar_j/(K-1), which differs from the
    paper's by (p_{i,s} - pbar_i)/(K-1); this follows the paper.)

    Args:
        token_rewards: [N, T] float, rewards on response tokens (the outcome reward on the last one).
        mask: [N, T] bool/0-1, response tokens.
        group: [N] int64, prompt-group id of each rollout.
        step_rewards: [N, T] float, required; a step's process reward on its last token.
        step_mask: [N, T] bool/0-1, required; 1 on each step's last token (only response tokens count).
        baseline_type: "rloo" (default) or "grpo".
        gamma: float discount of the process returns, per token (default 1.0).
        process_coef, outcome_coef: float weights of the two returns (default 1.0 each; the verl recipe's
            reward_dpo_coef and reward_gt_coef, 5 each there, which whitening makes equivalent to 1 each).
        whiten: bool, whiten A over the batch's response tokens (default true).
        eps: float added to the stds (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: if ``step_rewards``/``step_mask`` are missing or misshapen, an unknown ``baseline_type``, a
            group has fewer than 2 rollouts (naming the group id), on shape mismatch, or a NaN/inf reward or step
            reward inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    p, sm = _step_rewards({"step_rewards": step_rewards, "step_mask": step_mask}, m, "prime")
    if baseline_type not in ("rloo", "grpo"):
        raise ValueError(f"prime: unknown baseline_type {baseline_type!r}; valid: grpo, rloo")
    groups = Segments(group)
    steps = sm.sum(dim=1)
    pbar = torch.where(steps > 0, p.sum(dim=1) / steps.clamp(min=1), torch.zeros_like(steps))
    R = _sequence_reward(r)
    if baseline_type == "rloo":
        q = (p - _leave_one_out_mean(groups, pbar, "prime")[:, None]) * sm
        o = R - _leave_one_out_mean(groups, R, "prime")
    else:
        _leave_one_out_mean(groups, R, "prime")  # the same group-size check as rloo's
        mean_p = groups.broadcast(groups.mean(pbar))
        q = _scaled(p - mean_p[:, None], groups.broadcast(groups.std(pbar))[:, None].expand_as(p), eps) * sm
        o = _scaled(groups.center(R), groups.broadcast(groups.std(R)), eps)
    a = process_coef * reverse_discounted_sum(q, m, float(gamma)) + outcome_coef * _broadcast(o, m)
    return (_whiten_tokens(a, m, eps) if whiten else a * m).float()


# ----------------------------------------------------------------------------------------------------------------
# critic-based


@register_estimator("gae", needs=("values",))
def gae(*, token_rewards: Tensor, mask: Tensor, group: Tensor, values: Tensor | None = None, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True, eps: float = DEFAULT_EPS) -> Tensor:
    """Generalized Advantage Estimation (Schulman et al., 2016).

    delta_t = r_t + gamma * V_{t+1} - V_t, with V after the last response token = 0;
    A_t = sum_{l >= 0} (gamma * lam)^l delta_{t+l}. If ``whiten``, A <- (A - mean) / (unbiased std + eps) over all
    response tokens of the batch (in float64; equal A everywhere whitens to exactly 0). ``group`` is not used.

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
        ValueError: if ``values`` is missing or not [N, T], on shape mismatch, or a NaN/inf reward or value
            inside the mask.
    """
    r, m = _check_inputs(token_rewards, mask, group)
    if values is None:
        raise ValueError("advantage estimator 'gae' requires option 'values' ([N, T] critic values)")
    v = _check_like("values", values, r.shape, m > 0).detach()
    v = torch.where(m > 0, v, 0.0)
    v_next = torch.zeros_like(v)
    v_next[:, :-1] = v[:, 1:]  # 0 after the last response token because v is 0 off the mask
    delta = r + float(gamma) * v_next - v
    a = reverse_discounted_sum(delta, m, float(gamma) * float(lam))
    return (_whiten_tokens(a, m, eps) if whiten else a).float()


# ----------------------------------------------------------------------------------------------------------------
# turn-level estimators (multi-turn episodes). Each row here is one whole episode: the trainer calls them through
# `rewardlab.rl.episodes.episode_advantages`, which concatenates the sampled tokens of an episode's rows first.

#: The trainer-supplied turn inputs (never user options): see `register_estimator(inputs=...)`.
TURN_INPUTS = ("turn_rewards", "turn_index")


class _Turns:
    """Per-turn structure of a batch of episodes (rows = episodes, columns = sampled tokens).

    Attributes:
        index: [N, T] int64 turn of each response token (0 outside the mask).
        count: K, the number of turn columns (1 + the largest turn index; 1 for an empty batch).
        reached: [N, K] bool, episode i has a response token in turn k.
        final: [N] int64, the last turn of each episode (its largest turn index; 0 without response tokens).
    """

    def __init__(self, m: Tensor, turn_index: Tensor | None):
        on = m > 0
        if turn_index is None:
            index = torch.zeros(m.shape, dtype=torch.long, device=m.device)
        else:
            if tuple(turn_index.shape) != tuple(m.shape):
                raise ValueError(f"input 'turn_index' must have shape {tuple(m.shape)}, got {tuple(turn_index.shape)}")
            if turn_index.dtype.is_floating_point or turn_index.dtype == torch.bool:
                raise ValueError(f"input 'turn_index' must be an integer tensor, got {turn_index.dtype}")
            index = torch.where(on, turn_index.long(), 0)
            bad = on & (index < 0)
            if bool(bad.any()):
                where = bad.nonzero()[0].tolist()
                raise ValueError(f"input 'turn_index': negative turn {int(index[tuple(where)])} at index {where} "
                                 "inside the mask; turns count from 0 on sampled tokens")
        self.index = index
        self.count = int(index.max()) + 1 if index.numel() else 1
        n = m.shape[0]
        hits = torch.zeros(n, self.count, dtype=_COMPUTE, device=m.device)
        hits.scatter_add_(1, index, on.to(_COMPUTE))
        self.reached = hits > 0
        self.final = torch.where(on, index, -1).amax(dim=1).clamp(min=0) if m.shape[1] else torch.zeros(n).long()

    def sum(self, x: Tensor) -> Tensor:
        """Per-turn sums of x [N, T] (already 0 outside the mask) -> [N, K]."""
        out = torch.zeros(x.shape[0], self.count, dtype=x.dtype, device=x.device)
        return out.scatter_add_(1, self.index, x)

    def spread(self, per_turn: Tensor, m: Tensor) -> Tensor:
        """Each token gets its turn's value: [N, K] -> [N, T], 0 outside the mask."""
        return per_turn.gather(1, self.index) * m


def _turn_rewards(turn_rewards: Tensor | None, m: Tensor) -> Tensor:
    """turn_rewards [N, T] as float64, checked finite on response tokens, 0 elsewhere (all 0 when None)."""
    if turn_rewards is None:
        return torch.zeros_like(m)
    tr = _check_like("turn_rewards", turn_rewards, m.shape, m > 0)
    return torch.where(m > 0, tr, 0.0)


def _turn_keys(turn_key: Tensor | None, turns: _Turns, m: Tensor) -> Tensor:
    """The state key of each turn, [N, K] int64, from ``turn_key`` [N, T] (every turn its own key when None).

    Raises:
        ValueError: ``turn_key`` is not [N, T], or the tokens of one turn carry different keys.
    """
    n, k = m.shape[0], turns.count
    if turn_key is None:
        return torch.arange(n * k, device=m.device).view(n, k)
    if tuple(turn_key.shape) != tuple(m.shape):
        raise ValueError(f"input 'turn_key' must have shape {tuple(m.shape)}, got {tuple(turn_key.shape)}")
    key_tokens = torch.where(m > 0, turn_key.long(), 0)
    big = torch.iinfo(torch.long)
    high = torch.full((n, k), big.min, dtype=torch.long, device=m.device).scatter_reduce_(
        1, turns.index, torch.where(m > 0, key_tokens, big.min), "amax")
    low = torch.full((n, k), big.max, dtype=torch.long, device=m.device).scatter_reduce_(
        1, turns.index, torch.where(m > 0, key_tokens, big.max), "amin")
    split = turns.reached & (high != low)
    if bool(split.any()):
        i, j = split.nonzero()[0].tolist()
        raise ValueError(f"input 'turn_key': the tokens of turn {j} of episode row {i} carry different keys "
                         f"({int(low[i, j])} and {int(high[i, j])}); a turn acts in one state")
    return high


def _normalize_members(x: Tensor, member: Tensor, key: Tensor, eps: float, std: bool) -> Tensor:
    """(x - mean) / (std + eps) of the entries of x [M] where ``member`` [M] is true, within groups of equal ``key``
    [M] among the members (unbiased std; ``std=False``: x - mean only); 0 for non-members and for members of a
    group of size 1. Equal values within a group give exactly 0 (as ``Segments.center``)."""
    out = torch.zeros_like(x)
    if not bool(member.any()):
        return out
    groups = Segments(key[member])
    values = x[member]
    centered = groups.center(values)
    a = _scaled(centered, groups.broadcast(groups.std(values)), eps) if std else centered
    out[member] = torch.where(groups.sizes() > 1, a, torch.zeros_like(a))
    return out


@register_estimator("turn_grpo", inputs=TURN_INPUTS, min_group_size=2)
def turn_grpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, turn_rewards: Tensor | None = None,
              turn_index: Tensor | None = None, lam: float = 1.0, eps: float = DEFAULT_EPS) -> Tensor:
    """MT-GRPO, turn-level credit for multi-turn episodes (Zeng et al., 2025, "Reinforcing Multi-Turn Reasoning in
    LLM Agents via Turn-Level Credit Assignment").

    Each row is one episode with turns k = 0..K_i (K_i its last turn). With Â^O_i = ``grpo``'s advantage of the
    outcome (token_rewards; this calls grpo, eps as given) and r_{i,k} = the sum of ``turn_rewards`` over turn k's
    tokens (the environment's reward for that turn, placed on its last sampled token):
        Â^T_{i,k} = (r_{i,k} - mean_j r_{j,k}) / (std_j r_{j,k} + eps), j over the episodes of i's group that
                    reached turn k (unbiased std; 0 when only one episode of the group reached turn k, or all equal);
        A_{i,t} = Â^O_i + lam * Â^T_{i,k(t)} on the tokens of turns k < K_i, and A_{i,t} = Â^O_i on the final turn.
    Per-turn (immediate) rewards are normalised, not reward-to-go: the paper's turn-level advantage standardises the
    reward of the turn itself and lets the outcome advantage carry the episode's result. The paper writes the
    first-turn advantage as Â^T + lam * Â^O with lam = 1 in its experiments; lam here weights the turn term (the
    two coincide at the default lam = 1). With all turn rewards 0, or one turn per episode, the result equals
    ``grpo``'s exactly.

    Args:
        token_rewards: [N, T] float, the outcome reward on the episode's last sampled token.
        mask: [N, T] bool/0-1, the episode's sampled tokens.
        group: [N] int64, prompt-group id of each episode.
        turn_rewards: [N, T] float, trainer input: each turn's reward on its last sampled token (None: all 0).
        turn_index: [N, T] int64, trainer input: each sampled token's turn, from 0 (any value outside the mask;
            None: one turn per episode).
        lam: float, weight of the turn-level advantage (default 1.0).
        eps: float, added to each std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch, a non-integer or negative turn index inside the mask, or a NaN/inf reward or
            turn reward inside the mask.
    """
    outcome = grpo(token_rewards=token_rewards, mask=mask, group=group, eps=eps)
    r, m = _check_inputs(token_rewards, mask, group)
    turns = _Turns(m, turn_index)
    per_turn = turns.sum(_turn_rewards(turn_rewards, m))  # [N, K]
    n, k = per_turn.shape
    episode_group = segment_ids(group)
    key = (episode_group[:, None] * k + torch.arange(k, device=m.device)[None, :]).reshape(-1)  # (group, turn)
    a_turn = _normalize_members(per_turn.reshape(-1), turns.reached.reshape(-1), key, eps, True).view(n, k)
    a_turn = torch.where(torch.arange(k, device=m.device)[None, :] < turns.final[:, None], a_turn, 0.0)
    if not bool((a_turn != 0).any()):
        return outcome  # exactly grpo's
    return (outcome.to(_COMPUTE) + float(lam) * turns.spread(a_turn, m)).float()


@register_estimator("gigpo", inputs=(*TURN_INPUTS, "turn_key"), min_group_size=2)
def gigpo(*, token_rewards: Tensor, mask: Tensor, group: Tensor, turn_rewards: Tensor | None = None,
          turn_index: Tensor | None = None, turn_key: Tensor | None = None, omega: float = 1.0, gamma: float = 0.95,
          norm: str = "std", eps: float = DEFAULT_EPS) -> Tensor:
    """GiGPO, group-in-group advantages for multi-turn episodes (Feng et al., 2025, "Group-in-Group Policy
    Optimization for LLM Agent Training").

    Each row is one episode with turns k = 0..K_i. A = A^E + omega * A^S, where
    - A^E_i = ``grpo``'s advantage of the outcome (this calls grpo; scale "group" for norm="std", "none" for
      norm="none"). The paper's episode return is the sum of the step rewards; here the environment's per-turn
      rewards enter only A^S, so that omega = 0 gives grpo exactly.
    - A^S_{i,k}: the step-level advantage of turn k of episode i within its anchor-state group, the turns of the
      episodes of i's prompt group whose state key equals turn k's (``turn_key``):
        r_{i,k} = sum over turn k's tokens of (token_rewards + turn_rewards)   (the outcome lands in the last turn);
        G_{i,k} = sum_{k' >= k} gamma^(k' - k) r_{i,k'}   (the discounted return from turn k, as in the paper);
        A^S_{i,k} = (G_{i,k} - mean G) / (std G + eps) over the anchor group (unbiased std; norm="none": minus the
        mean only); 0 for an anchor group of one turn, or whose returns are all equal.
    Token t of turn k gets A^E_i + omega * A^S_{i,k}. Defaults: omega = 1 and gamma = 0.95 as in the authors'
    ALFWorld/WebShop runs, and norm = "std" (F_norm = std; their scripts also use "none", mean-only). With
    omega = 0, or every anchor group of size 1 (e.g. ``turn_key`` None: every turn its own state), the result
    equals ``grpo``'s exactly.

    Args:
        token_rewards: [N, T] float, the outcome reward on the episode's last sampled token.
        mask: [N, T] bool/0-1, the episode's sampled tokens.
        group: [N] int64, prompt-group id of each episode.
        turn_rewards: [N, T] float, trainer input: each turn's reward on its last sampled token (None: all 0).
        turn_index: [N, T] int64, trainer input: each sampled token's turn, from 0 (None: one turn per episode).
        turn_key: [N, T] int64, trainer input: on every sampled token of a turn, the id of the state the turn acted
            in (equal ids = the same state; the trainer maps `Rollout.turn_keys` strings to ids); None: every turn
            its own state.
        omega: float, weight of the step-level advantage (default 1.0).
        gamma: float in [0, 1], discount of the step-level return (default 0.95).
        norm: "std" (default) or "none".
        eps: float, added to each std (default 1e-6).
    Returns:
        [N, T] float32 advantages, 0 where mask is 0.
    Raises:
        ValueError: on shape mismatch, an unknown ``norm``, gamma outside [0, 1], a bad turn index, a turn whose
            tokens carry different keys, or a NaN/inf reward or turn reward inside the mask.

    Every input and option is its own keyword: `compute_advantages` calls an estimator as
    ``fn(token_rewards=, mask=, group=, **options)``, and the registry reads each estimator's declared options and
    trainer inputs from these keyword names, so they are not bundled.
    """
    if norm not in ("std", "none"):
        raise ValueError(f"gigpo: unknown norm {norm!r}; valid: none, std")
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gigpo: gamma must be in [0, 1], got {gamma}")
    episode_adv = grpo(token_rewards=token_rewards, mask=mask, group=group, eps=eps,
                       scale="group" if norm == "std" else "none")
    r, m = _check_inputs(token_rewards, mask, group)
    turns = _Turns(m, turn_index)
    n, k = m.shape[0], turns.count
    keys = _turn_keys(turn_key, turns, m)
    per_turn = turns.sum(torch.where(m > 0, r + _turn_rewards(turn_rewards, m), 0.0))  # [N, K]
    per_turn = torch.where(turns.reached, per_turn, 0.0)
    returns = reverse_discounted_sum(per_turn, turns.reached.to(_COMPUTE), float(gamma))  # [N, K], 0 where unreached
    # anchor key = (prompt group, state key): dense ids of the pairs
    anchor = segment_ids(segment_ids(group)[:, None].expand(n, k).reshape(-1), keys.reshape(-1))
    a_step = _normalize_members(returns.reshape(-1), turns.reached.reshape(-1), anchor, eps, norm == "std").view(n, k)
    if float(omega) == 0.0 or not bool((a_step != 0).any()):
        return episode_adv  # exactly grpo's
    return (episode_adv.to(_COMPUTE) + float(omega) * turns.spread(a_step, m)).float()
