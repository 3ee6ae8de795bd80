"""Sampling with behaviour log-probs and shared-prefix scoring: the prefix-tree sampler, the fallback through
transformers' `generate`, nucleus filtering, and completion logits with each distinct prompt run once.

`rewardlab.policy.hf.Policy` chooses between the shared-prefix and the plain paths; these functions take the model
(and tokenizer) they run.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer

from rewardlab.policy.batch import Batch


class _BehaviourLogprobs(LogitsProcessor):
    """Records log softmax(scores / temperature) of each sampled token during `generate`, one step behind.

    At step t the token sampled at step t-1 is the last column of `input_ids`, so only one step of [B, V]
    log-probs is kept (memory O(B V), not O(B T V) as with `output_logits`).
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, tokens[:, None]).squeeze(1))
            self.prev = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, T_generated] float32 log-probs of the generated tokens."""
        self._take(sequences[:, -1])
        return torch.stack(self.picked, dim=1) if self.picked else sequences.new_zeros((sequences.shape[0], 0)).float()


def expandable_cache(cache: Any) -> bool:
    """True for a key/value cache whose rows can be repeated and selected (`DynamicCache` of `DynamicLayer`s).

    The shared-prefix paths here need exactly that; models with other caches (linear-attention or recurrent state,
    encoder-decoder) take the plain paths.
    """
    return isinstance(cache, DynamicCache) and all(isinstance(layer, DynamicLayer) for layer in cache.layers)


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020) of [B, V] scores: keep the smallest set of top tokens whose
    probability mass reaches `top_p` (at least one token); the rest get -inf. Same rule as transformers'
    `TopPLogitsWarper`: drop tokens whose ascending cumulative probability is <= 1 - top_p."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
    drop_sorted = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def sample_prefix_tree(model: Any, batch: Batch, prefill: Any, *, eos_id: int, pad_id: int, n: int, temperature: float,
                       top_p: float, max_new_tokens: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Autoregressive sampling over a prefix tree: rows that share a prefix share its forward pass.

    The model runs once per distinct (prompt, tokens so far), not once per row: the n samples of a prompt start
    as one node (the prompt is prefilled once), and after each step the rows still generating are regrouped by
    (parent node, sampled token); the key/value cache keeps one row per node (`batch_select_indices` with each
    child's parent). Rows that sampled EOS leave. This is exact: rows with the same prefix have the same
    next-token distribution. Each row still draws its own token, one `torch.multinomial` draw per row from
    softmax(logits / temperature) after nucleus filtering (`top_p_filter`) - the distribution of `generate`;
    greedy takes the argmax. The behaviour log-prob is log softmax(logits / temperature) of the drawn token,
    before nucleus filtering (temperature 1 when greedy).

    `prefill` is the model's output over the prompt part of `batch` (use_cache=True, logits_to_keep=1), whose
    key/value cache must be expandable (`expandable_cache`); it is modified in place. Returns [B*n, L] int64 token
    ids (`pad_id` after EOS, L <= max_new_tokens) and [B*n, L] float32 behaviour log-probs, prompt-major, on the CPU.
    """
    eos, pad = eos_id, pad_id
    P = batch.prompt_len
    cache = prefill.past_key_values  # one row per node
    logits = prefill.logits[:, -1]  # [nodes, V]: next-token logits of each node
    attention = batch.attention_mask[:, :P]  # [nodes, P + t]
    position = batch.position_ids[:, P - 1]  # [nodes]: position of each node's last token
    B, V = logits.shape
    dev = logits.device
    N = B * n
    tokens = torch.full((N, max_new_tokens), pad, dtype=torch.long, device=dev)
    logps = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=dev)
    rows = torch.arange(N, device=dev)  # the rows still generating ...
    node = torch.arange(B, device=dev).repeat_interleave(n)  # ... and the node each one is at
    temp = 1.0 if greedy else temperature
    length = 0
    for t in range(max_new_tokens):
        scaled = logits.float() / temp
        logp_all = torch.log_softmax(scaled, dim=-1)
        if greedy:
            nxt = logits.argmax(dim=-1)[node]
        else:
            probs = logp_all.exp() if top_p >= 1.0 else top_p_filter(scaled, top_p).softmax(dim=-1)
            nxt = torch.multinomial(probs.index_select(0, node), num_samples=1).squeeze(1)
        tokens[rows, t] = nxt
        logps[rows, t] = logp_all[node, nxt]
        length = t + 1
        going = nxt != eos
        if t == max_new_tokens - 1 or not bool(going.any()):
            break
        rows, node, nxt = rows[going], node[going], nxt[going]
        children, node = torch.unique(node * V + nxt, return_inverse=True)  # distinct (parent, token)
        parent, token = children // V, children % V
        if parent.shape[0] != attention.shape[0] or not torch.equal(parent, torch.arange(len(parent), device=dev)):
            cache.batch_select_indices(parent)
            attention, position = attention[parent], position[parent]
        attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
        position = position + 1
        out = model(input_ids=token[:, None], attention_mask=attention, position_ids=position[:, None],
                    past_key_values=cache, use_cache=True)
        logits = out.logits[:, -1]
    return tokens[:, :length].cpu(), logps[:, :length].cpu()


def sample_with_generate(
    model: Any, tokenizer: Any, batch: Batch, *, n: int, temperature: float, top_p: float, max_new_tokens: int,
    greedy: bool, stop: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `generate` with the behaviour log-probs recorded by a logits processor (any model).

    Returns [B*n, L] int64 token ids and [B*n, L] float32 behaviour log-probs, prompt-major, on the CPU.
    """
    tok = tokenizer
    P = batch.prompt_len
    recorder = _BehaviourLogprobs(1.0 if greedy else temperature)
    config = GenerationConfig(
        do_sample=not greedy,
        temperature=None if greedy else temperature,
        top_p=None if greedy or top_p >= 1.0 else top_p,
        top_k=0,  # no top-k (None would mean transformers' default of 50)
        max_new_tokens=max_new_tokens,
        num_return_sequences=n,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        return_dict_in_generate=True,
        stop_strings=[stop] if stop is not None else None,
    )
    out = model.generate(
        input_ids=batch.input_ids[:, :P],
        attention_mask=batch.attention_mask[:, :P],
        generation_config=config,
        logits_processor=LogitsProcessorList([recorder]),
        tokenizer=tok if stop is not None else None,
    )
    return out.sequences[:, P:].cpu(), recorder.finish(out.sequences).cpu()


def group_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of `x` [N, K], numbered by first appearance: (first [U] int64, the first row index of each;
    inverse [N] int64, the number of each row's distinct value)."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    N = x.shape[0]
    U = int(inverse.max()) + 1 if N else 0
    first = torch.full((U,), N, dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, inverse, torch.arange(N, device=x.device), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(U, device=x.device)
    return first[order], rank[inverse]


def shared_prefix_logits(model: Any, batch: Batch, first: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor | None:
    """`Policy.completion_logits` with each distinct prompt run once: `first` [U] is a row of each prompt, `inverse`
    [N] the prompt of each row (numbered by first appearance). Returns [N, T, V] logits (model dtype,
    differentiable), or None when the model's cache cannot be repeated (`expandable_cache`)."""
    P, T = batch.prompt_len, batch.completion_ids.shape[1]
    N, U = inverse.shape[0], first.shape[0]
    dev = inverse.device
    head = model(input_ids=batch.input_ids[first, :P], attention_mask=batch.attention_mask[first, :P],
                 position_ids=batch.position_ids[first, :P], use_cache=True, logits_to_keep=1)
    cache = head.past_key_values
    if not expandable_cache(cache):
        return None
    ids, attention, position = batch.input_ids, batch.attention_mask, batch.position_ids
    G = N // U
    perm = torch.argsort(inverse, stable=True)  # rows grouped by prompt
    grouped = G * U == N and torch.equal(inverse[perm], torch.arange(U, device=dev).repeat_interleave(G))
    unsort = None
    if grouped:
        # G rows per prompt (a GRPO batch, in any row order): work on the rows sorted by prompt and repeat the
        # prompt's cache by broadcasting, whose backward is a sum; the logits go back to the batch's row order
        if not torch.equal(perm, torch.arange(N, device=dev)):
            ids, attention, position = (x.index_select(0, perm) for x in (ids, attention, position))
            unsort = torch.argsort(perm)

        def spread(x: torch.Tensor) -> torch.Tensor:
            return x.unsqueeze(1).expand(U, G, *x.shape[1:]).reshape(N, *x.shape[1:])
    else:
        # unequal groups: index_select, whose backward (index_add) is faster on CPU than the accumulating
        # index_put of x[inverse]
        def spread(x: torch.Tensor) -> torch.Tensor:
            return x.index_select(0, inverse)

    logits = spread(head.logits[:, -1:])  # position P-1 predicts completion token 0
    if T > 1:
        for layer in cache.layers:
            layer.keys, layer.values = spread(layer.keys), spread(layer.values)
        tail = model(input_ids=ids[:, P : P + T - 1], attention_mask=attention[:, : P + T - 1],
                     position_ids=position[:, P : P + T - 1], past_key_values=cache, use_cache=True)
        logits = torch.cat([logits, tail.logits], dim=1)
    return logits if unsort is None else logits.index_select(0, unsort)
