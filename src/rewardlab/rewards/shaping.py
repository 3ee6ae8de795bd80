"""Reward shaping: length and overlong penalties, PAR, and the clip and delta transforms of process rewards.

Each rule is a pure function (callable from the trainer or a test on plain numbers) and a config node that wraps a
reward: `{shape: KIND, reward: SPEC, ...options}` (checked by `parse_shaping` when `rewards.compose.parse_rewards`
parses a spec tree, constructed by `build_shaping` when `build_reward` builds it). A shaped output
keeps the reward's components, adds the shaping's own, and keeps the score before shaping in
`components["unshaped"]`; only the innermost shaping sets it (when absent), so it is the score no shaping touched
(dynamic sampling filters on it). An output with an error passes through unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rewardlab.registry import Registry
from rewardlab.types import Rollout, RewardOutput

#: shape kind -> the shaping node's class, `cls(reward, <options>, name=)`; `cls.check(<options>)` makes the checks
#: of its constructor without constructing it. Its options are numbers unless its registration meta names them as
#: `fields` (row field names, strings) or `specs` (nested reward specs).
SHAPINGS: Registry[Callable[..., Any]] = Registry("shaping", reserved=("reward", "name"))


# ---------------------------------------------------------------------------------------------- pure functions
def length_penalty(lengths: Iterable[float], coef: float, free_len: float = 0.0) -> list[float]:
    """A linear length penalty, added to the reward: p(L) = -coef * max(0, L - free_len).

    Args:
        lengths: completion lengths L in tokens, one per rollout.
        coef: penalty per token beyond `free_len` (>= 0), in reward units per token.
        free_len: tokens that cost nothing (>= 0).
    Returns:
        one penalty per length, <= 0.
    Raises:
        ValueError: a negative `coef` or `free_len`.
    """
    if coef < 0 or free_len < 0:
        raise ValueError(f"length penalty: coef and free_len must be >= 0, got coef={coef}, free_len={free_len}")
    return [-coef * max(0.0, float(L) - free_len) for L in lengths]


def overlong_penalty(lengths: Iterable[float], max_len: float, buffer: float, factor: float = 1.0) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476), added to the reward.

        p(L) = 0                                        if L <= max_len - buffer
               ((max_len - buffer) - L) / buffer        if max_len - buffer < L <= max_len
               -1                                       if L > max_len
        times `factor`.

    Args:
        lengths: completion lengths L in tokens (`len(rollout.completion_ids)`), one per rollout.
        max_len: L_max, the longest completion allowed, tokens (> 0).
        buffer: L_cache, the length of the penalty ramp before max_len, tokens (0 < buffer <= max_len).
        factor: scale of the penalty (>= 0; 1.0 in DAPO).
    Returns:
        one penalty per length, in [-factor, 0].
    Raises:
        ValueError: max_len <= 0, buffer outside (0, max_len], or factor < 0.
    """
    if max_len <= 0 or not 0 < buffer <= max_len or factor < 0:
        raise ValueError(f"overlong penalty: need max_len > 0, 0 < buffer <= max_len and factor >= 0; got "
                         f"max_len={max_len}, buffer={buffer}, factor={factor}")
    start = max_len - buffer
    out = []
    for L in lengths:
        L = float(L)
        p = 0.0 if L <= start else (start - L) / buffer if L <= max_len else -1.0
        out.append(factor * p)
    return out


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def par_reward(rewards: Iterable[float], references: Iterable[float | Sequence[float]]) -> list[float]:
    """Preference As Reward, PAR (Fu et al. 2025, "Reward Shaping to Mitigate Reward Hacking in RLHF",
    arXiv 2502.18770): the reward centred on a reference reward and squashed by a sigmoid.

        r' = (1/M) * sum_m sigmoid(r - r_ref_m)      with M reference rewards (M = 1: sigmoid(r - r_ref))

    r' in (0, 1); it is 0.5 when r equals the reference, and it saturates, which bounds what hacking can gain.

    Args:
        rewards: r, one per rollout (reward-model units).
        references: per rollout, r_ref (a number) or the rewards of M >= 1 reference responses.
    Returns:
        one shaped reward per rollout.
    Raises:
        ValueError: lengths differ, or a rollout has no reference reward.
    """
    rewards, references = list(rewards), list(references)
    if len(rewards) != len(references):
        raise ValueError(f"par: {len(rewards)} rewards but {len(references)} references")
    out = []
    for r, ref in zip(rewards, references):
        refs = [float(ref)] if isinstance(ref, (int, float)) else [float(x) for x in ref]
        if not refs:
            raise ValueError("par: a rollout has no reference reward")
        out.append(sum(_sigmoid(float(r) - x) for x in refs) / len(refs))
    return out


def clip_steps(step_scores: Sequence[float], eta: float) -> list[float]:
    """The clip transform of process rewards (Gao et al. 2024, "On Designing Effective RL Reward at Training Time
    for LLM Reasoning", arXiv 2410.15115): r'_s = min(r_s - eta, 0).

    Every step reward is <= 0, so repeating steps cannot raise the return (the hack the transform prevents).

    Args:
        step_scores: per-step process rewards r_s.
        eta: the threshold subtracted, unitless.
    """
    return [min(float(s) - eta, 0.0) for s in step_scores]


def delta_steps(step_scores: Sequence[float]) -> list[float]:
    """The delta transform of process rewards (Gao et al. 2024, arXiv 2410.15115).

        r'_s = r_s - r_{s+1}   for s < K (1-based steps 1..K),   r'_K = r_K (the last step is kept)

    The return from step s telescopes to sum_{t >= s} r'_t = r_s: it is bounded by one step's reward however many
    steps there are. [] gives [].
    """
    scores = [float(s) for s in step_scores]
    return [a - b for a, b in zip(scores, scores[1:])] + scores[-1:]


# ---------------------------------------------------------------------------------------------- config nodes
class ShapedReward:
    """Base of the shaping nodes: score the wrapped reward, then reshape each output without an error.

    Subclasses implement `shape(rollouts, outputs) -> list[tuple[score, step_scores, extra components] | str]`
    (a string is that rollout's error), and `check(<options>)` when their options have bounds (their constructor
    calls it; `parse_shaping` calls it on a spec's options, constructing nothing).
    """

    kind = "shaping"

    @classmethod
    def check(cls, **options: Any) -> None:
        """Check option values beyond their types (nothing here). Raises ValueError: one line, the cause."""

    def __init__(self, reward: Any, name: str | None = None) -> None:
        self.reward = reward
        self.name = name or reward.name

    def shape(self, rollouts: Sequence[Rollout], outputs: Sequence[RewardOutput]) -> list[Any]:
        raise NotImplementedError

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        outputs = self.reward(rollouts)
        ok = [i for i, o in enumerate(outputs) if o.error is None]
        shaped = dict(zip(ok, self.shape([rollouts[i] for i in ok], [outputs[i] for i in ok]))) if ok else {}
        result = []
        for i, o in enumerate(outputs):
            if i not in shaped:
                result.append(o)
                continue
            comps = dict(o.components)
            comps.setdefault("unshaped", o.score)
            value = shaped[i]
            if isinstance(value, str):
                result.append(RewardOutput(score=0.0, components=comps, step_scores=o.step_scores,
                                           error=f"{self.kind}: {value}"))
                continue
            score, steps, extra = value
            comps.update(extra)
            result.append(RewardOutput(score=score, components=comps, step_scores=steps))
        return result


@SHAPINGS.register("length")
class LengthShaped(ShapedReward):
    """score = reward + length_penalty(L, coef, free_len); component `length_penalty`."""

    kind = "length"

    def __init__(self, reward: Any, coef: float, free_len: float = 0.0, name: str | None = None) -> None:
        super().__init__(reward, name)
        self.check(coef, free_len)
        self.coef, self.free_len = coef, free_len

    @classmethod
    def check(cls, coef: float, free_len: float = 0.0) -> None:
        """Raises ValueError: a negative `coef` or `free_len` (see `length_penalty`)."""
        length_penalty([], coef, free_len)

    def shape(self, rollouts, outputs):
        pens = length_penalty([len(r.completion_ids) for r in rollouts], self.coef, self.free_len)
        return [(o.score + p, o.step_scores, {"length_penalty": p}) for o, p in zip(outputs, pens)]


@SHAPINGS.register("overlong")
class OverlongShaped(ShapedReward):
    """score = reward + overlong_penalty(L, max_len, buffer, factor) (DAPO); component `overlong_penalty`."""

    kind = "overlong"

    def __init__(self, reward: Any, max_len: float, buffer: float, factor: float = 1.0,
                 name: str | None = None) -> None:
        super().__init__(reward, name)
        self.check(max_len, buffer, factor)
        self.max_len, self.buffer, self.factor = max_len, buffer, factor

    @classmethod
    def check(cls, max_len: float, buffer: float, factor: float = 1.0) -> None:
        """Raises ValueError: max_len <= 0, buffer outside (0, max_len], or factor < 0 (see `overlong_penalty`)."""
        overlong_penalty([], max_len, buffer, factor)

    def shape(self, rollouts, outputs):
        pens = overlong_penalty([len(r.completion_ids) for r in rollouts], self.max_len, self.buffer, self.factor)
        return [(o.score + p, o.step_scores, {"overlong_penalty": p}) for o, p in zip(outputs, pens)]


@SHAPINGS.register("par", fields=("ref_field", "ref_completion_field"), specs=("ref_reward",))
class PARShaped(ShapedReward):
    """score = par_reward(reward, r_ref); component `par_ref` (the mean reference reward).

    r_ref comes from exactly one of: `ref` (a constant), `ref_field` (a row field holding a number or a list of
    numbers), or `ref_completion_field` (a row field holding a reference response, or a list of them, scored by
    `ref_reward`, by default the shaped reward itself: the PAR setting of one reward model scoring both). A
    reference response is scored as a rollout of the same prompt and row with that completion and no token ids;
    each distinct (prompt, reference) pair is scored once per batch.
    """

    kind = "par"

    def __init__(self, reward: Any, *, ref: float | None = None, ref_field: str | None = None,
                 ref_completion_field: str | None = None, ref_reward: Any = None, name: str | None = None) -> None:
        super().__init__(reward, name)
        self.check(ref=ref, ref_field=ref_field, ref_completion_field=ref_completion_field, ref_reward=ref_reward)
        self.ref, self.ref_field, self.ref_completion_field = ref, ref_field, ref_completion_field
        self.ref_reward = ref_reward if ref_reward is not None else reward

    @classmethod
    def check(cls, *, ref: float | None = None, ref_field: str | None = None, ref_completion_field: str | None = None,
              ref_reward: Any = None) -> None:
        """Raises ValueError: not exactly one of `ref`, `ref_field`, `ref_completion_field`, or `ref_reward`
        without `ref_completion_field` (`ref_reward` is only looked at for None)."""
        given = [k for k, v in (("ref", ref), ("ref_field", ref_field), ("ref_completion_field",
                                                                           ref_completion_field)) if v is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of 'ref', 'ref_field' or 'ref_completion_field' "
                             f"(got {', '.join(given) or 'none'})")
        if ref_reward is not None and ref_completion_field is None:
            raise ValueError("'ref_reward' scores reference responses: it needs 'ref_completion_field'")

    def _references(self, rollouts: Sequence[Rollout]) -> list[list[float] | str]:
        if self.ref is not None:
            return [[float(self.ref)] for _ in rollouts]
        field = self.ref_field or self.ref_completion_field
        values: list[list[Any] | str] = []
        for r in rollouts:
            if field not in r.row:
                values.append(f"the task row has no field {field!r}")
                continue
            v = r.row[field]
            v = list(v) if isinstance(v, (list, tuple)) else [v]
            values.append(v if v else f"row field {field!r} is empty")
        if self.ref_field is not None:
            out: list[list[float] | str] = []
            for v in values:
                if isinstance(v, str):
                    out.append(v)
                elif all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                    out.append([float(x) for x in v])
                else:
                    out.append(f"row field {field!r} must hold a number or a list of numbers, got {v!r}")
            return out
        keys: dict[tuple[str, str], int] = {}
        ref_rollouts: list[Rollout] = []
        for r, v in zip(rollouts, values):
            for text in v if not isinstance(v, str) else []:
                key = (r.prompt, str(text))
                if key not in keys:
                    keys[key] = len(ref_rollouts)
                    ref_rollouts.append(Rollout(prompt=r.prompt, prompt_ids=list(r.prompt_ids), completion=str(text),
                                                completion_ids=[], logprobs=[], row=r.row, group=r.group))
        scored = self.ref_reward(ref_rollouts) if ref_rollouts else []
        out = []
        for r, v in zip(rollouts, values):
            if isinstance(v, str):
                out.append(v)
                continue
            outs = [scored[keys[(r.prompt, str(text))]] for text in v]
            errs = [o.error for o in outs if o.error is not None]
            out.append(f"reference: {errs[0]}" if errs else [o.score for o in outs])
        return out

    def shape(self, rollouts, outputs):
        result = []
        for o, refs in zip(outputs, self._references(rollouts)):
            if isinstance(refs, str):
                result.append(refs)
                continue
            (score,) = par_reward([o.score], [refs])
            result.append((score, o.step_scores, {"par_ref": sum(refs) / len(refs)}))
        return result


@SHAPINGS.register("clip")
class ClipShaped(ShapedReward):
    """step_scores = clip_steps(step_scores, eta) (Gao et al. 2024); the score passes through."""

    kind = "clip"

    def __init__(self, reward: Any, eta: float, name: str | None = None) -> None:
        super().__init__(reward, name)
        self.eta = float(eta)

    def shape(self, rollouts, outputs):
        return [(o.score, clip_steps(o.step_scores, self.eta), {}) if o.step_scores is not None
                else f"reward {self.reward.name} gave no step_scores (clip transforms process rewards)"
                for o in outputs]


@SHAPINGS.register("delta")
class DeltaShaped(ShapedReward):
    """step_scores = delta_steps(step_scores) (Gao et al. 2024); the score passes through."""

    kind = "delta"

    def shape(self, rollouts, outputs):
        return [(o.score, delta_steps(o.step_scores), {}) if o.step_scores is not None
                else f"reward {self.reward.name} gave no step_scores (delta transforms process rewards)"
                for o in outputs]


# ---------------------------------------------------------------------------------------------- config parse, build
#: (a nested spec, its path) -> its parsed node (`rewards.compose.parse_node`).
Parse = Callable[[Any, str], Any]
#: a parsed node -> the reward built from it (`rewards.compose`'s build step).
Build = Callable[[Any], Any]


def parse_shaping(kind: str, spec: Mapping[str, Any], path: str, parse: Parse) -> dict[str, Any]:
    """The checked options of the shaping node `{shape: kind, reward: ..., ...spec}` found at `path` (`spec`: its keys
    less `shape`, `reward` and `label`); nothing is constructed.

    Every key of `spec` must be an option of `SHAPINGS[kind]` (and its required options present) whose value its
    annotation accepts (`Registry.validate`, which also reads each value as its annotation says); a number option
    must be a finite number, a `fields` option a string; a `specs` option is parsed with `parse(spec, path)` (its
    value in the result is the parsed node); then the class's own `check` runs on the options.

    Args:
        kind: a registered shaping (the caller reports an unknown one with its path).
    Raises:
        ValueError: one line naming `path`: an unknown or missing option (listing the valid ones), a value of the
            wrong type, what parsing a nested spec raises, or what the class's `check` raises (that one bare: the
            caller adds where it is).
    """
    options = SHAPINGS.validate(kind, spec, field=path, complete=True)
    meta = SHAPINGS.meta(kind)
    for key, value in options.items():
        if key in meta.get("specs", ()):
            options[key] = parse(value, f"{path}.{key}")
        elif key in meta.get("fields", ()):
            if not isinstance(value, str):
                raise ValueError(f"{path}.{key}: expected a row field name, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{path}.{key}: expected a number, got {value!r}")
    SHAPINGS[kind].check(**options)
    return options


def build_shaping(kind: str, reward: Any, options: Mapping[str, Any], build: Build) -> ShapedReward:
    """The shaping node `SHAPINGS[kind]` around the built `reward`, from the options `parse_shaping` returned (a
    `specs` option holds a parsed node: it is built with `build(node)`). No option is looked up or read again; the
    class's constructor repeats only its own `check`.

    Raises:
        ValueError: what building a nested spec raises (one line naming its path).
    """
    specs = SHAPINGS.meta(kind).get("specs", ())
    return SHAPINGS[kind](reward, **{k: build(v) if k in specs else v for k, v in options.items()})
