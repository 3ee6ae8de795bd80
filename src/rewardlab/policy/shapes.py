"""Models with real architectures and vocabulary sizes and random weights, built offline: what a real model costs in
memory and time (benchmarks/real_shape.py) without downloading one.

A shape is a Qwen2 configuration (`transformers.Qwen2Config`) and a tokenizer made here with exactly the model's
vocabulary size, 151,936 for both shapes below:

- ids 0-255: the 256 bytes (byte-level, as Qwen's BPE is): any text encodes, one token per UTF-8 byte, and
  decodes back to itself;
- ids 151,643-151,645: `<|endoftext|>` (end of sequence and padding, as in Qwen2.5 base models), `<|im_start|>`,
  `<|im_end|>`, at the ids Qwen2.5's tokenizer gives them;
- every other id: a filler token `<|filler_ID|>`, which no text encodes to (there are no merges) but which a model
  with random weights samples and which decodes to its own name, so the LM head, softmax and embedding have their
  full 151,936 rows.

There is no BOS token and no chat template (prompts are raw text), so rewardlab's `train` and TRL's `GRPOTrainer`
tokenize a prompt to the same ids. The directory `create_shape_model` writes is a normal Hugging Face model
directory (config.json, model.safetensors, tokenizer.json): `rewardlab train --model DIR`, `AutoModelForCausalLM` and
`AutoTokenizer` open it offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

#: Qwen2.5's embedding rows (config.json `vocab_size`; its tokenizer has 151,665 tokens, the rest are padding).
QWEN_VOCAB_SIZE = 151_936
#: Qwen2.5's first special tokens and their ids (tokenizer_config.json `added_tokens_decoder`).
SPECIAL_TOKENS = {"<|endoftext|>": 151_643, "<|im_start|>": 151_644, "<|im_end|>": 151_645}
EOS_TOKEN = "<|endoftext|>"
BYTES = 256

#: Settings every Qwen2.5 config.json shares (Qwen2.5-0.5B/1.5B/...): rotary base 1e6, RMSNorm eps 1e-6, SiLU MLP,
#: context of 32,768 tokens, no sliding window; BOS = EOS = <|endoftext|>.
QWEN2_COMMON: dict[str, Any] = {
    "vocab_size": QWEN_VOCAB_SIZE,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "bos_token_id": SPECIAL_TOKENS[EOS_TOKEN],
    "eos_token_id": SPECIAL_TOKENS[EOS_TOKEN],
    "pad_token_id": SPECIAL_TOKENS[EOS_TOKEN],
}


@dataclass(frozen=True)
class Shape:
    """A model architecture: `Qwen2Config` keyword arguments and where they come from.

    Attributes:
        name: the registry key, e.g. "qwen2.5-0.5b".
        config: `transformers.Qwen2Config` keyword arguments (the vocabulary included).
        parameters: the parameter count (tied embedding counted once), pinned by tests/policy/test_shapes.py.
        source: where the values come from.
    """

    name: str
    config: dict[str, Any] = field(repr=False)
    parameters: int
    source: str


def _qwen2(name: str, hidden: int, layers: int, heads: tuple[int, int], mlp: int, parameters: int,
           source: str) -> Shape:
    """A Qwen2.5-style shape: `QWEN2_COMMON`, tied embeddings, `heads` = (query, key-value) heads."""
    return Shape(name, {**QWEN2_COMMON, "hidden_size": hidden, "num_hidden_layers": layers,
                        "num_attention_heads": heads[0], "num_key_value_heads": heads[1], "intermediate_size": mlp,
                        "tie_word_embeddings": True, "max_window_layers": layers}, parameters, source)


#: The shapes by name.
SHAPES: dict[str, Shape] = {shape.name: shape for shape in (
    _qwen2("qwen2.5-0.5b", 896, 24, (14, 2), 4_864, 494_032_768,
           "Qwen/Qwen2.5-0.5B's config.json (hidden 896, 24 layers, 14 query / 2 key-value heads of 64, MLP 4,864, "
           "vocabulary 151,936, tied embeddings, rope_theta 1e6, rms_norm_eps 1e-6, 32,768 positions); Qwen2.5 "
           "technical report (Qwen Team, 2024, arXiv:2412.15115), Table 1 (layers, heads, tied embedding); the "
           "model card: 0.49B parameters, 0.36B without the embedding"),
    _qwen2("qwen2-small", 256, 2, (4, 2), 1_408, 41_453_824,
           "Qwen2.5's vocabulary (151,936) and settings on a small body: width 256, 2 layers, 4 query / 2 key-value "
           "heads of 64 (Qwen2.5-0.5B's head size), MLP 1,408 (0.5B's ratio 4,864 / 896 = 5.43 x 256, rounded up "
           "to a multiple of 64), tied embeddings: the vocabulary (38.9M of 41.5M parameters) dominates, as it does "
           "the memory of log-probs over long completions"),
)}


def get_shape(name: str) -> Shape:
    """The registered shape `name`.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(sorted(SHAPES))}")
    return SHAPES[name]


def shape_config(name: str) -> Qwen2Config:
    """The `Qwen2Config` of shape `name` (see `SHAPES`).

    Raises:
        ValueError: an unknown name.
    """
    return Qwen2Config(**get_shape(name).config)


def count_parameters(name: str) -> int:
    """Parameters of shape `name` (a tied embedding counted once), counted on the meta device: no weight is
    allocated.

    Raises:
        ValueError: an unknown name.
    """
    with torch.device("meta"):
        model = Qwen2ForCausalLM(shape_config(name))
    return sum(p.numel() for p in model.parameters())


def build_shape_tokenizer(vocab_size: int = QWEN_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer of exactly `vocab_size` tokens (see the module docstring for the layout).

    Encoding: one token per UTF-8 byte (id = byte value), no BOS or EOS added; text that spells a special token
    (e.g. "<|endoftext|>") is encoded byte by byte (`split_special_tokens`), so task text cannot end a sequence.
    Decoding a byte sequence gives the text back; a filler decodes to its name.

    Raises:
        ValueError: a `vocab_size` too small to hold the bytes and Qwen's special-token ids.
    """
    if vocab_size <= max(SPECIAL_TOKENS.values()):
        raise ValueError(f"vocab_size: must be > {max(SPECIAL_TOKENS.values())}, got {vocab_size}")
    specials = {i: tok for tok, i in SPECIAL_TOKENS.items()}
    vocab = {sym: b for b, sym in enumerate(byte_symbols())}
    for i in range(BYTES, vocab_size):
        vocab[specials.get(i, f"<|filler_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
        model_max_length=QWEN2_COMMON["max_position_embeddings"],
    )


def byte_symbols() -> list[str]:
    """The 256 characters byte-level tokenizers (GPT-2, Qwen) write bytes as, indexed by byte: a printable byte
    (33-126, 161-172, 174-255) stands for itself, the others for chr(256 + k) in byte order (Radford et al., 2019,
    GPT-2's `bytes_to_unicode`; the alphabet of `tokenizers.pre_tokenizers.ByteLevel`)."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    symbols, k = [], 0
    for b in range(BYTES):
        symbols.append(chr(b) if b in printable else chr(BYTES + k))
        k += b not in printable
    return symbols


def build_shape_model(name: str, *, seed: int = 0, dtype: str = "float32") -> Qwen2ForCausalLM:
    """A `Qwen2ForCausalLM` of shape `name` with random weights (transformers' initialization: normal(0, 0.02)
    linear and embedding weights, zero biases, unit norms), drawn from `seed` without touching torch's global RNG.

    Memory: 4 bytes a parameter in float32 (the 0.5B shape: 1.98 GB), 2 in bfloat16/float16.

    Raises:
        ValueError: an unknown name or dtype.
    """
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise ValueError(f"dtype: expected one of {sorted(dtypes)}, got {dtype!r}")
    config = shape_config(name)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = config.pad_token_id
    return model.to(dtypes[dtype])


def create_shape_model(path: str | Path, name: str, *, seed: int = 0, dtype: str = "float32") -> Path:
    """Build shape `name` (random weights from `seed`, saved in `dtype`) and its tokenizer, and save both as a Hugging
    Face model directory at `path` (created; existing files in it are overwritten); returns `path`.

    Disk: the weights' bytes (the 0.5B shape: 1.98 GB in float32) plus a 4 MB tokenizer.json.

    Raises:
        ValueError: an unknown name or dtype.
    """
    path = Path(path)
    model = build_shape_model(name, seed=seed, dtype=dtype)
    model.save_pretrained(path)
    build_shape_tokenizer(model.config.vocab_size).save_pretrained(path)
    return path
