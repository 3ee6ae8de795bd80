"""What a resumable loop saves beside its weights, in checkpoints/step-K/trainer_state.pt: optimizer, schedule,
data order and RNG states, so that step k+1 after a resume computes what the uninterrupted run computes."""

from __future__ import annotations

import random
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


def save_state(directory: Path, state: dict[str, Any]) -> None:
    """Write `state` (state dicts, RNG states, counters) to `directory`/trainer_state.pt."""
    torch.save(state, Path(directory) / STATE_FILE)


def load_state(directory: Path) -> dict[str, Any]:
    """Read `directory`/trainer_state.pt (a checkpoint this project wrote, verified against its manifest first)."""
    return torch.load(Path(directory) / STATE_FILE, weights_only=False)


def load_weights(model: torch.nn.Module, directory: Path) -> None:
    """Copy the weights of the Hugging Face checkpoint in `directory` (what `model.save_pretrained` wrote) into
    `model`, in place: the model object, its device and its attention implementation stay the ones the run built, so
    a resumed run computes what the uninterrupted one computes. The global RNG states are left as they were.

    Raises:
        OSError / ValueError: transformers cannot read the checkpoint; RuntimeError: its weights do not fit `model`.
    """
    with torch.random.fork_rng(devices=[]):
        fresh = type(model).from_pretrained(str(directory), dtype=next(model.parameters()).dtype)
    model.load_state_dict(fresh.state_dict())
    del fresh
