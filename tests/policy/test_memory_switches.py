"""The memory and precision switches of a policy: chunked log-probs (no [N, T, V] tensor), gradient checkpointing and
bf16 autocast. Each switch changes memory or speed, not the values (checkpointing, chunks), or changes them only by
the documented precision (autocast); and each test fails when its switch does nothing."""

from __future__ import annotations

import types

import pytest
import torch

from conftest import TINY_ARCH
from rewardlab.policy import Policy, load_policy, rollout_batch
from rewardlab.policy.logprobs import chunk_positions, lm_head_split, selective_logprobs

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(2)]


def _batch(policy, seed=0):
    torch.manual_seed(seed)
    rollouts = policy.generate([r["prompt"] for r in ROWS], n=4, rows=ROWS, max_new_tokens=7, temperature=1.5)
    return rollout_batch(policy, rollouts)


def _naive(policy, batch, temperature=1.0):
    """The [N, T, V] way: the model's full logits, float32 log_softmax over the vocabulary."""
    out = policy.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids, use_cache=False)
    P, T = batch.prompt_len, batch.completion_ids.shape[1]
    logq = torch.log_softmax(out.logits[:, P - 1 : P - 1 + T].float() / temperature, dim=-1)
    lp = logq.gather(-1, batch.completion_ids[..., None]).squeeze(-1) * batch.mask
    return lp, -(logq.exp() * logq).sum(-1) * batch.mask


def _grads(policy, lp, ent, g):
    policy.model.zero_grad(set_to_none=True)
    ((lp * g).sum() + (ent * g).sum()).backward()
    return [p.grad.clone() for p in policy.model.parameters()]


def _close(a, b, rel):
    scale = max(float(x.abs().max()) for x in b)
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) <= rel * scale


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [None, 1, 5])
def test_chunked_log_probs_and_entropy_equal_the_full_log_softmax(chunk, temperature):
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0, logprob_chunk_tokens=chunk)
    batch, old = _batch(policy)
    policy.model.train()
    lp, ent = policy.token_logprobs(batch, temperature=temperature, with_entropy=True, entropy_grad=True)
    ref_lp, ref_ent = _naive(policy, batch, temperature)
    assert (lp - ref_lp).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    with torch.no_grad():  # the sampler's behaviour log-probs (sampled at temperature 1.5)
        assert (policy.token_logprobs(batch, temperature=1.5)[0] - old).abs().max() <= 1e-5
    g = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    assert _close(_grads(policy, lp, ent, g), _grads(policy, ref_lp, ref_ent, g), 1e-5)


def test_selective_logprobs_gradients_match_autograd_in_float64():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(11, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(23, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(23, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randint(0, 23, (11,), generator=gen)
    head = types.SimpleNamespace(weight=w, bias=b)  # the LM head's weight and bias, as nn.Linear holds them
    lp, ent = selective_logprobs(h, y, head=head, temperature=0.8, chunk=4, with_entropy=True, entropy_grad=True)
    logq = torch.log_softmax((h @ w.t() + b) / 0.8, dim=-1)
    ref_lp, ref_ent = logq.gather(1, y[:, None]).squeeze(1), -(logq.exp() * logq).sum(-1)
    g1, g2 = torch.randn(11, dtype=torch.float64, generator=gen), torch.randn(11, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad((lp.double() * g1).sum() + (ent.double() * g2).sum(), [h, w, b])
    want = torch.autograd.grad((ref_lp * g1).sum() + (ref_ent * g2).sum(), [h, w, b])
    for x, z in zip(got, want):
        assert torch.allclose(x, z, atol=1e-5)
    # the entropy is detached unless asked for: only the log-prob term reaches the gradient
    lp, ent = selective_logprobs(h, y, head=head, temperature=0.8, chunk=4, with_entropy=True)
    assert not ent.requires_grad


def test_the_chunk_bounds_the_logits_that_exist_at_once(monkeypatch):
    """The LM head is applied to `chunk` positions at a time: no [M, V] product is ever formed for M > chunk."""
    import rewardlab.policy.logprobs as lp_module

    widths = []
    real = lp_module._log_softmax

    def spy(hidden, *args, **kwargs):
        widths.append(hidden.shape[0])
        return real(hidden, *args, **kwargs)

    monkeypatch.setattr(lp_module, "_log_softmax", spy)
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0, logprob_chunk_tokens=3)
    batch, _ = _batch(policy)
    lp, _ = policy.token_logprobs(batch, with_entropy=True)
    lp.sum().backward()
    assert widths and max(widths) <= 3
    assert sum(widths) == 2 * int(batch.mask.sum())  # each completion token once forward, once backward
    assert chunk_positions(151_936) == 110 and chunk_positions(101) == (1 << 24) // 101


def test_a_model_whose_logits_are_not_a_plain_head_falls_back_to_its_own_logits():
    """Gemma 2 soft-caps its logits after the LM head: the split is refused and the model's logits are used."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from rewardlab.policy.tiny import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                           head_dim=16, final_logit_softcapping=2.0, pad_token_id=0, eos_token_id=2,
                                           bos_token_id=1))
    policy = Policy(model, tok)
    assert lm_head_split(model) is None
    batch, _ = _batch(policy)
    lp, ent = policy.token_logprobs(batch, with_entropy=True)
    ref_lp, ref_ent = _naive(policy, batch)
    assert (lp - ref_lp).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    # without the cap the same weights give other log-probs: the check above would catch a wrong split
    model.config.final_logit_softcapping = None
    assert lm_head_split(model) is not None


def _count_layer_calls(policy):
    """Calls of the first decoder layer's MLP (a module inside the checkpointed layer: the recomputation calls the
    layer's forward directly, so hooks on the layer itself would not see it)."""
    policy.lm_head()  # the one-off split check runs the model too; not counted
    calls = []
    handle = policy.model.get_decoder().layers[0].mlp.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


def test_gradient_checkpointing_recomputes_layers_and_changes_no_value():
    plain = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    ckpt = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0, gradient_checkpointing=True)
    batch, _ = _batch(plain)
    results = []
    for policy in (plain, ckpt):
        policy.model.train()
        calls, handle = _count_layer_calls(policy)
        lp, ent = policy.token_logprobs(batch, with_entropy=True, entropy_grad=True)
        forward_calls = len(calls)
        g = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
        grads = _grads(policy, lp, ent, g)
        handle.remove()
        results.append((lp.detach(), grads, forward_calls, len(calls)))
    (lp0, g0, f0, n0), (lp1, g1, f1, n1) = results
    assert n0 == f0 and n1 > f1  # checkpointing runs the layer again in the backward pass
    assert f1 == 1  # one plain forward pass (the shared-prefix path needs the cache checkpointing drops)
    assert (lp0 - lp1).abs().max() <= 1e-5 and _close(g1, g0, 1e-5)


def test_bf16_autocast_computes_in_bf16_over_float32_weights():
    full = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    mixed = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0, autocast="bfloat16")
    batch, _ = _batch(full)
    seen = []
    mixed.lm_head()  # the one-off split check runs without autocast
    proj = mixed.model.get_decoder().layers[0].mlp.down_proj
    handle = proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    mixed.model.train()
    lp, _ = mixed.token_logprobs(batch)
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    ref, _ = full.token_logprobs(batch)
    diff = float((lp.detach() - ref).abs().max())
    assert 0 < diff < 0.1  # bf16 has 8 bits of mantissa: close to float32, not equal
    lp.sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
               for p in mixed.model.parameters() if p.grad is not None)
    # sampling runs under autocast too: its behaviour log-probs are the autocast ones
    torch.manual_seed(3)
    ro = mixed.generate(["1+2="], n=4, max_new_tokens=5, temperature=1.0)
    b2, old = rollout_batch(mixed, ro)
    assert float((mixed.token_logprobs(b2)[0] - old).abs().max()) < 0.05


def test_autocast_needs_float32_weights_and_a_known_dtype():
    with pytest.raises(ValueError, match="model.autocast: computes in bfloat16 over float32 master weights.*"
                                         "model.dtype=float32"):
        policy = load_policy("tiny", tiny_arch=TINY_ARCH)
        Policy(policy.model.to(torch.bfloat16), policy.tokenizer, autocast="bfloat16")
    with pytest.raises(ValueError, match="model.autocast: expected one of"):
        load_policy("tiny", tiny_arch=TINY_ARCH, autocast="float8")
    with pytest.raises(ValueError, match="model.logprob_chunk_tokens: must be >= 1"):
        load_policy("tiny", tiny_arch=TINY_ARCH, logprob_chunk_tokens=0)


def test_micro_batched_scoring_equals_one_pass():
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    batch, _ = _batch(policy)
    group = torch.arange(batch.mask.shape[0]) // 4
    whole = policy.scored_logprobs(batch)
    for micro in (1, 3, 5):
        assert (policy.scored_logprobs(batch, micro_batch_size=micro, group=group) - whole).abs().max() <= 1e-5
    trimmed = batch.select(torch.tensor([0, 1])).trim()
    assert trimmed.completion_ids.shape[1] <= batch.completion_ids.shape[1]
    assert int(trimmed.mask.sum()) == int(batch.mask[:2].sum())


def test_sampling_and_scoring_pass_the_cache_under_the_name_the_model_takes():
    """transformers 5.2x renamed the forward's `past_key_values` to `cache` (the old name warns, FutureWarning, on
    every call of the sampler); the sampler and the shared-prefix scorer use whichever name the model declares."""
    import warnings

    from rewardlab.policy.sampling import cache_kwarg

    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        batch, old = _batch(policy)
        lp, _ = policy.token_logprobs(batch, temperature=1.5)
    assert cache_kwarg(policy.model) in ("cache", "past_key_values")
    assert float((lp - old).abs().max()) <= 1e-5  # what was sampled is what is scored
    assert float((lp - _naive(policy, batch, 1.5)[0]).abs().max()) <= 1e-5
