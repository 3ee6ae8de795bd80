"""LoRA adapters through peft (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
arXiv:2106.09685): the base weights W stay frozen and each adapted linear layer computes W x + (alpha / r) B A x,
A [r, d_in] (random) and B [d_out, r] (zeros) trained, so the adapted model starts as the base model exactly.

Everything here goes through peft's own API (`get_peft_model`, `PeftModel.from_pretrained`, `disable_adapter`,
`merge_and_unload`, `set_peft_model_state_dict`); rewardlab adds where the base comes from and what a checkpoint
holds:

- An adapter directory (a LoRA checkpoint) holds peft's adapter_config.json and adapter_model.safetensors and the
  tokenizer, not the model's weights. Its base is named by path in adapter_config.json `base_model_name_or_path`:
  the absolute directory of the model the run started from. A base that is not on disk (the embedded `tiny` model,
  built in-process from a seed) is saved into the checkpoint itself as `base/` (a complete Hugging Face model
  directory), named "base" (relative to the adapter directory), so every checkpoint is self-sufficient.
- A base may itself be an adapter directory (an SFT LoRA checkpoint that `train` starts from): the base is then that
  directory's model with its adapter merged (`load_merged`, recursively), and the new adapter trains on top of it.
- `load_merged(dir)` is the full model an adapter directory stands for (base + adapter, merged): what `evaluate`,
  `train` without model.lora and `rewardlab merge` read.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch

from rewardlab.modeldir import ADAPTER_CONFIG

#: peft's adapter weights in an adapter directory (beside ADAPTER_CONFIG).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The sub-directory of a checkpoint that holds its base model when the base is not on disk (the tiny model).
BASE_DIR = "base"
INSTALL_HINT = "pip install 'rewardlab[lora]'"
#: Adapter directories whose base is an adapter directory, followed at most this deep (a cycle is an error).
MAX_CHAIN = 16


def import_peft(key: str = "model.lora") -> Any:
    """The `peft` module.

    Raises:
        ValueError: one line naming `key` and `pip install 'rewardlab[lora]'` when peft is not installed.
    """
    try:
        import peft
    except ImportError:
        raise ValueError(f"{key}: LoRA needs the peft package, which is not installed; {INSTALL_HINT}") from None
    return peft


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a peft model (an adapter on a base model); never imports peft."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` is a directory holding a peft adapter (adapter_config.json)."""
    p = Path(str(path)).expanduser()
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file()


def add_adapter(model: torch.nn.Module, lora: dict[str, Any], *, base: str | None,
                key: str = "model.lora") -> Any:
    """Wrap `model` with a fresh, trainable LoRA adapter: peft's `get_peft_model` with `LoraConfig(r, lora_alpha=alpha,
    lora_dropout=dropout, target_modules, task_type="CAUSAL_LM")`. Only the adapter's A and B require gradients;
    every base weight is frozen. B starts at zero, so the wrapped model computes what `model` computes.

    Args:
        model: a transformers causal LM (its weights in any dtype; the adapter's are float32 over bfloat16/float16
            base weights, peft's `autocast_adapter_dtype`).
        lora: `config.LoraConfig` as a dict: r (int >= 1), alpha (float > 0), dropout (in [0, 1)), target_modules
            ("all-linear": every linear layer but the LM head; or a list of module names, e.g. ["q_proj", "v_proj"]).
        base: what the adapter's checkpoints name as its base (`BASE_DIR` or an absolute directory), written to
            adapter_config.json as base_model_name_or_path.
        key: the config key named in errors.
    Returns:
        the peft model (`peft.PeftModelForCausalLM`), sharing `model`'s weights.
    Raises:
        ValueError: peft not installed (`import_peft`); unknown keys in `lora`; "KEY.target_modules: ..." when the
            listed modules name nothing in the model (one line).
    """
    peft = import_peft(key)
    unknown = set(lora) - {"r", "alpha", "dropout", "target_modules"}
    if unknown:
        raise ValueError(f"{key}: unknown key(s) {sorted(unknown)}; valid: alpha, dropout, r, target_modules")
    targets = lora.get("target_modules", "all-linear")
    config = peft.LoraConfig(r=int(lora.get("r", 16)), lora_alpha=float(lora.get("alpha", 32.0)),
                             lora_dropout=float(lora.get("dropout", 0.0)),
                             target_modules=targets if isinstance(targets, str) else list(targets),
                             task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated `is_gradient_checkpointing`
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:  # peft's NoMatchingPeftModuleError is a ValueError
        if "not found in the base model" in str(exc) or "Target modules" in str(exc):
            names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear) and n})
            raise ValueError(f"{key}.target_modules: {targets} match no module of the model; its linear layers "
                             f"are {', '.join(names)} (or use all-linear)") from None
        raise ValueError(f"{key}: peft cannot add the adapter ({str(exc).strip().splitlines()[0]})") from None
    # get_peft_model drops a name it cannot match to the model's own name_or_path; set after wrapping
    wrapped.peft_config["default"].base_model_name_or_path = base
    return wrapped


def adapter_base(path: str | Path, key: str = "model.path") -> Path:
    """The base model directory an adapter directory names: its `base/` when it holds one, else adapter_config.json's
    base_model_name_or_path (a relative name is taken relative to the adapter directory). The result may itself be
    an adapter directory.

    Raises:
        ValueError: one line naming `key`: the adapter config is unreadable, names no base, or its base does not
            exist.
    """
    p = Path(str(path)).expanduser()
    try:
        named = json.loads((p / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{key}: {path}: cannot read {ADAPTER_CONFIG} ({type(exc).__name__})") from None
    if (p / BASE_DIR / "config.json").is_file() and named in (None, BASE_DIR):
        return p / BASE_DIR
    if not named:
        raise ValueError(f"{key}: {path} is a LoRA adapter whose {ADAPTER_CONFIG} names no base model "
                         "(base_model_name_or_path)")
    base = Path(named).expanduser()
    base = base if base.is_absolute() else p / base
    if not base.is_dir():
        raise ValueError(f"{key}: {path} is a LoRA adapter on the base model {named}, which does not exist")
    return base


def base_chain(path: str | Path, key: str = "model.path") -> list[Path]:
    """The directories an adapter directory stands on, nearest first: [path, its base, its base's base, ...], the
    last one a full model directory.

    Raises:
        ValueError: what `adapter_base` raises; a chain that loops or is longer than MAX_CHAIN (one line).
    """
    chain = [Path(str(path)).expanduser()]
    while is_adapter_dir(chain[-1]):
        if len(chain) > MAX_CHAIN:
            raise ValueError(f"{key}: {path}: more than {MAX_CHAIN} LoRA adapters on top of one another")
        base = adapter_base(chain[-1], key)
        if base.resolve() in {c.resolve() for c in chain}:
            raise ValueError(f"{key}: {path}: the LoRA adapters name one another as base ({base})")
        chain.append(base)
    return chain


def load_merged(path: str | Path, *, key: str = "model.path", dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> tuple[torch.nn.Module, Any]:
    """The full causal LM an adapter directory stands for, and its tokenizer: the base model (`adapter_base`,
    recursively for a chain), each adapter loaded on it with peft (`PeftModel.from_pretrained`) and merged into its
    weights (`merge_and_unload`: W + (alpha / r) B A, in the base's dtype), in place: one model in memory. The
    result computes the adapter model's log-probs to float rounding.

    Args:
        path: an adapter directory (`is_adapter_dir`).
        key: the config key that gave `path`, named in errors.
        dtype: the dtype the base weights are loaded in.
        device: where the model is put.
    Returns:
        (a plain transformers model, the tokenizer of the adapter directory, or of the nearest base that has one: an
        adapter saved by another tool may hold none).
    Raises:
        ValueError: one line naming `key`: peft missing, a bad chain (`base_chain`), a base or adapter that does not
            load (`rewardlab.modeldir.load_pretrained`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewardlab.modeldir import check_model_dir, has_tokenizer_files, load_pretrained

    peft = import_peft(key)
    chain = base_chain(path, key)
    root = check_model_dir(chain[-1], key)
    model = load_pretrained(AutoModelForCausalLM, root, key, dtype=dtype).to(device)
    for adapter in reversed(chain[:-1]):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model = peft.PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        except Exception as exc:  # noqa: BLE001 - peft and safetensors raise ValueError, OSError, KeyError, ...
            text = str(exc).strip()
            raise ValueError(f"{key}: cannot load the LoRA adapter in {adapter} on its base "
                             f"({type(exc).__name__}: {text.splitlines()[0] if text else ''})") from None
        model = model.merge_and_unload()
    # the adapter directory's tokenizer (rewardlab saves one there), else the nearest base's that has one
    where = next((d for d in chain if has_tokenizer_files(d)), chain[0])
    tokenizer = load_pretrained(AutoTokenizer, where, key)
    return model, tokenizer


def base_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights under the plain model's parameter names (no adapter weights, peft's `base_layer`
    level removed): what `model.get_base_model().save_pretrained` must write for the base alone. Views of the
    model's own tensors, nothing copied."""
    state = model.get_base_model().state_dict()
    return {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}


def adapter_parameters(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's trainable parameters by their names in `model` (e.g.
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"): every parameter that requires a
    gradient, exactly the weights training changes (float32 [r, d_in] for A, [d_out, r] for B)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def load_adapter_parameters(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Copy `adapter_parameters` of another replica of `model` into it, in place.

    Raises:
        RuntimeError: the keys are not exactly `model`'s adapter parameters (one line with the first difference).
    """
    own = adapter_parameters(model)
    if set(state) != set(own):
        extra, missing = sorted(set(state) - set(own)), sorted(set(own) - set(state))
        raise RuntimeError(f"LoRA: the published adapter does not fit this model (unexpected {extra[:1]}, missing "
                           f"{missing[:1]})")
    with torch.no_grad():
        for name, value in state.items():
            own[name].copy_(value)


def load_adapter_weights(model: Any, directory: str | Path) -> None:
    """Load an adapter directory's weights (adapter_model.safetensors) into the adapter of `model`, in place, with
    peft's `set_peft_model_state_dict`: a resumed run continues on the model object it built (the base rebuilt as
    the run built it), bit for bit.

    Raises:
        ValueError: the directory has no adapter weights; RuntimeError: they do not fit `model`'s adapter (its rank
            or target modules differ).
    """
    from safetensors.torch import load_file

    peft = import_peft()
    f = Path(directory) / ADAPTER_WEIGHTS
    if not f.is_file():
        raise ValueError(f"{directory}: no {ADAPTER_WEIGHTS} (not a LoRA checkpoint)")
    state = load_file(str(f), device=str(next(model.parameters()).device))
    result = peft.set_peft_model_state_dict(model, state)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise RuntimeError(f"{directory}: its adapter does not fit the model's (unexpected "
                           f"{result.unexpected_keys[:1]}, missing {missing[:1]})")


def save_adapter(model: Any, tokenizer: Any, path: str | Path, *, base_on_disk: bool) -> None:
    """Write a LoRA model under `path`: peft's adapter files (adapter_config.json, adapter_model.safetensors: the
    A and B matrices only) and the tokenizer; with `base_on_disk` False, also the base model itself into
    `path`/base/ (config, weights, tokenizer: a Hugging Face model directory), which adapter_config.json names.

    Raises:
        OSError: a write failed.
    """
    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # peft's model card and base-model name notices
        model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    if not base_on_disk:
        model.get_base_model().save_pretrained(str(path / BASE_DIR), state_dict=base_state_dict(model))
        tokenizer.save_pretrained(str(path / BASE_DIR))


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "BASE_DIR", "INSTALL_HINT", "adapter_base", "adapter_parameters",
           "add_adapter", "base_chain", "base_state_dict", "import_peft", "is_adapter_dir", "is_peft_model",
           "load_adapter_parameters", "load_adapter_weights", "load_merged", "save_adapter"]
