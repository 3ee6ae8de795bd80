"""A value model (PPO critic) for estimators that need per-token values, such as `gae`.

The critic is the policy's architecture with a scalar token-classification head (transformers'
`AutoModelForTokenClassification`, one label), its backbone initialized from the policy's weights and its head from
scratch, trained by a clipped squared error to the GAE returns (Schulman et al. 2017, PPO).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForTokenClassification

from rewardlab.optim import make_optimizer
from rewardlab.policy.batch import Batch, micro_batches
from rewardlab.policy.hf import Policy
from rewardlab.policy.lora import base_state_dict
from rewardlab.rl.episodes import episode_advantages

CRITIC_DIR = "critic"


class ValueModel:
    """V(s_t): the expected return from the state before completion token t.

    Args:
        policy: the policy whose architecture and backbone weights the critic starts from (a LoRA policy's base
            weights: the critic itself is a full model, trained fully).
        lr: AdamW learning rate of the critic.
        value_clip: PPO value clipping range c (None: no clipping).
        path: load a saved critic from this directory instead (for resume).
    """

    def __init__(self, policy: Policy, *, lr: float, value_clip: float | None = 0.2, weight_decay: float = 0.0,
                 path: str | Path | None = None) -> None:
        if path is not None:
            self.model = AutoModelForTokenClassification.from_pretrained(path)
        else:
            config = copy.deepcopy(policy.model.config)
            config.num_labels = 1
            self.model = AutoModelForTokenClassification.from_config(config)
            # The backbone shares the causal LM's parameter names (e.g. `model.layers.0...`); the LM head is unused.
            # A LoRA policy's weights are its base's (a fresh adapter adds B A = 0), under the plain names.
            weights = base_state_dict(policy.model) if policy.has_adapter else policy.model.state_dict()
            missing, _ = self.model.load_state_dict(weights, strict=False)
            unloaded = [k for k in missing if not k.startswith(("score.", "classifier."))]
            if unloaded:  # the backbone must come from the policy, never stay random
                raise RuntimeError(f"critic: the policy's weights do not fit the value model's backbone (missing "
                                   f"{unloaded[0]})")
            head = getattr(self.model, "score", None) or getattr(self.model, "classifier", None)
            if head is not None:  # V = 0 everywhere at the start
                torch.nn.init.zeros_(head.weight)
        self.model.to(policy.device).train()
        self.value_clip = value_clip
        self.optimizer = make_optimizer(self.model, lr, weight_decay)

    @torch.no_grad()
    def scored_values(self, batch: Batch, *, micro_batch_size: int | None = None,
                      group: torch.Tensor | None = None) -> torch.Tensor:
        """`values` without gradient, `micro_batch_size` rows at a time (rows of a prompt `group` together), [N, T]
        float32."""
        N = batch.input_ids.shape[0]
        key = group if group is not None else torch.zeros(N, dtype=torch.long)
        out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
        for part in micro_batches(key, micro_batch_size):
            rows = part.to(batch.mask.device)
            out[rows] = self.values(batch.select(rows))
        return out

    def values(self, batch: Batch) -> torch.Tensor:
        """Values of the completion positions: [N, T] float32, V[i, t] read at the position that predicts token t
        (the last prompt token for t = 0), 0 where `batch.mask` is 0."""
        out = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids)
        T = batch.completion_ids.shape[1]
        v = out.logits[:, batch.prompt_len - 1 : batch.prompt_len - 1 + T, 0].float()
        return v * batch.mask

    def returns(self, token_rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, values: torch.Tensor,
                *, episode: torch.Tensor | None = None, order: torch.Tensor | None = None,
                **gae_options) -> torch.Tensor:
        """GAE returns R_t = A_t + V_t with unwhitened advantages (the critic's regression target), [N, T].

        With ``episode`` (and ``order``) [N] int64, an episode split into several rows, or with environment tokens
        (mask 0) between its turns, is one sequence: A_t bootstraps across them (`rl.episodes.episode_advantages`).
        """
        options = {**gae_options, "whiten": False}
        adv = episode_advantages("gae", token_rewards=token_rewards, mask=mask, group=group, episode=episode,
                                 order=order, values=values, **options)
        return (adv + values) * mask

    def update(self, batch: Batch, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
               grad_clip: float, *, micro_batches: list[torch.Tensor] | None = None) -> dict[str, float]:
        """One optimizer step on L = 0.5 * masked mean of max((V - R)^2, (V_clip - R)^2), with
        V_clip = V_old + clip(V - V_old, -c, c), the mean over all of `batch`'s masked tokens; its gradient is
        accumulated over `micro_batches` (row positions of `batch`; None: one pass), each adding its tokens' share.
        Returns `value/loss`, `value/clip_frac`, `value/mean`."""
        denom = mask.sum().clamp(min=1)
        sums = torch.zeros(3, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        for part in micro_batches if micro_batches is not None else [torch.arange(mask.shape[0])]:
            part = part.to(mask.device)
            m, r, v_old = mask[part], returns[part], old_values[part]
            v = self.values(batch.select(part))
            err = (v - r) ** 2
            if self.value_clip is not None:
                v_clip = v_old + (v - v_old).clamp(-self.value_clip, self.value_clip)
                err_clip = (v_clip - r) ** 2
                clipped = (err_clip > err).float()
                err = torch.maximum(err, err_clip)
            else:
                clipped = torch.zeros_like(err)
            loss = 0.5 * (err * m).sum() / denom
            loss.backward()
            sums += torch.tensor([loss.item(), float((clipped * m).sum()), float((v.detach() * m).sum())],
                                 dtype=torch.float64)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), grad_clip)
        self.optimizer.step()
        d = float(denom)
        return {"value/loss": float(sums[0]), "value/clip_frac": float(sums[1]) / d, "value/mean": float(sums[2]) / d}

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(path)
