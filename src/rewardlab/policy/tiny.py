"""The embedded default model: a character-level tokenizer and a small Llama-architecture causal LM.

Both are created from code (no download) and saved in standard Hugging Face format (tokenizer.json + safetensors),
so `transformers.AutoTokenizer` / `AutoModelForCausalLM.from_pretrained` open them like any other checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
#: Printable ASCII, then newline and tab: every character the built-in tasks and templates use.
CHARACTERS = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")

#: Defaults of `build_model` (about 0.8M parameters): enough for 1-digit chain sums, fast on 2 CPU cores.
DEFAULT_ARCH = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 256,
}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, `<s>` prepended, decoding is exact concatenation.

    Vocabulary: `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, then printable ASCII, newline and tab (101 tokens).
    Characters outside it encode as `<unk>`. Text that spells a special token (e.g. "</s>") is encoded character
    by character (`split_special_tokens`), so task text can never inject an end-of-sequence token.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
        model_max_length=DEFAULT_ARCH["max_position_embeddings"],
    )


def build_model(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **arch: int) -> LlamaForCausalLM:
    """A randomly initialized Llama causal LM sized by `arch` (keys of `DEFAULT_ARCH`), float32.

    Raises:
        ValueError: an unknown architecture key.
    """
    unknown = set(arch) - set(DEFAULT_ARCH)
    if unknown:
        raise ValueError(f"model.tiny: unknown key(s) {sorted(unknown)}; valid: {sorted(DEFAULT_ARCH)}")
    cfg = dict(DEFAULT_ARCH, **arch)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_key_value_heads=cfg["num_attention_heads"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **cfg,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def create_tiny(path: str | Path, *, seed: int = 0, **arch: int) -> Path:
    """Create the tiny tokenizer and a fresh model and save both in HF format under `path`; returns `path`."""
    path = Path(path)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=seed, **arch)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
