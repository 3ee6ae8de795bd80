"""What the TRL and verl adapters share: building a reward from a `Reward` or a config, the fixed component keys a
reward reports, and the row fields it needs.

A peer engine (TRL's GRPOTrainer, verl's reward manager) asks for its reward functions before it has scored
anything, and stacks per-key logs of fixed width, so the keys a reward reports are derived here from the reward's
structure, not from its outputs: the labels of the members of a sum, the children of a gated, tiered or penalty node
and their own keys (`gate_open`, `tier`, `penalty_factor`), a shaping's `unshaped` and its term (`length_penalty`,
`overlong_penalty`, `par_ref`). A leaf's own components (e.g. `correct`) are not known before it runs; name them
with `components=` where an adapter takes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewardlab.rewards.base import ON_ERROR, Reward, RowField, check_row_fields
from rewardlab.rewards.compose import GatedReward, PenaltyReward, TieredReward, WeightedSum, build_reward

#: Shaping kind -> the component its term is logged under (`rewards.shaping`); clip and delta add none.
SHAPING_KEYS = {"length": ("length_penalty",), "overlong": ("overlong_penalty",), "par": ("par_ref",)}


def as_reward(reward: Any, *, on_error: str) -> Reward:
    """A `Reward` from a `Reward` (returned as is) or a reward config as in `rewards:` (a registered name, a mapping,
    or a list of them), built with `build_reward(..., on_error="zero")` so that failures come back as
    `RewardOutput.error` and the adapter applies `on_error` itself. A `Reward` that is not a `WeightedSum` (a leaf,
    a gated node) is wrapped in a one-member sum of weight 1: the same score, its own score logged under its name
    as a component, and a non-finite value made an error like everywhere in rewardlab.

    Raises:
        ValueError: an `on_error` not in ("raise", "skip", "zero"), or a bad config (one line from `build_reward`,
            e.g. "rewards[0].name: unknown reward 'x'; valid: ...").
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error: expected one of {', '.join(sorted(ON_ERROR))}, got {on_error!r}")
    if isinstance(reward, (str, Mapping)) or (isinstance(reward, Sequence) and not isinstance(reward, bytes)):
        return build_reward(reward, on_error="zero")
    if isinstance(reward, WeightedSum):
        return reward
    if isinstance(reward, Reward) and callable(reward):
        return WeightedSum([(reward, 1.0)], on_error="zero", name=reward.name, labels=[reward.name])
    raise ValueError(f"reward: expected a rewardlab Reward or a reward config (a name, a mapping or a list), got "
                     f"{type(reward).__name__}")


def component_keys(reward: Reward) -> list[str]:
    """The component keys `reward` reports whatever it scores, in a fixed order (see the module docstring).

    For `build_reward([...])` (a `WeightedSum`): each member's label, then each member node's own keys under
    "<label>/<key>"; with one member its keys are bare (the sum logs them so). Example: `[{name: exact_match},
    {name: format_tags, weight: 0.1}]` -> ["exact_match", "format_tags"]; `{compose: gated, gate: exact_match,
    reward: x}` -> ["gated", "exact_match", "gate_open", "x"].
    """
    if isinstance(reward, WeightedSum):
        bare = len(reward.members) == 1
        keys: list[str] = []
        for label, (member, _) in zip(reward.labels, reward.members):
            keys.append(label)
            keys += [k if bare else f"{label}/{k}" for k in _node_keys(member)]
        return list(dict.fromkeys(keys))
    return [reward.name, *_node_keys(reward)]


def _node_keys(node: Any) -> list[str]:
    """A node's own component keys and its composite children's under "<label>/<key>" (a leaf has none)."""
    if isinstance(node, WeightedSum):
        return [k for k in component_keys(node)]
    children: list[tuple[str, Any]] = []
    own: list[str] = []
    if isinstance(node, GatedReward):
        children = [(node.gate_label, node.gate), (node.reward_label, node.reward)]
        own = ["gate_open"]
    elif isinstance(node, TieredReward):
        children = list(zip(node.labels, node.tiers))
        own = ["tier"]
    elif isinstance(node, PenaltyReward):
        children = list(zip(node.labels, [node.reward, *node.penalties]))
        own = ["penalty_factor"]
    elif hasattr(node, "shape") and hasattr(node, "reward"):  # a shaping node keeps its reward's components
        return [*_node_keys(node.reward), "unshaped", *SHAPING_KEYS.get(getattr(node, "kind", ""), ())]
    keys: list[str] = []
    for label, child in children:
        keys.append(label)
        keys += [f"{label}/{k}" for k in _node_keys(child)]
    return keys + own


def needed_fields(reward: Reward) -> list[RowField]:
    """The row fields `reward` cannot score without: the union of the `row_fields` of every reward in it (a
    `@reward` function's: `answer` if it takes it, its parameters without a default that are not rollout fields or
    options, and the fields it declares with `row_fields=`, e.g. `reasoning_gym`: dataset, question, answer,
    metadata; a class reward's attribute, e.g. `math`: answer), plus a PAR shaping's `ref_field` /
    `ref_completion_field`. Composite nodes (sums, gated, tiered, penalty, shaping) contribute their children's.

    Returns:
        the fields, sorted by name, each a field name or a tuple of alternative names (any one suffices, e.g.
        `arithmetic_steps`: ("expression", "metadata")).
    Raises:
        ValueError: a reward whose `row_fields` is malformed (see `rewards.base.check_row_fields`).
    """
    out: list[RowField] = []
    for node in _walk(reward):
        out += check_row_fields(getattr(node, "name", type(node).__name__), getattr(node, "row_fields", ()) or ())
        for attr in ("ref_field", "ref_completion_field"):
            value = getattr(node, attr, None)
            if isinstance(value, str):
                out.append(value)
    return sorted(dict.fromkeys(out), key=lambda f: (f,) if isinstance(f, str) else f)


def row_field_names(field: RowField) -> tuple[str, ...]:
    """An entry of `needed_fields` as its alternatives: ("answer",) for "answer"."""
    return (field,) if isinstance(field, str) else tuple(field)


def _walk(node: Any) -> list[Any]:
    """`node` and every reward below it (members, gate, tiers, penalties, shaped and reference rewards)."""
    seen: list[Any] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if any(n is s for s in seen):
            continue
        seen.append(n)
        todo += [m for m, _ in getattr(n, "members", ())] if isinstance(n, WeightedSum) else []
        for attr in ("gate", "reward", "ref_reward"):
            child = getattr(n, attr, None)
            if child is not None and callable(child) and hasattr(child, "name"):
                todo.append(child)
        for attr in ("tiers", "penalties"):
            todo += list(getattr(n, attr, ()) or ())
    return seen
