"""Policies: any Hugging Face causal LM (`hf.Policy`) and the embedded tiny model (`tiny`); packing (`batch`) and
sampling (`sampling`) helpers."""

from __future__ import annotations

from typing import Any

from rewardlab.policy.batch import Batch, rollout_batch
from rewardlab.policy.hf import Policy


def load_policy(
    path: str,
    *,
    prompt_format: str = "auto",
    dtype: str = "float32",
    device: str = "cpu",
    tiny_arch: dict[str, Any] | None = None,
    seed: int = 0,
    key: str = "model.path",
    autocast: str | None = None,
    gradient_checkpointing: bool = False,
    logprob_chunk_tokens: int | None = None,
    lora: dict[str, Any] | None = None,
) -> Policy:
    """`path` "tiny": the embedded model with fresh weights (seeded); otherwise a local Hugging Face model directory.

    Args:
        autocast, gradient_checkpointing, logprob_chunk_tokens: see `Policy`.
        lora: LoRA adapter settings (`config.LoraConfig` as a dict: r, alpha, dropout, target_modules), or None.
    Raises:
        ValueError: one line naming `key` for a path that does not exist (hub ids included: nothing is downloaded),
            is not a model directory or does not load; see `Policy.load`.
    """
    if lora is not None:
        raise ValueError("model.lora: LoRA is not available yet")
    options = {"autocast": autocast, "gradient_checkpointing": gradient_checkpointing,
               "logprob_chunk_tokens": logprob_chunk_tokens}
    if path == "tiny":
        from rewardlab.policy.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed=seed, **(tiny_arch or {})).to(device)
        return Policy(model, tokenizer, prompt_format, **options)
    return Policy.load(path, prompt_format=prompt_format, dtype=dtype, device=device, key=key, **options)


__all__ = ["Batch", "Policy", "load_policy", "rollout_batch"]
