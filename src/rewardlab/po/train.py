"""Preference optimization of a policy (`rewardlab po`): preference pairs as token ids, their summed log-probs under
the policy and the reference, and the loss of a batch of pairs (`rewardlab.po.losses.preference_loss`).

Offline (`train_offline`), the pairs of a file are encoded once, the reference's summed log-probs of every pair are
computed once before the first step and cached in the run directory (ref_logps.pt, TRL's precompute_ref_log_probs;
a resume reads them back), and `rewardlab.rm.fit.fit` runs the epochs: shuffled batches, micro-batches, AdamW,
checkpoints that resume exactly. Online and semi-online DPO are `rewardlab.po.online`.

Logged each step (metrics.jsonl), under the names TRL's DPOTrainer logs: `rewards/chosen`, `rewards/rejected`
(the loss's implicit rewards, e.g. DPO's beta * (log pi(y) - log pi_ref(y))), `rewards/margins`,
`rewards/accuracies` (fraction of pairs whose chosen reward is the higher), `logps/chosen`, `logps/rejected` (mean
summed log-probs under the policy, nats), `train/loss`, `lr`, `time/step_s`; with evaluation, `eval/accuracy` and
`eval/score_mean` (greedy, held-out rows of the task) and `eval/rewards/...` on the held-out pairs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rewardlab.po.data import PreferenceRow
from rewardlab.po.losses import PREFERENCE_LOSSES, REFERENCE_FREE, preference_loss
from rewardlab.policy import Policy
from rewardlab.runs import RunDir, atomic_write

__all__ = ["EncodedPair", "LossSpec", "OfflineData", "cached_reference_logps", "encode_pairs", "loss_spec",
           "mean_stats", "pair_loss", "pairs_digest", "pairs_metrics", "reference_logps", "summed_logps",
           "train_offline"]

#: The reference log-probs cache of an offline run, in its run directory.
REF_CACHE = "ref_logps.pt"


@dataclasses.dataclass(frozen=True)
class EncodedPair:
    """One preference pair as the token ids the policy is trained on: the formatted prompt's ids, and each response's
    ids ending with EOS. `where` names it in errors (FILE:LINE, or the online step and prompt)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    where: str = ""


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """The configured preference loss: its names (one, or a mix) and the options passed to `preference_loss`
    (beta when set, loss_weights, the loss_options); `reference`: whether any of them reads reference log-probs."""

    names: tuple[str, ...]
    options: dict[str, Any]

    @property
    def reference(self) -> bool:
        return any(n not in REFERENCE_FREE for n in self.names)


def loss_spec(p: Any) -> LossSpec:
    """The `LossSpec` of a `po` section (`rewardlab.config.POParams`), checked by a dry run on one pair before anything
    loads.

    Raises:
        ValueError: one line naming po.loss_type (an unknown loss), po.loss_weights (another count than the losses)
            or po.loss_options / po.beta (an undeclared option, a value a loss refuses).
    """
    names = (p.loss_type,) if isinstance(p.loss_type, str) else tuple(p.loss_type)
    for name in names:
        if name not in PREFERENCE_LOSSES:
            raise ValueError(f"po.loss_type: unknown preference loss {name!r}; valid: "
                             f"{', '.join(sorted(PREFERENCE_LOSSES))}")
    options = dict(p.loss_options)
    for key in ("beta", "loss_weights"):
        if key in options:
            raise ValueError(f"po.loss_options: {key!r} is its own key; set po.{key}")
    if p.beta is not None:
        options["beta"] = p.beta
    if p.loss_weights is not None:
        options["loss_weights"] = list(p.loss_weights)
    spec = LossSpec(names, options)
    one = torch.zeros(1)
    try:
        preference_loss(list(names), chosen_logps=one - 1, rejected_logps=one - 2, ref_chosen_logps=one - 1,
                        ref_rejected_logps=one - 1, chosen_lengths=one + 1, rejected_lengths=one + 1, **options)
    except ValueError as exc:
        text = str(exc)
        key = "po.loss_weights" if text.startswith("loss_weights") else (
            "po.beta" if "beta" in text and "unknown option" not in text else "po.loss_options")
        raise ValueError(f"{key}: {text}") from None
    return spec


def _response_ids(policy: Policy, response: Any, where: str, field: str) -> list[int]:
    """A response's ids + EOS: its text, or the content of its one assistant message."""
    if not isinstance(response, str):
        if len(response) != 1 or response[0]["role"] != "assistant":
            raise ValueError(f"{where}: field '{field}' must be one assistant message (multi-turn responses are not "
                             f"trained by po), got roles {[m['role'] for m in response]}")
        response = response[0]["content"]
    return policy.encode_target(response)


def encode_pairs(policy: Policy, rows: Sequence[PreferenceRow]) -> list[EncodedPair]:
    """The rows as token ids: the prompt formatted as the policy formats task prompts (`Policy.format_prompt`; a
    conversational prompt through the chat template, its last message the user's), each response + EOS
    (`Policy.encode_target`). Text responses are tokenized here: a pairs file holds text, not the ids a sampler
    drew (an online run trains on the sampled ids themselves).

    Raises:
        ValueError: one line naming the row's FILE:LINE: a conversational prompt whose last message is not the user's,
            a response that is not one assistant message, or a prompt + response longer than the model's context
            window.
    """
    out = []
    window = policy.context_window
    for r in rows:
        if isinstance(r.prompt, str):
            text = policy.format_prompt(r.prompt)
        else:
            if not r.prompt or r.prompt[-1]["role"] != "user":
                raise ValueError(f"{r.where}: field 'prompt' must end with the user's message")
            text = policy.format_prompt(r.prompt[-1]["content"], r.prompt)
        prompt = policy.encode_prompt(text)
        chosen = _response_ids(policy, r.chosen, r.where, "chosen")
        rejected = _response_ids(policy, r.rejected, r.where, "rejected")
        longest = len(prompt) + max(len(chosen), len(rejected))
        if window is not None and longest > window:
            raise ValueError(f"{r.where}: {len(prompt)} prompt + {longest - len(prompt)} response tokens do not fit "
                             f"the model's context window of {window} tokens")
        out.append(EncodedPair(prompt, chosen, rejected, r.where))
    return out


def summed_logps(policy: Policy, pairs: Sequence[EncodedPair]) -> tuple[Tensor, Tensor]:
    """(chosen, rejected): [B] float32 summed log-probs (nats) of each pair's responses under `policy`, with
    gradient; both responses of the B pairs run as one batch of 2B rows."""
    B = len(pairs)
    batch = policy.collate([p.prompt_ids for p in pairs] * 2, [p.chosen_ids for p in pairs] +
                           [p.rejected_ids for p in pairs])
    logprobs, _ = policy.token_logprobs(batch)
    sums = logprobs.sum(dim=-1)
    return sums[:B], sums[B:]


@torch.no_grad()
def reference_logps(reference: Policy, pairs: Sequence[EncodedPair], micro_batch_size: int | None = None) -> Tensor:
    """[N, 2] float32 summed log-probs of each pair's (chosen, rejected) response under `reference`, without
    gradient, `micro_batch_size` pairs per forward pass (None: all at once)."""
    size = micro_batch_size or max(len(pairs), 1)
    out = torch.zeros(len(pairs), 2)
    for a in range(0, len(pairs), size):
        c, r = summed_logps(reference, pairs[a:a + size])
        out[a:a + size, 0], out[a:a + size, 1] = c.float().cpu(), r.float().cpu()
    return out


def pair_loss(policy: Policy, pairs: Sequence[EncodedPair], ref: Tensor | None,
              spec: LossSpec) -> tuple[Tensor, dict[str, float]]:
    """The mean preference loss of `pairs` (scalar, with gradient) and its stats (`preference_loss`'s: rewards/...,
    logps/..., loss).

    Args:
        ref: [len(pairs), 2] reference log-probs (`reference_logps`), or None for a reference-free loss.
    """
    chosen, rejected = summed_logps(policy, pairs)
    device = chosen.device
    refs = {} if ref is None else {"ref_chosen_logps": ref[:, 0].to(device), "ref_rejected_logps": ref[:, 1].to(device)}
    lengths = {"chosen_lengths": torch.tensor([len(p.chosen_ids) for p in pairs], device=device),
               "rejected_lengths": torch.tensor([len(p.rejected_ids) for p in pairs], device=device)}
    losses, stats = preference_loss(list(spec.names), chosen_logps=chosen, rejected_logps=rejected, **refs, **lengths,
                                    **spec.options)
    return losses.mean(), stats


def mean_stats(records: Sequence[tuple[int, dict[str, float]]], prefix: str = "") -> dict[str, float]:
    """The pair-weighted means of micro-batches' stats: records are (pairs, stats); the `loss` entry is left out
    (the step logs its own train/loss)."""
    total = sum(n for n, _ in records) or 1
    keys = [k for k in records[0][1] if k != "loss"] if records else []
    return {prefix + k: sum(n * s[k] for n, s in records if k in s) / total for k in keys}


def pairs_digest(pairs: Sequence[EncodedPair]) -> str:
    """sha256 of the pairs' token ids: what the reference log-probs cache was computed for."""
    text = json.dumps([[p.prompt_ids, p.chosen_ids, p.rejected_ids] for p in pairs])
    return hashlib.sha256(text.encode()).hexdigest()


def cached_reference_logps(run: RunDir, name: str, compute: Callable[[], Tensor], digest: str) -> Tensor:
    """The reference log-probs saved in the run directory under `name` for pairs with `digest`, or (none saved, or
    saved for other pairs) `compute()`, then saved there atomically."""
    path = run.path / name
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if isinstance(saved, dict) and saved.get("digest") == digest:
            return saved["logps"]
    logps = compute()
    atomic_write(path, lambda tmp: torch.save({"digest": digest, "logps": logps}, tmp))
    return logps


@dataclasses.dataclass(frozen=True)
class OfflineData:
    """What an offline run trains on: the encoded training pairs and their reference log-probs (None for a
    reference-free loss), the held-out pairs likewise (empty: none), and the held-out greedy evaluation (a
    `HeldOutEval`, or None)."""

    pairs: list[EncodedPair]
    ref: Tensor | None
    eval_pairs: list[EncodedPair]
    eval_ref: Tensor | None
    heldout: Any = None


def pairs_metrics(policy: Policy, pairs: Sequence[EncodedPair], ref: Tensor | None, spec: LossSpec,
                  micro_batch_size: int | None, prefix: str) -> dict[str, float]:
    """The loss's stats on `pairs` (no gradient), pair-weighted over micro-batches, keys prefixed (`eval/`), with
    `{prefix}loss`."""
    size = micro_batch_size or max(len(pairs), 1)
    records, losses = [], 0.0
    with torch.no_grad():
        for a in range(0, len(pairs), size):
            part = pairs[a:a + size]
            loss, stats = pair_loss(policy, part, None if ref is None else ref[a:a + size], spec)
            records.append((len(part), stats))
            losses += float(loss) * len(part)
    return {f"{prefix}loss": losses / max(len(pairs), 1), **mean_stats(records, prefix)}


def train_offline(cfg: Any, policy: Policy, data: OfflineData, spec: LossSpec, run: RunDir, *,
                  start: tuple[int, Path | None, Any], show_progress: bool = True) -> dict[str, Any]:
    """Train `policy` on `data.pairs` for cfg.po.epochs (`rewardlab.rm.fit.fit`: shuffled batches of
    cfg.po.batch_size pairs, micro-batches of cfg.po.micro_batch_size, the step's loss the mean over its pairs),
    logging the TRL metrics (module doc), evaluating every cfg.po.eval_every steps and at the last, checkpointing
    every cfg.save_every steps (the policy in HF format + trainer_state.pt).

    Args:
        start: (the step resumed from, its checkpoint or None, the row-order `random.Random`), from
            `rewardlab.rm.fit.open_fit_run`.
    Returns:
        the summary: steps, pairs, wall seconds, final train and eval metrics, final_checkpoint, resumed_from.
    """
    from rewardlab.rm.fit import FitCheckpoints, FitObjective, fit

    p = cfg.po
    start_step, checkpoint, rng = start

    def batch_loss(idx: Sequence[int]) -> tuple[Tensor, tuple[int, dict[str, float]]]:
        ref = None if data.ref is None else data.ref[list(idx)]
        loss, stats = pair_loss(policy, [data.pairs[i] for i in idx], ref, spec)
        return loss, (len(idx), stats)

    def evaluate() -> dict[str, float]:
        out = data.heldout(policy) if data.heldout is not None else {}
        if data.eval_pairs:
            out.update(pairs_metrics(policy, data.eval_pairs, data.eval_ref, spec, p.micro_batch_size, "eval/"))
        return out

    wall0 = time.perf_counter()
    paired = any(n not in ("kto", "sft") for n in spec.names)  # a loss whose rewards pair up gives accuracies
    objective = FitObjective(batch_loss, mean_stats, progress_key="rewards/accuracies" if paired else "logps/chosen",
                             evaluate=evaluate if p.eval_every else None)
    checkpoints = FitCheckpoints(run, policy.save, save_every=cfg.save_every, keep=cfg.keep_checkpoints,
                                 resume_from=checkpoint)
    policy.model.train()
    step, last, last_eval, final = fit(policy.model, p, len(data.pairs), objective, checkpoints, rng=rng,
                                       name="PO", show_progress=show_progress)
    run.plot(["train/loss", "rewards/accuracies", "rewards/margins", "eval/accuracy"], "po.png")
    return {"stage": "po", "mode": "offline", "loss_type": list(spec.names), "steps": step,
            "train_pairs": len(data.pairs), "eval_pairs": len(data.eval_pairs), "wall_s": time.perf_counter() - wall0,
            "final_train": {k: v for k, v in last.items() if not k.startswith("eval/")}, "final_eval": last_eval,
            "final_checkpoint": str(final), "resumed_from": start_step if checkpoint is not None else None}

