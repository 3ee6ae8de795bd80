"""Packing rollouts as tensors (`Batch`, `collate`, `rollout_batch`) and marking reasoning steps on token spans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rewardlab.types import Rollout, split_steps


@dataclass
class Batch:
    """Rollouts packed as tensors: `[left-padded prompt | right-padded completion]`.

    Attributes:
        input_ids: [N, P + T] int64.
        attention_mask: [N, P + T] int64, 1 on real tokens.
        position_ids: [N, P + T] int64, positions counted from each row's first real token.
        completion_ids: [N, T] int64, the completion part of `input_ids` (pad after the end).
        mask: [N, T] float32, 1 on completion tokens (end-of-sequence token included).
        prompt_len: P, the padded prompt length.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    mask: torch.Tensor
    prompt_len: int

    def select(self, idx: torch.Tensor) -> Batch:
        """The rows `idx` ([M] int64) of this batch."""
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.position_ids[idx],
            self.completion_ids[idx],
            self.mask[idx],
            self.prompt_len,
        )


def collate(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], *, pad_id: int,
            device: torch.device | str = "cpu") -> Batch:
    """Pack prompts (left-padded) and completions (right-padded with `pad_id`) into a `Batch` on `device`."""
    n = len(prompt_ids)
    pad = pad_id
    P = max(len(p) for p in prompt_ids)
    T = max(1, max(len(c) for c in completion_ids))
    rows = [[pad] * (P - len(p)) + list(p) + list(c) + [pad] * (T - len(c))
            for p, c in zip(prompt_ids, completion_ids)]
    input_ids = torch.tensor(rows, dtype=torch.long).view(n, P + T)  # one tensor call, not 2 per row
    spans = torch.tensor([[P - len(p), P + len(c)] for p, c in zip(prompt_ids, completion_ids)]).view(n, 2)
    cols = torch.arange(P + T)
    attention = ((cols >= spans[:, :1]) & (cols < spans[:, 1:])).long()
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    dev = device
    return Batch(
        input_ids.to(dev),
        attention.to(dev),
        position_ids.to(dev),
        input_ids[:, P:].to(dev),
        attention[:, P:].float().to(dev),
        P,
    )


def mark_steps(tokenizer: Any, rollout: Rollout, separator: str = "\n") -> Rollout:
    """Fill `rollout.steps` (token spans) and `rollout.step_text` from `split_steps(completion, separator)`.

    A step's token span runs to the first token whose decoded prefix covers the step's last character; the last
    step also takes any trailing special tokens (EOS), so the spans tile `completion_ids`. Cost: one decode per
    completion token (O(T^2) characters), fine for the completion lengths used on a CPU.
    """
    text = rollout.completion
    spans = split_steps(text, separator)
    ids = rollout.completion_ids
    ends = [len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(1, len(ids) + 1)]
    steps, step_text, start = [], [], 0
    for j, (a, b) in enumerate(spans):
        stop = next((k + 1 for k in range(start, len(ids)) if ends[k] >= b), len(ids))
        if j == len(spans) - 1:
            stop = len(ids)
        if stop > start:
            steps.append((start, stop))
            step_text.append(text[a:b])
        elif step_text:  # a step that shares its token with the previous one joins it
            step_text[-1] += text[a:b]
        start = stop
    rollout.steps, rollout.step_text = steps, step_text
    return rollout


def rollout_batch(policy: Any, rollouts: Sequence[Rollout]) -> tuple[Batch, torch.Tensor]:
    """Pack rollouts into a `Batch` and their behaviour log-probs into [N, T] float32 (0 past each end)."""
    batch = policy.collate([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts])
    T = batch.mask.shape[1]
    old = torch.tensor([list(r.logprobs) + [0.0] * (T - len(r.logprobs)) for r in rollouts], dtype=torch.float32)
    return batch, old.view(len(rollouts), T).to(batch.mask.device)
