"""Policies: any Hugging Face causal LM (`hf.Policy`) and the embedded tiny model (`tiny`), with or without a LoRA
adapter (`lora`); packing (`batch`) and sampling (`sampling`) helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rewardlab.modeldir import check_model_dir
from rewardlab.policy.batch import Batch, rollout_batch
from rewardlab.policy.hf import Policy, load_model_dir, torch_dtype
from rewardlab.policy.lora import BASE_DIR, add_adapter, import_peft, is_adapter_dir, load_merged
from rewardlab.policy.settings import SamplingSettings


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
    """The policy at `path`: "tiny" (the embedded model with fresh weights, seeded), a local Hugging Face model
    directory, or a LoRA adapter directory (a LoRA checkpoint: its base with the adapter merged, `lora.load_merged`);
    with `lora`, a fresh trainable LoRA adapter on top of that model (`lora.add_adapter`), its base frozen, its
    random A drawn from `seed` (torch's global generator left as it was).

    A LoRA checkpoint given as `path` with `lora` set (an SFT adapter that `train` starts from) is merged into its
    base first, and the new adapter trains on the merged model: the run's base, and so its KL reference, is the
    model the run starts from. A resumed LoRA run builds the same policy and loads its adapter weights into it
    (`rewardlab.train_state.load_weights`).

    Its keywords are the `model` config section's fields (`ModelConfig.policy_options()`), one each, so that a
    config and a Python caller build the same policy.

    Args:
        autocast, gradient_checkpointing, logprob_chunk_tokens: see `Policy`.
        lora: LoRA adapter settings (`config.LoraConfig` as a dict: r, alpha, dropout, target_modules), or None.
    Raises:
        ValueError: one line naming `key` for a path that does not exist (hub ids included: nothing is downloaded),
            is not a model or adapter directory, or does not load (see `Policy.load`, `lora.load_merged`); one line
            naming model.lora when peft is not installed or the target modules name nothing in the model.
    """
    options = {"autocast": autocast, "gradient_checkpointing": gradient_checkpointing,
               "logprob_chunk_tokens": logprob_chunk_tokens}
    if lora is not None:
        import_peft()  # a missing peft is refused before any weights load
    if path == "tiny":
        from rewardlab.policy.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed=seed, **(tiny_arch or {})).to(device)
        base = BASE_DIR  # not on disk: a LoRA checkpoint saves it (base/)
    elif is_adapter_dir(path):
        model, tokenizer = load_merged(path, key=key, dtype=torch_dtype(dtype), device=device)
        base = str(Path(path).expanduser().resolve())
    else:
        check_model_dir(path, key, adapters=True)  # its errors name both kinds of directory
        model, tokenizer = load_model_dir(path, dtype=dtype, device=device, key=key)
        base = str(Path(path).expanduser().resolve())
    if lora is not None:
        where = torch.device(device)
        with torch.random.fork_rng(devices=[where.index or 0] if where.type == "cuda" else []):
            torch.manual_seed(seed)  # the adapter's A (peft draws it at random) is the seed's, whatever ran before
            model = add_adapter(model, lora, base=base)
    return Policy(model, tokenizer, prompt_format, **options)


__all__ = ["Batch", "Policy", "SamplingSettings", "load_policy", "rollout_batch"]
