"""The reward contract: `Reward` protocol, the `@reward` decorator, the `REWARDS` registry and `build_reward`."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from rewardlab.types import Rollout, RewardOutput

#: name -> factory(**options) -> Reward. Filled by `@reward(name=...)` and `register_reward`.
REWARDS: dict[str, Callable[..., Reward]] = {}

ON_ERROR = ("zero", "skip", "raise")


@runtime_checkable
class Reward(Protocol):
    """Scores a batch of rollouts. `name` labels its metrics (`reward/<name>/mean`)."""

    name: str

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]: ...


class RewardError(RuntimeError):
    """Raised by a reward with `on_error="raise"`; the message names the reward and the cause."""


def register_reward(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Register a factory `(**options) -> Reward` under `name`. Raises ValueError if the name is taken."""

    def wrap(factory: Callable[..., Reward]) -> Callable[..., Reward]:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is already registered")
        REWARDS[name] = factory
        return factory

    return wrap


def _rollout_fields(r: Rollout) -> dict[str, Any]:
    fields = dict(r.row)
    fields.update(
        prompt=r.row.get("prompt", r.prompt),
        completion=r.completion,
        answer=r.row.get("answer"),
        steps=list(r.step_text),
        row=r.row,
        rollout=r,
    )
    return fields


def _as_output(value: Any, name: str) -> RewardOutput:
    if isinstance(value, RewardOutput):
        out = value
    else:
        if isinstance(value, Mapping):
            score, comps = float(value["score"]), {k: float(v) for k, v in value.items() if k != "score"}
        else:
            score, comps = float(value), {}
        if not math.isfinite(score):  # before RewardOutput, whose own NaN check would hide the cause
            return RewardOutput(score=0.0, components=comps, error=f"{name}: score is {score}")
        out = RewardOutput(score=score, components=comps)
    if out.error is None and not math.isfinite(out.score):
        return RewardOutput(score=0.0, components=out.components, error=f"{name}: score is {out.score}")
    return out


class FunctionReward:
    """A per-sample function lifted to a batched `Reward`.

    The function receives only the parameters it names, filled from each rollout: `prompt` (the task prompt),
    `completion`, `answer`, `steps` (the step texts, `Rollout.step_text`), `row`, `rollout`, any task-row field, and
    the options given at construction. It returns a float, a dict with `score` and components, or a RewardOutput.
    An exception or a non-finite score becomes `RewardOutput.error` ("<name>: <cause>") with score 0.

    Raises:
        ValueError: at construction, when an option is not a parameter of the function.
    """

    def __init__(self, fn: Callable[..., Any], name: str, options: Mapping[str, Any] | None = None) -> None:
        self.fn = fn
        self.name = name
        self.options = dict(options or {})
        params = inspect.signature(fn).parameters
        self._wants_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self._params = [p for p in params if params[p].kind is not inspect.Parameter.VAR_KEYWORD]
        unknown = set(self.options) - set(self._params)
        if unknown and not self._wants_all:
            raise ValueError(f"reward {name}: unknown option(s) {sorted(unknown)}; valid: {sorted(self._params)}")

    def score_one(self, rollout: Rollout) -> RewardOutput:
        fields = _rollout_fields(rollout)
        fields.update(self.options)
        kwargs = fields if self._wants_all else {p: fields[p] for p in self._params if p in fields}
        try:
            return _as_output(self.fn(**kwargs), self.name)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an explicit error
            return RewardOutput(score=0.0, error=f"{self.name}: {type(exc).__name__}: {exc}".splitlines()[0])

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        return [self.score_one(r) for r in rollouts]


def reward(name: str | None = None, *, weight: float = 1.0, register: bool = True):
    """Decorator: turn a per-sample function into a `Reward` factory and register it under `name`.

    The decorated object is the factory: calling it with options returns a `FunctionReward`. `weight` is the
    default weight used by `build_reward` (0 makes the reward a logged metric only).
    """

    def wrap(fn: Callable[..., Any]):
        reward_name = name or fn.__name__

        def factory(**options: Any) -> FunctionReward:
            return FunctionReward(fn, reward_name, options)

        factory.__doc__ = fn.__doc__
        factory.__name__ = fn.__name__
        factory.default_weight = weight  # type: ignore[attr-defined]
        factory.fn = fn  # type: ignore[attr-defined]
        if register:
            register_reward(reward_name)(factory)
        return factory

    return wrap


class WeightedSum:
    """Several rewards combined as score = Σ_k w_k · score_k; each reward's score is a component by its name.

    A rollout with an error in any member gets that error (joined with "; "), and its score follows `on_error`:
    "zero" sets it to 0, "skip" keeps it for logging but the trainer drops it from the loss, "raise" raises
    `RewardError` naming the reward and cause.
    """

    def __init__(self, members: Sequence[tuple[Reward, float]], on_error: str = "zero", name: str = "reward") -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error: expected one of {ON_ERROR}, got {on_error!r}")
        self.members = list(members)
        # Component labels: the member's name, made unique ("exact_match", "exact_match#2") when names repeat.
        self.labels: list[str] = []
        for member, _ in self.members:
            label, k = member.name, 2
            while label in self.labels:
                label, k = f"{member.name}#{k}", k + 1
            self.labels.append(label)
        self.on_error = on_error
        self.name = name

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        per_member = [(label, w, m(rollouts)) for label, (m, w) in zip(self.labels, self.members)]
        outputs = []
        for i in range(len(rollouts)):
            score, comps, errors, steps = 0.0, {}, [], None
            for label, weight, outs in per_member:
                o = outs[i]
                comps[label] = o.score
                for k, v in o.components.items():
                    comps[k if len(self.members) == 1 else f"{label}/{k}"] = v
                    if k == "correct":  # exact-match correctness stays findable as `correct` (first reporter)
                        comps.setdefault("correct", v)
                if o.error is not None:
                    errors.append(o.error)
                score += weight * o.score
                if o.step_scores is not None and steps is None:
                    steps = o.step_scores
            error = "; ".join(errors) or None
            if error is not None:
                if self.on_error == "raise":
                    raise RewardError(error)
                score = 0.0
            outputs.append(RewardOutput(score=score, components=comps, step_scores=steps, error=error))
        return outputs


def build_reward(specs: Sequence[Mapping[str, Any]] | str, *, on_error: str = "zero") -> WeightedSum:
    """Build a composed reward from config, e.g. `[{name: reasoning_gym}, {name: format, weight: 0.2}]`.

    A bare string is one reward with its default weight. Each spec: `name`, optional `weight`, other keys are the
    reward's options.

    Raises:
        ValueError: an unknown reward name (the message lists valid names), a spec without `name`, or an option
            the reward does not take.
    """
    if isinstance(specs, str):
        specs = [{"name": specs}]
    members = []
    for i, spec in enumerate(specs):
        spec = dict(spec)
        if "name" not in spec:
            raise ValueError(f"rewards[{i}]: missing 'name'")
        name = spec.pop("name")
        if name not in REWARDS:
            raise ValueError(f"rewards[{i}].name: unknown reward {name!r}; valid: {', '.join(sorted(REWARDS))}")
        factory = REWARDS[name]
        weight = float(spec.pop("weight", getattr(factory, "default_weight", 1.0)))
        try:
            members.append((factory(**spec), weight))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"rewards[{i}] ({name}): {exc}") from None
    return WeightedSum(members, on_error=on_error)
