"""The `rl` section resolved once into typed specs: checking the config means building them.

`resolve_specs(cfg)` -> `TrainSpecs`, before the task, the reward or any model is loaded:

- `EstimatorSpec`: the advantage estimator, its options (declared, `ESTIMATORS.check`), the inputs the trainer
  computes for it (`rl.credit.ESTIMATOR_INPUTS`, each by its registered provider), its minimum group size and the
  source of its per-turn rewards (`rl.credit.TURN_REWARD_SOURCES`).
- `LossSpec`: the policy loss and aggregation with their options split and checked (`losses.check_loss_options`,
  values included, no tensor evaluated), `rl.clip_eps` and the trainer's `max_len` folded in
  (`resolve_loss_options`), and the KL estimator.
- the curriculum's and the group filter's options, checked against what they declare.
- the `rewards` tree, when the config gives one, parsed (`rewards.parse_rewards`: every name, key and option checked,
  nothing constructed); `setup` builds it (`build_reward(tree)`) without checking it again.

`setup` consumes the specs; nothing here is computed again there. `rl` is a `config.RLConfig` and `cfg` a
`config.TrainConfig` (read, not imported: library modules do not import the config layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import torch

from rewardlab.registry import Registry
from rewardlab.rewards import RewardTree, parse_rewards
from rewardlab.rl.advantages import ESTIMATORS
from rewardlab.rl.credit import ESTIMATOR_INPUTS, TURN_REWARD_SOURCES
from rewardlab.rl.curricula import CURRICULA
from rewardlab.rl.filters import GROUP_FILTERS
from rewardlab.rl.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, check_loss_options
from rewardlab.rl.online_prm import ONLINE_PRMS, check_online_prm


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator as the trainer runs it.

    Attributes:
        name: a key of `ESTIMATORS`. options: its options from `rl.estimator_options` (an input given there, e.g.
            fixed `values`, is passed as given and not computed).
        provided: the inputs the trainer computes for it, in need order (keys of `ESTIMATOR_INPUTS`).
        min_group_size: the fewest rollouts a prompt group needs (`meta["min_group_size"]`, default 1).
        turn_rewards: the source of the per-turn rewards it reads (a key of `TURN_REWARD_SOURCES`, `rl.turn_rewards`).
    """

    name: str
    options: dict[str, Any]
    provided: tuple[str, ...]
    min_group_size: int
    turn_rewards: str

    @property
    def inputs(self) -> tuple[str, ...]:
        """The episode-view inputs it reads (`ESTIMATORS.inputs`: turn_rewards, turn_index, turn_key)."""
        return ESTIMATORS.inputs(self.name)


@dataclass(frozen=True)
class LossSpec:
    """The policy loss as the trainer computes it.

    Attributes:
        name: a key of `POLICY_LOSSES`. agg: a key of `AGGREGATIONS`. kl_estimator: a key of `KL_ESTIMATORS`.
        options: every option passed to `compute_policy_loss` / `per_token_policy_loss` (`resolve_loss_options`).
        agg_options: the aggregation's part of them (the entropy bonus and the KL in the loss use it too).
    """

    name: str
    agg: str
    kl_estimator: str
    options: dict[str, Any]
    agg_options: dict[str, Any]


@dataclass(frozen=True)
class TrainSpecs:
    """The config resolved (`resolve_specs`): the estimator and the loss as the trainer runs them, and the parsed
    `rewards` tree (None: the task's own reward)."""

    estimator: EstimatorSpec
    loss: LossSpec
    rewards: RewardTree | None = None


def estimator_needs(name: str) -> tuple[str, ...]:
    """The inputs estimator `name` needs beyond token_rewards/mask/group that only a trainer can compute
    (`ESTIMATORS.meta(name)["needs"]`, e.g. ("values",) for gae)."""
    return tuple(ESTIMATORS.meta(name).get("needs", ()))


def estimator_min_group_size(name: str) -> int:
    """The fewest rollouts a prompt group needs for estimator `name` (`ESTIMATORS.meta(name)["min_group_size"]`,
    e.g. 2 for rloo; 1 when the estimator declares none)."""
    return int(ESTIMATORS.meta(name).get("min_group_size", 1))


def trainable_estimators() -> list[str]:
    """Estimators whose every extra input the trainer can compute."""
    return [n for n in ESTIMATORS if all(k in ESTIMATOR_INPUTS for k in estimator_needs(n))]


#: The `rl` keys (dotted below `rl`) that name a registered algorithm part, with their registry.
NAMED_PARTS: tuple[tuple[str, Registry], ...] = (
    ("estimator", ESTIMATORS), ("loss", POLICY_LOSSES), ("agg", AGGREGATIONS), ("kl_estimator", KL_ESTIMATORS),
    ("filtering.curriculum", CURRICULA), ("filtering.group_filter", GROUP_FILTERS),
    ("turn_rewards", TURN_REWARD_SOURCES), ("online_prm", ONLINE_PRMS))


def check_names(rl: Any) -> None:
    """Every `rl` key of `NAMED_PARTS` names a registered entry (rl.filtering.group_filter may be None).

    Raises:
        ValueError: one line naming the key and the valid names, e.g. "rl.loss: unknown name 'x'; valid: ...".
    """
    for key, registry in NAMED_PARTS:
        name = attrgetter(key)(rl)
        if name is not None and name not in registry:
            raise ValueError(f"rl.{key}: unknown name {name!r}; valid: {', '.join(sorted(registry))}")


def resolve_estimator(rl: Any) -> EstimatorSpec:
    """The estimator spec of `rl`: its options declared and read, the inputs the trainer provides for it.

    Raises:
        ValueError: one line naming the key: an input the trainer cannot compute, a group size below the
            estimator's minimum, per-turn rewards from a source for an estimator that reads none, process rewards
            without rl.step_separator, an undeclared option.
    """
    name = rl.estimator
    ESTIMATORS.check(name, rl.estimator_options, field="rl.estimator_options")
    options = dict(rl.estimator_options)
    needs = [k for k in estimator_needs(name) if k not in options]
    missing = [k for k in needs if k not in ESTIMATOR_INPUTS]
    if missing:
        raise ValueError(f"rl.estimator: {name!r} needs {missing}, which the trainer cannot compute; "
                         f"estimators it can run: {', '.join(sorted(trainable_estimators()))}")
    least = estimator_min_group_size(name)
    if rl.group_size < least:
        raise ValueError(f"rl.group_size: estimator {name!r} needs at least {least} rollouts per prompt "
                         f"group, got {rl.group_size} (its advantages compare the rollouts of a group: a group of one "
                         "has nothing to compare with, so the run would learn nothing)")
    if rl.turn_rewards != "env" and "turn_rewards" not in ESTIMATORS.inputs(name):
        raise ValueError(f"rl.turn_rewards: {rl.turn_rewards!r} sets the per-turn rewards of a turn-level estimator, "
                         f"and {name!r} reads none; use "
                         f"{' or '.join(n for n in ESTIMATORS if 'turn_rewards' in ESTIMATORS.inputs(n))}")
    process = any(k in ("step_rewards", "step_mask") for k in needs)
    if rl.online_prm is not None and not process:
        raise ValueError(f"rl.online_prm: {rl.online_prm!r} gives process rewards, which estimator {name!r} does not "
                         f"read; use {' or '.join(n for n in ESTIMATORS if 'step_rewards' in estimator_needs(n))}")
    if rl.online_prm is not None and rl.step_separator is not None:
        raise ValueError(f"rl.step_separator: rl.online_prm {rl.online_prm!r} rewards every sampled token, so the "
                         "completions are not split into steps; unset rl.step_separator")
    if process and rl.step_separator is None and rl.online_prm is None:
        raise ValueError(f"rl.step_separator: estimator {name!r} needs process rewards on steps; set the "
                         "step separator (e.g. '\\n') and use a reward that returns step_scores, or train an "
                         "online PRM (rl.online_prm: prime)")
    provided: list[str] = []
    for key in needs:  # one provider may supply several inputs: listed once, at its first
        if ESTIMATOR_INPUTS.get(key) not in [ESTIMATOR_INPUTS.get(k) for k in provided]:
            provided.append(key)
    return EstimatorSpec(name, options, tuple(provided), least, rl.turn_rewards)


def resolve_loss_options(rl: Any) -> dict[str, Any]:
    """The options the trainer passes to `compute_policy_loss`: `rl.loss_options`, plus
    - `rl.clip_eps` as each of `clip_low`, `clip_high` that the loss declares and `rl.loss_options` does not set
      (skipped when `rl.loss_options` sets the symmetric `clip`, which takes precedence);
    - `max_len = rl.sampling.max_new_tokens` when the aggregation declares `max_len` and `rl.loss_options` does not
      set it.

    Raises:
        ValueError: `rl.clip_eps` with a loss that declares neither `clip_low` nor `clip_high` (e.g. reinforce).
    """
    options = dict(rl.loss_options)
    if rl.clip_eps is not None:
        declared = POLICY_LOSSES.options(rl.loss)
        targets = [k for k in ("clip_low", "clip_high") if declared is None or k in declared]
        if not targets:
            raise ValueError(f"rl.clip_eps: policy loss {rl.loss!r} has no clip range (its options: "
                             f"{', '.join(declared) or '(none)'}); unset rl.clip_eps")
        if "clip" not in options:
            options = {**{k: rl.clip_eps for k in targets}, **options}
    if "max_len" in (AGGREGATIONS.options(rl.agg) or ()):
        options.setdefault("max_len", rl.sampling.max_new_tokens)
    return options


def resolve_loss(rl: Any) -> LossSpec:
    """The loss spec of `rl`: `resolve_loss_options`, split and checked (`check_loss_options`).

    Raises:
        ValueError: one line naming rl.clip_eps or rl.loss_options and the option.
    """
    options = resolve_loss_options(rl)
    to_loss, to_agg = check_loss_options(rl.loss, rl.agg, options, field="rl.loss_options")
    return LossSpec(rl.loss, rl.agg, rl.kl_estimator, {**to_loss, **to_agg}, to_agg)


def resolve_specs(cfg: Any) -> TrainSpecs:
    """Check every algorithm name and option of `cfg.rl` and the `cfg.rewards` tree, and resolve them into specs,
    before anything is loaded or written: the names (`check_names`), the estimator (`resolve_estimator`), the loss
    (`resolve_loss`), the options of the curriculum and the group filter against what they declare, and the rewards
    (`rewards.parse_rewards`, with `cfg.on_error`).

    Raises:
        ValueError: one line naming the config key and the option, listing the valid ones, e.g.
            "rl.loss_options: unknown option 'foo' for policy loss 'gspo'; valid: clip, clip_high, clip_low".
    """
    rl = cfg.rl
    check_names(rl)
    check_online_prm(rl)
    estimator = resolve_estimator(rl)
    CURRICULA.check(rl.filtering.curriculum, rl.filtering.curriculum_options, field="rl.filtering.curriculum_options")
    if rl.filtering.group_filter is not None:
        GROUP_FILTERS.check(rl.filtering.group_filter, rl.filtering.group_filter_options,
                            field="rl.filtering.group_filter_options")
        # the option values, checked by the filter itself on one row before anything loads
        GROUP_FILTERS[rl.filtering.group_filter](metric=torch.zeros(1), group=torch.zeros(1, dtype=torch.long),
                                                 **rl.filtering.group_filter_options)
    elif rl.filtering.group_filter_options:
        raise ValueError(f"rl.filtering.group_filter_options: {sorted(rl.filtering.group_filter_options)} given "
                         "without rl.filtering.group_filter")
    loss = resolve_loss(rl)
    rewards = parse_rewards(cfg.rewards, on_error=cfg.on_error) if cfg.rewards is not None else None
    return TrainSpecs(estimator, loss, rewards)
