"""Composed rewards: weighted sum, gated, tiered (lexicographic), multiplicative penalties and ensembles; config parse
and build.

Every node is a `Reward` (a batch of rollouts in, one `RewardOutput` per rollout out), so nodes nest. A node's
components hold each child's score under the child's label and the child's own components under "<label>/<key>";
the first child component named `correct` is also kept as `correct` (the accuracy metric reads it). A child's error
makes the node's output an error (score 0, the texts joined with "; "); the top-level `WeightedSum` then applies
`on_error`.

A config becomes a reward in two steps (below): `parse_rewards` checks the whole spec tree and returns it as a
`RewardTree` of frozen `LeafSpec` / `ComposeSpec` / `ShapeSpec` nodes, constructing nothing; `build_reward`
constructs the reward from that tree without checking anything again (given a raw config, it parses it first).

Config (the `rewards:` list of a `rewardlab train` config; docs/rewards-compose.md has worked examples):

    leaf:     {name: REWARD, weight: W, label: L, ...options of the reward}    REWARD: a registered name, or
              MODULE:FUNCTION / PATH.py:FUNCTION to import one (`rewards.importing`)
    sum:      {compose: sum, rewards: [SPEC, ...]}                               members take `weight`
    gated:    {compose: gated, gate: SPEC, reward: SPEC, threshold: 1.0, gate_weight: 0.0}
    tiered:   {compose: tiered, tiers: [SPEC + {threshold: T}, ..., SPEC]}
    penalty:  {compose: penalty, reward: SPEC, penalties: [SPEC, ...]}
    ensemble: {compose: ensemble, members: [SPEC, ...], reduce: mean | min | mean_minus_var | mean_minus_std, lam: 1}
    shaping:  {shape: length | overlong | par | clip | delta, reward: SPEC, ...}   (see `rewards.shaping`)

`label` (any node) names its components; default: the reward name, the composition kind, or for a shaping node the
label of the reward it shapes. `weight` belongs to members of a sum and to the reward a shaping wraps (it scales that
reward before the shaping adds its term: `{shape: overlong, reward: {name: r, weight: 0}, ...}` is the overlong
penalty alone, with r logged); `threshold` belongs to tiers; anywhere else these keys are the reward's own options
(`weight` is never one). Every option's value is checked against the annotation of the parameter it goes to
(`Registry.validate`) when the tree is parsed, before anything is built.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rewardlab.registry import Registry
from rewardlab.rewards.base import ON_ERROR, REWARDS, Reward, RewardError
from rewardlab.rewards.importing import is_import_name, resolve_reward
from rewardlab.rewards.shaping import SHAPINGS, build_shaping, parse_shaping
from rewardlab.types import Rollout, RewardOutput, parse_errors

#: compose kind -> parser(path, <the node's keys>) -> (child nodes, the node's own checked values), registered with
#: meta `build`: build(child rewards, child labels, name, <those values>) -> Reward (`ComposeSpec`).
COMPOSITIONS: Registry[Callable[..., tuple[list[Any], dict[str, Any]]]] = Registry("composition", reserved=("path",))


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


# ---------------------------------------------------------------------------------------------- ensemble
ENSEMBLE_REDUCTIONS = ("mean", "min", "mean_minus_var", "mean_minus_std")


class EnsembleReward:
    """k rewards that score the same thing (typically k reward models trained with different seeds or data subsets),
    reduced to one conservative score.

    Coste et al. 2023, "Reward Model Ensembles Help Mitigate Overoptimization" (arXiv 2310.02743), with r_1..r_k the
    members' scores, mean = (1/k) sum_i r_i and var = (1/k) sum_i (r_i - mean)^2 (the population variance, as in the
    paper's intra-ensemble variance):

        mean            mean                                   (mean optimization)
        min             min_i r_i                              (worst-case optimization, WCO)
        mean_minus_var  mean - lam * var                       (uncertainty-weighted optimization, UWO: the paper's)
        mean_minus_std  mean - lam * sqrt(var)                 (UWO with the std, in the reward's own units)

    step_scores: the same reduction step by step when every member gives step scores (equal lengths; different
    lengths are an error); else None. The members are not normalized here: Coste et al. normalize each RM's scores;
    wrap a member in a shaping (`{shape: clip}`, ...) or train the members alike to make their scales comparable.

    Components: each member's score under its label (`rm`, `rm#2`, ...) and its components under "<label>/<key>",
    `ensemble_mean` and `ensemble_std`. A member's error makes the node's output an error.
    """

    def __init__(self, members: Sequence[Reward], *, reduce: str = "mean", lam: float = 1.0, name: str = "ensemble",
                 labels: Sequence[str | None] | None = None) -> None:
        if len(members) < 2:
            raise ValueError(f"{name}: an ensemble needs at least 2 members, got {len(members)}")
        if reduce not in ENSEMBLE_REDUCTIONS:
            raise ValueError(f"{name}.reduce: expected one of {ENSEMBLE_REDUCTIONS}, got {reduce!r}")
        self.members, self.reduce, self.lam, self.name = list(members), reduce, float(lam), name
        given = list(labels) if labels is not None else [None] * len(self.members)
        self.labels = unique_labels([lab or m.name for lab, m in zip(given, self.members)])

    def reduced(self, scores: Sequence[float]) -> tuple[float, float, float]:
        """(the reduced score, mean, population std) of one rollout's member scores."""
        k = len(scores)
        mean = sum(scores) / k
        var = sum((x - mean) ** 2 for x in scores) / k
        if self.reduce == "mean":
            value = mean
        elif self.reduce == "min":
            value = min(scores)
        elif self.reduce == "mean_minus_var":
            value = mean - self.lam * var
        else:
            value = mean - self.lam * math.sqrt(var)
        return value, mean, math.sqrt(var)

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        outs = [m(rollouts) for m in self.members]
        outputs = []
        for i in range(len(rollouts)):
            comps: dict[str, float] = {}
            errors = []
            for label, member_outs in zip(self.labels, outs):
                add_child(comps, label, member_outs[i])
                if member_outs[i].error is not None:
                    errors.append(member_outs[i].error)
            mine = [member_outs[i] for member_outs in outs]
            score, comps["ensemble_mean"], comps["ensemble_std"] = self.reduced([o.score for o in mine])
            steps = None
            if not errors and all(o.step_scores is not None for o in mine):
                lengths = {len(o.step_scores) for o in mine}
                if len(lengths) > 1:
                    errors.append(f"{self.name}: members give different numbers of step scores {sorted(lengths)}")
                else:
                    steps = [self.reduced(column)[0] for column in zip(*(o.step_scores for o in mine))]
            if errors:
                outputs.append(_failed(comps, errors))
                continue
            outputs.append(RewardOutput(score=score, components=comps, step_scores=steps))
        return outputs


# ---------------------------------------------------------------------------------------------- parsed specs
@dataclass(frozen=True)
class LeafSpec:
    """A parsed leaf: a registered reward and its checked options; nothing constructed.

    Attributes:
        name: the reward's `REWARDS` name (for MODULE:FUNCTION, the canonical name it was imported and registered
            under, `rewards.importing.canonical_name`).
        options: its options (read-only), each value as its parameter's annotation reads it (`Registry.validate`:
            `{"rel_tol": "1e-3"}` -> `{"rel_tol": 0.001}`), passed as they are to the reward's factory.
        label: the `label` given, or None (the built reward's `name` then labels it).
        path: where the spec sits in the config ("rewards[1].gate"), for messages.
    """

    name: str
    options: Mapping[str, Any]
    label: str | None
    path: str


@dataclass(frozen=True)
class ComposeSpec:
    """A parsed composition node `{compose: KIND, ...}`.

    Attributes:
        kind: a `COMPOSITIONS` name: sum, gated, tiered, penalty, ensemble.
        children: the parsed child nodes in order: sum: the members; gated: (gate, reward); tiered: the tiers;
            penalty: (reward, *penalties); ensemble: the members.
        options: the node's own checked values (read-only): sum: `weights` (a float per member); gated:
            `threshold`, `gate_weight`; tiered: `thresholds` (a float in [0, 1] per tier but the last); penalty:
            none; ensemble: `reduce`, `lam`.
        label: the `label` given, or None (the kind then labels it).
        path: where the spec sits in the config.
    """

    kind: str
    children: tuple[NodeSpec, ...]
    options: Mapping[str, Any]
    label: str | None
    path: str


@dataclass(frozen=True)
class ShapeSpec:
    """A parsed shaping node `{shape: KIND, reward: SPEC, ...}`.

    Attributes:
        kind: a `SHAPINGS` name: length, overlong, par, clip, delta.
        reward: the parsed node it shapes.
        weight: the `weight` given with that reward (it then scores weight * reward before the shaping adds its
            term), or None.
        options: the shaping's checked options (read-only, `shaping.parse_shaping`); a nested spec option (PAR's
            `ref_reward`) holds its parsed node.
        label: the `label` given, or None (the label of the reward it shapes then labels it).
        path: where the spec sits in the config.
    """

    kind: str
    reward: NodeSpec
    weight: float | None
    options: Mapping[str, Any]
    label: str | None
    path: str


NodeSpec = LeafSpec | ComposeSpec | ShapeSpec


@dataclass(frozen=True)
class RewardTree:
    """A parsed `rewards:` config (`parse_rewards`): the top-level weighted sum, checked whole, nothing constructed;
    `build_reward(tree)` constructs it.

    Attributes:
        members: the parsed member nodes, in config order.
        weights: each member's weight (the `weight` given, else a leaf's default weight, else 1.0).
        on_error: "zero", "skip" or "raise" (see `WeightedSum`).
    """

    members: tuple[NodeSpec, ...]
    weights: tuple[float, ...]
    on_error: str


# ---------------------------------------------------------------------------------------------- parse
def _frozen(options: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(options))


def _number(value: Any, key: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}.{key}: expected a number, got {value!r}")
    return float(value)


def _list(value: Any, key: str, path: str) -> list[Any]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{path}.{key}: expected a non-empty list of reward specs, got {value!r}")
    return list(value)


def _members(items: Sequence[Any], path: str) -> tuple[list[NodeSpec], list[float]]:
    """Members of a sum: each spec may carry `weight` (default: the reward's default weight, else 1)."""
    nodes, weights = [], []
    for i, item in enumerate(items):
        item_path = f"{path}[{i}]"
        spec = _as_spec(item, item_path)
        given = "weight" in spec
        weight = spec.pop("weight", None)
        if given and (isinstance(weight, bool) or not isinstance(weight, (int, float))):
            raise ValueError(f"{item_path}.weight: expected a number, got {weight!r}")
        node = parse_node(spec, item_path)
        nodes.append(node)
        weights.append(float(weight) if given else _default_weight(node))
    return nodes, weights


def _default_weight(node: NodeSpec) -> float:
    """A leaf's default weight is its factory's `default_weight` (from `@reward(weight=...)`); a node's is 1."""
    if isinstance(node, LeafSpec):
        return float(getattr(REWARDS[node.name], "default_weight", 1.0))
    return 1.0


def _resolve(name: Any, path: str) -> str:
    """The `REWARDS` name of a leaf's `name`: itself, or for MODULE:FUNCTION the imported reward's name."""
    if not is_import_name(name):
        return name
    try:
        return resolve_reward(name)
    except ValueError as exc:
        raise ValueError(f"{path}.name: {exc}") from None


def _as_spec(item: Any, path: str) -> dict[str, Any]:
    if isinstance(item, str):
        return {"name": item}
    if not isinstance(item, Mapping):
        raise ValueError(f"{path}: expected a reward spec (a mapping like {{name: ...}} or a name), got {item!r}")
    return dict(item)


@contextlib.contextmanager
def _located(path: str, where: str):
    """Re-raise a ValueError from parsing the node at `path` as "WHERE: cause", unless it names `path` already."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(path):
            raise
        raise ValueError(f"{where}: {exc}") from None


def parse_node(item: Any, path: str) -> NodeSpec:
    """Parse one spec (leaf, `compose` or `shape` node) found at `path`, and every node under it; nothing is
    constructed (a MODULE:FUNCTION leaf's module is imported, to read its options).

    Raises:
        ValueError: one line naming `path` and the problem (see `parse_rewards`).
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
            parse = COMPOSITIONS.get(kind)
        except ValueError as exc:
            raise ValueError(f"{path}.compose: {exc}") from None
        spec = COMPOSITIONS.validate(kind, spec, field=path, complete=True)
        with _located(path, path):
            children, options = parse(path, **spec)
        return ComposeSpec(kind, tuple(children), _frozen(options), label, path)
    if "shape" in spec:
        kind = spec.pop("shape")
        try:
            SHAPINGS.get(kind)
        except ValueError as exc:
            raise ValueError(f"{path}.shape: {exc}") from None
        if "reward" not in spec:
            raise ValueError(f"{path}: missing 'reward' (shape: {kind})")
        inner, weight = _shaped_member(spec.pop("reward"), f"{path}.reward")
        with _located(path, f"{path} (shape: {kind})"):
            options = parse_shaping(kind, spec, path, parse_node)
        return ShapeSpec(kind, inner, weight, _frozen(options), label, path)
    name = _resolve(spec.pop("name"), path)
    try:
        REWARDS.get(name)
    except ValueError as exc:
        raise ValueError(f"{path}.name: {exc}{_import_hint(name)}") from None
    return LeafSpec(name, _frozen(REWARDS.validate(name, spec, field=path, complete=True)), label, path)


def _import_hint(name: Any) -> str:
    """For an unknown name that looks like a path to one's own reward, how to write it (TRL's CLI takes the
    dotted `my_lib.rewards.fn`; here the function follows a colon)."""
    if not isinstance(name, str) or "." not in name.strip("."):
        return ""
    if name.endswith(".py") or "/" in name:
        return f"; to import your own reward write PATH.py:FUNCTION, e.g. {name}:my_reward"
    return f"; to import your own reward write MODULE:FUNCTION, e.g. {':'.join(name.rsplit('.', 1))}"


def _shaped_member(item: Any, path: str) -> tuple[NodeSpec, float | None]:
    """The reward a shaping node wraps, and its `weight` (None when not given)."""
    if not isinstance(item, Mapping) or "weight" not in item:
        return parse_node(item, path), None
    spec = dict(item)
    weight = spec.pop("weight")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"{path}.weight: expected a number, got {weight!r}")
    return parse_node(spec, path), float(weight)


# ------------------------------------------------------------------------------------- compositions: parse, build
def _build_sum(children: Sequence[Reward], labels: Sequence[str], name: str, *, weights: Sequence[float]) -> Reward:
    return WeightedSum(list(zip(children, weights)), name=name, labels=labels)


@COMPOSITIONS.register("sum", build=_build_sum)
def _compose_sum(path: str, *, rewards: Sequence[Any]) -> tuple[list[NodeSpec], dict[str, Any]]:
    children, weights = _members(_list(rewards, "rewards", path), f"{path}.rewards")
    return children, {"weights": tuple(weights)}


def _build_gated(children: Sequence[Reward], labels: Sequence[str], name: str, *, threshold: float,
                 gate_weight: float) -> Reward:
    return GatedReward(children[0], children[1], threshold=threshold, gate_weight=gate_weight, name=name,
                       labels=(labels[0], labels[1]))


@COMPOSITIONS.register("gated", build=_build_gated)
def _compose_gated(path: str, *, gate: Any, reward: Any, threshold: float = 1.0,
                   gate_weight: float = 0.0) -> tuple[list[NodeSpec], dict[str, Any]]:
    children = [parse_node(gate, f"{path}.gate"), parse_node(reward, f"{path}.reward")]
    return children, {"threshold": _number(threshold, "threshold", path),
                      "gate_weight": _number(gate_weight, "gate_weight", path)}


def _build_tiered(children: Sequence[Reward], labels: Sequence[str], name: str, *,
                  thresholds: Sequence[float]) -> Reward:
    return TieredReward(children, thresholds, name=name, labels=labels)


@COMPOSITIONS.register("tiered", build=_build_tiered)
def _compose_tiered(path: str, *, tiers: Sequence[Any]) -> tuple[list[NodeSpec], dict[str, Any]]:
    items = _list(tiers, "tiers", path)
    if len(items) < 2:
        raise ValueError(f"{path}.tiers: needs at least 2 tiers, got {len(items)}")
    children, thresholds = [], []
    for j, item in enumerate(items):
        tier_path = f"{path}.tiers[{j}]"
        tier_spec = _as_spec(item, tier_path)
        threshold = _number(tier_spec.pop("threshold", 1.0), "threshold", tier_path)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"{tier_path}.threshold: must be in [0, 1] (tier scores are in [0, 1]), got {threshold}")
        children.append(parse_node(tier_spec, tier_path))
        if j < len(items) - 1:
            thresholds.append(threshold)
    return children, {"thresholds": tuple(thresholds)}


def _build_penalty(children: Sequence[Reward], labels: Sequence[str], name: str) -> Reward:
    return PenaltyReward(children[0], children[1:], name=name, labels=labels)


@COMPOSITIONS.register("penalty", build=_build_penalty)
def _compose_penalty(path: str, *, reward: Any, penalties: Sequence[Any]) -> tuple[list[NodeSpec], dict[str, Any]]:
    inner = parse_node(reward, f"{path}.reward")
    return [inner, *(parse_node(p, f"{path}.penalties[{j}]")
                     for j, p in enumerate(_list(penalties, "penalties", path)))], {}


def _build_ensemble(children: Sequence[Reward], labels: Sequence[str], name: str, *, reduce: str,
                    lam: float) -> Reward:
    return EnsembleReward(children, reduce=reduce, lam=lam, name=name, labels=labels)


@COMPOSITIONS.register("ensemble", build=_build_ensemble)
def _compose_ensemble(path: str, *, members: Sequence[Any], reduce: str = "mean",
                      lam: float = 1.0) -> tuple[list[NodeSpec], dict[str, Any]]:
    items = _list(members, "members", path)
    if len(items) < 2:
        raise ValueError(f"{path}.members: an ensemble needs at least 2 members, got {len(items)}")
    if reduce not in ENSEMBLE_REDUCTIONS:
        raise ValueError(f"{path}.reduce: expected one of {ENSEMBLE_REDUCTIONS}, got {reduce!r}")
    lam = _number(lam, "lam", path)
    if lam < 0:
        raise ValueError(f"{path}.lam: must be >= 0, got {lam:g}")
    return [parse_node(m, f"{path}.members[{j}]") for j, m in enumerate(items)], {"reduce": reduce, "lam": lam}


# ---------------------------------------------------------------------------------------------- build
def build_node(node: NodeSpec) -> tuple[Reward, str]:
    """Construct the reward of a parsed node and of every node under it, in config order (each leaf once); returns
    the reward and its label (the node's `label`, else a leaf reward's `name`, a composition's kind, or the label of
    the reward a shaping wraps). Nothing is checked or read again: `parse_node` did that.

    Raises:
        ValueError: "PATH (NAME): cause" (first line) when a leaf's factory raises TypeError, ValueError or OSError
            (e.g. a model path that does not load).
    """
    if isinstance(node, LeafSpec):
        try:
            reward = REWARDS[node.name](**node.options)
        except (TypeError, ValueError, OSError) as exc:  # OSError: a model path that does not load
            raise ValueError(f"{node.path} ({node.name}): {exc}".splitlines()[0]) from None
        return reward, node.label or reward.name
    if isinstance(node, ComposeSpec):
        built = [build_node(child) for child in node.children]
        name = node.label or node.kind
        build = COMPOSITIONS.meta(node.kind)["build"]
        return build([r for r, _ in built], [lab for _, lab in built], name, **node.options), name
    inner, inner_label = build_node(node.reward)
    if node.weight is not None:  # weight * score, its components logged bare; weight 0 leaves the shaping's term
        inner = WeightedSum([(inner, node.weight)], name=inner_label, labels=[inner_label])
    shaped = build_shaping(node.kind, inner, node.options, lambda n: build_node(n)[0])
    shaped.name = node.label or inner_label
    return shaped, shaped.name


# ---------------------------------------------------------------------------------------------- entry points
def parse_rewards(specs: Sequence[Mapping[str, Any] | str] | Mapping[str, Any] | str, *,
                  on_error: str = "zero") -> RewardTree:
    """Parse and check a `rewards:` config into a `RewardTree`, constructing no reward (nothing loads a model or
    opens a connection); `build_reward(tree)` constructs it.

    A bare string is one reward with its default weight; a single mapping is a one-element list. Checked, for the
    whole tree: every reward name (a MODULE:FUNCTION or PATH.py:FUNCTION name is imported and registered, its
    function not called), composition and shaping kind; the keys of each node (one of name/compose/shape, `label`,
    `weight` only on a member of a sum or the reward a shaping wraps); each option's name and value against the
    annotation of the parameter it goes to (`Registry.validate`, which also reads "1e-3" as 0.001 for a float); the
    nodes' own values (weights, thresholds, at least 2 tiers, the shaping's bounds such as a length `coef` >= 0); and
    `on_error`.

    Raises:
        ValueError: the first problem, in one line naming its path (e.g. "rewards[1].tiers[0]: missing 'name'"): an
            unknown reward name or node kind (the message lists valid ones), a missing or unknown key, an option the
            reward does not take, an option value its annotation refuses ("rewards[0].rel_tol: expected a number, got
            'abc'"), a MODULE:FUNCTION that does not import (`rewards.importing.resolve_reward`), an `on_error` not
            in ("zero", "skip", "raise").
    """
    if isinstance(specs, (str, Mapping)):
        specs = [specs]
    if not isinstance(specs, Sequence) or not specs:
        raise ValueError(f"rewards: expected a non-empty list of reward specs, got {specs!r}")
    members, weights = _members(specs, "rewards")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error: expected one of {ON_ERROR}, got {on_error!r}")
    return RewardTree(tuple(members), tuple(weights), on_error)


def build_reward(specs: RewardTree | Sequence[Mapping[str, Any] | str] | Mapping[str, Any] | str, *,
                 on_error: str | None = None) -> WeightedSum:
    """Build the reward of a `rewards:` config: a weighted sum over its members.

    `specs` is a `RewardTree` from `parse_rewards` (only constructed: nothing is checked again), or the config
    itself (a list of specs, a single spec or a reward name), parsed first with `parse_rewards(specs,
    on_error=on_error or "zero")`, so a bad option anywhere is reported before any leaf is constructed (e.g. before a
    reward model earlier in the list loads). Each leaf's factory is called once, in config order. Returns a
    `WeightedSum` named "reward" whose `on_error` ("zero", "skip", "raise") decides the score of a rollout with an
    error anywhere in the tree; its members' labels and weights are `component_weights`.

    Args:
        specs: a parsed tree, or the config (see `parse_rewards`).
        on_error: for a config, its `on_error` (default "zero"); for a tree, None or the tree's own.
    Raises:
        ValueError: what `parse_rewards` raises; `on_error` given with a tree parsed with another; "PATH (NAME):
            cause" when a leaf's factory raises (see `build_node`).
    """
    if isinstance(specs, RewardTree):
        tree = specs
        if on_error is not None and on_error != tree.on_error:
            raise ValueError(f"on_error: {on_error!r} given for a reward tree parsed with on_error={tree.on_error!r}")
    else:
        tree = parse_rewards(specs, on_error="zero" if on_error is None else on_error)
    built = [build_node(node) for node in tree.members]
    return WeightedSum([(r, w) for (r, _), w in zip(built, tree.weights)], on_error=tree.on_error,
                       labels=[lab for _, lab in built])
