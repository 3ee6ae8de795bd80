"""Where prompts come from. `load("kind:spec", **options)` returns a `Task` with disjoint train/test rows.

Kinds: `reasoning_gym:NAME` (any reasoning-gym dataset), `jsonl:PATH` (lines with `prompt` and `answer`, or chat
rows with `messages`), `humaneval[:FILE]`, `worked:NAME` (`reasoning_gym:NAME` with template compact and target
steps, the worked solution as `answer`; see tasks/worked.py), `env:NAME` (a built-in environment's rows, run as
episodes; see tasks/environment.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rewardlab.registry import Registry
from rewardlab.tasks.base import Row, Task, dedup_and_split, describe_task, row_key

#: kind -> loader `fn(argument, /, <options>) -> Task`; the argument (the part of the spec after the colon) is
#: positional-only, so the loader's other parameters are exactly its options (`task.options`).
LOADERS: Registry[Callable[..., Task]] = Registry("task kind")


def register_loader(kind: str, *, argument_optional: bool = False, example: str | None = None
                    ) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Register a task loader under `kind` (the part of the spec before the colon).

    The loader is `fn(argument, /, <options>) -> Task` with every option declared by name; one with `**options`
    (forwarding them to a third-party config) must check them itself. `argument_optional`: the spec may be the
    bare kind (`humaneval`), and the loader then gets "" as its argument. `example`: how a spec of this kind is
    written, shown when a spec has no kind (default "KIND:ARGUMENT", or "KIND[:ARGUMENT]" when it is optional).

    Raises:
        ValueError: if `kind` is already registered.
    """
    return LOADERS.register(kind, argument_optional=argument_optional, example=example)


def spec_examples() -> str:
    """How a spec of each registered kind is written, e.g. "reasoning_gym:NAME (e.g. reasoning_gym:chain_sum),
    jsonl:PATH, worked:NAME, humaneval[:FILE]"."""
    out = []
    for kind in LOADERS:
        meta = LOADERS.meta(kind)
        default = f"{kind}[:ARGUMENT]" if meta.get("argument_optional") else f"{kind}:ARGUMENT"
        out.append(meta.get("example") or default)
    return ", ".join(out)


def load(spec: str, **options: Any) -> Task:
    """Load a task from a spec `kind:argument`, e.g. `reasoning_gym:chain_sum` or `jsonl:data/train.jsonl`.

    Raises:
        ValueError: when the spec has no `kind:` prefix or no argument (the message shows a spec of every kind), the
            kind is unknown (the message lists valid kinds), or an option is not one the loader declares
            ("task.options: unknown option 'x' for task kind 'jsonl'; valid: ..."), and what the loader raises.
    """
    kind, sep, arg = spec.partition(":")
    optional = kind in LOADERS and LOADERS.meta(kind).get("argument_optional", False)
    if not sep and optional:  # e.g. `humaneval`
        arg = ""
    elif not sep or not arg:
        raise ValueError(f"task spec {spec!r}: expected 'kind:argument', one of: {spec_examples()}")
    try:
        loader = LOADERS.get(kind)
    except ValueError as exc:
        raise ValueError(f"task spec {spec!r}: {exc}") from None
    LOADERS.check(kind, options, field="task.options")
    return loader(arg, **options)


# Registration imports (no other side effects).
from rewardlab.tasks import jsonl as _jsonl  # noqa: E402,F401
from rewardlab.tasks import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rewardlab.tasks import humaneval as _humaneval  # noqa: E402,F401
from rewardlab.tasks import worked as _worked  # noqa: E402,F401
from rewardlab.tasks import environment as _environment  # noqa: E402,F401
from rewardlab.tasks.check import (  # noqa: E402
    check_chat_format, check_prompt_lengths, check_target_lengths, check_task_for_policy, check_task_vocabulary)

__all__ = ["LOADERS", "Row", "Task", "check_chat_format", "check_prompt_lengths", "check_target_lengths",
           "check_task_for_policy", "check_task_vocabulary", "dedup_and_split", "describe_task", "load",
           "register_loader", "row_key", "spec_examples"]
