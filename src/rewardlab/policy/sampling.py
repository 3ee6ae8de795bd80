"""Sampling with behaviour log-probs and shared-prefix scoring: the prefix-tree sampler, the fallback through
transformers' `generate`, nucleus filtering, and completion logits with each distinct prompt run once.

`rewardlab.policy.hf.Policy` chooses between the shared-prefix and the plain paths; these functions take the model
(and tokenizer) they run.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, DynamicLayer

from rewardlab.policy.batch import Batch
from rewardlab.policy.streams import hashed_uniform, inverse_cdf


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


def cache_kwarg(model: Any) -> str:
    """The keyword under which `model`'s forward takes its key/value cache: `cache` from transformers 5.2x (which
    deprecates `past_key_values` with a FutureWarning), `past_key_values` before. A peft wrapper is looked through."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The key/value cache a forward with `use_cache=True` returned: `out.cache` (transformers 5.2x) or
    `out.past_key_values` (before), read without the deprecation warning."""
    return out.cache if "cache" in getattr(type(out), "__dataclass_fields__", {}) else out.past_key_values


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


def stop_end(tokenizer: Any, ids: list[int], stops: Sequence[str], before: str = "") -> int | None:
    """How many tokens of `ids` to keep so the continuation ends with the token that completes the first stop
    string, or None when no stop string is completed.

    The text searched is `before` + decode(ids) (special tokens skipped); `before` is text preceding the ids (e.g.
    the prompt's tail), so a stop string that starts there and ends in the new text counts, while one lying wholly
    inside `before` does not. "First" is the stop string whose first occurrence ends earliest in the text.
    """
    text = before + tokenizer.decode(ids, skip_special_tokens=True)
    need = None  # characters of new text up to the end of the earliest-ending stop string
    for stop in stops:
        at = text.find(stop, max(0, len(before) - len(stop) + 1))
        if at >= 0 and (need is None or at + len(stop) - len(before) < need):
            need = at + len(stop) - len(before)
    if need is None:
        return None
    for k in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:k], skip_special_tokens=True)) >= need:
            return k
    return len(ids)


class StopWatch:
    """Tells, token by token, which rows have completed a stop string, so a sampler can stop running them.

    Each row's new tokens are pushed as they are sampled. A cheap check decodes only the last few tokens (enough
    for the longest stop string, so its cost per token does not grow with the row) and, when it finds a stop
    string, the row's whole text is checked with `stop_end` (so the answer is never wrong; at worst a stop is
    noticed late, and the caller's final `stop_end` cut is exact).

    Args:
        tokenizer: decodes the ids.
        stops: the stop strings (non-empty).
        befores: per row, the text before its new tokens (see `stop_end`).
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], befores: Sequence[str]) -> None:
        self.tokenizer, self.stops, self.befores = tokenizer, list(stops), list(befores)
        self.ids: list[list[int]] = [[] for _ in befores]
        # tokens decoded by the cheap check: twice the longest stop string's characters, plus 2, leaves room for
        # tokens that decode to no text or to part of a character
        self.window = 2 * max(len(s) for s in self.stops) + 2

    def push(self, rows: Sequence[int], tokens: Sequence[int]) -> list[bool]:
        """Append `tokens[j]` to row `rows[j]`; returns, per pushed row, whether its new text now completes a stop
        string."""
        out = []
        for r, tok in zip(rows, tokens):
            ids = self.ids[r]
            ids.append(int(tok))
            tail = self.tokenizer.decode(ids[-self.window:], skip_special_tokens=True)
            if len(ids) <= self.window:
                tail = self.befores[r] + tail
            out.append(any(s in tail for s in self.stops)
                       and stop_end(self.tokenizer, ids, self.stops, self.befores[r]) is not None)
        return out


def stream_draw(scaled: torch.Tensor, top_p: float, u: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens drawn by inverse CDF (`streams.inverse_cdf`) from softmax(`scaled`) after nucleus filtering
    (`top_p_filter`), the softmax and cumulative sum in float64. `scaled` is [M, V] logits / temperature, `u` [R]
    float64 uniforms, `index` [R] the row of `scaled` of each draw (None: R == M). Returns [R] int64."""
    return inverse_cdf(top_p_filter(scaled, top_p).double().softmax(dim=-1), u, index)


@dataclass(frozen=True)
class Draw:
    """How each new token is drawn: from softmax(logits / temperature) after nucleus filtering to mass `top_p`
    (`top_p_filter`), or the argmax when `greedy` (then temperature is not read: behaviour log-probs are at
    temperature 1)."""

    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False


@dataclass(frozen=True)
class SampleRows:
    """The N rows one sampling call continues.

    Attributes:
        node: [N] int64, the prompt (row of the batch) each row continues (prompt-major for `sample_with_generate`,
            which does not read it).
        budgets: [N] int64 >= 1, each row's max new tokens.
        words: [N, 4] int64 stream words (`streams.stream_words`), or None: torch's global generator.
        watch: stop-string detection over the N rows (`StopWatch`), or None: no stop strings.
    """

    node: torch.Tensor
    budgets: torch.Tensor
    words: torch.Tensor | None = None
    watch: StopWatch | None = None


def sample_prefix_tree(model: Any, batch: Batch, prefill: Any, rows: SampleRows, draw: Draw, *, eos_id: int,
                       pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Autoregressive sampling over a prefix tree: rows that share a prefix share its forward pass.

    The model runs once per distinct (prompt, tokens so far): the rows of a prompt start as one node (the prompt is
    prefilled once), and after each step the rows still generating are regrouped by (parent node, sampled token);
    the key/value cache keeps one row per node (`batch_select_indices`). A row leaves at EOS, at its budget, or
    (with `rows.watch`) at a completed stop string. Exact: rows with the same prefix have the same next-token
    distribution, and each row draws its own token as `draw` says (`next_tokens`). The behaviour log-prob is
    log softmax(logits / temperature) of the drawn token, before nucleus filtering (temperature 1 when greedy).

    Args:
        model, batch: the causal LM and the prompts, one per node, left-padded (`Batch`).
        prefill: the model's output over the prompt part of `batch` (use_cache=True, logits_to_keep=1), whose
            key/value cache must be expandable (`expandable_cache`); it is modified in place.
        rows: `SampleRows`: each row's prompt (node), budget, stream words and the stop watch.
        draw: `Draw`: temperature, top_p, greedy.
        eos_id, pad_id: the end-of-sequence id (ends a row) and the id written after a row's end.
    Returns:
        [N, L] int64 token ids (`pad_id` after a row's end, L = the longest row), [N, L] float32 behaviour
        log-probs and [N] int64 lengths (tokens sampled by each row), on the CPU.
    """
    P = batch.prompt_len
    cache, cache_key = output_cache(prefill), cache_kwarg(model)  # the cache: one row per node
    logits = prefill.logits[:, -1]  # [nodes, V]: next-token logits of each node
    attention = batch.attention_mask[:, :P]  # [nodes, P + t]
    position = batch.position_ids[:, P - 1]  # [nodes]: position of each node's last token
    V = logits.shape[1]
    dev = logits.device
    N = rows.node.shape[0]
    node = rows.node.to(dev)
    budgets = rows.budgets.to(dev)
    words = rows.words.to(dev) if rows.words is not None else None
    L = int(budgets.max())
    tokens = torch.full((N, L), pad_id, dtype=torch.long, device=dev)
    logps = torch.zeros((N, L), dtype=torch.float32, device=dev)
    lengths = torch.zeros(N, dtype=torch.long, device=dev)
    live = torch.arange(N, device=dev)  # the rows still generating (`node`: the node each one is at)
    length = 0
    for t in range(L):
        nxt, logp_all = next_tokens(logits, node, draw, None if words is None else words.index_select(0, live), t)
        tokens[live, t] = nxt
        logps[live, t] = logp_all[node, nxt]
        lengths[live] = t + 1
        length = t + 1
        going = (nxt != eos_id) & (budgets.index_select(0, live) > t + 1)
        if rows.watch is not None:
            on = going.nonzero().squeeze(1)
            if on.numel():
                hit = rows.watch.push(live[on].tolist(), nxt[on].tolist())
                going[on] = ~torch.tensor(hit, dtype=torch.bool, device=dev)
        if not bool(going.any()):
            break
        live, node, nxt = live[going], node[going], nxt[going]
        children, node = torch.unique(node * V + nxt, return_inverse=True)  # distinct (parent, token)
        logits, attention, position = extend_nodes(model, (cache, cache_key), children // V, children % V,
                                                   attention, position)
    return tokens[:, :length].cpu(), logps[:, :length].cpu(), lengths.cpu()


def extend_nodes(model: Any, cache: tuple[Any, str], parent: torch.Tensor, token: torch.Tensor,
                 attention: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of `sample_prefix_tree`'s tree: the new nodes, child c = node `parent[c]` + token `token[c]`, run
    through the model on its key/value cache (`cache`: the cache, one row per old node, re-indexed to the parents
    in place when they differ; and the forward's keyword for it, `cache_kwarg`).

    Returns:
        ([C, V] next-token logits of each new node, its [C, P + t + 1] attention mask, its [C] last position).
    """
    kv, key = cache
    if parent.shape[0] != attention.shape[0] or not torch.equal(parent, torch.arange(len(parent),
                                                                                    device=parent.device)):
        kv.batch_select_indices(parent)
        attention, position = attention[parent], position[parent]
    attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
    position = position + 1
    out = model(input_ids=token[:, None], attention_mask=attention, position_ids=position[:, None],
                use_cache=True, **{key: kv})
    return out.logits[:, -1], attention, position


def next_tokens(logits: torch.Tensor, node: torch.Tensor, draw: Draw, words: torch.Tensor | None,
                t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of `sample_prefix_tree`: the token of each live row and the log softmax(logits / temperature) of
    every node (temperature 1 when greedy).

    Args:
        logits: [nodes, V] next-token logits of each node.
        node: [R] int64, the node of each live row.
        draw: `Draw`: greedy takes the argmax; else, with `words`, row r's token by inverse CDF at the uniform
            `hashed_uniform(words[r], t)` (`stream_draw`), and without, one `torch.multinomial` draw per row from
            torch's global generator.
        words: [R, 4] int64 stream words of the live rows, or None.
        t: the index of the token drawn (0 for the first new token).
    Returns:
        ([R] int64 tokens, [nodes, V] float32 log-probs).
    """
    scaled = logits.float() / (1.0 if draw.greedy else draw.temperature)
    logp_all = torch.log_softmax(scaled, dim=-1)
    if draw.greedy:
        nxt = logits.argmax(dim=-1)[node]
    elif words is not None:
        nxt = stream_draw(scaled, draw.top_p, hashed_uniform(words, t), node)
    else:
        probs = logp_all.exp() if draw.top_p >= 1.0 else top_p_filter(scaled, draw.top_p).softmax(dim=-1)
        nxt = torch.multinomial(probs.index_select(0, node), num_samples=1).squeeze(1)
    return nxt, logp_all


class _StreamDraws(LogitsProcessor):
    """Inside `generate` (placed after `_BehaviourLogprobs`, with do_sample off): draws each row's token from its
    stream (`stream_draw` on scores / temperature) and masks every other token to -inf, so the argmax is the draw."""

    def __init__(self, words: torch.Tensor, prompt_len: int, temperature: float, top_p: float) -> None:
        self.words, self.prompt_len, self.temperature, self.top_p = words, prompt_len, temperature, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len
        picked = stream_draw(scores.float() / self.temperature, self.top_p,
                             hashed_uniform(self.words.to(scores.device), t))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(1, picked[:, None], 0.0)


class _RowEnds(StoppingCriteria):
    """Inside `generate`: a row is done at EOS, at its own budget, or (with a `StopWatch`) at a completed stop
    string; records each row's length (tokens sampled) when it is first done."""

    def __init__(self, budgets: torch.Tensor, prompt_len: int, eos_id: int, watch: StopWatch | None) -> None:
        self.budgets, self.prompt_len, self.eos_id, self.watch = budgets, prompt_len, eos_id, watch
        self.lengths = torch.zeros_like(budgets)
        self.done = torch.zeros(budgets.shape, dtype=torch.bool)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_len  # tokens generated so far
        last = input_ids[:, -1].cpu()
        done = (last == self.eos_id) | (self.budgets <= t)
        live = (~self.done & ~done).nonzero().squeeze(1)
        if self.watch is not None and live.numel():
            hit = self.watch.push(live.tolist(), last[live].tolist())
            done[live] = torch.tensor(hit, dtype=torch.bool)
        new = done & ~self.done
        self.lengths[new] = t
        self.done |= done
        return self.done.to(input_ids.device)


def sample_with_generate(model: Any, tokenizer: Any, batch: Batch, rows: SampleRows, draw: Draw, *,
                         n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' `generate` with the behaviour log-probs recorded by a logits processor (any model).

    `n` samples of each prompt of `batch`, prompt-major; `rows` (`SampleRows`, node not read): budgets [B*n] int64,
    words ([B*n, 4] stream words: draws as in `sample_prefix_tree`, so both samplers give the same ids; None:
    transformers' multinomial sampling) and watch (stop strings), per row; `draw`: temperature, top_p, greedy.
    Returns [B*n, L] int64 token ids, [B*n, L] float32 behaviour log-probs and [B*n] int64 lengths (tokens sampled
    by each row), on the CPU.
    """
    temperature, top_p, greedy = draw.temperature, draw.top_p, draw.greedy
    budgets, words, watch = rows.budgets, rows.words, rows.watch
    tok = tokenizer
    P = batch.prompt_len
    temp = 1.0 if greedy else temperature
    recorder = _BehaviourLogprobs(temp)
    processors = [recorder]
    sample = not greedy and words is None
    if not greedy and words is not None:
        processors.append(_StreamDraws(words, P, temperature, top_p))
    ends = _RowEnds(budgets.cpu(), P, tok.eos_token_id, watch)
    config = GenerationConfig(
        do_sample=sample,
        temperature=temperature if sample else None,
        top_p=top_p if sample and top_p < 1.0 else None,
        top_k=0 if sample else None,  # no top-k (None would mean transformers' default of 50 when sampling)
        max_new_tokens=int(budgets.max()),
        num_return_sequences=n,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        return_dict_in_generate=True,
    )
    out = model.generate(
        input_ids=batch.input_ids[:, :P],
        attention_mask=batch.attention_mask[:, :P],
        generation_config=config,
        logits_processor=LogitsProcessorList(processors),
        stopping_criteria=StoppingCriteriaList([ends]),
    )
    gen = out.sequences[:, P:].cpu()
    lengths = torch.where(ends.done, ends.lengths, torch.full_like(ends.lengths, gen.shape[1]))
    return gen, recorder.finish(out.sequences).cpu(), lengths


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


def shared_prefix_features(forward: Any, batch: Batch, first: torch.Tensor,
                           inverse: torch.Tensor) -> torch.Tensor | None:
    """`Policy.completion_features` with each distinct prompt run once: `first` [U] is a row of each prompt, `inverse`
    [N] the prompt of each row (numbered by first appearance). `forward(input_ids=, attention_mask=, position_ids=,
    past_key_values=None)` runs the model with its cache on and returns (features [B, L, F], cache): the last hidden
    states, or the logits. Returns [N, T, F] features at the positions that predict each completion token (model
    dtype, differentiable), or None when the model's cache cannot be repeated (`expandable_cache`)."""
    P, T = batch.prompt_len, batch.completion_ids.shape[1]
    N, U = inverse.shape[0], first.shape[0]
    dev = inverse.device
    head, cache = forward(input_ids=batch.input_ids[first, :P], attention_mask=batch.attention_mask[first, :P],
                          position_ids=batch.position_ids[first, :P])
    if not expandable_cache(cache):
        return None
    ids, attention, position = batch.input_ids, batch.attention_mask, batch.position_ids
    G = N // U
    perm = torch.argsort(inverse, stable=True)  # rows grouped by prompt
    grouped = G * U == N and torch.equal(inverse[perm], torch.arange(U, device=dev).repeat_interleave(G))
    unsort = None
    if grouped:
        # G rows per prompt (a GRPO batch, in any row order): work on the rows sorted by prompt and repeat the
        # prompt's cache by broadcasting, whose backward is a sum; the features go back to the batch's row order
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

    features = spread(head[:, -1:])  # position P-1 predicts completion token 0
    if T > 1:
        for layer in cache.layers:
            layer.keys, layer.values = spread(layer.keys), spread(layer.values)
        tail, _ = forward(input_ids=ids[:, P : P + T - 1], attention_mask=attention[:, : P + T - 1],
                          position_ids=position[:, P : P + T - 1], past_key_values=cache)
        features = torch.cat([features, tail], dim=1)
    return features if unsort is None else features.index_select(0, unsort)
