"""Where prompts come from. `load("kind:spec", **options)` returns a `Task` with disjoint train/test rows.

Kinds: `reasoning_gym:NAME` (any reasoning-gym dataset), `jsonl:PATH` (lines with `prompt` and `answer`, or chat
rows with `messages`), `humaneval[:FILE]`, `worked:NAME` (`reasoning_gym:NAME` with template compact and target
steps, the worked solution as `answer`; see tasks/worked.py), `env:NAME` (a built-in environment's rows, run as
episodes; see envs/task.py).

A kind whose loader lives in a layer above tasks/ (`env:NAME` lives in envs/, which pulls torch) is listed in
`KIND_PROVIDERS`: the module that registers it, imported by `load` on first use of that kind, as Python's entry
points name a plugin's module. So `import rewardlab.tasks` imports nothing above tasks/, and `load("env:...")` works
whether or not `rewardlab.envs` was imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from rewardlab.registry import Registry
from rewardlab.tasks.base import Row, Task, dedup_and_split, describe_task, row_key

#: kind -> loader `fn(argument, /, <options>) -> Task`; the argument (the part of the spec after the colon) is
#: positional-only, so the loader's other parameters are exactly its options (`task.options`).
LOADERS: Registry[Callable[..., Task]] = Registry("task kind")


class KindProvider(NamedTuple):
    """Where the loader of a task kind registered by a layer above tasks/ lives: `module` registers it
    (`register_loader`) when imported; `example` is how a spec of the kind is written (`spec_examples`)."""

    module: str
    example: str


#: kind -> the module above tasks/ that registers its loader, imported by `load` on first use of the kind (not at
#: `import rewardlab.tasks`: envs/ costs seconds, it pulls torch). The in-code table of plugin modules, as Python
#: entry points would be for installed ones.
KIND_PROVIDERS: dict[str, KindProvider] = {"env": KindProvider("rewardlab.envs.task", "env:NAME")}


def _provide(kind: str) -> None:
    """Import the module that registers `kind` (`KIND_PROVIDERS`) unless it is registered already."""
    if kind not in LOADERS and kind in KIND_PROVIDERS:
        importlib.import_module(KIND_PROVIDERS[kind].module)


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


#: The module that installs the check of a task's reward name (`set_reward_check`) when imported: the rewards layer,
#: which knows the names. `check_reward_name` imports it on first use, as `load` does `KIND_PROVIDERS`.
REWARD_CHECK_PROVIDER = "rewardlab.rewards"
_reward_check: list[Callable[[str], Any]] = []


def set_reward_check(check: Callable[[str], Any]) -> None:
    """Install `check(name)`, which raises ValueError("unknown reward 'x'; valid: a, b") for a name no reward is
    registered under (the rewards layer installs `REWARDS.get` when imported; a later call replaces it)."""
    _reward_check[:] = [check]


def check_reward_name(name: str, *, field: str) -> None:
    """Check that a reward is registered under `name` (loaders call it on their `reward` option, e.g. jsonl's),
    importing `REWARD_CHECK_PROVIDER` on first use. A "module:function" spec is not checked: it is resolved when the
    reward is built.

    Raises:
        ValueError: "FIELD: unknown reward 'x'; valid: a, b" (the installed check's message after the field).
    """
    if ":" in name:
        return
    if not _reward_check:
        importlib.import_module(REWARD_CHECK_PROVIDER)
    try:
        _reward_check[0](name)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def spec_examples() -> str:
    """How a spec of each registered kind is written, e.g. "reasoning_gym:NAME (e.g. reasoning_gym:chain_sum),
    jsonl:PATH, worked:NAME, humaneval[:FILE]"."""
    out = []
    for kind in LOADERS:
        meta = LOADERS.meta(kind)
        default = f"{kind}[:ARGUMENT]" if meta.get("argument_optional") else f"{kind}:ARGUMENT"
        out.append(meta.get("example") or default)
    out += [provider.example for kind, provider in KIND_PROVIDERS.items() if kind not in LOADERS]
    return ", ".join(out)


def load(spec: str, **options: Any) -> Task:
    """Load a task from a spec `kind:argument`, e.g. `reasoning_gym:chain_sum` or `jsonl:data/train.jsonl`.

    Raises:
        ValueError: when the spec has no `kind:` prefix or no argument (the message shows a spec of every kind), the
            kind is unknown (the message lists valid kinds), or an option is not one the loader declares
            ("task.options: unknown option 'x' for task kind 'jsonl'; valid: ..."), and what the loader raises.
    """
    kind, sep, arg = spec.partition(":")
    _provide(kind)
    optional = kind in LOADERS and LOADERS.meta(kind).get("argument_optional", False)
    if not sep and optional:  # e.g. `humaneval`
        arg = ""
    elif not sep or not arg:
        raise ValueError(f"task spec {spec!r}: expected 'kind:argument', one of: {spec_examples()}")
    if kind not in LOADERS:  # the valid kinds include those not imported yet
        raise ValueError(f"task spec {spec!r}: unknown task kind {kind!r}; valid: "
                         f"{', '.join(sorted({*LOADERS, *KIND_PROVIDERS}))}")
    loader = LOADERS[kind]
    LOADERS.check(kind, options, field="task.options")
    return loader(arg, **options)


# Registration imports (no other side effects).
from rewardlab.tasks import jsonl as _jsonl  # noqa: E402,F401
from rewardlab.tasks import reasoning_gym as _reasoning_gym  # noqa: E402,F401
from rewardlab.tasks import humaneval as _humaneval  # noqa: E402,F401
from rewardlab.tasks import worked as _worked  # noqa: E402,F401
from rewardlab.tasks.check import (  # noqa: E402
    check_chat_format, check_prompt_lengths, check_target_lengths, check_task_for_policy, check_task_vocabulary)

__all__ = ["KIND_PROVIDERS", "KindProvider", "LOADERS", "REWARD_CHECK_PROVIDER", "Row", "Task", "check_chat_format",
           "check_prompt_lengths", "check_reward_name", "check_target_lengths", "check_task_for_policy",
           "check_task_vocabulary", "dedup_and_split", "describe_task", "load", "register_loader", "row_key",
           "set_reward_check", "spec_examples"]
