"""Token-level sampling (`Policy.sample_ids`) and per-row random streams: the hash and the inverse CDF by hand,
draws independent of the batch and of torch's global generator, both samplers agreeing, budgets and stop strings."""

import random

import pytest
import torch

from rewardlab.policy import rollout_batch
from rewardlab.policy.streams import hashed_uniform, inverse_cdf, mix32, stream_words
from rewardlab.types import Rollout

PROMPTS = ["1+2=", "12+34+5=", "7=", "9+9="]
M32 = 0xFFFFFFFF


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 with Python's unbounded ints, masked to 32 bits after each product."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _flat(policy, scale=0.3):
    with torch.no_grad():
        policy.model.model.norm.weight.mul_(scale)  # flatter logits: varied tokens, EOS now and then
    return policy


def _ids(policy, texts):
    return [policy.encode_prompt(t) for t in texts]


# ---------------------------------------------------------------- the hash and the inverse CDF
def test_mix32_equals_the_published_hash_computed_with_python_ints():
    rng = random.Random(0)
    xs = [0, 1, 2, 0xFFFF, 0x10000, M32, 0x80000000] + [rng.getrandbits(32) for _ in range(200)]
    got = mix32(torch.tensor(xs, dtype=torch.long)).tolist()
    assert got == [_lowbias32(x) for x in xs]  # no int64 overflow in the split products
    assert got[0] == 0 and len(set(got)) == len(xs)  # 0 is its fixed point; a bijection


def test_hashed_uniform_is_the_documented_formula():
    words = stream_words([(0, 1, 2), (5,), (-3, 10**30)])
    assert words.shape == (3, 4) and int(words.min()) >= 0 and int(words.max()) <= M32
    for t in (0, 1, 17):
        u = hashed_uniform(words, t).tolist()
        for row, value in zip(words.tolist(), u):
            hi = _lowbias32(row[0] ^ _lowbias32(row[1] ^ t))
            lo = _lowbias32(row[2] ^ _lowbias32(row[3] ^ t))
            assert value == ((hi << 21) | (lo >> 11)) / 2**53


def test_hashed_uniforms_are_uniform_and_differ_by_stream_and_token():
    words = stream_words([(7, k) for k in range(2000)])
    u = torch.cat([hashed_uniform(words, t) for t in range(10)])  # 20,000 draws
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0)
    assert ((counts - 2000).abs() < 200).all(), counts  # each tenth gets 2000 +- 10% (sd ~42)
    assert len(set(u.tolist())) == len(u)  # no two (stream, t) collide
    # the key is the whole tuple: (1, 2) and (12,) or (2, 1) are different streams
    a, b, c = hashed_uniform(stream_words([(1, 2), (12,), (2, 1)]), 0).tolist()
    assert len({a, b, c}) == 3


def test_inverse_cdf_picks_the_interval_that_holds_u():
    probs = torch.tensor([[0.5, 0.25, 0.25]])
    # cumulative 0.5, 0.75, 1.0: token k holds [cdf[k-1], cdf[k])
    us = [0.0, 0.4999, 0.5, 0.7499, 0.75, 0.9999]
    picked = inverse_cdf(probs.expand(len(us), 3), torch.tensor(us, dtype=torch.float64))
    assert picked.tolist() == [0, 0, 1, 1, 2, 2]
    # unnormalised weights give the same draws; a zero-probability token is never picked
    assert inverse_cdf(torch.tensor([[2.0, 1.0, 1.0]]).expand(6, 3), torch.tensor(us, dtype=torch.float64)).tolist() \
        == [0, 0, 1, 1, 2, 2]
    zero_mid = torch.tensor([[0.5, 0.0, 0.5]]).expand(3, 3)
    assert inverse_cdf(zero_mid, torch.tensor([0.49, 0.5, 0.51], dtype=torch.float64)).tolist() == [0, 2, 2]
    zero_last = torch.tensor([[0.5, 0.5, 0.0]])
    assert inverse_cdf(zero_last, torch.tensor([1 - 2**-53], dtype=torch.float64)).tolist() == [1]
    # `index`: each draw reads its own row
    two = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert inverse_cdf(two, torch.tensor([0.3, 0.3, 0.9], dtype=torch.float64),
                       torch.tensor([1, 0, 1])).tolist() == [1, 0, 1]


def test_stream_draws_follow_the_distribution():
    probs = torch.tensor([[0.7, 0.2, 0.1]])
    u = hashed_uniform(stream_words([(3, k) for k in range(5000)]), 4)
    freq = torch.bincount(inverse_cdf(probs.expand(5000, 3), u), minlength=3).double() / 5000
    assert torch.allclose(freq, probs[0].double(), atol=0.02), freq


def test_stream_keys_are_validated():
    for bad in [(), (1.5, 2), ("a",), (True,), 3]:
        with pytest.raises(ValueError, match=r"streams\[0\]"):
            stream_words([bad])


# ---------------------------------------------------------------- sample_ids on the tiny model
def test_token_sampler_properties(tiny_policy):
    assert tiny_policy.eos_token_id == 2
    assert tiny_policy.context_window == 256  # the tiny model's max_position_embeddings


def test_same_stream_same_ids_whatever_the_batch_and_global_seed(tiny_policy):
    policy = _flat(tiny_policy)
    prompts = _ids(policy, PROMPTS)
    streams = [(0, 1, k) for k in range(4)]
    torch.manual_seed(0)
    base = policy.sample_ids(prompts, max_new_tokens=16, temperature=0.9, top_p=0.95, streams=streams)
    torch.manual_seed(1)
    reverse = policy.sample_ids(prompts[::-1], max_new_tokens=16, temperature=0.9, top_p=0.95,
                                streams=streams[::-1])[::-1]
    torch.manual_seed(2)  # rows 1 and 3 alone, next to other rows (a repeat of prompt 3 with another stream)
    mixed = policy.sample_ids([prompts[3], prompts[0], prompts[1], prompts[3]], max_new_tokens=16, temperature=0.9,
                              top_p=0.95, streams=[(9, 9), (5, 5), streams[1], streams[3]])
    assert [s.ids for s in reverse] == [s.ids for s in base]
    assert mixed[2].ids == base[1].ids and mixed[3].ids == base[3].ids
    assert mixed[0].ids != base[3].ids  # same prompt, another stream
    assert len({tuple(s.ids) for s in base}) == 4


def test_different_streams_of_one_prompt_differ(tiny_policy):
    policy = _flat(tiny_policy)
    (prompt,) = _ids(policy, ["3+4="])
    out = policy.sample_ids([prompt] * 8, max_new_tokens=6, streams=[(0, 0, k) for k in range(8)])
    assert len({tuple(s.ids) for s in out}) == 8


def test_streams_none_draws_from_torchs_generator(tiny_policy):
    policy = _flat(tiny_policy)
    prompts = _ids(policy, PROMPTS)

    def run(seed):
        torch.manual_seed(seed)
        return [s.ids for s in policy.sample_ids(prompts, max_new_tokens=8)]

    assert run(0) == run(0) and run(0) != run(1)


@pytest.mark.parametrize("greedy, temperature, top_p", [(False, 0.7, 0.9), (False, 1.3, 1.0), (True, 1.0, 1.0)])
def test_sample_ids_behaviour_logprobs_equal_a_forward_pass(tiny_policy, greedy, temperature, top_p):
    policy = _flat(tiny_policy, 0.5)
    prompts = _ids(policy, PROMPTS)
    out = policy.sample_ids(prompts, max_new_tokens=[3, 10, 7, 12], temperature=temperature, top_p=top_p,
                            greedy=greedy, streams=[(1, k) for k in range(4)])
    rollouts = [Rollout("", p, "", s.ids, s.logprobs) for p, s in zip(prompts, out)]
    batch, old = rollout_batch(policy, rollouts)
    with torch.no_grad():
        new, _ = policy.token_logprobs(batch, temperature=1.0 if greedy else temperature)
    assert (new - old).abs().max().item() < 1e-4
    assert all(len(s.logprobs) == len(s.ids) > 0 for s in out)


def test_per_prompt_budgets_are_honoured(tiny_policy):
    policy = _flat(tiny_policy, 0.1)  # near-uniform: EOS ~1/101 per token
    prompts = _ids(policy, PROMPTS) * 4
    budgets = [1, 2, 5, 9] * 4
    out = policy.sample_ids(prompts, max_new_tokens=budgets, streams=[(2, k) for k in range(16)])
    eos = policy.eos_token_id
    for s, b in zip(out, budgets):
        assert len(s.ids) <= b and eos not in s.ids[:-1]
        assert s.finish == ("eos" if s.ids[-1] == eos else "length")
        if s.finish == "length":
            assert len(s.ids) == b
    assert sum(s.finish == "length" for s in out) >= 12


def _a_stop_in(policy, ids, start=3):
    """(k, stop): a 2-character stop string completed first by token k (1-based) of `ids`, k >= start."""
    pieces = [policy.tokenizer.decode([i], skip_special_tokens=True) for i in ids]
    for k in range(start, len(ids) + 1):
        if len(pieces[k - 2]) == len(pieces[k - 1]) == 1:
            stop = pieces[k - 2] + pieces[k - 1]
            if stop not in "".join(pieces[: k - 1]):
                return k, stop
    raise AssertionError("no usable stop string in the sample")


@pytest.mark.parametrize("shared_prefix", [None, False], ids=["prefix-tree", "transformers-generate"])
def test_stop_string_ends_the_turn_at_the_completing_token(tiny_policy, shared_prefix):
    policy = _flat(tiny_policy, 0.5)
    policy.shared_prefix = shared_prefix
    (prompt,) = _ids(policy, ["12+34="])
    stream = [(4, 4)]
    (free,) = policy.sample_ids([prompt], max_new_tokens=20, streams=stream)
    k, stop = _a_stop_in(policy, free.ids[:-1] if free.finish == "eos" else free.ids)
    (s,) = policy.sample_ids([prompt], max_new_tokens=20, stop=[stop], streams=stream)
    assert (s.ids, s.finish) == (free.ids[:k], "stop") and s.logprobs == pytest.approx(free.logprobs[:k], abs=1e-6)
    # exact fit: the last budget token completes the stop string -> "stop", not "length"
    (fit,) = policy.sample_ids([prompt], max_new_tokens=k, stop=[stop], streams=stream)
    assert (fit.ids, fit.finish) == (free.ids[:k], "stop")
    (short,) = policy.sample_ids([prompt], max_new_tokens=k - 1, stop=[stop], streams=stream)
    assert (short.ids, short.finish) == (free.ids[: k - 1], "length")
    # several stop strings: the one completed first wins, whatever their order
    k2, later = _a_stop_in(policy, free.ids, k + 1)
    (first,) = policy.sample_ids([prompt], max_new_tokens=20, stop=["\x7f\x7f", later, stop], streams=stream)
    assert (first.ids, first.finish) == (free.ids[:k], "stop") and k2 > k


def test_stop_string_in_the_prompt_does_not_count_for_sample_ids(tiny_policy):
    policy = _flat(tiny_policy, 0.5)
    (prompt,) = _ids(policy, ["12+34="])
    stream = [(4, 4)]
    (free,) = policy.sample_ids([prompt], max_new_tokens=6, streams=stream)
    first = policy.tokenizer.decode(free.ids[:1], skip_special_tokens=True)
    assert len(first) == 1 and ("=" + first) not in policy.tokenizer.decode(free.ids)
    (s,) = policy.sample_ids([prompt], max_new_tokens=6, stop=["=" + first], streams=stream)
    assert s.ids == free.ids and s.finish == free.finish  # the "=" is the prompt's: no stop
    # generate's `stop` counts a string that starts in the prompt (search's step sampling relies on it)
    (r,) = policy.generate(["12+34="], max_new_tokens=6, stop="=" + first, streams=stream)
    assert r.completion_ids == free.ids[:1] and not r.truncated


def test_rows_that_stopped_cost_no_more_forward_passes(tiny_policy):
    policy = _flat(tiny_policy, 0.5)
    (prompt,) = _ids(policy, ["12+34="])
    (free,) = policy.sample_ids([prompt], max_new_tokens=20, streams=[(4, 4)])
    k, stop = _a_stop_in(policy, free.ids[:-1] if free.finish == "eos" else free.ids)
    calls = []
    hook = policy.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        (s,) = policy.sample_ids([prompt], max_new_tokens=60, stop=[stop], streams=[(4, 4)])
    finally:
        hook.remove()
    assert len(s.ids) == k and len(calls) == k  # the prefill and k - 1 steps, not 60


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_both_samplers_give_the_same_ids_for_the_same_streams(tiny_policy, temperature, top_p):
    policy = _flat(tiny_policy)
    prompts = _ids(policy, PROMPTS) + _ids(policy, ["7="])  # prompt "7=" twice: rows share a node in the tree
    kw = dict(max_new_tokens=[4, 12, 20, 20, 9], temperature=temperature, top_p=top_p,
              streams=[(3, k) for k in range(5)])
    free = policy.sample_ids(prompts, **kw)
    _, stop = _a_stop_in(policy, free[2].ids)  # completed by a token of row 2, before its budget of 20
    kw["stop"] = [stop]
    tree = policy.sample_ids(prompts, **kw)
    policy.shared_prefix = False
    plain = policy.sample_ids(prompts, **kw)
    assert [(s.ids, s.finish) for s in tree] == [(s.ids, s.finish) for s in plain]
    for a, b in zip(tree, plain):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert tree[2].finish == "stop" and any(s.finish == "length" for s in tree)
    # generate: n samples per prompt through transformers' generate, one stream per rollout
    streams = [(5, k) for k in range(6)]
    g_plain = policy.generate(PROMPTS[:3], n=2, max_new_tokens=10, temperature=temperature, top_p=top_p,
                              streams=streams)
    policy.shared_prefix = None
    g_tree = policy.generate(PROMPTS[:3], n=2, max_new_tokens=10, temperature=temperature, top_p=top_p,
                             streams=streams)
    assert [r.completion_ids for r in g_tree] == [r.completion_ids for r in g_plain]


def test_generate_with_streams_is_reproducible_across_batches_and_seeds(tiny_policy):
    policy = _flat(tiny_policy)
    streams = [(0, 7, k) for k in range(8)]
    torch.manual_seed(0)
    a = policy.generate(PROMPTS, n=2, max_new_tokens=12, streams=streams)
    torch.manual_seed(1)
    b = policy.generate(PROMPTS, n=2, max_new_tokens=12, streams=streams, batch_size=1)
    torch.manual_seed(2)
    c = policy.generate(PROMPTS[2:], n=2, max_new_tokens=12, streams=streams[4:])
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert [r.completion_ids for r in a[4:]] == [r.completion_ids for r in c]
    assert [r.completion_ids for r in a][::2] != [r.completion_ids for r in a][1::2]  # a group's 2 streams differ
    with pytest.raises(ValueError, match="generation.streams: expected one per rollout"):
        policy.generate(PROMPTS, n=2, streams=streams[:4])


def test_budget_is_clamped_to_the_context_window(tiny_policy):
    policy = _flat(tiny_policy, 0.05)
    window = policy.context_window
    prompt = [1] + [20] * (window - 4)  # 3 tokens of room
    outs = policy.sample_ids([prompt] * 4, max_new_tokens=10, streams=[(k,) for k in range(4)])
    assert all(len(prompt) + len(s.ids) <= window for s in outs)
    assert any(s.finish == "length" and len(s.ids) == 3 for s in outs)
    with pytest.raises(ValueError, match=r"prompts\[1\]: 256 tokens leave no room in the context window of 256"):
        policy.sample_ids([[1], [1] * window], max_new_tokens=1)


@pytest.mark.parametrize(
    "prompts, kwargs, message",
    [
        ([[1, 5], []], {}, r"prompts\[1\]: empty prompt"),
        ([[1, 500]], {}, r"prompts\[0\]: token id outside the vocabulary \[0, 101\)"),
        ([[1, 5]], dict(max_new_tokens=0), "max_new_tokens: every budget must be >= 1"),
        ([[1, 5], [1]], dict(max_new_tokens=[3]), "max_new_tokens: 1 budgets for 2 prompts"),
        ([[1, 5]], dict(streams=[(1,), (2,)]), "streams: 2 streams for 1 prompts"),
        ([[1, 5]], dict(streams=[(1.0,)]), r"streams\[0\]: expected a non-empty tuple of ints"),
        ([[1, 5]], dict(stop=[""]), "stop: expected non-empty strings"),
        ([[1, 5]], dict(temperature=0.0), "temperature: must be > 0"),
        ([[1, 5]], dict(top_p=1.5), r"top_p: must be in \(0, 1\]"),
    ],
)
def test_sample_ids_validates_its_inputs(tiny_policy, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_policy.sample_ids(prompts, **{"max_new_tokens": 4, **kwargs})


def test_sample_ids_gives_the_model_the_ids_as_they_are(tiny_policy):
    # ids no text encodes (a BOS in the middle, a pad) reach the model unchanged: the greedy continuation equals the
    # argmax of one forward pass over exactly those ids
    prompt = [1, 20, 1, 0, 30]
    (s,) = tiny_policy.sample_ids([prompt], max_new_tokens=1, greedy=True)
    with torch.no_grad():
        logits = tiny_policy.model(torch.tensor([prompt])).logits[0, -1]
    assert s.ids == [int(logits.argmax())]
    assert s.logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1).max()), abs=1e-5)
    assert tiny_policy.sample_ids([], max_new_tokens=3) == []
