"""Where prompts come from. `load("kind:spec", **options)` returns a `Task` with disjoint train/test rows.

Kinds: `reasoning_gym:NAME` (any reasoning-gym dataset), `jsonl:PATH` (lines with `prompt` and `answer`),
`worked:NAME` (`reasoning_gym:NAME` with template compact and target steps, the worked solution as `answer`;
see tasks/worked.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewardlab.tasks.base import Row, Task, dedup_and_split

LOADERS: dict[str, Callable[..., Task]] = {}


def register_loader(kind: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Register a task loader under `kind` (the part of the spec before the colon)."""

    def wrap(fn: Callable[..., Task]) -> Callable[..., Task]:
        LOADERS[kind] = fn
        return fn

    return wrap


def load(spec: str, **options: Any) -> Task:
    """Load a task from a spec `kind:argument`, e.g. `reasoning_gym:chain_sum` or `jsonl:data/train.jsonl`.

    Raises:
        ValueError: when the spec has no `kind:` prefix or the kind is unknown (the message lists valid kinds).
    """
    kind, sep, arg = spec.partition(":")
    if not sep and getattr(LOADERS.get(kind), "argument_optional", False):  # e.g. `humaneval`
        return LOADERS[kind]("", **options)
    if not sep or not arg:
        raise ValueError(f"task spec {spec!r}: expected 'kind:argument', e.g. 'reasoning_gym:chain_sum'")
    if kind not in LOADERS:
        raise ValueError(f"task spec {spec!r}: unknown kind {kind!r}; valid: {', '.join(sorted(LOADERS))}")
    return LOADERS[kind](arg, **options)


# Registration imports (no other side effects).
from rewardlab.tasks import jsonl as _jsonl  # noqa: E402,F401
from rewardlab.tasks import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rewardlab.tasks import humaneval as _humaneval  # noqa: E402,F401
from rewardlab.tasks import worked as _worked  # noqa: E402,F401

__all__ = ["LOADERS", "Row", "Task", "dedup_and_split", "load", "register_loader"]
