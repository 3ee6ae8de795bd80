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

    def trim(self) -> Batch:
        """The same rows without the prompt columns that are padding in every row and the completion columns past
        every row's end: the same tokens, positions and mask entries in a narrower tensor (positions are counted
        from each row's first real token, so they do not move). At least one completion column is kept."""
        P, T = self.prompt_len, self.completion_ids.shape[1]
        used = self.attention_mask.sum(0) > 0  # [P + T]
        lead = int((~used[:P]).long().cumprod(0).sum())
        ends = used[P:].nonzero()
        width = int(ends.max()) + 1 if ends.numel() else 1
        if lead == 0 and width == T:
            return self
        cols = slice(lead, P + width)
        return Batch(self.input_ids[:, cols], self.attention_mask[:, cols], self.position_ids[:, cols],
                     self.completion_ids[:, :width], self.mask[:, :width], P - lead)


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


def micro_batches(group: torch.Tensor, size: int | None, episode: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Positions 0..n-1 of `n` rows cut into micro-batches of at most `size` whole episodes (gradient accumulation
    and the no-grad scoring passes), with no random draws.

    Episodes are ordered by prompt group (stable: then by their first row), so a micro-batch holds the rollouts of
    one prompt together and the shared-prefix scorer (`Policy.completion_features`) runs their prompt once; an
    episode's rows stay in their order and are never split between micro-batches.

    Args:
        group: [n] int64 prompt-group id of each row.
        size: episodes per micro-batch (the last may have fewer); None: one micro-batch of every row, in the given
            order.
        episode: [n] int64 episode id of each row, or None (each row its own episode).
    Returns:
        list of 1-D int64 tensors of positions; every position appears in exactly one.
    Raises:
        ValueError: `size` < 1, or `episode` not of group's shape.
    """
    n = int(group.shape[0])
    if size is None:
        return [torch.arange(n)]
    if size < 1:
        raise ValueError(f"micro_batch_size: must be >= 1, got {size}")
    if episode is not None and episode.shape != group.shape:
        raise ValueError(f"micro_batches: episode shape {tuple(episode.shape)} != group shape {tuple(group.shape)}")
    if n == 0:
        return []
    group, rows = group.cpu(), torch.arange(n)
    inverse = torch.unique(episode.cpu(), return_inverse=True)[1] if episode is not None else rows
    E = int(inverse.max()) + 1
    first = torch.full((E,), n, dtype=torch.long).scatter_reduce(0, inverse, rows, reduce="amin")
    by_first = torch.argsort(first, stable=True)
    order = by_first[torch.argsort(group[first][by_first], stable=True)]  # episodes by (group, first row)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(E)
    return episode_chunks(inverse, rank, size)


def episode_chunks(inverse: torch.Tensor, rank: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Row positions in the order of their episode's rank (an episode's rows in their order), cut into chunks of
    `size` whole episodes: what micro-batches (`micro_batches`) and minibatches (`rl.episodes.episode_minibatches`)
    are made of.

    Args:
        inverse: [n] int64, each row's episode index in 0..E-1.
        rank: [E] int64, a permutation of 0..E-1: the position of each episode in the order wanted.
        size: episodes per chunk, >= 1 (the last chunk may have fewer).
    Returns:
        list of 1-D int64 tensors of row positions; every row appears in exactly one; no empty chunk.
    """
    n, e = int(inverse.shape[0]), int(rank.shape[0])
    rows = torch.arange(n)
    ordered = rows[torch.argsort(rank[inverse] * max(n, 1) + rows)]
    counts = torch.bincount(rank[inverse][ordered] // size, minlength=(e + size - 1) // size if e else 0)
    return [part for part in ordered.split(counts.tolist()) if part.numel()]
