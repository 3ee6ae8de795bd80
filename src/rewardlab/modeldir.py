"""Local Hugging Face model directories: checked before transformers sees them, loaded without the network.

Every model rewardlab loads from a path (a policy, a reward-model backbone, a scorer checkpoint, a local judge) goes
through `check_model_dir` and `load_pretrained`, so a bad path is one line naming the config key that gave it
("model.path: /x does not exist") instead of transformers' hub-id validation or tokenizer messages. Nothing is
downloaded at run time: a string that is not an existing directory never reaches the hub.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: "org/name" as the hub spells repository ids; only used to add a hint to the "does not exist" error.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")

#: peft's adapter config: the file that makes a directory a LoRA adapter (`rewardlab.policy.lora.ADAPTER_CONFIG`).
ADAPTER_CONFIG = "adapter_config.json"

#: Files one of which a saved tokenizer has (fast tokenizer, sentencepiece, WordPiece/BPE vocabularies).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.txt", "vocab.json",
                    "sentencepiece.bpe.model")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0].rstrip(" :") if text else ""
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def check_model_dir(path: str | Path, key: str = "model.path", *, adapters: bool = False) -> Path:
    """The directory `path` (with `~` expanded), checked to hold a Hugging Face model (a config.json) or, with
    `adapters`, a LoRA adapter (peft's adapter_config.json: a LoRA checkpoint, `rewardlab.policy.lora`).

    Args:
        path: a local directory; hub ids are not resolved (download them first, e.g. with
            `hf download ORG/NAME --local-dir DIR`, and pass DIR).
        key: the config key or option that gave `path`, named in the errors (e.g. "model.path").
        adapters: accept an adapter directory (where a policy is loaded: `rewardlab.policy.load_policy`).
    Returns:
        the directory as a `Path`.
    Raises:
        ValueError: one line, "KEY: PATH does not exist" (with a hint for strings shaped like a hub id), "KEY: PATH
            is not a directory", or "KEY: PATH has no config.json (not a Hugging Face model directory)" (with
            `adapters`: "has no config.json or adapter_config.json").
    """
    text = str(path)
    if not text.strip():
        raise ValueError(f"{key}: empty path (expected a Hugging Face model directory)")
    p = Path(text).expanduser()
    if not p.exists():
        hint = ""
        if _HUB_ID.fullmatch(text):
            hint = (" (hub ids are not downloaded at run time: download it first, e.g. "
                    f"`hf download {text} --local-dir DIR`, and pass DIR)")
        raise ValueError(f"{key}: {text} does not exist{hint}")
    if not p.is_dir():
        raise ValueError(f"{key}: {text} is not a directory (expected a Hugging Face model directory)")
    if adapters and (p / ADAPTER_CONFIG).is_file():
        return p
    if not (p / "config.json").is_file():
        if adapters:
            raise ValueError(f"{key}: {text} has no config.json or {ADAPTER_CONFIG} (not a Hugging Face model or "
                             "LoRA adapter directory)")
        raise ValueError(f"{key}: {text} has no config.json (not a Hugging Face model directory)")
    return p


def has_tokenizer_files(path: str | Path) -> bool:
    """Whether directory `path` holds one of the files a saved tokenizer has (tokenizer.json, tokenizer.model, ...)."""
    return any((Path(path) / f).is_file() for f in _TOKENIZER_FILES)


def load_pretrained(factory: Any, path: Path, key: str = "model.path", **kwargs: Any) -> Any:
    """`factory.from_pretrained(path, local_files_only=True, **kwargs)` with a one-line error naming `key`.

    Args:
        factory: a transformers Auto class (`AutoTokenizer`, `AutoModelForCausalLM`, ...).
        path: a directory that passed `check_model_dir`.
        key: the config key that gave `path`.
    Raises:
        ValueError: "KEY: PATH has no tokenizer files (...)" when a tokenizer fails to load from a directory without
            any of the usual files; else "KEY: cannot load the model|tokenizer in PATH (ERROR)", ERROR being the
            first line of what transformers or safetensors raised (a bad config.json, missing or truncated weights).
    """
    what = "tokenizer" if "Tokenizer" in getattr(factory, "__name__", "") else "model"
    try:
        loaded = factory.from_pretrained(str(path), local_files_only=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, SafetensorError, KeyError...
        if what == "tokenizer" and not has_tokenizer_files(path):
            files = ", ".join(_TOKENIZER_FILES)
            raise ValueError(f"{key}: {path} has no tokenizer files (none of {files})") from exc
        raise ValueError(f"{key}: cannot load the {what} in {path} ({_first_line(exc)})") from exc
    return realign(loaded) if what == "model" else loaded


def realign(model: Any) -> Any:
    """Give every parameter and buffer of `model` storage of its own from torch's allocator (64-byte aligned on
    the CPU), in place; tied parameters stay tied (they are one Parameter object). Returns `model`.

    Weights loaded from safetensors can sit at any offset of the file's buffer (24 bytes past a 64-byte boundary,
    say), and the CPU's matrix kernels round differently at other alignments: a model loaded from a checkpoint then
    computes other floats than the model that wrote it, and a resumed run drifts from the uninterrupted one."""
    import torch

    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.device.type == "cpu" and tensor.data_ptr() % 64:
                tensor.data = tensor.data.clone()
    return model
