"""Composed rewards: weighted sum, gated, tiered (lexicographic) and multiplicative penalties, and the config builder.

Every node is a `Reward` (a batch of rollouts in, one `RewardOutput` per rollout out) built from config by
`build_reward` (below), so nodes nest. A node's components hold each child's score under the child's label
and the child's own components under "<label>/<key>"; the first child component named `correct` is also kept as
`correct` (the accuracy metric reads it). A child's error makes the node's output an error (score 0, the texts
joined with "; "); the top-level `WeightedSum` then applies `on_error`.

Config (the `rewards:` list of a `rewardlab train` config; docs/rewards-compose.md has worked examples):

    leaf:     {name: REWARD, weight: W, label: L, ...options of the reward}    REWARD: a registered name, or
              MODULE:FUNCTION / PATH.py:FUNCTION to import one (`rewards.importing`)
    sum:      {compose: sum, rewards: [SPEC, ...]}                               members take `weight`
    gated:    {compose: gated, gate: SPEC, reward: SPEC, threshold: 1.0, gate_weight: 0.0}
    tiered:   {compose: tiered, tiers: [SPEC + {threshold: T}, ..., SPEC]}
    penalty:  {compose: penalty, reward: SPEC, penalties: [SPEC, ...]}
    shaping:  {shape: length | overlong | par | clip | delta, reward: SPEC, ...}   (see `rewards.shaping`)

`label` (any node) names its components; default: the reward name, the composition kind, or for a shaping node the
label of the reward it shapes. `weight` belongs to members of a sum and to the reward a shaping wraps (it scales that
reward before the shaping adds its term: `{shape: overlong, reward: {name: r, weight: 0}, ...}` is the overlong
penalty alone, with r logged); `threshold` belongs to tiers; anywhere else these keys are the reward's own options
(`weight` is never one). Every option's value is checked against the annotation of the parameter it goes to
(`Registry.validate`) before anything is built.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewardlab.registry import Registry
from rewardlab.rewards.base import ON_ERROR, REWARDS, Reward, RewardError
from rewardlab.rewards.importing import is_import_name, resolve_reward
from rewardlab.rewards.shaping import SHAPINGS, build_shaped
from rewardlab.types import Rollout, RewardOutput, parse_errors

#: compose kind -> builder(path, label, <the node's keys>) -> Reward.
COMPOSITIONS: Registry[Callable[..., Reward]] = Registry("composition", reserved=("path", "label"))


# ---------------------------------------------------------------------------------------------- shared helpers
def unique_labels(names: Sequence[str]) -> list[str]:
    """`names` made unique in order: a repeat of "x" becomes "x#2", "x#3", ..."""
    labels: list[str] = []
    for name in names:
        label, k = name, 2
        while label in labels:
            label, k = f"{name}#{k}", k + 1
        labels.append(label)
    return labels


def add_child(components: dict[str, float], label: str, out: RewardOutput, *, bare: bool = False) -> None:
    """Log a child's output in a node's components: `label` -> its score, "<label>/<key>" -> each component
    ("<key>" when `bare`); the first `correct` seen is also kept as `correct`."""
    components[label] = out.score
    for key, value in out.components.items():
        components[key if bare else f"{label}/{key}"] = value
        if key == "correct":
            components.setdefault("correct", value)


def error_sources(error: str | None) -> list[str]:
    """The reward names an error text starts with, one per joined error: "judge: HTTP 500 ...; math: timed out"
    -> ["judge", "math"] (for `reward/errors/<name>` counts). [] for None."""
    return [name for name, _ in parse_errors(error)]


def _failed(components: dict[str, float], errors: Sequence[str]) -> RewardOutput:
    return RewardOutput(score=0.0, components=components, error="; ".join(errors))


def non_finite(score: float, components: Mapping[str, float] | None = None,
               step_scores: Sequence[float] | None = None) -> str | None:
    """The first NaN or +-inf among a score, its components and step scores, as a cause ("score is inf",
    "component 'judge' is nan", "step_scores[2] is nan"); None when all are finite."""
    if not math.isfinite(score):
        return f"score is {score}"
    for key, value in (components or {}).items():
        if not math.isfinite(value):
            return f"component {key!r} is {value}"
    for j, value in enumerate(step_scores or ()):
        if not math.isfinite(value):
            return f"step_scores[{j}] is {value}"
    return None


def finite_or_error(out: RewardOutput, name: str) -> RewardOutput:
    """`out` if its score, components and step scores are all finite; else an error output "<name>: <cause>" with
    score 0, the finite components kept and no step scores (an output that already has an error keeps it, minus its
    non-finite values)."""
    cause = non_finite(out.score, out.components, out.step_scores)
    if cause is None:
        return out
    components = {k: v for k, v in out.components.items() if math.isfinite(v)}
    return RewardOutput(score=0.0, components=components, error=out.error or f"{name}: {cause}")


# ---------------------------------------------------------------------------------------------- weighted sum
class WeightedSum:
    """Several rewards combined as score = sum_k w_k * score_k.

    Components: each member's score under its label (the member's name, made unique: "exact_match",
    "exact_match#2"), each member's components under "<label>/<key>" (bare "<key>" when there is one member), and
    `correct` from the first member that reports it. When a member was shaped (`rewards.shaping`), `unshaped` =
    sum_k w_k * unshaped_k (a member's unshaped score is its score when it was not shaped).

    step_scores = sum_k w_k * step_scores_k over the members with a non-zero weight that give step scores (one
    per `Rollout.steps` entry); None when none does. Step lists of different lengths are an error.

    A member output with a NaN or inf score, component or step score is an error of that member ("<member>: score is
    nan", "<member>: component 'x' is inf", ...), so no non-finite value reaches an estimator: it is counted in
    `reward/errors` and handled by `on_error` like any other reward error; so is a weighted sum that overflows. This
    is the one place every reward's output passes before the trainer sees it.

    A rollout with an error in any member gets those errors (joined with "; "), and its score follows `on_error`:
    "zero" sets it to 0, "skip" also 0 (the trainer drops the rollout from the batch), "raise" raises
    `RewardError` naming the reward and cause.

    Raises:
        ValueError: an unknown `on_error`, or `labels` of the wrong length.
    """

    def __init__(
        self,
        members: Sequence[tuple[Reward, float]],
        on_error: str = "zero",
        name: str = "reward",
        labels: Sequence[str | None] | None = None,
    ) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error: expected one of {ON_ERROR}, got {on_error!r}")
        self.members = list(members)
        given = list(labels) if labels is not None else [None] * len(self.members)
        if len(given) != len(self.members):
            raise ValueError(f"{name}: {len(given)} labels for {len(self.members)} members")
        self.labels = unique_labels([lab or m.name for lab, (m, _) in zip(given, self.members)])
        self.on_error = on_error
        self.name = name

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        per_member = [(label, m.name, w, m(rollouts)) for label, (m, w) in zip(self.labels, self.members)]
        bare = len(self.members) == 1
        outputs = []
        for i in range(len(rollouts)):
            score, comps, errors, steps = 0.0, {}, [], None
            shaped = False
            unshaped = 0.0
            for label, member, weight, outs in per_member:
                o = finite_or_error(outs[i], member)
                add_child(comps, label, o, bare=bare)
                if o.error is not None:
                    errors.append(o.error)
                score += weight * o.score
                shaped = shaped or "unshaped" in o.components
                unshaped += weight * o.components.get("unshaped", o.score)
                if o.step_scores is not None and weight != 0:
                    if steps is None:
                        steps = [0.0] * len(o.step_scores)
                    if len(o.step_scores) != len(steps):
                        errors.append(f"{self.name}: step_scores of {label} have {len(o.step_scores)} entries, "
                                      f"another member's {len(steps)}")
                        continue
                    steps = [s + weight * x for s, x in zip(steps, o.step_scores)]
            if shaped:
                comps["unshaped"] = unshaped
            if not errors:  # finite members can still overflow (1e308 * 10) or cancel (inf - inf); the members'
                # own scores and components in `comps` passed finite_or_error, so only the sums need a look
                cause = non_finite(score, {"unshaped": unshaped} if shaped else None, steps)
                if cause is not None:
                    errors.append(f"{self.name}: weighted {cause}")
            error = "; ".join(errors) or None
            if error is not None:
                if self.on_error == "raise":
                    raise RewardError(error)
                score = 0.0
                comps = {k: v for k, v in comps.items() if math.isfinite(v)}
                steps = steps if steps is None or all(math.isfinite(x) for x in steps) else None
            outputs.append(RewardOutput(score=score, components=comps, step_scores=steps, error=error))
        return outputs


# ---------------------------------------------------------------------------------------------- gated
def component_weights(reward: Reward) -> list[tuple[str, float]]:
    """The (component label, weight) pairs whose weighted sum is `reward`'s score: score = sum_k w_k * score_k.

    For a `WeightedSum` (what `build_reward` returns): each member's label (the key of its score in the output's
    `components`) and weight w_k, in member order. Any other reward is one component: its `name`, weight 1.0 (a
    tiered or penalty reward is not a sum, so it is not split). GDPO (`rl.advantages.gdpo`) normalizes each of these
    components on its own and sums them with these weights.
    """
    if isinstance(reward, WeightedSum):
        return [(label, float(w)) for label, (_, w) in zip(reward.labels, reward.members)]
    return [(reward.name, 1.0)]


class GatedReward:
    """A reward that counts only for rollouts whose gate reward reaches a threshold.

    Posterior-GRPO (Fan et al. 2025, arXiv 2508.05170) rewards the reasoning process only of rollouts whose outcome
    is correct; Gated Reward Accumulation, G-RA (arXiv 2508.10548, 2025) accumulates step rewards only when the
    outcome reward is >= tau. Both are this node with the outcome reward as the gate.

        open_i  = gate_i >= threshold            (a gate error closes nothing: the rollout is an error)
        score_i = gate_weight * gate_i + (reward_i if open_i else 0)
        step_scores_i = reward_i's step_scores if open_i else [0] * len(rollout.steps) (None without steps)

    `reward` is scored only on the open rollouts of the batch (a process reward model or a judge is not called for
    the others). Components: the gate's label -> gate score, `gate_open` -> 1 or 0, the reward's label -> its score
    (open rollouts only), and both children's components under "<label>/<key>".

    Args:
        gate: the gate reward (e.g. an outcome verifier).
        reward: the gated reward (e.g. a process reward).
        threshold: gate score needed, unitless (default 1.0: a correct outcome).
        gate_weight: weight of the gate's own score in `score` (default 0: the gate only gates).
    """

    def __init__(self, gate: Reward, reward: Reward, *, threshold: float = 1.0, gate_weight: float = 0.0,
                 name: str = "gated", labels: tuple[str | None, str | None] = (None, None)) -> None:
        self.gate, self.reward = gate, reward
        self.threshold, self.gate_weight = float(threshold), float(gate_weight)
        self.name = name
        self.gate_label, self.reward_label = unique_labels([labels[0] or gate.name, labels[1] or reward.name])

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        gates = self.gate(rollouts)
        is_open = [g.error is None and g.score >= self.threshold for g in gates]
        open_idx = [i for i, o in enumerate(is_open) if o]
        inner = dict(zip(open_idx, self.reward([rollouts[i] for i in open_idx]) if open_idx else []))
        outputs = []
        for i, (r, g) in enumerate(zip(rollouts, gates)):
            comps: dict[str, float] = {}
            add_child(comps, self.gate_label, g)
            comps["gate_open"] = float(is_open[i])
            if g.error is not None:
                outputs.append(_failed(comps, [g.error]))
                continue
            score = self.gate_weight * g.score
            steps = [0.0] * len(r.steps) if r.steps else None
            if is_open[i]:
                o = inner[i]
                add_child(comps, self.reward_label, o)
                if o.error is not None:
                    outputs.append(_failed(comps, [o.error]))
                    continue
                score += o.score
                steps = o.step_scores
            outputs.append(RewardOutput(score=score, components=comps, step_scores=steps))
        return outputs


# ---------------------------------------------------------------------------------------------- tiered
class TieredReward:
    """Lexicographic tiers: a lower tier counts only once every higher tier meets its threshold.

    The ordering follows the hierarchical rewards of ChipSeek-R1 (Chen et al. 2025, arXiv 2507.04736: syntax ->
    functional correctness -> PPA) and OptiAgent; the banded formula below is rewardlab's own. With K tiers of
    scores s_j in [0, 1] and thresholds tau_j (j < K-1; the last tier's threshold is not used):

        k     = the first j < K-1 with s_j < tau_j, or K-1 when every such tier passes
        score = (k + s_k) / K                      in [0, 1]

    Tier k owns the band [k/K, (k+1)/K]: a rollout stuck at tier k scores below k+1/K (s_k < tau_k <= 1), one that
    passed it scores at least (k+1)/K, so the order is strict. Example, K = 3 (format, correct, efficiency):
    format 0.5 -> (0 + 0.5)/3 = 0.1667; format 1, correct 0 -> (1 + 0)/3 = 0.3333; all pass, efficiency 0.6 ->
    (2 + 0.6)/3 = 0.8667.

    Tier j is scored only on the rollouts that passed every tier before it. Components: each scored tier's label ->
    its score (and its components under "<label>/<key>"), `tier` -> k. A tier score outside [0, 1] is an error.

    Raises:
        ValueError: fewer than 2 tiers, a threshold outside [0, 1], or thresholds of the wrong length.
    """

    def __init__(self, tiers: Sequence[Reward], thresholds: Sequence[float], *, name: str = "tiered",
                 labels: Sequence[str | None] | None = None) -> None:
        if len(tiers) < 2:
            raise ValueError(f"{name}: needs at least 2 tiers, got {len(tiers)}")
        if len(thresholds) != len(tiers) - 1:
            raise ValueError(f"{name}: {len(thresholds)} thresholds for {len(tiers)} tiers (want one per tier "
                             "but the last)")
        for j, t in enumerate(thresholds):
            if not 0.0 <= float(t) <= 1.0:
                raise ValueError(f"{name}: tier {j} threshold must be in [0, 1], got {t}")
        self.tiers = list(tiers)
        self.thresholds = [float(t) for t in thresholds]
        self.name = name
        given = list(labels) if labels is not None else [None] * len(self.tiers)
        self.labels = unique_labels([lab or t.name for lab, t in zip(given, self.tiers)])

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        K = len(self.tiers)
        comps: list[dict[str, float]] = [{} for _ in rollouts]
        errors: list[list[str]] = [[] for _ in rollouts]
        stuck: dict[int, tuple[int, float]] = {}  # rollout index -> (tier k, s_k)
        active = list(range(len(rollouts)))
        for j, (tier, label) in enumerate(zip(self.tiers, self.labels)):
            if not active:
                break
            outs = tier([rollouts[i] for i in active])
            still = []
            for i, o in zip(active, outs):
                add_child(comps[i], label, o)
                if o.error is not None:
                    errors[i].append(o.error)
                elif not 0.0 <= o.score <= 1.0:
                    errors[i].append(f"{self.name}: tier {label} scored {o.score:g}, outside [0, 1]")
                elif j == K - 1 or o.score < self.thresholds[j]:
                    stuck[i] = (j, o.score)
                else:
                    still.append(i)
            active = still
        outputs = []
        for i in range(len(rollouts)):
            if errors[i]:
                outputs.append(_failed(comps[i], errors[i]))
                continue
            k, s = stuck[i]
            comps[i]["tier"] = float(k)
            outputs.append(RewardOutput(score=(k + s) / K, components=comps[i]))
        return outputs


# ---------------------------------------------------------------------------------------------- penalty
class PenaltyReward:
    """A reward multiplied by penalty factors in [0, 1].

    CaRL (Jaeger et al. 2025, arXiv 2504.17838) rewards route completion and penalizes each infraction by
    multiplying, not subtracting:

        score = reward * prod_j p_j,        p_j in [0, 1] (1: no penalty)
        step_scores = reward's step_scores, each times prod_j p_j (None when the reward gives none)

    Components: the reward's label -> its score, each penalty's label -> p_j, `penalty_factor` -> prod_j p_j, and the
    children's components under "<label>/<key>". A factor outside [0, 1] is an error.
    """

    def __init__(self, reward: Reward, penalties: Sequence[Reward], *, name: str = "penalty",
                 labels: Sequence[str | None] | None = None) -> None:
        if not penalties:
            raise ValueError(f"{name}: needs at least one penalty")
        self.reward, self.penalties = reward, list(penalties)
        self.name = name
        given = list(labels) if labels is not None else [None] * (1 + len(self.penalties))
        self.labels = unique_labels([lab or m.name for lab, m in zip(given, [reward, *self.penalties])])

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        outs = [m(rollouts) for m in [self.reward, *self.penalties]]
        outputs = []
        for i in range(len(rollouts)):
            comps: dict[str, float] = {}
            errors, factor = [], 1.0
            for j, (label, member_outs) in enumerate(zip(self.labels, outs)):
                o = member_outs[i]
                add_child(comps, label, o)
                if o.error is not None:
                    errors.append(o.error)
                elif j > 0:
                    if not 0.0 <= o.score <= 1.0:
                        errors.append(f"{self.name}: factor {label} = {o.score:g} is outside [0, 1]")
                    factor *= o.score
            comps["penalty_factor"] = factor
            if errors:
                outputs.append(_failed(comps, errors))
                continue
            base = outs[0][i]
            steps = None if base.step_scores is None else [s * factor for s in base.step_scores]
            outputs.append(RewardOutput(score=base.score * factor, components=comps, step_scores=steps))
        return outputs


# ---------------------------------------------------------------------------------------------- config builder
def _number(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}.{key}: expected a number, got {value!r}")
    return float(value)


def _list(value: Any, key: str, path: str) -> list[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{path}.{key}: expected a non-empty list of reward specs, got {value!r}")
    return list(value)


def _members(items: Sequence[Any], path: str) -> tuple[list[tuple[Reward, float]], list[str]]:
    """Members of a sum: each spec may carry `weight` (default: the reward's default weight, else 1)."""
    members, labels = [], []
    for i, item in enumerate(items):
        item_path = f"{path}[{i}]"
        spec = _as_spec(item, item_path)
        weight = spec.pop("weight") if "weight" in spec else _default_weight(spec, item_path)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"{item_path}.weight: expected a number, got {weight!r}")
        reward, label = build_node(spec, item_path)
        members.append((reward, float(weight)))
        labels.append(label)
    return members, labels


def _default_weight(spec: Mapping[str, Any], path: str) -> float:
    """A leaf's default weight is its factory's `default_weight` (from `@reward(weight=...)`); a node's is 1."""
    name = spec.get("name")
    if is_import_name(name) and not any(k in spec for k in ("compose", "shape")):
        name = _resolve(name, path)
    factory = REWARDS.get(name, None) if isinstance(name, str) else None
    return getattr(factory, "default_weight", 1.0)


def _resolve(name: Any, path: str) -> str:
    """The `REWARDS` name of a leaf's `name`: itself, or for MODULE:FUNCTION the imported reward's name."""
    if not is_import_name(name):
        return name
    try:
        return resolve_reward(name)
    except ValueError as exc:
        raise ValueError(f"{path}.name: {exc}") from None


@COMPOSITIONS.register("sum")
def _compose_sum(path: str, label: str | None, *, rewards: Sequence[Any]) -> Reward:
    members, labels = _members(_list(rewards, "rewards", path), f"{path}.rewards")
    return WeightedSum(members, name=label or "sum", labels=labels)


@COMPOSITIONS.register("gated")
def _compose_gated(path: str, label: str | None, *, gate: Any, reward: Any, threshold: float = 1.0,
                   gate_weight: float = 0.0) -> Reward:
    gate_node, gate_label = build_node(gate, f"{path}.gate")
    inner, inner_label = build_node(reward, f"{path}.reward")
    return GatedReward(gate_node, inner, threshold=_number(threshold, "threshold", path),
                       gate_weight=_number(gate_weight, "gate_weight", path), name=label or "gated",
                       labels=(gate_label, inner_label))


@COMPOSITIONS.register("tiered")
def _compose_tiered(path: str, label: str | None, *, tiers: Sequence[Any]) -> Reward:
    items = _list(tiers, "tiers", path)
    if len(items) < 2:
        raise ValueError(f"{path}.tiers: needs at least 2 tiers, got {len(items)}")
    built, thresholds, labels = [], [], []
    for j, item in enumerate(items):
        tier_path = f"{path}.tiers[{j}]"
        tier_spec = _as_spec(item, tier_path)
        threshold = _number(tier_spec.pop("threshold", 1.0), "threshold", tier_path)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"{tier_path}.threshold: must be in [0, 1] (tier scores are in [0, 1]), got {threshold}")
        reward, tier_label = build_node(tier_spec, tier_path)
        built.append(reward)
        labels.append(tier_label)
        if j < len(items) - 1:
            thresholds.append(threshold)
    return TieredReward(built, thresholds, name=label or "tiered", labels=labels)


@COMPOSITIONS.register("penalty")
def _compose_penalty(path: str, label: str | None, *, reward: Any, penalties: Sequence[Any]) -> Reward:
    inner, inner_label = build_node(reward, f"{path}.reward")
    built = [build_node(p, f"{path}.penalties[{j}]") for j, p in enumerate(_list(penalties, "penalties", path))]
    return PenaltyReward(inner, [b[0] for b in built], name=label or "penalty",
                         labels=[inner_label, *(b[1] for b in built)])


def _as_spec(item: Any, path: str) -> dict[str, Any]:
    if isinstance(item, str):
        return {"name": item}
    if not isinstance(item, Mapping):
        raise ValueError(f"{path}: expected a reward spec (a mapping like {{name: ...}} or a name), got {item!r}")
    return dict(item)


#: True while `check_specs` walks a spec tree: leaves are checked, not constructed.
_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("rewardlab_checking_reward_specs", default=False)


class _Unbuilt:
    """Stands in for a leaf reward while `check_specs` walks a spec tree: it has a name and is never called."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        raise RuntimeError(f"reward {self.name}: a spec being checked is never scored")


@contextlib.contextmanager
def _located(path: str, where: str):
    """Re-raise a ValueError from building the node at `path` as "WHERE: cause", unless it names `path` already."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(path):
            raise
        raise ValueError(f"{where}: {exc}") from None


def build_node(item: Any, path: str) -> tuple[Reward, str]:
    """Build one spec (leaf, `compose` or `shape` node) found at `path`; returns the reward and its label.

    Raises:
        ValueError: one line naming `path` and the problem.
    """
    spec = _as_spec(item, path)
    label = spec.pop("label", None)
    if label is not None and (not isinstance(label, str) or not label):
        raise ValueError(f"{path}.label: expected a non-empty string, got {label!r}")
    kinds = [k for k in ("name", "compose", "shape") if k in spec]
    if not kinds:
        raise ValueError(f"{path}: missing 'name'")
    if len(kinds) > 1:
        raise ValueError(f"{path}: give one of 'name' (a reward), 'compose' or 'shape', got {' and '.join(kinds)}"
                         " (a node's label is 'label')")
    if "weight" in spec:
        raise ValueError(f"{path}.weight: a weight belongs to a member of a sum (the rewards list or compose: sum)")
    if "compose" in spec:
        kind = spec.pop("compose")
        try:
            builder = COMPOSITIONS.get(kind)
        except ValueError as exc:
            raise ValueError(f"{path}.compose: {exc}") from None
        spec = COMPOSITIONS.validate(kind, spec, field=path, complete=True)
        with _located(path, path):
            return builder(path, label, **spec), label or kind
    if "shape" in spec:
        kind = spec.pop("shape")
        try:
            SHAPINGS.get(kind)
        except ValueError as exc:
            raise ValueError(f"{path}.shape: {exc}") from None
        if "reward" not in spec:
            raise ValueError(f"{path}: missing 'reward' (shape: {kind})")
        inner, inner_label = _shaped_member(spec.pop("reward"), f"{path}.reward")
        with _located(path, f"{path} (shape: {kind})"):
            shaped = build_shaped(kind, inner, spec, path, build_node)
        shaped.name = label or inner_label
        return shaped, shaped.name
    name = _resolve(spec.pop("name"), path)
    try:
        factory = REWARDS.get(name)
    except ValueError as exc:
        raise ValueError(f"{path}.name: {exc}{_import_hint(name)}") from None
    spec = REWARDS.validate(name, spec, field=path, complete=True)
    if _CHECKING.get():
        return _Unbuilt(name), label or _leaf_label(name, factory)
    try:
        reward = factory(**spec)
    except (TypeError, ValueError, OSError) as exc:  # OSError: a model path that does not load
        raise ValueError(f"{path} ({name}): {exc}".splitlines()[0]) from None
    return reward, label or reward.name


def _import_hint(name: Any) -> str:
    """For an unknown name that looks like a path to one's own reward, how to write it (TRL's CLI takes the
    dotted `my_lib.rewards.fn`; here the function follows a colon)."""
    if not isinstance(name, str) or "." not in name.strip("."):
        return ""
    if name.endswith(".py") or "/" in name:
        return f"; to import your own reward write PATH.py:FUNCTION, e.g. {name}:my_reward"
    return f"; to import your own reward write MODULE:FUNCTION, e.g. {':'.join(name.rsplit('.', 1))}"


def _leaf_label(name: str, factory: Any) -> str:
    """A leaf's default label before it is built: its registered name, or for an imported reward the name the
    built reward will have (a `@reward`'s own name, else the function's)."""
    if not is_import_name(name):
        return name
    for candidate in (getattr(factory, "reward_name", None), getattr(factory, "name", None)):
        if isinstance(candidate, str) and candidate:
            return candidate
    return name.rpartition(":")[2]


def _shaped_member(item: Any, path: str) -> tuple[Reward, str]:
    """The reward a shaping node wraps. With a `weight`, it is a one-member weighted sum (weight * score, its
    components logged bare): weight 0 keeps the reward as a logged metric and leaves the shaping's term alone."""
    if not isinstance(item, Mapping) or "weight" not in item:
        return build_node(item, path)
    spec = dict(item)
    weight = spec.pop("weight")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"{path}.weight: expected a number, got {weight!r}")
    inner, label = build_node(spec, path)
    return WeightedSum([(inner, float(weight))], name=label, labels=[label]), label


def check_specs(specs: Sequence[Any] | Mapping[str, Any] | str, *, on_error: str = "zero") -> None:
    """Check a `rewards:` spec tree without constructing any leaf reward (nothing loads a model or opens a
    connection): every reward name (importing MODULE:FUNCTION names), composition and shaping kind, key and option,
    each option's value against its parameter's type annotation (`Registry.validate`), and the nodes' own values.

    Raises:
        ValueError: the first problem, in one line naming its path (as `build_reward` would raise it).
    """
    token = _CHECKING.set(True)
    try:
        _build_sum(specs, on_error)
    finally:
        _CHECKING.reset(token)


def build_reward(specs: Sequence[Mapping[str, Any] | str] | Mapping[str, Any] | str, *,
                 on_error: str = "zero") -> WeightedSum:
    """Build the reward of a `rewards:` config: a weighted sum over a list of specs.

    A bare string is one reward with its default weight; a single mapping is a one-element list. Each list item is
    a leaf `{name, weight, label, ...options}` (a registered reward), a composition node `{compose: sum | gated |
    tiered | penalty, ...}` or a shaping node `{shape: length | overlong | par | clip | delta, reward: {...}, ...}`;
    nodes nest. Returns a `WeightedSum` whose `on_error` ("zero", "skip", "raise") decides the score of a rollout
    with an error anywhere in the tree.

    The whole tree is checked first (`check_specs`), so a bad option anywhere is reported before any leaf is
    constructed (e.g. before a reward model earlier in the list loads).

    Raises:
        ValueError: a bad spec, in one line naming its path (e.g. "rewards[1].tiers[0]: missing 'name'"): an unknown
            reward name or node kind (the message lists valid ones), a missing or unknown key, an option the reward
            does not take, an option value its annotation refuses ("rewards[0].rel_tol: expected a number, got
            'abc'"), a MODULE:FUNCTION that does not import (`rewards.importing.resolve_reward`).
    """
    check_specs(specs, on_error=on_error)
    return _build_sum(specs, on_error)


def _build_sum(specs: Sequence[Any] | Mapping[str, Any] | str, on_error: str) -> WeightedSum:
    if isinstance(specs, (str, Mapping)):
        specs = [specs]
    if not isinstance(specs, Sequence) or not specs:
        raise ValueError(f"rewards: expected a non-empty list of reward specs, got {specs!r}")
    members, labels = _members(specs, "rewards")
    return WeightedSum(members, on_error=on_error, labels=labels)
