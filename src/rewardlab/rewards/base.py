"""The reward contract: `Reward` protocol, the `@reward` decorator and the `REWARDS` registry.

`build_reward`, `WeightedSum` and the other composition nodes live in `rewards/compose.py`, which imports this
module (never the other way round); `rewardlab.rewards` re-exports them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol, TypeVar, runtime_checkable

from pydantic import Field

from rewardlab.registry import Registry, option_annotations
from rewardlab.types import Rollout, RewardOutput

#: name -> factory(<options>) -> Reward. Filled by `@reward(name=...)` and `register_reward`.
REWARDS: Registry[Callable[..., Reward]] = Registry("reward")

ON_ERROR = ("zero", "skip", "raise")

#: Default number of items of one batch an async reward keeps in flight at once (`max_concurrency`).
DEFAULT_MAX_CONCURRENCY = 16
#: Options of `FunctionReward` that set how it runs rather than what it computes (see `FunctionReward`).
EXECUTION_OPTIONS = ("max_concurrency", "workers", "item_timeout")

_T = TypeVar("_T")


@runtime_checkable
class Reward(Protocol):
    """Scores a batch of rollouts. `name` labels its metrics (`reward/<name>/mean`)."""

    name: str

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]: ...


class RewardError(RuntimeError):
    """Raised by a reward with `on_error="raise"`; the message names the reward and the cause."""


def register_reward(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Register a factory `(<options>) -> Reward` (a class or a function declaring its options by name) in `REWARDS`
    under `name`. Raises ValueError if the name is taken."""
    return REWARDS.register(name)


#: The fields every rollout gives a reward function, over the task row's own fields (which they override): name ->
#: its value for a rollout (`answer` is the row's, None without one).
ROLLOUT_FIELDS: dict[str, Callable[[Rollout], Any]] = {
    "prompt": lambda r: r.row.get("prompt", r.prompt),
    "completion": lambda r: r.completion,
    "answer": lambda r: r.row.get("answer"),
    "steps": lambda r: list(r.step_text),
    "row": lambda r: r.row,
    "rollout": lambda r: r,
}


class RowFieldIgnoredWarning(UserWarning):
    """A task-row field has the name of an option of the reward scoring it; the row's value is ignored (options come
    from the config, so a data row cannot loosen a verifier). Issued once per reward object and field name. Turn it
    into an error with `warnings.simplefilter("error", RowFieldIgnoredWarning)`."""


def _rollout_fields(r: Rollout) -> dict[str, Any]:
    fields = dict(r.row)
    fields.update((name, get(r)) for name, get in ROLLOUT_FIELDS.items())
    return fields


#: A reward's `row_fields` entry: a task-row field it cannot score without, or a tuple of alternatives (any one).
RowField = str | tuple[str, ...]


def check_row_fields(name: str, row_fields: Any) -> tuple[RowField, ...]:
    """`row_fields` as declared (a sequence of field names or tuples of alternative names) in canonical form.

    Raises:
        ValueError: a str instead of a sequence, or an entry that is not a name or a non-empty tuple of names.
    """
    if isinstance(row_fields, str) or not isinstance(row_fields, Sequence):
        raise ValueError(f"reward {name}: row_fields must be a list of field names (or of tuples of alternative "
                         f"names), got {row_fields!r}")
    out: list[RowField] = []
    for entry in row_fields:
        if isinstance(entry, str) and entry:
            out.append(entry)
        elif isinstance(entry, Sequence) and not isinstance(entry, str) and entry and \
                all(isinstance(a, str) and a for a in entry):
            out.append(tuple(entry) if len(entry) > 1 else entry[0])
        else:
            raise ValueError(f"reward {name}: row_fields entry {entry!r} is not a field name or a non-empty tuple "
                             "of alternative names")
    return tuple(dict.fromkeys(out))


def _inferred_row_fields(fn: Callable[..., Any], options: Mapping[str, Any] = {}) -> list[str]:  # noqa: B006
    """The row fields a function cannot score without, from its signature: `answer` when it is a parameter, and the
    parameters without a default that are neither rollout fields nor given as options."""
    params = inspect.signature(fn).parameters
    return [p for p, v in params.items() if p not in options and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)
            and (p == "answer" or (p not in ROLLOUT_FIELDS and v.default is inspect.Parameter.empty))]


#: Return types read as a plain score without the (slower) ABC check for a mapping.
_SCALARS = (float, int, bool)


def _as_output(value: Any, name: str) -> RewardOutput:
    if isinstance(value, RewardOutput):
        if value.error is None and not math.isfinite(value.score):
            return RewardOutput(score=0.0, components=value.components, error=f"{name}: score is {value.score}")
        return value
    if type(value) in _SCALARS or not isinstance(value, Mapping):  # a plain number, the common case, tested first
        score, comps = float(value), {}
    else:
        score, comps = float(value["score"]), {k: float(v) for k, v in value.items() if k != "score"}
    if not math.isfinite(score):  # before RewardOutput, whose own NaN check would hide the cause
        return RewardOutput(score=0.0, components=comps, error=f"{name}: score is {score}")
    return RewardOutput(score=score, components=comps)


def run_sync(make_coro: Callable[[], Awaitable[_T]]) -> _T:
    """Run the coroutine `make_coro()` to completion from synchronous code and return its result.

    With no event loop running in this thread it uses `asyncio.run`. When one is running (a notebook, an async
    caller), blocking it with `asyncio.run` is impossible, so the coroutine runs on a fresh loop in a helper thread
    and this call waits for it. Exceptions propagate.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewardlab-async") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


def _error_text(name: str, exc: BaseException) -> str:
    return f"{name}: {type(exc).__name__}: {exc}".splitlines()[0]


class FunctionReward:
    """A per-sample function lifted to a batched `Reward`.

    The function receives only the parameters it names. Each parameter is one of:
        a rollout field: `prompt` (the task prompt), `completion`, `answer` (the row's), `steps` (the step texts,
            `Rollout.step_text`), `row` (the whole task row), `rollout`; filled from each rollout;
        a row field: a parameter without a default, or one named in `fields`; filled from the task row's field of
            that name (a missing one keeps the default, or is a TypeError naming it when there is none);
        an option: every other parameter (it has a default). Its value comes from the config (`options`), else the
            default - never from a task row. A row field with an option's name is ignored with a one-time
            `RowFieldIgnoredWarning` naming the reward and the field, so a data row cannot loosen a verifier
            (`{"answer": "5", "abs_tol": 1e9}` does not widen `numeric`'s tolerance).
    Any parameter given in `options` takes that value for every rollout. A `**kwargs` function also receives every
    other row field. It returns a float, a dict with `score` and components, or a RewardOutput. An exception or a
    non-finite score becomes `RewardOutput.error` ("<name>: <cause>") with score 0.

    Execution options (taken out of `options` unless the function has a parameter of the same name, which then
    receives it instead):
        max_concurrency: `async def` functions only; items of one batch awaited at once (default
            `DEFAULT_MAX_CONCURRENCY`, 16). The batch runs on an event loop (see `run_sync`), so the trainer's
            synchronous call works, also from code that already runs an event loop.
        item_timeout: `async def` functions only; seconds one item may take. Past it the item is cancelled and its
            output is an error "<name>: timed out after <t> s" (score 0). Default None: no limit. A sync function
            cannot have one (a thread cannot be stopped); it must enforce its own limit.
        workers: sync functions only; threads that score the items of a batch in parallel (for I/O-bound work such
            as HTTP calls; CPU-bound Python gains nothing from threads). Default 1: in the calling thread.

    `row_fields`: the task-row fields it cannot score without (what the TRL adapter checks a dataset's columns
    against): `answer` when the function takes it, its parameters without a default that are not rollout fields
    (less those given as options), and the fields declared with `@reward(row_fields=...)` for what it reads through
    `row` or `**kwargs` (an entry may be a tuple of alternatives, any one of which suffices).

    Raises:
        ValueError: at construction, when an option is not a parameter of the function, a name in `fields` is not
            one, `row_fields` is malformed, or an execution option is out of range or does not apply to this kind of
            function.
    """

    def __init__(self, fn: Callable[..., Any], name: str, options: Mapping[str, Any] | None = None,
                 fields: Sequence[str] = (), row_fields: Sequence[RowField] = ()) -> None:
        self.fn = fn
        self.name = name
        self.options = dict(options or {})
        self.row_fields = check_row_fields(name, [*_inferred_row_fields(fn, self.options), *row_fields])
        params = inspect.signature(fn).parameters
        self._wants_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._params = [p for p in params if params[p].kind is not inspect.Parameter.VAR_KEYWORD]
        execution = {k: self.options.pop(k) for k in EXECUTION_OPTIONS if k in self.options and k not in params}
        unknown = set(self.options) - set(self._params)
        if unknown and not self._wants_all:
            raise ValueError(f"reward {name}: unknown option(s) {sorted(unknown)}; valid: {sorted(self._params)}")
        self.fields = tuple(fields)
        bad = [f for f in self.fields if f not in self._params or f in ROLLOUT_FIELDS]
        if bad:
            raise ValueError(f"reward {name}: fields {bad} are not parameters of the function (or are rollout "
                             f"fields, always filled); parameters: {sorted(self._params)}")
        #: Parameters that are options (a default, not a declared row field): never read from a task row.
        self.option_params = tuple(p for p in self._params if p not in ROLLOUT_FIELDS and p not in self.fields
                                   and params[p].default is not inspect.Parameter.empty)
        self._getters = [(p, ROLLOUT_FIELDS.get(p)) for p in self._params
                         if p not in self.options and p not in self.option_params]
        self._guarded = tuple(p for p in self.option_params if p not in self.options)
        self._warned: set[str] = set()
        self.is_async = inspect.iscoroutinefunction(fn)
        self.max_concurrency = _positive_int(name, "max_concurrency", execution.get("max_concurrency"),
                                             DEFAULT_MAX_CONCURRENCY)
        self.workers = _positive_int(name, "workers", execution.get("workers"), 1)
        timeout = execution.get("item_timeout")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"reward {name}: item_timeout must be a number of seconds > 0, got {timeout!r}")
        self.item_timeout = None if timeout is None else float(timeout)
        if self.is_async and "workers" in execution:
            raise ValueError(f"reward {name}: 'workers' is for sync functions; an async reward uses max_concurrency")
        if not self.is_async:
            for key in ("max_concurrency", "item_timeout"):
                if key in execution:
                    raise ValueError(f"reward {name}: {key!r} applies to async def rewards only; a sync function "
                                     "uses 'workers' and must enforce its own time limit")

    def _ignore_row_options(self, row: Mapping[str, Any]) -> None:
        """Warn, once per field, about row fields named like an option this reward was not given in the config."""
        for p in self._guarded:
            if p in row and p not in self._warned:
                self._warned.add(p)
                warnings.warn(f"reward {self.name}: row field {p!r} ignored: {p!r} is an option of this reward, set "
                              "in the config only (a task row cannot change it)", RowFieldIgnoredWarning, stacklevel=4)

    def _kwargs(self, rollout: Rollout) -> dict[str, Any]:
        row = rollout.row
        if self._guarded:
            self._ignore_row_options(row)
        if self._wants_all:
            fields = _rollout_fields(rollout)
            for p in self.option_params:
                fields.pop(p, None)
            fields.update(self.options)
            return fields
        # Only the named parameters, read straight from the rollout (the per-item cost of every reward call):
        # an option, else a rollout field, else a row field; a parameter none of them has keeps its default.
        kwargs = dict(self.options)
        for p, get in self._getters:
            if get is not None:
                kwargs[p] = get(rollout)
            elif p in row:
                kwargs[p] = row[p]
        return kwargs

    def score_one(self, rollout: Rollout) -> RewardOutput:
        if self.is_async:
            return self([rollout])[0]
        try:
            return _as_output(self.fn(**self._kwargs(rollout)), self.name)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an explicit error
            return RewardOutput(score=0.0, error=_error_text(self.name, exc))

    async def _ascore_one(self, rollout: Rollout, limit: asyncio.Semaphore) -> RewardOutput:
        async with limit:
            try:
                async with asyncio.timeout(self.item_timeout) as deadline:
                    value = await self.fn(**self._kwargs(rollout))
            except TimeoutError as exc:
                if deadline.expired():
                    return RewardOutput(score=0.0, error=f"{self.name}: timed out after {self.item_timeout:g} s")
                return RewardOutput(score=0.0, error=_error_text(self.name, exc))
            except Exception as exc:  # noqa: BLE001 - every failure becomes an explicit error
                return RewardOutput(score=0.0, error=_error_text(self.name, exc))
            try:
                return _as_output(value, self.name)
            except Exception as exc:  # noqa: BLE001 - a return value that is not a score
                return RewardOutput(score=0.0, error=_error_text(self.name, exc))

    async def acall(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        """`__call__` for async callers: awaits the batch on the caller's loop (a sync function runs in a thread)."""
        if not self.is_async:
            return await asyncio.to_thread(self, rollouts)
        limit = asyncio.Semaphore(self.max_concurrency)
        return list(await asyncio.gather(*(self._ascore_one(r, limit) for r in rollouts)))

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        if self.is_async:
            return run_sync(lambda: self.acall(rollouts))
        if self.workers > 1 and len(rollouts) > 1:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.workers, len(rollouts)),
                                                       thread_name_prefix=f"reward-{self.name}") as pool:
                return list(pool.map(self.score_one, rollouts))
        return [self.score_one(r) for r in rollouts]


def _positive_int(name: str, key: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"reward {name}: {key} must be an integer >= 1, got {value!r}")
    return value


def reward(
    name: str | None = None,
    *,
    weight: float = 1.0,
    register: bool = True,
    max_concurrency: int | None = None,
    workers: int | None = None,
    item_timeout: float | None = None,
    fields: Sequence[str] = (),
    row_fields: Sequence[RowField] | None = None,
):
    """Decorator: turn a per-sample function (plain or `async def`) into a `Reward` factory registered as `name`.

    The decorated object is the factory: calling it with options returns a `FunctionReward`. `weight` is the
    default weight used by `build_reward` (0 makes the reward a logged metric only). `max_concurrency`,
    `item_timeout` (async functions) and `workers` (sync functions) are default execution options, overridable per
    config like any option; see `FunctionReward`. `fields`: parameters with a default that are read from the task
    row (e.g. `references`); every other parameter with a default is an option, set in the config only.
    `row_fields`: the row fields the function reads through `row` or `**kwargs` and cannot score without (a name,
    or a tuple of alternatives of which one suffices); with the ones its signature shows (see `FunctionReward`) they
    are the reward's `row_fields`, also on the factory. A function that takes `row` should declare them (`()` when
    it needs none).

    Raises:
        ValueError: a name in `fields` that is not a parameter of the function, or is a rollout field; a malformed
            `row_fields` (a str, an empty entry).
    """
    defaults = {k: v for k, v in (("max_concurrency", max_concurrency), ("workers", workers),
                                  ("item_timeout", item_timeout)) if v is not None}

    def wrap(fn: Callable[..., Any]):
        reward_name = name or fn.__name__
        _check_fields(reward_name, fn, fields)
        declared = None if row_fields is None else check_row_fields(reward_name, row_fields)
        factory = _reward_factory(fn, reward_name, weight, defaults, fields, declared)
        if register:
            register_reward(reward_name)(factory)
        return factory

    return wrap


def _check_fields(name: str, fn: Callable[..., Any], fields: Sequence[str]) -> None:
    """Check `@reward(fields=...)`: each one a parameter of `fn` and not a rollout field (those are always filled).

    Raises:
        ValueError: one line naming the reward, the bad fields and the function's parameters.
    """
    params = inspect.signature(fn).parameters
    bad = [f for f in fields if f not in params or f in ROLLOUT_FIELDS]
    if bad:
        raise ValueError(f"reward {name}: fields {bad} are not parameters of the function (or are "
                         f"rollout fields, always filled); parameters: {sorted(params)}")


def _reward_factory(fn: Callable[..., Any], name: str, weight: float, defaults: Mapping[str, Any],
                    fields: Sequence[str], declared: tuple[RowField, ...] | None) -> Callable[..., FunctionReward]:
    """The factory `@reward` makes of `fn`: `factory(**options)` builds a `FunctionReward` with the execution
    `defaults` under `options`; it carries `fn`'s name and docstring, the options it takes as its signature (what
    the registry checks), and `default_weight`, `fn`, `fields`, `declared_row_fields` (None: none declared),
    `row_fields` (inferred from the signature, then `declared`) and `reward_name`."""

    def factory(**options: Any) -> FunctionReward:
        return FunctionReward(fn, name, {**defaults, **options}, fields=fields, row_fields=declared or ())

    factory.__doc__ = fn.__doc__
    factory.__name__ = fn.__name__
    factory.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
    factory.__module__ = getattr(fn, "__module__", __name__)
    factory.__signature__ = _factory_signature(fn)  # type: ignore[attr-defined]
    factory.default_weight = weight  # type: ignore[attr-defined]
    factory.fn = fn  # type: ignore[attr-defined]
    factory.fields = tuple(fields)  # type: ignore[attr-defined]
    #: what `row_fields=` declared (None: nothing declared) and the row fields with no option given
    factory.declared_row_fields = declared  # type: ignore[attr-defined]
    factory.row_fields = check_row_fields(  # type: ignore[attr-defined]
        name, [*_inferred_row_fields(fn), *(declared or ())])
    factory.reward_name = name  # type: ignore[attr-defined]
    return factory


#: The types of the execution options (what `REWARDS.validate` checks them against when the function does not take
#: an option of that name itself); `FunctionReward` checks the same bounds when it is built.
EXECUTION_OPTION_TYPES: dict[str, Any] = {
    "max_concurrency": Annotated[int, Field(ge=1)],
    "workers": Annotated[int, Field(ge=1)],
    "item_timeout": Annotated[float, Field(gt=0)] | None,
}


def _factory_signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The options a `@reward` factory takes, as a signature (what `REWARDS.check` and `REWARDS.validate` read):
    every parameter of the function, with its type annotation (any may be given as an option; those not given are
    filled from each rollout or row, or keep their default: see `FunctionReward`), and the execution options it
    does not take itself, all optional keywords; plus `**options` when the function has `**kwargs` (it then
    receives any option)."""
    params = list(inspect.signature(fn).parameters.values())
    annotations = option_annotations(fn)
    named = [p.name for p in params if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    keyword = inspect.Parameter.KEYWORD_ONLY
    out = [inspect.Parameter(n, keyword, default=None, annotation=annotations.get(n, inspect.Parameter.empty))
           for n in named]
    out += [inspect.Parameter(k, keyword, default=None, annotation=EXECUTION_OPTION_TYPES[k])
            for k in EXECUTION_OPTIONS if k not in named]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        out.append(inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(out)
