"""What a resumable loop saves beside its weights, in checkpoints/step-K/trainer_state.pt: optimizer, schedule,
data order and RNG states, so that step k+1 after a resume computes what the uninterrupted run computes; and the
JSON-able record of torch's RNG state that `evaluate` and `search` log after each finished batch or unit."""

from __future__ import annotations

import base64
import pickle
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict[str, Any]:
    """The global RNG states: torch CPU, every initialized CUDA device, and Python's `random`."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized()
            else None,
            "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])


def rng_state_record() -> dict[str, Any]:
    """torch's global RNG state (CPU, and every CUDA device once CUDA is in use) as JSON-able base64 strings.

    Reading the state consumes no random numbers, so recording it leaves a run's sampling unchanged.
    """
    rec: dict[str, Any] = {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii")}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rec["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode("ascii") for s in torch.cuda.get_rng_state_all()]
    return rec


def restore_rng_state(rec: Mapping[str, Any]) -> None:
    """Set torch's global RNG state from a `rng_state_record` (the inverse of it)."""

    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(rec["torch"]))
    if "cuda" in rec:
        torch.cuda.set_rng_state_all([tensor(t) for t in rec["cuda"]])


def save_state(directory: Path, state: dict[str, Any]) -> None:
    """Write `state` (state dicts, RNG states, counters) to `directory`/trainer_state.pt.

    Raises:
        OSError: the write failed (e.g. no space left); written through a Python file so that the error is an
            OSError, which `RunDir.save_checkpoint` reports as one line.
    """
    with (Path(directory) / STATE_FILE).open("wb") as fh:
        torch.save(state, fh)


def _safe_types() -> list[type]:
    """The classes besides tensors and plain containers a trainer_state.pt holds: the records of the batches an
    asynchronous trainer prefetched (`rl.rollouts.Prefetch.state_dict`)."""
    from rewardlab.types import RewardOutput, Rollout

    return [Rollout, RewardOutput]


def _refusal(message: str) -> str:
    """Why torch's weights-only unpickler refused a file, in one line, from its (multi-line) `message`; never its
    advice to load with weights_only=False."""
    text = " ".join(message.split())
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return (f"it names {found.group(1)}, which is not data (a trainer_state.pt holds tensors, numbers, strings "
                "and containers, and is never run as code)")
    detail = re.search(r"WeightsUnpickler error: (.*?)(?: Check the documentation|$)", text)
    return f"not a trainer state ({detail.group(1)[:200] if detail else 'not a torch pickle'})"


def load_state(directory: Path) -> dict[str, Any]:
    """Read `directory`/trainer_state.pt (written by `save_state`; verified against its manifest first) as data:
    torch's weights-only unpickler builds tensors, numbers, strings, bytes, None and plain containers (dict, list,
    tuple, set), and of classes only `_safe_types`; any other global a pickle names (a function such as os.system,
    any other class) is refused before anything is called. A manifest is a checksum, not a signature: a checkpoint
    from elsewhere is never trusted as code.

    Raises:
        ValueError: one line naming the file: it names a global that is not data (the message names it), or it is
            not a torch pickle (truncated, garbage).
    """
    path = Path(directory) / STATE_FILE
    scope = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5; 2.4 has only the global allowlist
    try:
        if scope is not None:
            with scope(_safe_types()):
                return torch.load(path, weights_only=True)
        torch.serialization.add_safe_globals(_safe_types())
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused to load: {_refusal(str(exc))}") from None
    except (EOFError, RuntimeError) as exc:  # truncated, or not a torch file at all
        raise ValueError(f"{path}: not a trainer state ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from None


def load_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the weights of the Hugging Face checkpoint in `directory` (what `model.save_pretrained` wrote) into
    `model`, in place: the model object, its device and its attention implementation stay the ones the run built, so
    a resumed run computes what the uninterrupted one computes. The global RNG states are left as they were. For a
    LoRA model (peft), the checkpoint holds the adapter only and only the adapter is loaded
    (`rewardlab.policy.lora.load_adapter_weights`): the base is the one the run built.

    Raises:
        OSError / ValueError: transformers cannot read the checkpoint; RuntimeError: its weights do not fit `model`.
    """
    from rewardlab.policy.lora import is_peft_model, load_adapter_weights

    if is_peft_model(model):
        load_adapter_weights(model, directory)
        return
    with torch.random.fork_rng(devices=[]):
        fresh = type(model).from_pretrained(str(directory), dtype=next(model.parameters()).dtype)
    model.load_state_dict(fresh.state_dict())
    del fresh


def restore_training_state(directory: Path, optimizer: torch.optim.Optimizer,
                           scheduler: torch.optim.lr_scheduler.LRScheduler, *, model: torch.nn.Module | None = None,
                           sampler: Any = None) -> dict[str, Any]:
    """Restore a training loop from its checkpoint `directory` (what the loop saved with `save_state` beside the
    weights), in this order: the weights into `model` (`load_weights`; skipped when None, for a verb that builds its
    model from the checkpoint itself), then `optimizer`, `scheduler`, `sampler` (anything with `load_state_dict`;
    skipped when None) from their entries "optimizer", "scheduler" and "sampler", then the global RNG states from
    "rng" (`set_rng_state`). The objects are those the run built, restored in place, so the step after a resume
    computes what the uninterrupted run computes. The verb restores its own entries (the step, its extra state) from
    the returned dict.

    Returns:
        everything trainer_state.pt holds (`load_state`).
    Raises:
        OSError / ValueError / RuntimeError: the weights cannot be read or do not fit `model` (`load_weights`);
        ValueError: trainer_state.pt is not a trainer state (`load_state`); KeyError / ValueError: it lacks an entry
            or holds state that does not fit `optimizer`, `scheduler` or `sampler`.
    """
    if model is not None:
        load_weights(model, directory)
    saved = load_state(directory)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if sampler is not None:
        sampler.load_state_dict(saved["sampler"])
    set_rng_state(saved["rng"])
    return saved
