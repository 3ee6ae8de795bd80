"""Online process reward models: a reward model trained beside the policy, each step, on that step's rollouts.

Registry, looked up by `rl.online_prm` (options `rl.online_prm_options`, each declared; an unknown one is an error):

    ONLINE_PRMS[name](start, *, <options>) -> an online PRM with `provide(view) -> Provided`

`prime`, PRIME's implicit PRM (Cui et al., 2025, "Process Reinforcement through Implicit Rewards",
arXiv:2502.01456, after Yuan et al., 2024, "Free Process Rewards without Process Labels", arXiv:2412.01981):

- pi_phi, a causal LM initialized from the run's starting model (`model.path`), and pi_ref, that model frozen;
- token-level process rewards r_t = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t)) on every sampled
  token (temperature 1), so every sampled token is a step of the estimator's step_rewards (estimator `prime`,
  `process_sum` or `pure`);
- each step, before the rewards are computed (`update: before`, the double forward of verl's recipe) or after
  (`after`: the rewards come from the update's own forward), pi_phi takes one optimizer step per rl.minibatch_size
  rollouts (in order, no random draws) on the cross-entropy of the sequence-level implicit reward against the
  outcome label l_i in [0, 1]:

      L = -mean_i [ l_i log sigmoid(beta * sum_t q_{i,t}) + (1 - l_i) log(1 - sigmoid(beta * sum_t q_{i,t})) ],
      q_{i,t} = log pi_phi(y_{i,t}) - log pi_ref(y_{i,t}) over the sampled tokens of rollout i;

- with `norm: batch` (verl's prime_norm batch_norm) the rewards are divided by max_{i,t} |sum_{s>=t} r_{i,s}| +
  1e-6 over the batch.

Logged per step: prm/loss and prm/accuracy on the step's rollouts with the PRM's weights before its update (so
on rollouts it has not trained on; with several minibatches, each minibatch's rows after the steps of those before
it; accuracy: `ranking_accuracy`, how often the implicit reward orders two rollouts
of a prompt as their labels do, when some group has two different labels), prm/loss_after (the same rollouts after
the update; `update: before` only), prm/reward_mean (mean over rollouts of sum_t r_t, before `norm`), time/prm_s.

The PRM's weights are saved with each checkpoint (`online_prm/`) and its optimizer in trainer_state.pt, so a resumed
run continues it exactly. Single completions only (an environment task is refused when the run is set up).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from rewardlab.optim import make_optimizer
from rewardlab.policy import Batch, Policy, load_policy
from rewardlab.policy.batch import micro_batches
from rewardlab.registry import Registry
from rewardlab.rl.segments import reverse_discounted_sum

#: The checkpoint subdirectory that holds the online PRM's weights.
ONLINE_PRM_DIR = "online_prm"

#: name -> factory(start, **options) of an online PRM; ``meta(name)["check"](**options)`` checks option values.
ONLINE_PRMS: Registry[Callable[..., Any]] = Registry("online PRM", reserved=("start",))


@dataclass(frozen=True)
class PrmStart:
    """What an online PRM is built from (the factory's `start`).

    Attributes:
        model_path: the run's starting model (`model.path`), which the PRM and its reference copy.
        model_kw: `load_policy` keyword arguments (seed, dtype, device, autocast...; lora dropped: the PRM is a full
            model).
        reference: the run's KL reference when it is the frozen starting model (rl.beta > 0, never refreshed), which
            the PRM then shares; None: the PRM loads its own frozen copy.
        saved: the resumed checkpoint's PRM directory, else None.
        weight_decay, grad_clip: the run's AdamW weight decay and max gradient norm (rl.weight_decay, rl.grad_clip).
        minibatch_size, micro_batch_size: rollouts per PRM optimizer step (None: all of the step's) and per
            forward/backward pass (None: a minibatch at once): rl.minibatch_size and rl.micro_batch_size.
    """

    model_path: str
    model_kw: dict[str, Any]
    reference: Policy | None
    saved: Path | None
    weight_decay: float
    grad_clip: float
    minibatch_size: int | None
    micro_batch_size: int | None


def _number(value: Any) -> float | None:
    """`value` as a float: a number, or a string YAML 1.1 left unparsed such as '1e-6'; None otherwise."""
    if isinstance(value, bool):
        return None
    try:
        return float(value) if isinstance(value, (int, float, str)) else None
    except ValueError:
        return None


def check_prime_options(*, beta: float = 0.05, lr: float = 1e-6, update: str = "before", norm: str = "batch",
                        label: str = "score") -> None:
    """Check the values of `prime`'s options (their names are checked by the registry).

    Raises:
        ValueError: one line naming rl.online_prm_options and the option: beta or lr not > 0 (or not finite), an
            update other than before/after, a norm other than batch/none, an empty label.
    """
    field = "rl.online_prm_options"
    for key, value in (("beta", beta), ("lr", lr)):
        if not (_number(value) is not None and math.isfinite(_number(value)) and _number(value) > 0):
            raise ValueError(f"{field}.{key}: must be a number > 0, got {value!r}")
    if update not in ("before", "after"):
        raise ValueError(f"{field}.update: unknown value {update!r}; valid: after, before")
    if norm not in ("batch", "none"):
        raise ValueError(f"{field}.norm: unknown value {norm!r}; valid: batch, none")
    if not isinstance(label, str) or not label:
        raise ValueError(f"{field}.label: 'score' or the name of a reward component in [0, 1], got {label!r}")


def implicit_prm_loss(q: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor, beta: float) -> torch.Tensor:
    """PRIME's cross-entropy of each rollout's sequence-level implicit reward against its outcome label:
    -(l log sigmoid(z) + (1 - l) log(1 - sigmoid(z))), z = beta * sum_t q_t * sampled_t.

    Args:
        q: [N, T] float32 log pi_phi - log pi_ref per token. labels: [N] float in [0, 1]. sampled: [N, T] 0/1.
        beta: the implicit reward's scale.
    Returns:
        [N] float32 per-rollout losses (differentiable through q).
    """
    z = beta * (q * sampled).sum(dim=1)
    return F.binary_cross_entropy_with_logits(z, labels.to(z.dtype), reduction="none")


def ranking_accuracy(z: torch.Tensor, labels: torch.Tensor, group: torch.Tensor) -> float | None:
    """How often the implicit reward orders two rollouts of a prompt as their labels do: over the pairs (i, j) of a
    group with l_i > l_j, weighted by l_i - l_j, 1 when z_i > z_j, 1/2 on a tie, 0 otherwise (verl's PRIME recipe
    logs the same pairwise accuracy). None when no group has two different labels.

    Args:
        z: [N] float implicit rewards beta * sum_t q_t. labels: [N] float. group: [N] int64 prompt groups.
    """
    z, labels, group = z.double().cpu(), labels.double().cpu(), group.cpu()
    weight = (labels[:, None] - labels[None, :]).clamp(min=0) * (group[:, None] == group[None, :])
    total = float(weight.sum())
    if total == 0:
        return None
    right = (z[:, None] > z[None, :]).double() + 0.5 * (z[:, None] == z[None, :]).double()
    return float((weight * right).sum()) / total


def normalized_rewards(r: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """verl's prime_norm batch_norm: r / (max_{i,t} |sum_{s>=t} r_{i,s}| + 1e-6) over the batch, [N, T] -> [N, T]."""
    if not r.numel():
        return r
    to_go = reverse_discounted_sum(r, sampled.to(r.dtype), 1.0)
    return r / (to_go.abs().max() + 1e-6)


class ImplicitPRM:
    """PRIME's implicit PRM (see the module doc): `provide(view)` updates it on the step's rollouts and returns the
    estimator's step_rewards/step_mask, [N, T] float32 each, with its metrics.

    Args:
        model: pi_phi, trained. reference: pi_ref, frozen (never modified here).
        beta, lr, update, norm, label: the options (`check_prime_options`).
        start: what it was built from (`PrmStart`): the weight decay, gradient clip, minibatch and micro-batch sizes
            its update uses.
    """

    def __init__(self, model: Policy, reference: Policy, *, beta: float, lr: float, update: str, norm: str,
                 label: str, start: PrmStart) -> None:
        self.model, self.reference = model, reference
        self.beta, self.update_when, self.norm, self.label = float(beta), update, norm, label
        self.start = start
        self.optimizer = make_optimizer(model.model, lr, start.weight_decay)
        model.model.train()

    # ------------------------------------------------------------------------------------------------ pieces
    def labels(self, outputs: list[Any]) -> torch.Tensor:
        """The outcome label of each row's reward output: its score, or its component named by `label`, [N] float32.

        Raises:
            ValueError: a label outside [0, 1] or not finite, or a component the output does not have (one line
                naming rl.online_prm_options.label).
        """
        values = []
        for o in outputs:
            if self.label == "score":
                v = o.score
            elif self.label in o.components:
                v = o.components[self.label]
            else:
                raise ValueError(f"rl.online_prm_options.label: the reward output has no component {self.label!r} "
                                 f"(its components: {', '.join(sorted(o.components)) or 'none'})")
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ValueError(f"rl.online_prm_options.label: prime's cross-entropy needs outcome labels in [0, 1], "
                                 f"got {v!r} ({self.label}); name a 0/1 reward component instead, e.g. label: correct")
            values.append(float(v))
        return torch.tensor(values, dtype=torch.float32)

    def log_ratio(self, batch: Batch, ref_logprobs: torch.Tensor) -> torch.Tensor:
        """q = log pi_phi - log pi_ref on `batch`'s completion tokens, [n, T] float32, differentiable in pi_phi."""
        logprobs, _ = self.model.token_logprobs(batch)
        return (logprobs - ref_logprobs) * batch.mask

    @torch.no_grad()
    def scored_log_ratio(self, batch: Batch, ref_logprobs: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """`log_ratio` without gradient in eval mode (no dropout), rl.micro_batch_size rows at a time, [N, T]
        float32."""
        self.model.model.eval()
        try:
            return self.model.scored_logprobs(batch, micro_batch_size=self.start.micro_batch_size,
                                              group=group) - ref_logprobs
        finally:
            self.model.model.train()

    def train_step(self, batch: Batch, ref_logprobs: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor,
                   group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over the rows in order: an optimizer step per rl.minibatch_size rows on the mean of their
        `implicit_prm_loss`, its gradient accumulated over micro-batches of rl.micro_batch_size rows, the gradient
        norm clipped to rl.grad_clip.

        Returns:
            (q, losses): the log-ratios [N, T] and per-row losses [N] of each row's forward pass in this update
            (detached; a later minibatch's rows see the earlier minibatches' steps).
        """
        N = labels.shape[0]
        q_all = torch.zeros_like(sampled)
        losses = torch.zeros(N, dtype=torch.float32, device=sampled.device)
        size = self.start.minibatch_size or max(N, 1)
        for first in range(0, N, size):
            idx = torch.arange(first, min(first + size, N))
            self.optimizer.zero_grad(set_to_none=True)
            for part in micro_batches(group[idx], self.start.micro_batch_size):
                rows = idx[part].to(sampled.device)
                q = self.log_ratio(batch.select(rows), ref_logprobs[rows])
                loss = implicit_prm_loss(q, labels[rows], sampled[rows], self.beta)
                (loss.sum() / len(idx)).backward()
                q_all[rows] = q.detach()
                losses[rows] = loss.detach().float().to(losses.device)
            torch.nn.utils.clip_grad_norm_(self.model.model.parameters(), self.start.grad_clip)
            self.optimizer.step()
        return q_all, losses

    # ------------------------------------------------------------------------------------------------ the step
    def provide(self, view: Any) -> Any:
        """Update the PRM on the step's rows (`view`: `rl.credit.CreditView`) and return `Provided` with
        step_rewards = r (normalized with `norm: batch`) and step_mask = the sampled tokens, [N, T] float32 each,
        and the metrics of the module doc."""
        from rewardlab.rl.credit import Provided

        t0 = time.perf_counter()
        sampled = view.sampled
        group = torch.tensor([r.group for r in view.rows], dtype=torch.long)
        labels = self.labels(view.outputs).to(sampled.device)
        ref = self.reference.scored_logprobs(view.packed, micro_batch_size=self.start.micro_batch_size, group=group)
        q_before, losses = self.train_step(view.packed, ref, labels, sampled, group)
        metrics = {"prm/loss": float(losses.mean()) if len(losses) else 0.0}
        accuracy = ranking_accuracy(self.beta * (q_before * sampled).sum(dim=1), labels, group)
        if accuracy is not None:
            metrics["prm/accuracy"] = accuracy
        if self.update_when == "before":
            q = self.scored_log_ratio(view.packed, ref, group)
            metrics["prm/loss_after"] = float(implicit_prm_loss(q, labels.to(q.device), sampled, self.beta).mean())
        else:
            q = q_before
        r = self.beta * q * sampled
        metrics["prm/reward_mean"] = float(r.sum(dim=1).mean()) if r.numel() else 0.0
        if self.norm == "batch":
            r = normalized_rewards(r, sampled)
        metrics["time/prm_s"] = time.perf_counter() - t0
        return Provided({"step_rewards": r * sampled, "step_mask": sampled.clone()}, metrics=metrics)

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (the weights are saved by `save`)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def save(self, path: str | Path) -> None:
        """Write pi_phi's weights to `path` (a model directory `load_policy` reads)."""
        self.model.save(path)


@ONLINE_PRMS.register("prime", check=check_prime_options)
def prime(start: PrmStart, *, beta: float = 0.05, lr: float = 1e-6, update: str = "before", norm: str = "batch",
          label: str = "score") -> ImplicitPRM:
    """PRIME's implicit PRM (Cui et al., 2025, arXiv:2502.01456; see the module doc).

    Args:
        start: what it is built from (`PrmStart`).
        beta: the implicit reward's scale (the paper's and verl's beta_train 0.05).
        lr: its AdamW learning rate (the paper's 1e-6).
        update: "before" (update, then score the rollouts: verl's default) or "after" (score with the update's
            own forward pass).
        norm: "batch" (verl's prime_norm batch_norm) or "none".
        label: the outcome label: "score" (the reward's score) or a reward component's name; must be in [0, 1].
    Returns:
        the `ImplicitPRM`, pi_phi loaded from `start.saved` on a resume, else from the starting model.
    Raises:
        ValueError: an option value `check_prime_options` refuses.
    """
    check_prime_options(beta=beta, lr=lr, update=update, norm=norm, label=label)
    kw = {**start.model_kw, "lora": None}
    model = load_policy(str(start.saved) if start.saved is not None else start.model_path, **kw)
    reference = start.reference
    if reference is None:
        reference = load_policy(start.model_path, **kw)
        reference.model.eval().requires_grad_(False)
    return ImplicitPRM(model, reference, beta=float(beta), lr=float(lr), update=update, norm=norm, label=label,
                       start=start)


def check_online_prm(rl: Any) -> None:
    """rl.online_prm's options (rl.online_prm_options) are declared and valid (its name is checked with the other
    named parts, `rl.specs.check_names`; an unknown one still raises here, from the registry).

    Raises:
        ValueError: one line naming the key.
    """
    if rl.online_prm is None:
        if rl.online_prm_options:
            raise ValueError(f"rl.online_prm_options: {sorted(rl.online_prm_options)} given without rl.online_prm")
        return
    ONLINE_PRMS.check(rl.online_prm, rl.online_prm_options, field="rl.online_prm_options")
    ONLINE_PRMS.meta(rl.online_prm)["check"](**rl.online_prm_options)


def make_online_prm(cfg: Any, reference: Policy | None, latest: tuple[int, Path] | None) -> Any:
    """The run's online PRM (rl.online_prm), else None: built from the starting model, or from the resumed
    checkpoint's `online_prm/` directory. It shares the run's reference when that is the frozen starting model."""
    rl = cfg.rl
    if rl.online_prm is None:
        return None
    shared = reference if reference is not None and rl.ref_refresh_every is None else None
    start = PrmStart(cfg.model.path, {"seed": cfg.seed, **cfg.model.policy_options()}, shared,
                     latest[1] / ONLINE_PRM_DIR if latest is not None else None, rl.weight_decay, rl.grad_clip,
                     rl.minibatch_size, rl.micro_batch_size)
    return ONLINE_PRMS[rl.online_prm](start, **rl.online_prm_options)
