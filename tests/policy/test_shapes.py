"""Real-shape models (`rewardlab.policy.shapes`): the configs match their sources, the tokenizer has exactly the
vocabulary and round-trips text, and the small shape trains through `load_policy` like any checkpoint."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

from rewardlab.policy import load_policy, rollout_batch
from rewardlab.policy.shapes import (
    QWEN_VOCAB_SIZE,
    SHAPES,
    SPECIAL_TOKENS,
    build_shape_tokenizer,
    byte_symbols,
    count_parameters,
    create_shape_model,
    get_shape,
    shape_config,
)

TOKENIZER = build_shape_tokenizer()


# ---------------------------------------------------------------- configs
def test_qwen25_05b_config_matches_its_config_json():
    c = shape_config("qwen2.5-0.5b")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (896, 24, 14, 2)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings) == (4864, 151_936, True)
    assert c.rope_parameters["rope_theta"] == 1e6 and c.rms_norm_eps == 1e-6
    assert c.max_position_embeddings == 32_768 and not c.use_sliding_window and c.hidden_act == "silu"
    assert c.eos_token_id == c.bos_token_id == 151_643


def test_qwen2_small_config():
    c = shape_config("qwen2-small")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (256, 2, 4, 2)
    assert (c.intermediate_size, c.vocab_size, c.tie_word_embeddings) == (1408, 151_936, True)
    assert c.hidden_size // c.num_attention_heads == 896 // 14  # Qwen2.5-0.5B's head size


def test_parameter_counts_without_allocating():
    # Qwen2.5-0.5B: 494,032,768 parameters (0.49B; 0.36B without the 151,936 x 896 embedding), on the meta device.
    assert count_parameters("qwen2.5-0.5b") == 494_032_768
    assert 494_032_768 - 151_936 * 896 == pytest.approx(0.36e9, rel=0.01)
    for name, shape in SHAPES.items():
        assert count_parameters(name) == shape.parameters, name


def test_unknown_shape_is_one_line_error():
    with pytest.raises(ValueError, match="unknown model shape 'gpt5'; known: qwen2-small, qwen2.5-0.5b"):
        get_shape("gpt5")


# ---------------------------------------------------------------- tokenizer
def test_tokenizer_has_exactly_the_vocabulary():
    assert len(TOKENIZER) == QWEN_VOCAB_SIZE == 151_936
    assert TOKENIZER.eos_token_id == TOKENIZER.pad_token_id == 151_643
    assert TOKENIZER.bos_token is None and not TOKENIZER.chat_template
    assert TOKENIZER.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(SPECIAL_TOKENS.values())
    assert TOKENIZER.convert_ids_to_tokens([256, 151_935]) == ["<|filler_256|>", "<|filler_151935|>"]
    assert sorted(byte_symbols()) == sorted(pre_tokenizers.ByteLevel.alphabet())


def test_prompts_encode_one_token_per_byte():
    assert TOKENIZER("3+4=")["input_ids"] == [ord(c) for c in "3+4="]  # no BOS, no EOS
    # text spelling a special token is encoded byte by byte: task text never ends a sequence
    assert TOKENIZER.eos_token_id not in TOKENIZER("a<|endoftext|>")["input_ids"]


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_tokenizer_round_trips_any_text(text):
    ids = TOKENIZER(text)["input_ids"]
    assert len(ids) == len(text.encode("utf-8")) and max(ids, default=0) < 256
    assert TOKENIZER.decode(ids) == text


def test_fillers_decode_to_their_names():
    assert TOKENIZER.decode([300, 65, 151_643], skip_special_tokens=True) == "<|filler_300|>A"


# ---------------------------------------------------------------- the model directory
@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    return create_shape_model(tmp_path_factory.mktemp("shape") / "qwen2-small", "qwen2-small", seed=3)


def test_small_shape_loads_as_a_hf_directory(small_dir):
    model = AutoModelForCausalLM.from_pretrained(small_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.get_input_embeddings().num_embeddings == 151_936
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    assert len(AutoTokenizer.from_pretrained(small_dir)) == 151_936


def test_same_seed_same_weights(small_dir, tmp_path):
    again = create_shape_model(tmp_path / "again", "qwen2-small", seed=3)
    a, b = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (small_dir, again))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_small_shape_samples_and_scores_through_load_policy(small_dir):
    policy = load_policy(str(small_dir), key="model.path")
    assert policy.prompt_format == "raw"
    torch.manual_seed(0)
    rollouts = policy.generate(["3+4=", "12-5="], n=2, max_new_tokens=3, temperature=1.0)
    assert [r.prompt_ids for r in rollouts[:1]] == [[ord(c) for c in "3+4="]]
    assert all(len(r.completion_ids) == 3 or r.completion_ids[-1] == 151_643 for r in rollouts)
    batch, behaviour = rollout_batch(policy, rollouts)
    logprobs, _ = policy.token_logprobs(batch)
    # random weights: every token about as likely as any other, log p ~ -log(151,936) = -11.9
    on = batch.mask > 0
    assert torch.allclose(logprobs[on], behaviour[on], atol=1e-4)
    assert (logprobs[on] - (-11.93)).abs().max() < 2.0


def test_create_refuses_unknown_dtype(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        create_shape_model(tmp_path / "m", "qwen2-small", dtype="int8")
