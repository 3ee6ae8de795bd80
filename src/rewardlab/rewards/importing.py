"""Rewards imported by path from a config: `{name: my_pkg.rewards:units_match}` or `{name: ./my_rewards.py:units_match}`.

A reward name holding a colon is `MODULE:ATTRIBUTE`. MODULE is a dotted module name (imported with the current
directory on the module search path, as `python -m` would) or the path of a `.py` file (relative to the current
directory; any name with a `/` or ending in `.py`). The attribute may be

- a `@reward`-decorated function, or a factory registered with `register_reward`: used as it is (its name, default
  weight and options);
- a class: a `Reward` factory, its `__init__` parameters its options;
- any other callable: a per-sample reward function, as `@reward(name=ATTRIBUTE, register=False)` would make it:
  it receives the rollout fields it names (`completion`, `answer`, `prompt`, `steps`, `row`), the task-row fields
  it names as parameters without a default, and its options (parameters with a default) from its spec, never from
  a row (see `FunctionReward`); it returns a float, a dict with `score`, or a `RewardOutput`.

The imported factory is registered in `REWARDS` under the canonical name (`module:attr`, or `/abs/path.py:attr`), so
its options are checked like any other reward's. A module or file is executed once per process.

The importing itself (`import_attribute`) serves environments too: a task `env:MODULE:CLASS` or `env:PATH.py:CLASS`
(`rewardlab.envs.resolve_env`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from rewardlab.rewards.base import REWARDS, Reward, reward

__all__ = ["canonical_name", "import_attribute", "import_names", "is_import_name", "resolve_reward"]

#: Parameter names of TRL's batched reward functions, which score a whole batch: `f(prompts, completions, **kw)`.
_BATCHED = ("completions", "prompts", "completion_ids")


def is_import_name(name: Any) -> bool:
    """True for a reward name of the form `MODULE:ATTRIBUTE` (registered names never hold a colon)."""
    return isinstance(name, str) and ":" in name


def import_names(spec: Any) -> list[str]:
    """Every `MODULE:ATTRIBUTE` string in a reward spec (a name, a mapping, a list; nested), in order: the code that
    building it would import. Conservative: a string option value holding a colon counts too.

    Example: import_names([{"name": "math"}, {"compose": "sum", "rewards": ["os:system"]}]) -> ["os:system"].
    """
    if isinstance(spec, str):
        return [spec] if is_import_name(spec) else []
    if isinstance(spec, dict):
        return [n for value in spec.values() for n in import_names(value)]
    if isinstance(spec, (list, tuple)):
        return [n for item in spec for n in import_names(item)]
    return []


def _split(name: str) -> tuple[str, str, bool]:
    """(module or file, attribute, is a file) of `MODULE:ATTRIBUTE`; a Windows drive letter stays in the file."""
    module, _, attr = name.rpartition(":")
    is_file = module.endswith(".py") or "/" in module or os.sep in module
    return module, attr, is_file


def canonical_name(name: str) -> str:
    """The name an imported reward is registered under: `module:attr`, or the absolute file path `:attr` (so
    `./r.py:f` means the same file wherever it was resolved from)."""
    module, attr, is_file = _split(name)
    return f"{Path(module).expanduser().resolve()}:{attr}" if is_file else f"{module}:{attr}"


#: What a reward name imports, for messages: (kind, the attribute's placeholder, a module example, a file example).
_REWARD = ("reward", "FUNCTION", "my_pkg.rewards:units_match", "./my_rewards.py:units_match")


def _error(name: str, cause: str, kind: str = "reward") -> ValueError:
    return ValueError(f"cannot import {kind} {name!r}: {cause}".splitlines()[0])


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _load_file(name: str, file: Path, kind: str) -> ModuleType:
    if not file.is_file():
        raise _error(name, f"no file {file} (a relative path is read from the current directory, {Path.cwd()})", kind)
    for module in list(sys.modules.values()):  # already imported (e.g. by the user's script): the same objects
        found = getattr(module, "__file__", None)
        if found and Path(found).resolve() == file:
            return module
    stem = file.stem if file.stem.isidentifier() else "module"
    module_name = f"rewardlab_user_{stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise _error(name, f"{file} is not a Python file", kind)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before executing it, as `import` does (dataclasses and pickling need it)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        del sys.modules[module_name]
        if not isinstance(exc, Exception):
            raise
        raise _error(name, f"running {file} raised {_cause(exc)}", kind) from None
    return module


def _load_module(name: str, module_name: str, what: tuple[str, str, str, str]) -> ModuleType:
    kind, placeholder, _, file_example = what
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise _error(name, f"no module named {exc.name!r} (searched the module path and the current directory, "
                         f"{Path.cwd()}; for a file give its path, e.g. {file_example.rpartition(':')[0]}:"
                         f"{placeholder})", kind) from None
        raise _error(name, f"importing {module_name} raised {_cause(exc)}", kind) from None
    except Exception as exc:  # noqa: BLE001 - whatever the module's own code raises
        raise _error(name, f"importing {module_name} raised {_cause(exc)}", kind) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())


def _as_factory(name: str, attr: str, obj: Any) -> Callable[..., Reward]:
    if any(obj is entry for entry in REWARDS.values()) or hasattr(obj, "default_weight"):
        return obj  # a @reward factory or a registered one
    if inspect.isclass(obj):
        return obj
    if not callable(obj):
        raise _error(name, f"{attr} is not a function or class (its type is {type(obj).__name__})")
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        raise _error(name, f"{attr} has no signature to read") from None
    batched = [p for p in _BATCHED if p in params]
    if batched:
        raise _error(name, f"{attr} takes {batched[0]!r}, a whole batch (TRL's signature); a rewardlab reward "
                     f"function scores one completion: def {attr}(completion, answer, ...) -> float")
    return reward(name=attr, register=False)(obj)


def import_attribute(name: str, what: tuple[str, str, str, str] = _REWARD) -> Any:
    """The object `MODULE:ATTRIBUTE` names (see the module docstring for MODULE), importing its module or file (once
    per process).

    Args:
        name: `MODULE:ATTRIBUTE` or `PATH.py:ATTRIBUTE`.
        what: for messages, (kind, the attribute's placeholder, a module example, a file example), e.g. ("environment",
            "CLASS", "my_envs:UnitGame", "./my_envs.py:UnitGame"); default: a reward's.
    Raises:
        ValueError: one line, "cannot import KIND 'NAME': CAUSE": a malformed name, no such module or file, the
            module raised while importing (its exception's type and first line), no such attribute (the message
            lists the module's public callables).
    """
    kind, placeholder, module_example, file_example = what
    module_part, attr, is_file = _split(name)
    if not module_part or not attr or not attr.isidentifier():
        raise _error(name, f"expected MODULE:{placeholder} or PATH.py:{placeholder}, e.g. {module_example} or "
                     f"{file_example}", kind)
    if is_file:
        module = _load_file(name, Path(canonical_name(name).rpartition(":")[0]), kind)
    else:
        module = _load_module(name, module_part, what)
    if not hasattr(module, attr):
        public = sorted(k for k, v in vars(module).items() if not k.startswith("_") and callable(v)
                        and getattr(v, "__module__", module.__name__) == module.__name__)
        raise _error(name, f"{module_part} has no attribute {attr!r}; it defines: {', '.join(public) or '(none)'}",
                     kind)
    return getattr(module, attr)


def resolve_reward(name: str) -> str:
    """Import the reward `MODULE:ATTRIBUTE` (see the module docstring) and register it in `REWARDS` under
    `canonical_name(name)` unless it is there already; return that name.

    Raises:
        ValueError: one line naming `name` and the cause: what `import_attribute` raises, an attribute that is not
            callable, or a function with TRL's batched signature.
    """
    key = canonical_name(name)
    if key in REWARDS:
        return key
    attr = _split(name)[1]
    REWARDS.register(key)(_as_factory(name, attr, import_attribute(name)))
    return key
