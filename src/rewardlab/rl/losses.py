"""Policy losses, KL estimators and loss aggregation.

Three registries of pure tensor functions, keyed by the names papers use:

    POLICY_LOSSES[name](logprobs=, old_logprobs=, advantages=, mask=, episode=, **options) -> (loss [N, T], stats)
    KL_ESTIMATORS[name](logprobs=, ref_logprobs=) -> [N, T]
    AGGREGATIONS[mode](per_token_loss=, mask=, episode=, **options) -> 0-dim loss

All tensors are [N, T] over completion tokens (right-padded); ``mask`` (bool or 0/1) marks response tokens (for an
episode: the tokens the policy sampled, never an environment token).
``episode`` [N] int64 (optional, an input, never an option): the episode id of each row, when an episode is split
into several rows; None means each row is its own episode (the single-turn case).
Whatever reads a sequence counts an episode once, over its tokens across its rows: the ``seq-mean-*``
aggregations and GSPO's sequence ratio; token-level losses and ``token-mean`` do not depend on it.
Policy losses compute in float32 (inputs are upcast) and return 0 outside the mask. Every loss and aggregation
declares its options by name; ``compute_policy_loss`` hands each option to the loss or the aggregation that declares
it, and refuses one that neither declares (a ValueError naming it and listing the valid ones).

Stats (python floats, computed without gradient, over masked tokens):
``policy/clip_frac_low``, ``policy/clip_frac_high``, ``policy/clip_frac_dual`` (fraction of response tokens where
that clip decides the loss), ``policy/clip_frac`` (any of them), ``policy/approx_kl`` (k3 estimate of
KL(old || new) from tokens sampled by the old policy: mean of exp(d) - 1 - d, d = logprobs - old_logprobs),
``policy/ratio_mean``, ``policy/ratio_min``, ``policy/ratio_max``, ``policy/ratio_std`` (population standard
deviation; of the importance ratio the loss uses, new / behaviour, so its spread grows with the staleness of
asynchronous training),
``policy/log_ratio_clamped`` (number of response tokens whose log-ratio reached the bound, see below).

Extreme log-ratios are clamped, following verl: the policy losses use d = clamp(logprobs - old_logprobs, -20, 20)
(so an old log-prob of -inf on a response token gives a ratio of e^20, a finite loss and a zero gradient on that
token instead of inf/NaN), and the KL estimators use d = clamp(logprobs - ref_logprobs, -20, 20), with k3's value
further clamped to [-10, 10]. ``kl_clamped`` counts the response tokens where a KL estimator's clamp is active.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import Tensor

from rewardlab.registry import Registry, unknown_options
from rewardlab.rl.segments import Segments

__all__ = [
    "POLICY_LOSSES",
    "KL_ESTIMATORS",
    "AGGREGATIONS",
    "register_policy_loss",
    "register_kl_estimator",
    "register_aggregation",
    "compute_policy_loss",
    "per_token_policy_loss",
    "aggregation_weights",
    "split_loss_options",
    "check_loss_options",
    "kl_penalty",
    "kl_clamped",
    "aggregate",
    "PolicyLossStats",
    "loss_tokens",
    "LOG_RATIO_BOUND",
    "K3_BOUND",
]

POLICY_LOSSES: Registry[Callable[..., tuple[Tensor, dict[str, float]]]] = Registry(
    "policy loss", reserved=("logprobs", "old_logprobs", "advantages", "mask", "episode"))
KL_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("KL estimator", reserved=("logprobs", "ref_logprobs"))
AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("aggregation mode",
                                                        reserved=("per_token_loss", "mask", "episode"))

#: |log-ratio| bound (nats) of the policy losses and the KL estimators: exp(20) = 4.9e8 stays finite in float32.
LOG_RATIO_BOUND = 20.0
#: Bound of the k3 KL estimate (verl's convention).
K3_BOUND = 10.0
#: KL estimator name -> the bound its value is clamped to (those not listed clamp only d).
KL_VALUE_BOUNDS: dict[str, float] = {"k3": K3_BOUND}


def register_policy_loss(name: str, *, check: Callable[..., Any] | None = None) -> Callable:
    """Register ``fn(*, logprobs, old_logprobs, advantages, mask, episode=None, <options>) -> (loss [N, T], stats)``
    in ``POLICY_LOSSES``; every option is declared by name (no ``**kwargs``). A loss that reads whole sequences
    must use ``episode`` ([N] int64 or None) to treat the rows of one episode as one sequence; one without an
    ``episode`` parameter is refused episode ids by ``compute_policy_loss``.

    ``check(**options)``, when given, raises a one-line ValueError for option values the loss refuses (e.g. a
    negative clip epsilon); ``check_loss_options`` runs it before any tensor exists, and the loss calls it too.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return POLICY_LOSSES.register(name, **({"check": check} if check is not None else {}))


def register_kl_estimator(name: str) -> Callable:
    """Register ``fn(*, logprobs, ref_logprobs) -> [N, T]`` in ``KL_ESTIMATORS``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return KL_ESTIMATORS.register(name)


def register_aggregation(name: str, *, check: Callable[..., Any] | None = None) -> Callable:
    """Register ``fn(*, per_token_loss, mask, episode=None, <options>) -> 0-dim Tensor`` in ``AGGREGATIONS``; every
    option is declared by name (no ``**kwargs``); ``episode`` and ``check`` as for ``register_policy_loss``.

    Raises:
        ValueError: if ``name`` is already registered.
    """
    return AGGREGATIONS.register(name, **({"check": check} if check is not None else {}))


# ----------------------------------------------------------------------------------------------------------------
# public entry points


def split_loss_options(name: str, agg: str, options: Mapping[str, Any], *,
                       field: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``options`` into those of policy loss ``name`` and those of aggregation mode ``agg``.

    An option both declare goes to both; a loss or aggregation with ``**kwargs`` takes every option.

    Args:
        name: a registered policy loss.
        agg: a registered aggregation mode.
        options: option name -> value.
        field: a config key to start an error message with, e.g. "rl.loss_options".
    Returns:
        (loss options, aggregation options).
    Raises:
        ValueError: an unknown ``name`` or ``agg`` (the message lists the valid names), or an option neither
            declares: "unknown option 'foo' for policy loss 'gspo'; valid: clip, clip_high, clip_low" (the
            aggregation is named too when it declares options).
    """
    POLICY_LOSSES.get(name)
    AGGREGATIONS.get(agg)
    loss_names, agg_names = POLICY_LOSSES.options(name), AGGREGATIONS.options(agg)
    to_loss = {k: v for k, v in options.items() if loss_names is None or k in loss_names}
    to_agg = {k: v for k, v in options.items() if agg_names is None or k in agg_names}
    unknown = [k for k in options if k not in to_loss and k not in to_agg]
    if unknown:
        owner = f"policy loss {name!r}" + (f" or aggregation mode {agg!r}" if agg_names else "")
        raise ValueError(unknown_options(unknown, owner, [*(loss_names or ()), *(agg_names or ())], field))
    return to_loss, to_agg


def check_loss_options(name: str, agg: str, options: Mapping[str, Any], *,
                       field: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``options`` of policy loss ``name`` and aggregation ``agg`` without computing anything: split them
    (``split_loss_options``), read each value against its parameter's annotation (``Registry.validate``), then run
    the value checks the loss and the aggregation registered (``check=``; one registered without a check gets the
    annotation check only).

    Returns:
        (loss options, aggregation options), each value as its annotation reads it.
    Raises:
        ValueError: one line starting with ``field``: an unknown name or option (``split_loss_options``), a value of
            the wrong type ("rl.loss_options.clip_low: expected a number, got 'x'"), or a value the loss refuses
            ("rl.loss_options: ppo_clip: dual_clip must be > 1, got 0.5").
    """
    to_loss, to_agg = split_loss_options(name, agg, options, field=field)
    checked = []
    for registry, entry, given in ((POLICY_LOSSES, name, to_loss), (AGGREGATIONS, agg, to_agg)):
        values = registry.validate(entry, given, field=field)
        check = registry.meta(entry).get("check")
        if check is not None:
            try:
                check(**values)
            except ValueError as exc:
                raise ValueError(f"{field}: {exc}" if field else str(exc)) from None
        checked.append(values)
    return checked[0], checked[1]


def compute_policy_loss(name: str, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                        agg: str = "token-mean", episode: Tensor | None = None,
                        **options: Any) -> tuple[Tensor, dict[str, float]]:
    """Per-token policy loss ``POLICY_LOSSES[name]`` reduced with ``AGGREGATIONS[agg]``.

    Each option goes to the loss (e.g. ``clip_low``) or the aggregation (e.g. ``max_len``) that declares it (see
    ``split_loss_options``).

    Args:
        name: registered policy loss, e.g. ``"ppo_clip"``.
        logprobs: [N, T] float, log-probs of the sampled tokens under the current policy (carries gradient).
        old_logprobs: [N, T] float, log-probs under the behaviour policy.
        advantages: [N, T] float.
        mask: [N, T] bool/0-1, response tokens.
        agg: aggregation mode (default ``"token-mean"``).
        episode: [N] int64 episode id of each row, or None (default: each row its own episode).
        **options: options of the loss and of the aggregation.
    Returns:
        (loss, stats): 0-dim float32 Tensor, and dict[str, float] of the loss's stats.
    Raises:
        ValueError: if ``name`` or ``agg`` is unknown (the message lists the valid names), an option is declared by
            neither (the message names it and lists the valid ones), ``episode`` is given to a loss or aggregation
            without an ``episode`` parameter, or on bad inputs.
    """
    _, agg_options = split_loss_options(name, agg, options)
    per_token, stats = per_token_policy_loss(name, logprobs=logprobs, old_logprobs=old_logprobs,
                                             advantages=advantages, mask=mask, agg=agg, episode=episode, **options)
    loss = AGGREGATIONS[agg](per_token_loss=per_token, mask=mask, **_episode_input(AGGREGATIONS, agg, episode),
                             **agg_options)
    return loss, stats


def per_token_policy_loss(name: str, *, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                          agg: str = "token-mean", episode: Tensor | None = None,
                          **options: Any) -> tuple[Tensor, dict[str, float]]:
    """The per-token loss ``POLICY_LOSSES[name]`` before aggregation, with its stats: what a micro-batch of a
    minibatch contributes, weighted by ``aggregation_weights`` of the whole minibatch.

    Args: as ``compute_policy_loss`` (``agg`` only names the aggregation whose options ``options`` may also hold).
    Returns:
        ([N, T] float32 per-token loss, 0 off the mask; dict[str, float] of the loss's stats).
    Raises:
        ValueError: as ``compute_policy_loss``.
    """
    loss_options, _ = split_loss_options(name, agg, options)
    per_token, stats = POLICY_LOSSES[name](logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                                           mask=mask, **_episode_input(POLICY_LOSSES, name, episode),
                                           **loss_options)
    return per_token, stats


def aggregation_weights(mode: str, mask: Tensor, *, episode: Tensor | None = None, **options: Any) -> Tensor:
    """The weight of each token in aggregation ``mode``: w with ``AGGREGATIONS[mode](l) = sum_{i,t} w_{i,t} l_{i,t}``
    for every per-token loss l (the gradient of the aggregation with respect to l, which is constant because the
    registered aggregations are linear in l). A minibatch split into micro-batches keeps exactly its aggregation
    (e.g. token-mean over all the minibatch's tokens, not a mean of micro-batch means) when each micro-batch's
    per-token loss is weighted by its rows of w and the weighted sums' gradients are accumulated.

    For example token-mean: w = m / sum(m); seq-mean-token-mean: w_{i,t} = m_{i,t} / (E * sum_t m_{i,t}) with an
    episode's tokens summed over its rows; seq-mean-token-sum-norm: w = m / (E * max_len).

    Args:
        mode: a registered aggregation.
        mask: [N, T] bool/0-1, the minibatch's response tokens.
        episode: [N] int64 episode id of each row, or None (each row its own episode).
        **options: the aggregation's options (e.g. ``max_len``).
    Returns:
        [N, T] float32 weights, 0 off the mask.
    Raises:
        ValueError: as ``aggregate``; or the aggregation is not linear in the per-token loss (checked on a random
            probe: a user-registered aggregation such as a median cannot be split into micro-batches).
    """
    probe = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        value = aggregate(probe, mask, mode, episode=episode, **options)
        (weights,) = torch.autograd.grad(value, probe, allow_unused=True)
    weights = torch.zeros_like(probe) if weights is None else weights.detach()
    with torch.no_grad():
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(mask.shape, generator=gen, dtype=torch.float64).to(device=mask.device)
        got = float(aggregate(x, mask, mode, episode=episode, **options))
        expected = float((weights.double() * x).sum())
        scale = float((weights.double() * x).abs().sum()) + 1e-12
        if float(value.detach()) != 0.0 or abs(got - expected) > 1e-5 * scale:
            raise ValueError(f"aggregation {mode!r} is not linear in the per-token loss, so a minibatch cannot be "
                             "split into micro-batches with the same loss; unset rl.micro_batch_size")
    return weights


def _episode_input(registry: Registry, name: str, episode: Tensor | None) -> dict[str, Tensor]:
    """{"episode": episode} for an entry that takes it, {} when episode is None.

    Raises: ValueError if episode ids are given to an entry without an ``episode`` parameter."""
    if episode is None:
        return {}
    if "episode" not in inspect.signature(registry.get(name)).parameters:
        raise ValueError(f"{registry.kind} {name!r} takes no 'episode' input, so it cannot count the rows of a "
                         "split episode as one; give it an episode parameter")
    return {"episode": episode}


def kl_penalty(name: str, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token KL estimate ``KL_ESTIMATORS[name]`` between the current and reference policies.

    Args:
        name: ``"k1"``, ``"k2"`` or ``"k3"``.
        logprobs: [N, T] float, current-policy log-probs of the sampled tokens.
        ref_logprobs: [N, T] float, reference-policy log-probs of the same tokens.
    Returns:
        [N, T] Tensor in the promoted dtype of the inputs; the caller masks and aggregates.
    Raises:
        ValueError: if ``name`` is unknown (the message lists the valid names) or the shapes differ.
    """
    return KL_ESTIMATORS.get(name)(logprobs=logprobs, ref_logprobs=ref_logprobs)


@torch.no_grad()
def kl_clamped(name: str, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> int:
    """Number of response tokens where ``kl_penalty(name, ...)`` is clamped, for logging (``policy/kl_clamped``).

    A token counts when |logprobs - ref_logprobs| > LOG_RATIO_BOUND (20), or when the estimator has a value bound
    (``KL_VALUE_BOUNDS``: k3 -> 10) and its value reached it.

    Args:
        name: registered KL estimator.
        logprobs, ref_logprobs: [N, T] float, as for ``kl_penalty``.
        mask: [N, T] bool/0-1, response tokens.
    Returns:
        int count of masked tokens.
    Raises:
        ValueError: as ``kl_penalty``.
    """
    value = kl_penalty(name, logprobs, ref_logprobs)
    hit = (logprobs - ref_logprobs).abs() > LOG_RATIO_BOUND
    bound = KL_VALUE_BOUNDS.get(name)
    if bound is not None:
        hit = hit | (value.abs() >= bound)
    return int((hit & (mask > 0)).sum())


def aggregate(per_token_loss: Tensor, mask: Tensor, mode: str, *, episode: Tensor | None = None,
              **options: Any) -> Tensor:
    """Reduce a per-token loss [N, T] to a scalar with ``AGGREGATIONS[mode]``.

    Args:
        per_token_loss: [N, T] float.
        mask: [N, T] bool/0-1, response tokens.
        mode: ``"token-mean"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
            ``"seq-mean-token-sum-norm"``.
        episode: [N] int64 episode id of each row, or None (each row its own episode).
        **options: options the mode declares (``max_len`` for ``seq-mean-token-sum-norm``).
    Returns:
        0-dim Tensor.
    Raises:
        ValueError: if ``mode`` is unknown (the message lists the valid names), an option is not one the mode
            declares (the message names it and lists the valid ones), or the shapes differ.
    """
    fn = AGGREGATIONS.get(mode)
    AGGREGATIONS.check(mode, options)
    return fn(per_token_loss=per_token_loss, mask=mask, **_episode_input(AGGREGATIONS, mode, episode), **options)


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _prepare(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor):
    """Check shapes; return (m, lp, log_ratio, adv) as float32 with off-mask entries set to 0.

    log_ratio = clamp(logprobs - old_logprobs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND) = clamp(d, -20, 20), so exp() of
    it is finite even for an old log-prob of -inf on a response token (such a token gets no gradient through the
    ratio). Zeroing before exp() keeps padding values (e.g. -inf) from producing inf/NaN in values or gradients.
    """
    shape = logprobs.shape
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [N, T], got shape {tuple(shape)}")
    for name, x in (("old_logprobs", old_logprobs), ("advantages", advantages), ("mask", mask)):
        if x.shape != shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} != logprobs shape {tuple(shape)}")
    m = mask.to(torch.float32)
    on = m > 0
    zero = torch.zeros((), dtype=torch.float32, device=logprobs.device)
    lp = torch.where(on, logprobs.to(torch.float32), zero)
    old = torch.where(on, old_logprobs.detach().to(torch.float32), zero)
    adv = torch.where(on, advantages.detach().to(torch.float32), zero)
    return m, lp, torch.clamp(lp - old, -LOG_RATIO_BOUND, LOG_RATIO_BOUND), adv


def _masked_mean(x: Tensor, m: Tensor) -> float:
    return float((x * m).sum() / m.sum().clamp(min=1))


#: Codes of `PolicyLossStats.tokens["clip"]`: which clip of the loss was active on a token.
CLIP_NONE, CLIP_LOW, CLIP_HIGH, CLIP_DUAL = 0, 1, 2, 3


class PolicyLossStats(dict):
    """A policy loss's statistics (dict[str, float], averaged into the step's metrics) and, in `tokens`, its
    per-token view: "ratio" [N, T] float32 (the importance ratio the loss used, exp of the clamped log-ratio; for
    GSPO the sequence ratio on each token) and "clip" [N, T] int8 (`CLIP_NONE`, `CLIP_LOW`, `CLIP_HIGH` or
    `CLIP_DUAL`: which clip was active on the token, as counted in policy/clip_frac_*; 0 off the mask). The
    built-in losses return one; a registered loss may return a plain dict (it then has no per-token view)."""

    def __init__(self, stats: dict[str, float], tokens: dict[str, Tensor] | None = None) -> None:
        super().__init__(stats)
        self.tokens: dict[str, Tensor] = tokens or {}


def loss_tokens(stats: dict[str, float]) -> dict[str, Tensor]:
    """The per-token view of a policy loss's stats (`PolicyLossStats.tokens`), {} for a loss that gives none."""
    return getattr(stats, "tokens", {})


@torch.no_grad()
def _stats(ratio: Tensor, log_ratio: Tensor, m: Tensor, low: Tensor, high: Tensor,
           dual: Tensor) -> PolicyLossStats:
    """Stats over masked tokens; ``low``/``high``/``dual`` are [N, T] bool masks of where each clip is active.

    ``log_ratio`` is the clamped one from ``_prepare``: a token at the bound +-20 counts in
    ``policy/log_ratio_clamped``. The per-token ratio and clip codes go in the result's ``tokens``.
    """
    on = m > 0
    ratios = ratio.detach()[on]
    has = ratios.numel() > 0
    low, high, dual = low & on, high & on, dual & on
    d = log_ratio.detach()
    clip = torch.zeros(m.shape, dtype=torch.int8, device=m.device)
    for code, where in ((CLIP_LOW, low), (CLIP_HIGH, high), (CLIP_DUAL, dual)):
        clip[where] = code
    tokens = {"ratio": ratio.detach().float() * m, "clip": clip}
    return PolicyLossStats({
        "policy/clip_frac_low": _masked_mean(low.float(), m),
        "policy/clip_frac_high": _masked_mean(high.float(), m),
        "policy/clip_frac_dual": _masked_mean(dual.float(), m),
        "policy/clip_frac": _masked_mean((low | high | dual).float(), m),
        # k3 estimate of KL(old || new) on tokens sampled from old: r = new/old, k3 = r - 1 - log r.
        "policy/approx_kl": _masked_mean(torch.expm1(d) - d, m),
        "policy/ratio_mean": float(ratios.mean()) if has else 1.0,
        "policy/ratio_min": float(ratios.min()) if has else 1.0,
        "policy/ratio_max": float(ratios.max()) if has else 1.0,
        "policy/ratio_std": float(ratios.std(unbiased=False)) if has else 0.0,
        "policy/log_ratio_clamped": float(((d.abs() >= LOG_RATIO_BOUND) & on).sum()),
    }, tokens)


def _no_clip(m: Tensor) -> Tensor:
    return torch.zeros_like(m, dtype=torch.bool)


# ----------------------------------------------------------------------------------------------------------------
# policy losses


def _check_ppo_clip(*, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None) -> None:
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"ppo_clip: clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"ppo_clip: dual_clip must be > 1, got {dual_clip}")


@register_policy_loss("ppo_clip", check=_check_ppo_clip)
def ppo_clip(*, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
             episode: Tensor | None = None, clip_low: float = 0.2, clip_high: float = 0.2,
             dual_clip: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate objective (Schulman et al., 2017, PPO), with asymmetric "clip-higher" bounds
    (Yu et al., 2025, DAPO) and optional dual clip (Ye et al., 2020).

    rho = exp(clamp(logprobs - old_logprobs, -20, 20));
    l = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A);
    with ``dual_clip = c`` (c > 1): where A < 0, l = min(l, -c * A).

    Args:
        logprobs: [N, T] float, current policy (carries gradient).
        old_logprobs: [N, T] float, behaviour policy (treated as constant).
        advantages: [N, T] float (treated as constant).
        mask: [N, T] bool/0-1, response tokens.
        episode: [N] int64 or None; a token-level loss does not depend on it.
        clip_low: float >= 0, epsilon of the lower bound (default 0.2).
        clip_high: float >= 0, epsilon of the upper bound (default 0.2).
        dual_clip: float > 1 or None (default None: off).
    Returns:
        ([N, T] float32 per-token loss, 0 off the mask; dict of stats).
    Raises:
        ValueError: if a clip epsilon is negative, ``dual_clip`` <= 1, or shapes differ.
    """
    _check_ppo_clip(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    m, _lp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        clip_active = clipped > unclipped
        low = clip_active & (adv < 0)
        high = clip_active & (adv > 0)
    if dual_clip is not None:
        bound = -dual_clip * adv
        with torch.no_grad():
            dual = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    else:
        dual = _no_clip(m)
    loss = loss * m
    return loss, _stats(ratio, log_ratio, m, low, high, dual)


#: GSPO's clip range from the paper (Zheng et al., 2025): s_i is kept within [1 - 3e-4, 1 + 4e-4].
GSPO_CLIP_LOW, GSPO_CLIP_HIGH = 3e-4, 4e-4


def _gspo_clip_range(*, clip: float | None = None, clip_low: float | None = None,
                     clip_high: float | None = None) -> tuple[float, float]:
    """GSPO's (clip_low, clip_high) from its options (``clip`` symmetric; the paper's range by default)."""
    if clip is not None:
        if clip_low is not None or clip_high is not None:
            raise ValueError("gspo: give clip (symmetric) or clip_low/clip_high, not both")
        clip_low = clip_high = clip
    clip_low = GSPO_CLIP_LOW if clip_low is None else clip_low
    clip_high = GSPO_CLIP_HIGH if clip_high is None else clip_high
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"gspo: clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    return clip_low, clip_high


@register_policy_loss("gspo", check=_gspo_clip_range)
def gspo(*, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, episode: Tensor | None = None,
         clip: float | None = None, clip_low: float | None = None,
         clip_high: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization (Zheng et al., 2025, GSPO).

    Sequence-level, length-normalized ratio s_i = exp(mean_{t in mask_i} d_t), d = clamp(logprobs - old_logprobs,
    -20, 20), and sequence
    advantage A_i = masked mean over t of advantages[i, t] (equal to the value at any token when A is broadcast);
    l_{i,t} = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i) on every response token of i.
    ``clip = eps`` is the symmetric form of the paper's formula, clip(s_i, 1 - eps, 1 + eps): clip_low = clip_high
    = eps. Defaults are the paper's clip range (clip_low 3e-4, clip_high 4e-4). Ratio stats describe s_i (counted
    once per token). With ``episode``, the sequence i is the episode: s_i and A_i are taken over the episode's
    response tokens across all its rows, and every token of the episode gets its l.

    Args:
        logprobs: [N, T] float, current policy (carries gradient).
        old_logprobs: [N, T] float, behaviour policy (treated as constant).
        advantages: [N, T] float (treated as constant).
        mask: [N, T] bool/0-1, response tokens.
        episode: [N] int64 episode id of each row, or None (each row its own sequence).
        clip: float >= 0 or None, symmetric epsilon; exclusive with clip_low/clip_high (default None).
        clip_low: float >= 0 (default 3e-4).
        clip_high: float >= 0 (default 4e-4).
    Returns:
        ([N, T] float32 per-token loss, 0 off the mask; dict of stats).
    Raises:
        ValueError: if ``clip`` is given together with ``clip_low`` or ``clip_high``, a clip epsilon is negative,
            or shapes differ.
    """
    clip_low, clip_high = _gspo_clip_range(clip=clip, clip_low=clip_low, clip_high=clip_high)
    m, _lp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    if episode is None:
        lengths = m.sum(dim=1).clamp(min=1)
        seq_ratio = torch.exp((log_ratio * m).sum(dim=1) / lengths)  # [N]
        seq_adv = (adv * m).sum(dim=1) / lengths  # [N]
    else:  # the sums of an episode's rows, gathered back to each of its rows
        episodes = _episodes(episode, m.shape[0])
        lengths = episodes.broadcast(episodes.sum(m.sum(dim=1))).clamp(min=1)
        seq_ratio = torch.exp(episodes.broadcast(episodes.sum((log_ratio * m).sum(dim=1))) / lengths)
        seq_adv = episodes.broadcast(episodes.sum((adv * m).sum(dim=1))) / lengths
    unclipped = -seq_adv * seq_ratio
    clipped = -seq_adv * torch.clamp(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)[:, None] * m
    with torch.no_grad():
        clip_active = (clipped > unclipped)[:, None].expand_as(m)
        negative = (seq_adv < 0)[:, None].expand_as(m)
        low, high = clip_active & negative, clip_active & ~negative
    ratio_tokens = seq_ratio[:, None].expand_as(m)
    return loss, _stats(ratio_tokens, log_ratio, m, low, high, _no_clip(m))


def _check_cispo(*, clip_high: float = 0.2, clip_low: float | None = None) -> None:
    if clip_high < 0:
        raise ValueError(f"cispo: clip_high must be >= 0, got {clip_high}")
    if clip_low is not None and not 0 <= clip_low <= 1:
        raise ValueError(f"cispo: clip_low must be in [0, 1], got {clip_low}")


@register_policy_loss("cispo", check=_check_cispo)
def cispo(*, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
          episode: Tensor | None = None, clip_high: float = 0.2,
          clip_low: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped IS-weight Policy Optimization (MiniMax, 2025, MiniMax-M1).

    rho = exp(clamp(logprobs - old_logprobs, -20, 20)); l = -sg(min(rho, 1 + clip_high)) * A * logprobs,
    sg = stop-gradient.
    Every token keeps its gradient; only the importance weight is bounded. The paper sets no lower bound; pass
    ``clip_low`` to also bound the weight below by 1 - clip_low. The default clip_high = 0.2 is ours (the paper
    tunes it and reports no single value).

    Args:
        logprobs: [N, T] float, current policy (carries gradient).
        old_logprobs: [N, T] float, behaviour policy (treated as constant).
        advantages: [N, T] float (treated as constant).
        mask: [N, T] bool/0-1, response tokens.
        episode: [N] int64 or None; a token-level loss does not depend on it.
        clip_high: float >= 0 (default 0.2).
        clip_low: float in [0, 1] or None (default None: no lower bound).
    Returns:
        ([N, T] float32 per-token loss, 0 off the mask; dict of stats).
    Raises:
        ValueError: if ``clip_high`` < 0, ``clip_low`` is outside [0, 1], or shapes differ.
    """
    _check_cispo(clip_high=clip_high, clip_low=clip_low)
    m, lp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        weight = torch.clamp(ratio, max=1.0 + clip_high)
        high = ratio > 1.0 + clip_high
        if clip_low is not None:
            weight = torch.clamp(weight, min=1.0 - clip_low)
            low = ratio < 1.0 - clip_low
        else:
            low = _no_clip(m)
    loss = -weight * adv * lp * m
    return loss, _stats(ratio, log_ratio, m, low, high, _no_clip(m))


@register_policy_loss("reinforce")
def reinforce(*, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
              mask: Tensor, episode: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Vanilla policy gradient, REINFORCE (Williams, 1992).

    l = -A * logprobs (no importance weight; on-policy). Its gradient equals ppo_clip's when logprobs ==
    old_logprobs; its value does not (ppo_clip's value there is -A).

    Args:
        logprobs: [N, T] float, current policy (carries gradient).
        old_logprobs: [N, T] float, used only for the ratio stats.
        advantages: [N, T] float (treated as constant).
        mask: [N, T] bool/0-1, response tokens.
        episode: [N] int64 or None; a token-level loss does not depend on it.
    Returns:
        ([N, T] float32 per-token loss, 0 off the mask; dict of stats, clip fractions 0).
    Raises:
        ValueError: if shapes differ.
    """
    m, lp, log_ratio, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    loss = -adv * lp * m
    none = _no_clip(m)
    return loss, _stats(torch.exp(log_ratio), log_ratio, m, none, none, none)


# ----------------------------------------------------------------------------------------------------------------
# KL estimators (Schulman, 2020, "Approximating KL Divergence"); samples come from the current policy,
# d = logprobs - ref_logprobs = log(pi / pi_ref).


def _kl_inputs(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """d = clamp(logprobs - ref_logprobs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND) = clamp(d, -20, 20), [N, T]."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} != logprobs shape {tuple(logprobs.shape)}")
    return torch.clamp(logprobs - ref_logprobs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@register_kl_estimator("k1")
def kl_k1(*, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 = d, d = clamp(logprobs - ref_logprobs, -20, 20) (Schulman, 2020). Unbiased for KL(pi || pi_ref) (up to
    the clamp), high variance.

    Args: logprobs, ref_logprobs: [N, T] float. Returns: [N, T]. Raises: ValueError if shapes differ.
    """
    return _kl_inputs(logprobs, ref_logprobs)


@register_kl_estimator("k2")
def kl_k2(*, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k2 = d^2 / 2, d = clamp(logprobs - ref_logprobs, -20, 20) (Schulman, 2020). Biased, low variance, in
    [0, 200].

    Args: logprobs, ref_logprobs: [N, T] float. Returns: [N, T]. Raises: ValueError if shapes differ.
    """
    d = _kl_inputs(logprobs, ref_logprobs)
    return 0.5 * d * d


@register_kl_estimator("k3")
def kl_k3(*, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 = clamp(exp(-d) + d - 1, -10, 10), d = clamp(logprobs - ref_logprobs, -20, 20) (Schulman, 2020; the
    clamps are verl's). Unbiased for KL(pi || pi_ref) up to the clamps, in [0, 10]. The value clamp is active for
    d > ~11.0 and d < ~-2.6; there the gradient is 0.

    Args: logprobs, ref_logprobs: [N, T] float. Returns: [N, T]. Raises: ValueError if shapes differ.
    """
    d = _kl_inputs(logprobs, ref_logprobs)
    return torch.clamp(torch.expm1(-d) + d, -K3_BOUND, K3_BOUND)


# ----------------------------------------------------------------------------------------------------------------
# aggregation: l = per-token loss, m = mask, sums over t run over the T columns


def _agg_inputs(per_token_loss: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if per_token_loss.dim() != 2 or mask.shape != per_token_loss.shape:
        raise ValueError(
            f"per_token_loss must be [N, T] and match mask; got {tuple(per_token_loss.shape)} and {tuple(mask.shape)}"
        )
    m = mask.to(per_token_loss.dtype)
    return torch.where(m > 0, per_token_loss, torch.zeros_like(per_token_loss)), m


def _episodes(episode: Tensor, n: int) -> Segments:
    """The episodes of the N rows as segments. Raises ValueError if episode is not [N]."""
    if tuple(episode.shape) != (n,):
        raise ValueError(f"episode must be [N] = [{n}], got shape {tuple(episode.shape)}")
    return Segments(episode)


@register_aggregation("token-mean")
def token_mean(*, per_token_loss: Tensor, mask: Tensor, episode: Tensor | None = None) -> Tensor:
    """sum_{i,t} l*m / sum_{i,t} m: every response token weighs the same (DAPO, Yu et al., 2025).

    Args: per_token_loss [N, T] float; mask [N, T] bool/0-1; episode [N] int64 or None (not used: a token counts
    once whichever row it is in). Returns: 0-dim Tensor (0 for an empty mask).
    Raises: ValueError if shapes differ.
    """
    lm, m = _agg_inputs(per_token_loss, mask)
    return lm.sum() / m.sum().clamp(min=1)


@register_aggregation("seq-mean-token-mean")
def seq_mean_token_mean(*, per_token_loss: Tensor, mask: Tensor, episode: Tensor | None = None) -> Tensor:
    """mean_i (sum_t l*m / sum_t m): every sequence weighs the same (GRPO, Shao et al., 2024).

    Rows with an empty mask contribute 0 and still count in the mean over N. With ``episode``, i runs over the
    E episodes and the sums over t over each episode's tokens in all its rows (an episode counts once).
    Args: per_token_loss [N, T] float; mask [N, T] bool/0-1; episode [N] int64 or None. Returns: 0-dim Tensor.
    Raises: ValueError if shapes differ.
    """
    lm, m = _agg_inputs(per_token_loss, mask)
    if episode is None:
        return (lm.sum(dim=1) / m.sum(dim=1).clamp(min=1)).mean()
    episodes = _episodes(episode, lm.shape[0])
    return (episodes.sum(lm.sum(dim=1)) / episodes.sum(m.sum(dim=1)).clamp(min=1)).mean()


@register_aggregation("seq-mean-token-sum")
def seq_mean_token_sum(*, per_token_loss: Tensor, mask: Tensor, episode: Tensor | None = None) -> Tensor:
    """mean_i sum_t l*m; with ``episode``, i runs over the E episodes and t over each one's tokens in all its rows.

    Args: per_token_loss [N, T] float; mask [N, T] bool/0-1; episode [N] int64 or None. Returns: 0-dim Tensor.
    Raises: ValueError if shapes differ.
    """
    lm, _m = _agg_inputs(per_token_loss, mask)
    if episode is None:
        return lm.sum(dim=1).mean()
    return _episodes(episode, lm.shape[0]).sum(lm.sum(dim=1)).mean()


def _check_max_len(*, max_len: int | None = None) -> None:
    if max_len is not None and not max_len > 0:
        raise ValueError(f"seq-mean-token-sum-norm: max_len must be > 0, got {max_len}")


@register_aggregation("seq-mean-token-sum-norm", check=_check_max_len)
def seq_mean_token_sum_norm(*, per_token_loss: Tensor, mask: Tensor, episode: Tensor | None = None,
                            max_len: int | None = None) -> Tensor:
    """sum_{i,t} l*m / (N * max_len): a constant normalizer, free of length bias (Liu et al., 2025, Dr. GRPO).

    With ``episode``, N is the number of episodes E. The default max_len is the row width T, which depends on
    how episodes were split into rows: give max_len (the trainer does) for split-invariance.
    Args: per_token_loss [N, T] float; mask [N, T] bool/0-1; episode [N] int64 or None; max_len: int tokens > 0
    (default T). Returns: 0-dim Tensor. Raises: ValueError if shapes differ or max_len <= 0.
    """
    lm, _m = _agg_inputs(per_token_loss, mask)
    length = per_token_loss.shape[1] if max_len is None else max_len
    if not length > 0:
        raise ValueError(f"seq-mean-token-sum-norm: max_len must be > 0, got {length}")
    count = per_token_loss.shape[0] if episode is None else _episodes(episode, lm.shape[0]).segments
    return lm.sum() / (max(count, 1) * length)
