"""The embedded tiny model and `Policy`: tokenizer round trip, HF format, generation and its log-probs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import TINY_ARCH
from rewardlab.policy import Policy, load_policy, rollout_batch
from rewardlab.policy.tiny import CHARACTERS, build_model, build_tokenizer, create_tiny

TOKENIZER = build_tokenizer()
PROMPTS = ["1+2=", "12+34+5=", "7="]  # 5, 9 and 3 ids with BOS: left padding differs per row


# ---------------------------------------------------------------- tokenizer
def test_vocabulary_layout():
    # 4 special tokens + 95 printable ASCII (32..126) + newline + tab = 101.
    assert len(TOKENIZER) == 101
    assert (TOKENIZER.pad_token_id, TOKENIZER.bos_token_id, TOKENIZER.eos_token_id, TOKENIZER.unk_token_id) == (0, 1, 2, 3)
    assert TOKENIZER.convert_ids_to_tokens([4, 98, 99, 100]) == [" ", "~", "\n", "\t"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=CHARACTERS, max_size=60))
def test_tokenizer_round_trip(text):
    ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert TOKENIZER.unk_token_id not in ids
    assert TOKENIZER.decode(ids) == text


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=CHARACTERS, max_size=30))
def test_tokenizer_prepends_bos(text):
    ids = TOKENIZER(text)["input_ids"]
    assert ids[0] == TOKENIZER.bos_token_id and len(ids) == len(text) + 1
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("text", ["</s>", "<s>", "<pad>", "<unk>", "a</s>b"])
def test_tokenizer_text_spelling_a_special_token_stays_text(text):
    ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and not set(ids) & {0, 1, 2, 3}  # no pad/bos/eos/unk injected by text
    assert TOKENIZER.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_unknown_character_is_unk():
    assert TOKENIZER("é", add_special_tokens=False)["input_ids"] == [TOKENIZER.unk_token_id]


def test_tokenizer_reload_gives_same_ids(tmp_path):
    TOKENIZER.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Q: 3 + 4 =\n\tA: 7 ~! </s>"  # the reloaded tokenizer also keeps "</s>" as text
    assert reloaded(text)["input_ids"] == TOKENIZER(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text


# ---------------------------------------------------------------- model files
def test_create_tiny_opens_with_transformers(tmp_path):
    path = create_tiny(tmp_path / "tiny", **TINY_ARCH)
    assert (path / "model.safetensors").is_file() and not list(path.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.hidden_size == 32 and model.config.vocab_size == len(tok) == 101
    fresh = build_model(build_tokenizer(), seed=0, **TINY_ARCH)
    for (name, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(fresh.state_dict().items())):
        assert torch.equal(a, b), name


def test_build_model_is_seeded():
    a = build_model(TOKENIZER, seed=0, **TINY_ARCH)
    b = build_model(TOKENIZER, seed=0, **TINY_ARCH)
    c = build_model(TOKENIZER, seed=1, **TINY_ARCH)
    w = "model.embed_tokens.weight"
    assert torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert not torch.equal(a.state_dict()[w], c.state_dict()[w])


def test_build_model_rejects_unknown_arch_key():
    with pytest.raises(ValueError, match="unknown key"):
        build_model(TOKENIZER, hidden=3)


def test_policy_save_and_load_round_trip(tmp_path, tiny_policy):
    tiny_policy.save(tmp_path / "p")
    loaded = Policy.load(tmp_path / "p")
    ids = torch.tensor([TOKENIZER("3+4=")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(tiny_policy.model(ids).logits, loaded.model(ids).logits)
    assert loaded.prompt_format == "raw"


def test_policy_rejects_bad_prompt_formats(tiny_policy):
    with pytest.raises(ValueError, match="prompt_format"):
        Policy(tiny_policy.model, TOKENIZER, "markdown")
    with pytest.raises(ValueError, match="no chat template"):
        Policy(tiny_policy.model, TOKENIZER, "chat")


def test_policy_load_rejects_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="model.dtype"):
        Policy.load(tmp_path, dtype="int8")


# ---------------------------------------------------------------- packing
def test_encode_prompt_and_target(tiny_policy):
    assert tiny_policy.encode_prompt("1+2=") == [1] + TOKENIZER("1+2=", add_special_tokens=False)["input_ids"]
    assert tiny_policy.encode_target("3") == TOKENIZER("3", add_special_tokens=False)["input_ids"] + [2]


def test_collate_left_pads_prompts_and_right_pads_completions(tiny_policy):
    b = tiny_policy.collate([[1, 5], [1]], [[7], [8, 9]])
    # P = 2, T = 2; pad id 0.
    assert b.prompt_len == 2
    assert b.input_ids.tolist() == [[1, 5, 7, 0], [0, 1, 8, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    # positions count from each row's first real token (cumsum(attention) - 1, clamped at 0).
    assert b.position_ids.tolist() == [[0, 1, 2, 2], [0, 0, 1, 2]]
    assert b.completion_ids.tolist() == [[7, 0], [8, 9]]
    assert b.mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]


# ---------------------------------------------------------------- generation
def _max_logprob_gap(policy, rollouts, temperature):
    batch, old = rollout_batch(policy, rollouts)
    with torch.no_grad():
        new, _ = policy.token_logprobs(batch, temperature=temperature)
    assert old.shape == new.shape
    return (new - old).abs().max().item()


@pytest.mark.parametrize("shared_prefix", [None, False], ids=["shared-prefix", "transformers-generate"])
@pytest.mark.parametrize(
    "kwargs, temperature",
    [
        (dict(n=3, temperature=0.7, top_p=0.9), 0.7),
        (dict(n=2, temperature=1.3), 1.3),
        (dict(greedy=True), 1.0),
    ],
)
def test_behaviour_logprobs_equal_forward_pass(tiny_policy, kwargs, temperature, shared_prefix):
    tiny_policy.shared_prefix = shared_prefix
    torch.manual_seed(0)
    rollouts = tiny_policy.generate(PROMPTS, max_new_tokens=12, **kwargs)
    assert all(len(r.logprobs) == len(r.completion_ids) > 0 for r in rollouts)
    assert all(lp <= 0.0 for r in rollouts for lp in r.logprobs)
    assert _max_logprob_gap(tiny_policy, rollouts, temperature) < 1e-4


@pytest.mark.parametrize("shared_prefix", [None, False], ids=["shared-prefix", "transformers-generate"])
def test_behaviour_logprobs_match_after_eos(tiny_policy, shared_prefix):
    # Flatten the output distribution so some completions sample EOS early: mixed lengths, right padding (and, in
    # the shared-prefix sampler, rows leaving the batch mid-way).
    tiny_policy.shared_prefix = shared_prefix
    torch.manual_seed(1)
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(0.1)  # logits near 0: each token, EOS included, ~1/101
    rollouts = tiny_policy.generate(PROMPTS, n=8, temperature=1.0, max_new_tokens=40)
    lengths = {len(r.completion_ids) for r in rollouts}
    assert any(not r.truncated for r in rollouts) and len(lengths) > 1
    assert _max_logprob_gap(tiny_policy, rollouts, 1.0) < 1e-4


def test_completions_end_at_eos_or_are_truncated(tiny_policy):
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(0.1)
    eos = TOKENIZER.eos_token_id
    rollouts = tiny_policy.generate(PROMPTS, n=8, max_new_tokens=30)
    for r in rollouts:
        if r.truncated:
            assert len(r.completion_ids) == 30 and eos not in r.completion_ids
        else:
            assert r.completion_ids[-1] == eos and eos not in r.completion_ids[:-1]
            assert len(r.completion_ids) <= 30
        assert r.completion == TOKENIZER.decode(r.completion_ids, skip_special_tokens=True)
    assert {r.truncated for r in rollouts} == {True, False}  # both cases occurred


@pytest.mark.parametrize("shared_prefix", [None, False], ids=["shared-prefix", "transformers-generate"])
def test_sampling_has_no_top_k(tiny_policy, shared_prefix):
    # One prompt, a near-uniform next-token distribution (logits ~0): 600 draws of the first token cover nearly all
    # 101 tokens. transformers fills an unset top_k with 50, which would cap the distinct first tokens at 50.
    tiny_policy.shared_prefix = shared_prefix
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(0.01)
    rollouts = tiny_policy.generate(["7="], n=600, temperature=1.0, max_new_tokens=1)
    assert len({r.completion_ids[0] for r in rollouts}) > 80


def test_shared_prefix_greedy_equals_transformers_generate(tiny_policy):
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(0.3)  # flatter logits: some rows end early, some run to the limit
    prompts = PROMPTS + ["9+9+9=", "1="]
    shared = tiny_policy.generate(prompts, greedy=True, max_new_tokens=10)
    tiny_policy.shared_prefix = False
    plain = tiny_policy.generate(prompts, greedy=True, max_new_tokens=10)
    assert [r.completion_ids for r in shared] == [r.completion_ids for r in plain]
    assert [r.truncated for r in shared] == [r.truncated for r in plain]
    for a, b in zip(shared, plain):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_prefix_tree_sampling_shares_then_splits_prefixes(tiny_policy):
    # Peaked logits: the 8 samples of a prompt often draw the same first tokens, then diverge. The sampler runs one
    # row per distinct prefix and regroups every step; wrong cache rows would show as log-probs that differ from a
    # forward pass over the completed rows.
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(10.0)
    rollouts = tiny_policy.generate(PROMPTS, n=8, temperature=1.0, max_new_tokens=8)
    for g in range(len(PROMPTS)):
        completions = [tuple(r.completion_ids) for r in rollouts if r.group == g]
        assert len({c[0] for c in completions}) < len(set(completions))  # shared first tokens, split later
    assert len({len(r.completion_ids) for r in rollouts}) > 1
    assert _max_logprob_gap(tiny_policy, rollouts, 1.0) < 1e-4


def test_top_p_filter_hand_computed_and_as_transformers():
    from transformers import TopPLogitsWarper

    from rewardlab.policy.sampling import top_p_filter

    scores = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # ascending cumulative mass 0.05, 0.20, 0.50, 1.00: with top_p = 0.7 the tokens at <= 0.3 go (0.05 and 0.15).
    kept = torch.isfinite(top_p_filter(scores, 0.7))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(scores, 0.01)).tolist() == [[True, False, False, False]]  # at least one
    assert torch.equal(top_p_filter(scores, 1.0), scores)
    torch.manual_seed(0)
    x = torch.randn(64, 101) * 3
    for p in (0.3, 0.9, 0.99):
        assert torch.equal(top_p_filter(x, p), TopPLogitsWarper(top_p=p)(None, x.clone()))


@pytest.mark.parametrize("rows", ["prompt-major", "shuffled", "subset", "duplicates"])
def test_shared_prefix_logprobs_and_gradients_equal_one_forward_pass(tiny_policy, rows):
    # 3 prompts x 4 samples of different lengths: the scorer runs each prompt once and the completions on its
    # repeated cache (broadcast for equal groups in any row order, index_select for unequal ones); values and
    # parameter gradients must match one forward pass over every row.
    torch.manual_seed(0)
    with torch.no_grad():
        tiny_policy.model.model.norm.weight.mul_(0.3)
    rollouts = tiny_policy.generate(PROMPTS, n=4, temperature=1.0, max_new_tokens=6)
    assert len({len(r.completion_ids) for r in rollouts}) > 1
    batch, _ = rollout_batch(tiny_policy, rollouts)
    if rows == "shuffled":
        batch = batch.select(torch.randperm(len(rollouts)))
    elif rows == "subset":  # unequal groups, as in a minibatch: 4 + 2 + 1 rows
        batch = batch.select(torch.tensor([9, 0, 1, 2, 3, 5, 6]))
    elif rows == "duplicates":  # identical rows (samples that coincide) are computed once
        batch = batch.select(torch.tensor([0, 5, 0, 1, 11, 5, 2, 0, 3, 4, 6, 7, 8, 9, 10, 11]))
    model = tiny_policy.model

    def run(shared_prefix):
        tiny_policy.shared_prefix = shared_prefix
        model.zero_grad()
        logprobs, entropy = tiny_policy.token_logprobs(batch, temperature=0.8, with_entropy=True)
        (logprobs * torch.linspace(-1, 1, logprobs.numel()).view_as(logprobs)).sum().backward()
        return logprobs.detach(), entropy, {k: p.grad.clone() for k, p in model.named_parameters()}

    lp_shared, ent_shared, grads_shared = run(None)
    lp_plain, ent_plain, grads_plain = run(False)
    assert torch.allclose(lp_shared, lp_plain, atol=1e-5) and torch.allclose(ent_shared, ent_plain, atol=1e-5)
    for name, g in grads_plain.items():
        assert torch.allclose(grads_shared[name], g, atol=1e-5, rtol=1e-4), name


def test_rollouts_are_prompt_major(tiny_policy):
    rows = [{"prompt": p, "answer": str(i)} for i, p in enumerate(PROMPTS)]
    rollouts = tiny_policy.generate(PROMPTS, n=2, max_new_tokens=3, rows=rows)
    # 3 prompts x 2 samples; rollout k belongs to prompt k // 2.
    assert [r.group for r in rollouts] == [0, 0, 1, 1, 2, 2]
    assert [r.prompt for r in rollouts] == ["1+2=", "1+2=", "12+34+5=", "12+34+5=", "7=", "7="]
    assert [r.row["answer"] for r in rollouts] == ["0", "0", "1", "1", "2", "2"]
    assert [r.prompt_ids for r in rollouts[::2]] == [[1] + TOKENIZER(p, add_special_tokens=False)["input_ids"]
                                                      for p in PROMPTS]


def test_generate_batch_size_keeps_prompt_groups(tiny_policy):
    rollouts = tiny_policy.generate(PROMPTS, n=2, max_new_tokens=3, batch_size=2)
    assert [r.group for r in rollouts] == [0, 0, 1, 1, 2, 2]
    assert [r.prompt for r in rollouts[::2]] == PROMPTS


def test_greedy_is_deterministic_and_restores_train_mode(tiny_policy):
    tiny_policy.model.train()
    a = tiny_policy.generate(PROMPTS, greedy=True, max_new_tokens=6)
    b = tiny_policy.generate(PROMPTS, greedy=True, max_new_tokens=6)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert tiny_policy.model.training


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(n=0), "n must be"),
        (dict(greedy=True, n=2), "n must be"),
    ],
)
def test_generate_validates_arguments(tiny_policy, kwargs, field):
    with pytest.raises(ValueError, match=field):
        tiny_policy.generate(["1="], **kwargs)


def test_token_logprobs_entropy_is_bounded(tiny_policy):
    batch = tiny_policy.collate([[1, 20], [1]], [[21, 2], [22]])
    with torch.no_grad():
        logprobs, entropy = tiny_policy.token_logprobs(batch, with_entropy=True)
    assert logprobs.shape == entropy.shape == (2, 2)
    # entropy of a 101-way distribution lies in [0, ln 101 ~ 4.615]; padded positions are 0.
    assert ((entropy >= 0) & (entropy <= torch.log(torch.tensor(101.0)) + 1e-5)).all()
    assert logprobs[1, 1].item() == 0.0 and entropy[1, 1].item() == 0.0


def test_load_policy_tiny_is_seeded():
    a = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    b = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    w = "model.embed_tokens.weight"
    assert torch.equal(a.model.state_dict()[w], b.model.state_dict()[w])
    assert a.prompt_format == "raw"


CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_chat_prompt_format_applies_the_tokenizer_template(tiny_policy):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    policy = Policy(tiny_policy.model, tokenizer, "auto")  # auto picks chat when the tokenizer has a template
    assert policy.prompt_format == "chat"
    text = policy.format_prompt("3+4=")
    assert text == "<|user|>3+4=\n<|assistant|>"
    # the template's text is the whole prompt: no BOS is added on top of it (one id per character).
    assert policy.encode_prompt(text) == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(policy.encode_prompt(text)) == len(text)
    (rollout,) = policy.generate(["3+4="], greedy=True, max_new_tokens=2)
    assert rollout.prompt == text
    raw = Policy(tiny_policy.model, tokenizer, "raw")
    assert raw.format_prompt("3+4=") == "3+4=" and raw.encode_prompt("3+4=")[0] == tokenizer.bos_token_id


def test_mark_steps_gives_token_spans_that_tile_the_completion(tiny_policy):
    from rewardlab.types import Rollout

    text = "1+2=3\n3+4=7"
    ids = tiny_policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [tiny_policy.tokenizer.eos_token_id]
    r = Rollout("q", [1], text, ids, [0.0] * len(ids))
    tiny_policy.mark_steps(r, "\n")
    # character tokenizer: "1+2=3\n" is tokens 0..5, "3+4=7" tokens 6..10, EOS (token 11) joins the last step
    assert r.steps == [(0, 6), (6, 12)]
    assert r.step_text == ["1+2=3\n", "3+4=7"]
    assert tiny_policy.tokenizer.decode(ids[6:12], skip_special_tokens=True) == "3+4=7"
