"""One registry class for every name -> callable table: estimators, losses, rewards, task loaders, search methods...

    ESTIMATORS = Registry("advantage estimator", reserved=("token_rewards", "mask", "group"))

    @ESTIMATORS.register("grpo")
    def grpo(*, token_rewards, mask, group, eps=1e-6, scale="group"): ...

    ESTIMATORS.get("grpo")                    # the function; an unknown name is a ValueError listing the valid ones
    ESTIMATORS.check("grpo", {"eps": 1e-8})   # the options it accepts; an undeclared option is a ValueError
    ESTIMATORS.validate("grpo", {"eps": "1e-8"})   # check, then each value against its annotation: {"eps": 1e-08}
    "grpo" in ESTIMATORS, ESTIMATORS["grpo"], sorted(ESTIMATORS), len(ESTIMATORS)   # a read-only Mapping

A registered callable declares its options by name in its signature (keyword parameters, or the parameters of a
class's `__init__`). The options of an entry are its parameters minus the registry's `reserved` inputs (the tensors
or rows every caller passes, e.g. `token_rewards`, `mask`, `group`), minus the entry's own `inputs` (given at
registration, `register("turn_grpo", inputs=("turn_index",))`: tensors only a caller such as the trainer computes,
never a user's option) and minus positional-only parameters. A callable
with `**kwargs` declares that it checks its options itself, and `check` accepts anything for it. `validate` also
checks each value against the parameter's type annotation (pydantic's lax mode: "1e-3" reads as a float, "abc" is an
error); a parameter annotated `Any`, or not at all, takes any value.
"""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

__all__ = ["Registry", "option_annotations", "read_value", "unknown_options"]

T = TypeVar("T")
_MISSING: Any = object()


class Registry(Mapping[str, T], Generic[T]):
    """A table of named callables with one way to register them, look them up and check their options.

    Behaves as a read-only ``Mapping[str, T]`` (``name in R``, ``R[name]``, iteration in registration order,
    ``len``); entries are added only by ``register``.

    Args:
        kind: what an entry is, in messages ("advantage estimator" -> "unknown advantage estimator 'x'; valid: ...").
        reserved: parameter names every entry takes as inputs rather than options (excluded from its options).
    """

    def __init__(self, kind: str, *, reserved: Iterable[str] = ()) -> None:
        self.kind = kind
        self.reserved = tuple(reserved)
        self._entries: dict[str, T] = {}
        self._meta: dict[str, Mapping[str, Any]] = {}

    # ------------------------------------------------------------------------------------------------ Mapping
    def __getitem__(self, name: str) -> T:
        """The entry registered as ``name``. Raises KeyError (whose text lists the valid names) if there is none."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise KeyError(self._unknown(name)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # an unhashable value is no name
            return False

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    # ------------------------------------------------------------------------------------------------ registering
    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register the decorated callable (function or class) as ``name`` and return it unchanged.

        ``meta`` holds facts about the entry that callers look up with ``meta(name)`` (e.g. the inputs an estimator
        needs that only a trainer can compute). ``register(name)(obj)`` registers a callable defined elsewhere.
        ``meta["inputs"]`` (a tuple of parameter names, default ()) is special: those parameters are inputs that a
        caller computes (e.g. an estimator's ``turn_index``), so they are not options (``options``, ``check`` and
        ``validate`` leave them out: a user-given one is an unknown option); read them with ``inputs(name)``.

        Raises:
            ValueError: if ``name`` is not a non-empty string or is already registered, or ``inputs`` is not a tuple
                or list of strings.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if "inputs" in meta:
            inputs = meta["inputs"]
            if not isinstance(inputs, (tuple, list)) or not all(isinstance(k, str) for k in inputs):
                raise ValueError(f"{self.kind} {name!r}: inputs must be a tuple of parameter names, got {inputs!r}")
            meta["inputs"] = tuple(inputs)

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            self._meta[name] = MappingProxyType(dict(meta))
            return obj

        return decorator

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its entry (for tests and plugins that register temporarily).

        Raises:
            ValueError: if ``name`` is not registered (the message lists the valid names).
        """
        entry = self.get(name)
        del self._entries[name]
        del self._meta[name]
        return entry

    # ------------------------------------------------------------------------------------------------ lookup
    def get(self, name: str, default: Any = _MISSING) -> T:
        """The entry registered as ``name``.

        Without ``default``, an unknown name raises; with one, it is returned instead (``Mapping.get``).

        Raises:
            ValueError: "unknown <kind> 'x'; valid: a, b, c" (names sorted) when ``name`` is not registered and no
                ``default`` is given.
        """
        if name in self:
            return self._entries[name]
        if default is not _MISSING:
            return default
        raise ValueError(self._unknown(name))

    def meta(self, name: str) -> Mapping[str, Any]:
        """The read-only ``meta`` given to ``register`` for ``name`` (empty if none).

        Raises:
            ValueError: if ``name`` is not registered (the message lists the valid names).
        """
        self.get(name)
        return self._meta[name]

    def inputs(self, name: str) -> tuple[str, ...]:
        """The caller-computed inputs of entry ``name`` beyond ``self.reserved`` (``meta(name)["inputs"]``; () when
        it declares none): parameters that are not options.

        Raises:
            ValueError: if ``name`` is not registered (the message lists the valid names).
        """
        return tuple(self.meta(name).get("inputs", ()))

    def options(self, name: str, *, reserved: Iterable[str] = ()) -> tuple[str, ...] | None:
        """The option names entry ``name`` declares, in signature order, or None when it takes ``**kwargs``.

        Options are the parameters that can be passed by keyword, minus ``self.reserved``, the entry's ``inputs``
        and ``reserved``.

        Raises:
            ValueError: if ``name`` is not registered (the message lists the valid names).
        """
        params = inspect.signature(self.get(name)).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        skip = {*self.reserved, *self.inputs(name), *reserved}
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return tuple(p.name for p in params if p.kind in keyword and p.name not in skip)

    def check(self, name: str, options: Mapping[str, Any], *, reserved: Iterable[str] = (),
              field: str | None = None, complete: bool = False) -> tuple[str, ...] | None:
        """Check that entry ``name`` declares every key of ``options``; return its option names (see ``options``).

        Args:
            name: a registered name.
            options: the options a caller means to pass (only the keys are looked at).
            reserved: more input names to exclude from the options, on top of the registry's own.
            field: a config key to start the message with, e.g. "rl.loss_options".
            complete: also require every option the entry has no default for (for entries built from a spec).
        Returns:
            The declared option names, or None for an entry with ``**kwargs`` (which checks its options itself).
        Raises:
            ValueError: ``name`` is not registered, an option is not declared, or (``complete``) a required option
                is missing, in one line: "[field: ]unknown option 'foo' for policy loss 'gspo'; valid: clip,
                clip_high, clip_low" or "[field: ]missing option 'gate' for composition 'gated'".
        """
        declared = self.options(name, reserved=reserved)
        if declared is None:
            return None
        unknown = [key for key in options if key not in declared]
        if unknown:
            raise ValueError(unknown_options(unknown, f"{self.kind} {name!r}", declared, field))
        if complete:
            params = inspect.signature(self._entries[name]).parameters
            missing = [k for k in declared if params[k].default is inspect.Parameter.empty and k not in options]
            if missing:
                head = f"{field}: " if field else ""
                raise ValueError(f"{head}missing option{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(repr(k) for k in missing)} for {self.kind} {name!r}")
        return declared

    def validate(self, name: str, options: Mapping[str, Any], *, reserved: Iterable[str] = (),
                 field: str | None = None, complete: bool = False) -> dict[str, Any]:
        """`check` the option names, then each value against its parameter's type annotation; return the options
        with their values as the annotations read them (`{"rel_tol": "1e-3"}` -> `{"rel_tol": 0.001}`: YAML reads
        1e-3 as a string).

        Values are read as pydantic does in lax mode (an int for a float, "1e-3" for a float, "true" for a bool), except
        that a bool is never a number. A parameter annotated `Any`, unannotated, or with an annotation that does not
        resolve or that pydantic cannot check takes any value; so does every option of an entry with `**kwargs` that
        is not a named parameter.

        Args:
            as for `check`; `field` also starts the path of a bad value ("rewards[0]" -> "rewards[0].rel_tol").
        Returns:
            a new dict: the options, each value as its annotation reads it.
        Raises:
            ValueError: what `check` raises, or one line for a value of the wrong type: "rewards[0].rel_tol: expected
                a number, got 'abc'" (with pydantic's reason when it is a bound: "... (input should be greater than or
                equal to 1)").
        """
        self.check(name, options, reserved=reserved, field=field, complete=complete)
        annotations = option_annotations(self._entries[name])
        out = dict(options)
        for key, value in options.items():
            if key in annotations:
                out[key] = read_value(annotations[key], value, f"{field}.{key}" if field else key)
        return out

    def _unknown(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries)) or '(none)'}"


def unknown_options(unknown: Iterable[str], owner: str, valid: Iterable[str], field: str | None = None) -> str:
    """The one-line message for options nobody declares:
    "[field: ]unknown option(s) 'a', 'b' for OWNER; valid: x, y" (valid names sorted, "(none)" when empty)."""
    unknown = list(unknown)
    head = f"{field}: " if field else ""
    names = ", ".join(repr(k) for k in unknown)
    return (f"{head}unknown option{'s' if len(unknown) > 1 else ''} {names} for {owner}; "
            f"valid: {', '.join(sorted(set(valid))) or '(none)'}")


_LAX = ConfigDict(arbitrary_types_allowed=True)
#: pydantic error types that are about a bound rather than a type; their text is added to the message.
_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number", "too_short",
           "too_long", "literal_error", "enum")


def option_annotations(obj: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type annotation of each keyword parameter of `obj` (a function, or a class: its `__init__`) that
    has one other than `Any`. String annotations (`from __future__ import annotations`) are resolved in the
    defining module; one that does not resolve is left out."""
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return {}
    target = obj.__init__ if inspect.isclass(obj) else obj  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001 - an unresolvable annotation elsewhere in the signature
        hints = {}
    out = {}
    for p in params:
        hint = p.annotation
        if hint is inspect.Parameter.empty:
            continue
        if isinstance(hint, str):
            if p.name not in hints:
                continue
            hint = hints[p.name]
        if hint is not Any:
            out[p.name] = hint
    return out


_WORDS = {float: "a number", int: "an integer", bool: "true or false", str: "a string", type(None): "null"}


def _type_text(hint: Any) -> str:
    """A type as a message says it: float -> "a number", `str | None` -> "a string or null", `Sequence[str]` as is."""
    if typing.get_origin(hint) is typing.Annotated:
        return _type_text(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type_text(arg) for arg in typing.get_args(hint)))
    if hint in _WORDS:
        return _WORDS[hint]
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "").replace("NoneType", "None")


def read_value(hint: Any, value: Any, where: str) -> Any:
    """`value` read as type `hint` (pydantic, lax; a bool is never a number; a `pathlib.Path` is a str), or `value`
    unchanged when pydantic cannot check `hint`.

    Raises:
        ValueError: "WHERE: expected TYPE, got VALUE" (plus the reason for a bound), one line.
    """
    try:
        adapter = TypeAdapter(hint, config=_LAX)
    except Exception:  # noqa: BLE001 - an annotation pydantic has no schema for: not checked
        return value
    try:
        try:
            out = adapter.validate_python(value)
        except ValidationError:
            if not isinstance(value, os.PathLike):
                raise
            out = adapter.validate_python(os.fspath(value))  # a pathlib.Path where a str path is annotated
    except ValidationError as exc:
        err = exc.errors()[0]
        reason = f" ({err['msg'][0].lower()}{err['msg'][1:]})" if err["type"] in _BOUNDS else ""
        raise ValueError(f"{where}: expected {_type_text(hint)}, got {value!r}{reason}".splitlines()[0]) from None
    except Exception:  # noqa: BLE001 - e.g. isinstance against a protocol that is not runtime-checkable
        return value
    if isinstance(value, bool) and not isinstance(out, bool):
        raise ValueError(f"{where}: expected {_type_text(hint)}, got {value!r}")
    return out
