"""Log-probs and entropy of chosen tokens without a [N, T, V] tensor: the vocabulary projection is applied to a chunk
of positions at a time, in the forward pass and again in the backward pass, so what exists at once is one chunk's
[chunk, V] float32 logits whatever the batch, the completion length or the vocabulary.

The references are TRL's `selective_log_softmax` (log p(y) = logit[y] - logsumexp(logits), row by row) and Liger's
fused linear cross-entropy (the projection and the softmax fused, chunk by chunk, the logits never stored): here the
upstream loss is not a cross-entropy (a clipped ratio, a KL, an entropy bonus), so the backward recomputes each
chunk's logits instead of storing gradients computed in the forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: The default chunk: this many float32 logits at once (2^24 = 64 MiB; 110 positions of a 151,936-token vocabulary,
#: every position of a micro-batch of the tiny model's 101 tokens).
CHUNK_ELEMENTS = 1 << 24


def chunk_positions(vocab_size: int, chunk_tokens: int | None = None) -> int:
    """Positions per chunk: `chunk_tokens`, or as many as keep [chunk, V] within CHUNK_ELEMENTS (at least 1)."""
    if chunk_tokens is not None:
        if chunk_tokens < 1:
            raise ValueError(f"model.logprob_chunk_tokens: must be >= 1, got {chunk_tokens}")
        return int(chunk_tokens)
    return max(1, CHUNK_ELEMENTS // max(int(vocab_size), 1))


def _log_softmax(hidden: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype, temperature: float,
                 logq: Tensor, probs: Tensor) -> Tensor:
    """Fill `logq` [c, V] with log softmax(z) and `probs` [c, V] with softmax(z), z = (hidden W^T + b) / temperature
    in float32 (the product computed in `dtype`, the weights' or the autocast dtype, then accumulated in float32),
    in place: no other [c, V] tensor is allocated. Returns logsumexp(z) [c, 1]."""
    with torch.autocast(hidden.device.type, enabled=False):
        if dtype == torch.float32 and hidden.dtype == torch.float32 and weight.dtype == torch.float32:
            torch.mm(hidden, weight.t(), out=logq)
        else:
            logq.copy_(hidden.to(dtype) @ weight.to(dtype).t())
    if bias is not None:
        logq.add_(bias.to(dtype).float())
    if temperature != 1.0:
        logq.div_(temperature)
    top = logq.amax(dim=-1, keepdim=True)
    logq.sub_(top)
    torch.exp(logq, out=probs)
    total = probs.sum(dim=-1, keepdim=True)
    log_total = total.log()
    logq.sub_(log_total)
    probs.div_(total)
    return top + log_total


def _entropy(logq: Tensor, probs: Tensor) -> Tensor:
    """-sum_v p_v log p_v of each row, [c, 1], as a batched dot product (no [c, V] temporary)."""
    return -torch.bmm(probs[:, None, :], logq[:, :, None]).squeeze(-1)


def _buffers(rows: int, vocab: int, like: Tensor) -> tuple[Tensor, Tensor]:
    return (torch.empty((rows, vocab), dtype=torch.float32, device=like.device),
            torch.empty((rows, vocab), dtype=torch.float32, device=like.device))


class _ProjectedLogprobs(torch.autograd.Function):
    """log p(y) and the entropy of softmax(h W^T + b) / temperature, chunk by chunk (see `selective_logprobs`). Two
    [chunk, V] float32 buffers are all the vocabulary-wide memory it uses, in the forward and in the backward."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                options: tuple[float, int, torch.dtype, bool]) -> tuple[Tensor, Tensor]:
        """`options`: (temperature, chunk, dtype, with_entropy), one argument so that `backward` returns one
        gradient per tensor input and one None for them all."""
        temperature, chunk, dtype, with_entropy = options
        M = hidden.shape[0]
        logp = torch.empty(M, dtype=torch.float32, device=hidden.device)
        entropy = torch.zeros(M if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        logq_buf, probs_buf = _buffers(min(chunk, M), weight.shape[0], hidden)
        for s in range(0, M, chunk):
            h = hidden[s:s + chunk]
            logq, probs = logq_buf[:h.shape[0]], probs_buf[:h.shape[0]]
            _log_softmax(h, weight, bias, dtype, temperature, logq, probs)
            logp[s:s + chunk] = logq.gather(1, targets[s:s + chunk, None]).squeeze(1)
            if with_entropy:
                entropy[s:s + chunk] = _entropy(logq, probs).squeeze(1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk, ctx.dtype = temperature, chunk, dtype
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None: its term is skipped
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_entropy: Tensor | None):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        M = hidden.shape[0]
        if g_entropy is not None and g_entropy.numel() == 0:
            g_entropy = None
        if g_logp is None and g_entropy is None:
            return None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        logq_buf, probs_buf = _buffers(min(ctx.chunk, M), weight.shape[0], hidden)
        for s in range(0, M, ctx.chunk):
            h = hidden[s:s + ctx.chunk]
            logq, probs = logq_buf[:h.shape[0]], probs_buf[:h.shape[0]]
            _log_softmax(h, weight, bias, ctx.dtype, ctx.temperature, logq, probs)
            # dL/dz_v = g_logp ([v = y] - p_v) + g_entropy (-p_v (log p_v + H))
            if g_entropy is not None:
                H = _entropy(logq, probs)
                grad_z = logq.add_(H).mul_(probs).mul_(-g_entropy[s:s + ctx.chunk, None])
                if g_logp is not None:
                    grad_z.sub_(probs.mul_(g_logp[s:s + ctx.chunk, None]))
            else:
                grad_z = probs.mul_(-g_logp[s:s + ctx.chunk, None])
            if g_logp is not None:
                grad_z.scatter_add_(1, targets[s:s + ctx.chunk, None], g_logp[s:s + ctx.chunk, None].float())
            if ctx.temperature != 1.0:
                grad_z.div_(ctx.temperature)
            with torch.autocast(hidden.device.type, enabled=False):
                if need_h:
                    if ctx.dtype == torch.float32 and weight.dtype == torch.float32:
                        grad_h[s:s + ctx.chunk] = (grad_z @ weight).to(hidden.dtype)
                    else:
                        grad_h[s:s + ctx.chunk] = (grad_z.to(ctx.dtype) @ weight.to(ctx.dtype)).to(hidden.dtype)
                if need_w:
                    grad_w.addmm_(grad_z.t(), h.float())
                if need_b:
                    grad_b.add_(grad_z.sum(0))
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None)


def selective_logprobs(features: Tensor, targets: Tensor, *, head: Any = None, temperature: float = 1.0,
                       chunk: int | None = None, with_entropy: bool = False, entropy_grad: bool = False,
                       dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target token and the entropy of each position's distribution, never materializing more than
    one chunk of vocabulary-wide float32 logits.

    log p(y_m) = z_m[y_m] - logsumexp_v z_m[v];  H_m = logsumexp_v z_m[v] - sum_v softmax(z_m)[v] z_m[v], with
    z_m = (h_m W^T + b) / temperature when `head` is given (the LM head applied here, chunk by chunk, in the
    forward pass and again in the backward pass: the logits are never stored), else z_m = features_m / temperature
    (logits already computed by the model; only the float32 softmax work is chunked).

    Args:
        features: [M, H] hidden states (with `head`) or [M, V] logits, any float dtype (differentiable).
        targets: [M] int64 token ids in [0, V).
        head: the LM head, a `torch.nn.Linear` (or any object with its `weight` [V, H], tied embeddings included,
            and `bias` [V] or None); None: `features` are the logits.
        temperature: the logits are divided by it (> 0), as in sampling.
        chunk: positions per chunk (None: `chunk_positions(V)`).
        with_entropy: also return the entropy.
        entropy_grad: let gradients flow through the entropy (an entropy bonus); else it is detached.
        dtype: the dtype of the projection's product (None: the weight's; on a CPU, a half dtype over float32
            weights, which autocast gives, is computed in float32); the result is float32 either way.
    Returns:
        logprobs [M] float32 (natural log), entropy [M] float32 in nats or None.
    Raises:
        ValueError: a temperature <= 0 or a chunk < 1.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    weight, bias = (head.weight, head.bias) if head is not None else (None, None)
    V = weight.shape[0] if weight is not None else features.shape[-1]
    chunk = chunk_positions(V, chunk)
    if weight is not None:
        dtype = dtype or weight.dtype
        half = dtype in (torch.bfloat16, torch.float16)
        if features.device.type == "cpu" and half and weight.dtype == torch.float32:
            # On a CPU the head's products run in float32 over float32 weights: the backward's [c, V] x [V, H]
            # product in bf16 took 12 s against 0.14 s in float32 on an AVX2 core (no native bf16 arithmetic)
            dtype = torch.float32
        logp, entropy = _ProjectedLogprobs.apply(features, weight, bias, targets,
                                                 (float(temperature), chunk, dtype, with_entropy))
        if not with_entropy:
            return logp, None
        return logp, entropy if entropy_grad and torch.is_grad_enabled() else entropy.detach()
    logps, entropies = [], []
    for s in range(0, features.shape[0], chunk):
        z = features[s:s + chunk].float()
        z = z / temperature if temperature != 1.0 else z
        lse = torch.logsumexp(z, dim=-1)
        logps.append(z.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                logq = z - lse[:, None]
                entropies.append(-(logq.exp() * logq).sum(-1))
    empty = features.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    return logp, (torch.cat(entropies) if entropies else empty) if with_entropy else None


def lm_head_split(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """(body, head) of a causal LM whose logits are exactly head(body(...).last_hidden_state): the decoder
    (`get_decoder()`) and a plain linear LM head (`get_output_embeddings()`), checked once on a 4-token input (in
    eval mode, without autocast) against the model's own logits. None when the model has no such split or computes
    its logits otherwise (a final soft-cap or a logit scale, as Gemma 2 and Cohere do): such a model's log-probs are
    computed from its full logits (`selective_logprobs` without `head`). A PEFT model is split through its base
    model (the adapter layers stay in place)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if not callable(get_decoder) or not callable(get_head):
        return None
    body, head = get_decoder(), get_head()
    if body is None or body is base or not isinstance(head, torch.nn.Linear):
        return None
    dev = head.weight.device
    ids = (torch.arange(1, 5, device=dev) % head.weight.shape[0])[None]
    was = base.training
    base.eval()
    try:
        with torch.no_grad(), torch.autocast(dev.type, enabled=False):
            full = base(input_ids=ids, use_cache=False).logits.float()
            part = head(body(input_ids=ids, use_cache=False).last_hidden_state).float()
    finally:
        base.train(was)
    scale = float(full.abs().max().clamp(min=1.0))
    if full.shape != part.shape or not torch.allclose(full, part, rtol=1e-4, atol=1e-4 * scale):
        return None
    return body, head
