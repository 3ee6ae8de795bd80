"""The RL training loop (GRPO family): `train` = `setup` + per step `collect` -> `assign_credit` -> `update` -> log.

- `setup(cfg, mode)` -> `TrainState`: task, reward, policy, reference, critic, optimizer, schedule, prompt sampler,
  and for an environment task (task.spec env:NAME) its environment and budgets, and the rollout engine
  (`rewardlab.rl.engines`, rl.engine local or ray) with the policy's weights published to it; opens the run
  directory and, on a resume, restores the newest valid checkpoint.
- `collect(state)` -> `Collected`: draw prompts (curriculum looked up by name) -> the engine generates G rollouts each
  (episodes, for an environment task: `rewardlab.envs.sample_rollouts`, chunk by chunk; each counted and scored once,
  on its last row) -> the engine scores them ->
  keep groups (group filter looked up by name, generating more rounds when it drops some) -> leave out errored
  rollouts (on_error=skip) and groups left below the estimator's minimum size -> the estimator's inputs that need
  generation (e.g. ReMax's greedy baseline), all generation counted in time/gen_s.
- `assign_credit(state, batch)` -> `Credit`: the rows of the kept rollouts (an episode may be several) -> token
  rewards on sampled tokens (optionally minus beta * KL) -> advantages on the episode view (estimator
  looked up by name; its other inputs, such as reward components, step rewards or the critic's values, computed
  by the providers below, looked up by input name) and the critic's returns.
- `update(state, batch, credit)`: mu epochs of minibatch policy-loss minimization (loss, aggregation and KL
  estimator looked up by name; optional entropy bonus), the critic's update, the learning-rate schedule; then the new
  weights are published to the engine as policy version `step`.
- `Prefetch`: where the loop takes each step's batch. Step s trains on the batch of step s sampled by policy version
  max(0, s - 1 - rl.max_staleness), produced ahead (`produce`; on engine ray in a background thread, while the learner
  updates); rl.max_staleness 0 is the synchronous `collect`. Checkpoints hold the batches prefetched.
- `log_step`, `save_checkpoint`: metrics.jsonl, samples.jsonl, atomic checkpoints.
- held-out evaluation every rl.eval_every steps (`rewardlab.evaluation.heldout`), logged on the step's metrics line.

A first Ctrl-C (SIGINT) or SIGTERM ends the run after the step it is in, with a checkpoint and the summary
(`Interrupted`); after a SIGTERM, within its grace period (`rewardlab.interrupt`).

The loop never branches on an algorithm name.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import RLConfig, TrainConfig, dump_config
from rewardlab.envs.replay import episode_record
from rewardlab.envs.sampling import (EpisodeSettings, close_env, episode_ends, episode_metrics, episode_rows,
                                     load_episodes, sample_rollouts, turn_budget_warning)
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.modeldir import check_model_dir
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Batch, Policy, SamplingSettings, load_policy, rollout_batch
from rewardlab.policy.batch import micro_batches
from rewardlab.progress import stage
from rewardlab.rewards import Reward, RewardError, build_reward
from rewardlab.rewards.compose import check_specs, component_weights
from rewardlab.rl.advantages import ESTIMATORS
from rewardlab.rl.critic import CRITIC_DIR, ValueModel
from rewardlab.rl.engines import Engine, make_engine
from rewardlab.rl.episodes import episode_advantages, episode_minibatches, episode_tensors
from rewardlab.rl.curricula import CURRICULA, make_curriculum
from rewardlab.rl.filters import GROUP_FILTERS, filter_groups
from rewardlab.rl.info_gain import info_gain_rewards
from rewardlab.rl.losses import (AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, aggregate, aggregation_weights,
                                 compute_policy_loss, kl_clamped, kl_penalty, per_token_policy_loss,
                                 split_loss_options)
from rewardlab.runs import RunDir, RunMode, warn
from rewardlab.threads import apply_threads, freeze_heap
from rewardlab.train_state import load_weights, restore_training_state, rng_state, save_state, set_rng_state
from rewardlab.tasks import Task, check_prompt_lengths, check_task_for_policy, describe_task, load as load_task
from rewardlab.types import Rollout, RewardOutput

#: Settings a resumed run may change (train longer, checkpoint differently, fit in less memory: the memory switches
#: change the floats' rounding, not the algorithm); any other change is refused.
RESUME_MAY_CHANGE = ("rl.steps", "save_every", "keep_checkpoints", "rl.micro_batch_size",
                     "model.gradient_checkpointing", "model.logprob_chunk_tokens")


def estimator_needs(name: str) -> tuple[str, ...]:
    """The inputs estimator `name` needs beyond token_rewards/mask/group that only a trainer can compute
    (`ESTIMATORS.meta(name)["needs"]`, e.g. ("values",) for gae)."""
    return tuple(ESTIMATORS.meta(name).get("needs", ()))


def estimator_min_group_size(name: str) -> int:
    """The fewest rollouts a prompt group needs for estimator `name` (`ESTIMATORS.meta(name)["min_group_size"]`,
    e.g. 2 for rloo; 1 when the estimator declares none)."""
    return int(ESTIMATORS.meta(name).get("min_group_size", 1))


def check_names(cfg: TrainConfig) -> None:
    """Fail fast, with the valid names, when an algorithm name in `cfg.rl` is not registered, an estimator needs
    an input the trainer cannot supply, or `rl.group_size` is below the estimator's minimum group size; then check
    every algorithm option (`check_options`).

    Raises:
        ValueError: one line naming the config key, e.g. "rl.loss: unknown name 'x'; valid: ...".
    """
    rl = cfg.rl
    checks = [
        ("rl.estimator", rl.estimator, ESTIMATORS),
        ("rl.loss", rl.loss, POLICY_LOSSES),
        ("rl.agg", rl.agg, AGGREGATIONS),
        ("rl.kl_estimator", rl.kl_estimator, KL_ESTIMATORS),
        ("rl.curriculum", rl.curriculum, CURRICULA),
    ]
    if rl.group_filter is not None:
        checks.append(("rl.group_filter", rl.group_filter, GROUP_FILTERS))
    for key, name, registry in checks:
        if name not in registry:
            raise ValueError(f"{key}: unknown name {name!r}; valid: {', '.join(sorted(registry))}")
    needs = [k for k in estimator_needs(rl.estimator) if k not in rl.estimator_options]
    missing = [k for k in needs if k not in INPUT_PROVIDERS]
    if missing:
        raise ValueError(f"rl.estimator: {rl.estimator!r} needs {missing}, which the trainer cannot compute; "
                         f"estimators it can run: {', '.join(sorted(trainable_estimators()))}")
    least = estimator_min_group_size(rl.estimator)
    if rl.group_size < least:
        raise ValueError(f"rl.group_size: estimator {rl.estimator!r} needs at least {least} rollouts per prompt "
                         f"group, got {rl.group_size} (its advantages compare the rollouts of a group: a group of one "
                         "has nothing to compare with, so the run would learn nothing)")
    if rl.turn_rewards != "env" and "turn_rewards" not in ESTIMATORS.inputs(rl.estimator):
        raise ValueError(f"rl.turn_rewards: {rl.turn_rewards!r} sets the per-turn rewards of a turn-level estimator, "
                         f"and {rl.estimator!r} reads none; use "
                         f"{' or '.join(n for n in ESTIMATORS if 'turn_rewards' in ESTIMATORS.inputs(n))}")
    if any(k in ("step_rewards", "step_mask") for k in needs) and rl.step_separator is None:
        raise ValueError(f"rl.step_separator: estimator {rl.estimator!r} needs process rewards on steps; set the "
                         "step separator (e.g. '\\n') and use a reward that returns step_scores")
    check_options(cfg)


def check_options(cfg: TrainConfig) -> None:
    """Check, before anything is loaded or written, that every option in `cfg.rl` is declared by the function it
    goes to: `rl.estimator_options` by the estimator, `rl.loss_options` (with `rl.clip_eps` and the trainer's
    `max_len`, see `resolve_loss_options`) by the policy loss or the aggregation, `rl.curriculum_options` by the
    curriculum, `rl.group_filter_options` by the group filter. The loss options' values are checked too, by
    evaluating the loss once on a one-token batch; and `cfg.rewards`, when given, by `rewards.compose.check_specs`
    (names, keys, options and their values' types, of the whole tree, before the task loads; nothing is constructed).

    Raises:
        ValueError: one line naming the config key and the option and listing the valid ones, e.g.
            "rl.loss_options: unknown option 'foo' for policy loss 'gspo'; valid: clip, clip_high, clip_low".
    """
    rl = cfg.rl
    ESTIMATORS.check(rl.estimator, rl.estimator_options, field="rl.estimator_options")
    CURRICULA.check(rl.curriculum, rl.curriculum_options, field="rl.curriculum_options")
    if rl.group_filter is not None:
        GROUP_FILTERS.check(rl.group_filter, rl.group_filter_options, field="rl.group_filter_options")
    elif rl.group_filter_options:
        raise ValueError(f"rl.group_filter_options: {sorted(rl.group_filter_options)} given without rl.group_filter")
    options = resolve_loss_options(rl)
    split_loss_options(rl.loss, rl.agg, options, field="rl.loss_options")
    one = torch.zeros(1, 1)
    try:
        compute_policy_loss(rl.loss, logprobs=one, old_logprobs=one, advantages=one, mask=torch.ones(1, 1),
                            agg=rl.agg, **options)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rl.loss_options: {exc}".splitlines()[0]) from None
    if cfg.rewards is not None:
        check_specs(cfg.rewards, on_error=cfg.on_error)


def resolve_loss_options(rl) -> dict[str, Any]:
    """The options the trainer passes to `compute_policy_loss`: `rl.loss_options`, plus
    - `rl.clip_eps` as each of `clip_low`, `clip_high` that the loss declares and `rl.loss_options` does not set
      (skipped when `rl.loss_options` sets the symmetric `clip`, which takes precedence);
    - `max_len = rl.max_new_tokens` when the aggregation declares `max_len` and `rl.loss_options` does not set it.

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
        options.setdefault("max_len", rl.max_new_tokens)
    return options


def training_rollouts(rollouts: list[Rollout], outputs: list[RewardOutput], *, skip_errors: bool,
                      min_group_size: int) -> tuple[list[Rollout], list[RewardOutput], int, int]:
    """The rollouts the estimator and the loss see.

    With `skip_errors` (on_error=skip) a rollout whose reward errored leaves the batch: it has no reward, so it must
    count in no group statistic and no loss denominator. A prompt group then left with fewer than `min_group_size`
    rollouts (`estimator_min_group_size`, e.g. 2 for rloo) leaves too: it contributes no gradient
    this step instead of failing the estimator.

    Returns:
        (rollouts, outputs, skipped, dropped_groups): the kept rollouts and outputs in their order, the number of
        errored rollouts left out, and the number of prompt groups with no rollout left.
    """
    groups = {r.group for r in rollouts}
    kept = [(r, o) for r, o in zip(rollouts, outputs) if not (skip_errors and o.error is not None)]
    skipped = len(rollouts) - len(kept)
    size = Counter(r.group for r, _ in kept)
    kept = [(r, o) for r, o in kept if size[r.group] >= min_group_size]
    dropped_groups = len(groups) - len({r.group for r, _ in kept})
    return [r for r, _ in kept], [o for _, o in kept], skipped, dropped_groups


def reward_tensors(rollouts: list[Rollout], outputs: list[RewardOutput],
                   mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome rewards on the last sampled token of each episode, and the prompt-group ids.

    Args:
        rollouts, outputs: the batch's rows and each row's reward output (the rows of an episode share its output).
        mask: [N, T] 1 on the tokens the policy sampled (`Rollout.loss_mask` inside the completion).
    Returns:
        token_rewards [N, T] float32: score_i on the last sampled token of an episode's last row (a single-turn
        rollout's last token, t = len_i - 1), 0 elsewhere, on earlier rows of the episode and on every token the
        environment, a tool or the chat template inserted; group [N] int64.
    """
    token_rewards = torch.zeros_like(mask)
    group = torch.tensor([r.group for r in rollouts], dtype=torch.long)
    for i, (r, o) in enumerate(zip(rollouts, outputs)):
        if r.episode_id is not None and r.termination is None:
            continue  # not the episode's last row
        sampled = [t for t, m in enumerate(r.loss_mask) if m]
        if sampled:
            token_rewards[i, sampled[-1]] = o.score
    return token_rewards * mask, group


def process_reward_tensors(rollouts: list[Rollout], outputs: list[RewardOutput], mask: torch.Tensor):
    """Process rewards on the last token of each reasoning step: step_rewards [N, T] and step_mask [N, T] float32.

    Raises:
        ValueError: a reward returned a number of step scores different from the rollout's number of steps.
    """
    step_rewards, step_mask = torch.zeros_like(mask), torch.zeros_like(mask)
    for i, (r, o) in enumerate(zip(rollouts, outputs)):
        if o.step_scores is None:
            continue
        if len(o.step_scores) != len(r.steps):
            raise ValueError(f"reward returned {len(o.step_scores)} step scores for a rollout with {len(r.steps)} "
                             f"steps (rl.step_separator={r.step_text and 'set'}); completion: {r.completion!r:.60}")
        for (_, end), score in zip(r.steps, o.step_scores):
            step_rewards[i, end - 1] = score
            step_mask[i, end - 1] = 1.0
    return step_rewards * mask, step_mask * mask


@dataclass
class TrainState:
    """Everything a training step reads or changes, built by `setup`.

    Attributes:
        cfg: the run's config. task, reward: the task and its reward (or `cfg.rewards`). policy: the trained model.
        reference: the frozen KL reference (rl.beta > 0), else None: a second copy of the starting model, or with
            model.lora the policy's own base with its adapter disabled (`Policy.without_adapter`). critic: the value
            model (estimators that need values, e.g. gae), else None. optimizer, scheduler: the policy's AdamW and
            its learning-rate schedule. sampler: the prompt curriculum. run: the open run directory.
        loss_options, agg_options: `resolve_loss_options(cfg.rl)` and its aggregation part (the entropy bonus and
            the KL in the loss are aggregated with them too).
        start_step: the last step done before this run (0, or the resumed checkpoint's step).
        latest: (step, path) of the newest checkpoint, None before the first.
        step: the step being run (1-based).
        generated_total: rollouts generated by the run so far, every step and filter round (rollout/generated_total;
            `train` recounts it from metrics.jsonl on a resume); an episode counts once.
        episodes: an environment task's environment and budgets (`task.spec` env:NAME, the `env` section), else
            None (single completions).
        engine: where `collect` generates and scores (`rewardlab.rl.engines`, rl.engine); its `version` is the
            last published policy version.
        prefetch: the batches produced ahead of the steps that train them (`Prefetch`, built by `train`);
            saved_prefetch: its state in the resumed checkpoint (None for a new run or a checkpoint without one).
    """

    cfg: TrainConfig
    task: Task
    reward: Reward
    policy: Policy
    reference: Policy | None
    critic: ValueModel | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    run: RunDir
    loss_options: dict[str, Any]
    agg_options: dict[str, Any]
    start_step: int = 0
    latest: tuple[int, Path] | None = None
    step: int = 0
    generated_total: int = 0
    episodes: EpisodeSettings | None = None
    engine: Engine | None = None
    prefetch: Any = None
    saved_prefetch: dict[str, Any] | None = None


@dataclass
class Collected:
    """One step's rollouts, built by `collect`.

    Attributes:
        rollouts, outputs: what the estimator and the loss see (after the group filter, on_error=skip and the
            estimator's minimum group size), N of each. For an environment task, one rollout per episode: its last
            row (what the reward read); `rows_of` holds all its rows.
        all_rollouts, all_outputs: every rollout (episode) generated and scored this step, every filter round
            (logged).
        rows_of: id(last row) -> the rows of its episode, for every episode generated this step ({} for single
            completions: each rollout is its own row; `rows` reads both).
        inputs: estimator inputs that needed generation (e.g. ReMax's `baseline` [N] float32).
        metrics: reward, accuracy, rollout-shape and filter metrics.
        gen_s: seconds spent generating (rounds and sampled inputs). gen_tokens: tokens generated.
        before: (prompt sampler state, RNG states) before the batch was produced (`stop_on_reward_errors`).
    """

    rollouts: list[Rollout]
    outputs: list[RewardOutput]
    all_rollouts: list[Rollout]
    all_outputs: list[RewardOutput]
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    gen_s: float = 0.0
    gen_tokens: int = 0
    rows_of: dict[int, list[Rollout]] = field(default_factory=dict)
    before: tuple[dict, dict] | None = None

    def to_state(self) -> dict[str, Any]:
        """A picklable copy for a checkpoint (`rows_of` keyed by position, not by id)."""
        at = {id(r): i for i, r in enumerate(self.all_rollouts)}
        return {"all_rollouts": self.all_rollouts, "all_outputs": self.all_outputs,
                "kept": [at[id(r)] for r in self.rollouts], "outputs": self.outputs, "inputs": self.inputs,
                "metrics": self.metrics, "gen_s": self.gen_s, "gen_tokens": self.gen_tokens,
                "rows": [self.rows_of.get(id(r)) for r in self.all_rollouts]}

    @classmethod
    def from_state(cls, saved: dict[str, Any]) -> Collected:
        """The inverse of `to_state`."""
        every = saved["all_rollouts"]
        rows_of = {id(r): rows for r, rows in zip(every, saved["rows"]) if rows is not None}
        return cls([every[i] for i in saved["kept"]], saved["outputs"], every, saved["all_outputs"], saved["inputs"],
                   saved["metrics"], saved["gen_s"], saved["gen_tokens"], rows_of)

    def rows(self, rollouts: list[Rollout], outputs: list[RewardOutput]) -> tuple[list[Rollout], list[RewardOutput],
                                                                                  list[int]]:
        """The training rows of `rollouts` (episodes; each expanded to its rows in order), each row's output (its
        episode's), and each row's index in `rollouts`."""
        rows, outs, owner = [], [], []
        for i, (r, o) in enumerate(zip(rollouts, outputs)):
            for row in self.rows_of.get(id(r), [r]):
                rows.append(row)
                outs.append(o)
                owner.append(i)
        return rows, outs, owner


@dataclass
class Credit:
    """The credit assigned to one step's kept rollouts, built by `assign_credit` (N rollouts, T tokens).

    Attributes:
        rows, outputs: the N training rows (an episode's rows, or one per single-turn rollout) and each row's reward
            output (its episode's).
        packed: the rows as tensors. old_logprobs: behaviour log-probs [N, T] float32 (0 on inserted tokens).
        ref_logprobs: the reference's log-probs [N, T] float32 (rl.beta > 0), else None.
        sampled: [N, T] float32, 1 exactly on the tokens the policy sampled (`Rollout.loss_mask`).
        episode: [N] int64 episode id of each row (an episode's rows share it), or None when every row is its own
            episode (single completions): the aggregations and sequence-level losses count an episode once.
        group: [N] int64 prompt group of each row (micro-batches take a group's rows together).
        loss_mask: [N, T] float32, `sampled` times each episode's weight for its termination reason
            (`rl.truncation_weights()`: truncated rollouts zeroed when rl.mask_truncated is true).
        advantages: [N, T] float32. values, returns: the critic's V_t and its targets [N, T] float32 (estimators
            that need values), else None.
        metrics: the KL-in-reward metrics (policy/kl_reward, policy/kl_clamped) when rl.kl_in = reward.
    """

    rows: list[Rollout]
    outputs: list[RewardOutput]
    packed: Batch
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    sampled: torch.Tensor
    episode: torch.Tensor | None
    group: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


# Estimator inputs the trainer can compute, by input name (see the `needs` of `ESTIMATORS.meta(name)`), in two
# kinds. A sampled input generates text: `collect` computes it (its time counts in time/gen_s) and its provider
# returns the inputs, one entry per rollout (episode), and the rollouts it generated. A batch input is computed by
# `assign_credit` from the training rows, their outputs, their packed tensors and the sampled-token mask.
def _greedy_baseline(state: TrainState, rollouts: list[Rollout]) -> tuple[dict[str, torch.Tensor], list[Rollout]]:
    """ReMax's baseline: the reward of one greedy completion (for an environment task, one greedy episode) of each
    prompt, broadcast to its group's rollouts."""
    rl = state.cfg.rl
    first: dict[int, Rollout] = {}
    for r in rollouts:
        first.setdefault(r.group, r)
    groups = list(first)
    rows = [first[g].row for g in groups]
    greedy = sample_rollouts(state.policy, rows, SamplingSettings(max_new_tokens=rl.max_new_tokens, greedy=True,
                             max_prompt_length=rl.max_prompt_length), episodes=state.episodes)
    if rl.step_separator is not None:
        for r in greedy:
            state.policy.mark_steps(r, rl.step_separator)
    score = {g: o.score for g, o in zip(groups, state.reward(episode_ends(greedy)))}
    return {"baseline": torch.tensor([score[r.group] for r in rollouts], dtype=torch.float32)}, greedy


def _reward_components(state: TrainState, rows: list[Rollout], outputs: list[RewardOutput], packed: Batch,
                       sampled: torch.Tensor) -> dict[str, torch.Tensor]:
    """GDPO's inputs: each member reward's score as a column of components [N, K], and the members' weights [K]."""
    pairs = component_weights(state.reward)
    labels = [label for label, _ in pairs]
    weights = [w for _, w in pairs]
    comps = [[o.components.get(label, o.score if len(labels) == 1 else 0.0) for label in labels] for o in outputs]
    return {"components": torch.tensor(comps, dtype=torch.float32),
            "weights": torch.tensor(weights, dtype=torch.float32)}


def _critic_values(state: TrainState, rows: list[Rollout], outputs: list[RewardOutput], packed: Batch,
                   sampled: torch.Tensor) -> dict[str, torch.Tensor]:
    """GAE's values: the value model's V_t on the sampled tokens of the batch, before this step's updates (no
    gradient)."""
    group = torch.tensor([r.group for r in rows], dtype=torch.long)
    values = state.critic.scored_values(packed, micro_batch_size=state.cfg.rl.micro_batch_size, group=group)
    return {"values": values * sampled}


def _step_inputs(state: TrainState, rows: list[Rollout], outputs: list[RewardOutput], packed: Batch,
                 sampled: torch.Tensor) -> dict[str, torch.Tensor]:
    step_rewards, step_mask = process_reward_tensors(rows, outputs, sampled)
    return {"step_rewards": step_rewards, "step_mask": step_mask}


SAMPLED_INPUTS: dict[str, Any] = {"baseline": _greedy_baseline}
BATCH_INPUTS: dict[str, Any] = {
    "components": _reward_components,
    "weights": _reward_components,
    "step_rewards": _step_inputs,
    "step_mask": _step_inputs,
    "values": _critic_values,
}
INPUT_PROVIDERS: dict[str, Any] = {**SAMPLED_INPUTS, **BATCH_INPUTS}


def trainable_estimators() -> list[str]:
    """Estimators whose every extra input the trainer can compute."""
    return [n for n in ESTIMATORS if all(k in INPUT_PROVIDERS for k in estimator_needs(n))]


def _providers(name: str, given: dict[str, Any], table: dict[str, Any]) -> list[Any]:
    """The providers in `table` of the inputs estimator `name` needs and `given` lacks, each once, in need order."""
    out: list[Any] = []
    for key in estimator_needs(name):
        provider = table.get(key)
        if key not in given and provider is not None and provider not in out:
            out.append(provider)
    return out


def filter_metric(output: RewardOutput, name: str) -> float:
    """The per-rollout value a group filter looks at (`rl.filter_metric`).

    Raises:
        ValueError: `name` is neither 'score', 'unshaped' nor a component of the output.
    """
    if name == "score" or output.error is not None:
        return output.score
    if name == "unshaped":
        return output.components.get("unshaped", output.score)
    if name not in output.components:
        raise ValueError(f"rl.filter_metric: {name!r} is not a reward component; components: "
                         f"{', '.join(sorted(output.components)) or '(none)'}")
    return output.components[name]


def step_metrics(rollouts: list[Rollout], outputs: list[RewardOutput], group_size: int) -> dict[str, float]:
    """Reward, accuracy and rollout-shape metrics of one batch (names as logged in metrics.jsonl)."""
    scores = torch.tensor([o.score for o in outputs])
    lengths = torch.tensor([len(r.completion_ids) for r in rollouts], dtype=torch.float32)
    m: dict[str, float] = {
        "reward/mean": scores.mean().item(),
        "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
        "reward/errors": float(sum(o.error is not None for o in outputs)),
        "accuracy": sum(o.correct for o in outputs) / len(outputs),
        "rollout/len_mean": lengths.mean().item(),
        "rollout/len_max": lengths.max().item(),
        "rollout/truncated_frac": sum(r.truncated for r in rollouts) / len(rollouts),
        "rollout/tied_group_frac": (scores.view(-1, group_size).std(dim=1, unbiased=False) == 0).float().mean().item(),
    }
    for name in sorted({k for o in outputs for k in o.components}):
        vals = [o.components[name] for o in outputs if name in o.components]
        m[f"reward/{name}/mean"] = sum(vals) / len(vals)
    for o in outputs:  # one count per failed reward of a rollout
        for name, _ in o.errors:
            m[f"reward/errors/{name}"] = m.get(f"reward/errors/{name}", 0.0) + 1.0
    return m


def check_task_fits(task: Task, policy: Policy, rl: RLConfig) -> None:
    """The model can read the task (`tasks.check_task_for_policy`) and its prompts fit the context window with
    rl.max_new_tokens (`tasks.check_prompt_lengths`); prompts that rl.max_prompt_length cuts are counted in one
    warning. Raises the one-line ValueErrors of those checks."""
    check_task_for_policy(task, policy)
    note = check_prompt_lengths(task, policy, max_new_tokens=rl.max_new_tokens, key="rl.max_new_tokens",
                                max_prompt_length=rl.max_prompt_length, prompt_key="rl.max_prompt_length")
    if note:
        warn(note)


def setup(cfg: TrainConfig, *, mode: RunMode = "new") -> TrainState:
    """Check `cfg`, load the task, reward and models, check that the model can read the task and that its prompts fit
    the context window (`check_task_fits`), open the run directory and, with "resume", restore the newest valid
    checkpoint (weights, optimizer, schedule, sampler, RNG state, critic and refreshed reference).

    The model is loaded before the directory is touched (an overwrite deletes the old run); the RNGs are seeded
    with `cfg.seed` after every model is built, then a resume restores their saved state. The run directory is
    closed again when a later part of the set-up fails.

    Raises:
        see `train`.
    """
    check_names(cfg)
    if cfg.rl.engine == "ray" and cfg.rl.ray_address is not None:
        from rewardlab.rl.engines.ray_engine import check_reachable

        check_reachable(cfg.rl.ray_address)  # a cluster nothing answers at, refused before the task and model load
    threads = apply_threads(cfg.threads)
    if cfg.model.path != "tiny" and (mode != "resume" or cfg.rl.beta > 0 or cfg.model.lora is not None):
        # a bad path is refused before the run directory is created (a LoRA run resumes on its base, so needs it)
        check_model_dir(cfg.model.path, adapters=True)
    rl = cfg.rl
    task = load_task(cfg.task.spec, **cfg.task.options)
    reward = build_reward(cfg.rewards if cfg.rewards is not None else task.reward, on_error=cfg.on_error)
    if task.env is None and rl.turn_rewards != "env":
        raise ValueError(f"rl.turn_rewards: {rl.turn_rewards!r} scores the turns of an episode, and {cfg.task.spec} "
                         "is a single-turn task (use an environment task, task.spec env:NAME)")
    if task.env is not None and rl.step_separator is not None:
        raise ValueError(f"rl.step_separator: {cfg.task.spec} is an environment task, whose episodes are not split "
                         "into reasoning steps (process rewards score single completions); unset it")
    model_kw = {"seed": cfg.seed, **cfg.model.policy_options()}
    policy: Policy | None = None
    if mode != "resume":
        policy = load_policy(cfg.model.path, **model_kw)
        check_task_fits(task, policy, rl)  # before the run directory is touched
    # the environment and the env section's budgets, its keys checked against the environment (and the model's
    # tokenizer, known here unless resuming) before the run directory is touched
    episodes = load_episodes(task, cfg.env, policy)
    heldout_rows(task, rl.eval_every, rl.eval_n, field="rl.eval_every")  # no held-out rows: refused before the run
    # the rollout engine (rl.engine ray: its workers, ray missing refused) before the run directory is touched
    engine = make_engine(cfg, episodes=episodes, reward=reward, threads=threads, task=task)
    try:
        run = RunDir.start(cfg.out, mode=mode)
    except BaseException:
        engine.close()
        raise
    try:
        latest = None
        if mode == "resume":  # the newest valid checkpoint, logs rolled back to it; allowed changes to config.yaml
            latest = run.resume_training(dump_config(cfg), may_change=RESUME_MAY_CHANGE, steps=rl.steps,
                                         steps_key="rl.steps")
        else:
            run.write_config(dump_config(cfg))
            if rl.prompts_per_step > len(task.train):  # said once, when the run starts (a resume keeps the setting)
                warn(f"rl.prompts_per_step={rl.prompts_per_step} is more than the {len(task.train)} training rows of "
                     f"{cfg.task.spec}: every step repeats prompts (each row about "
                     f"{rl.prompts_per_step / len(task.train):.1f} times, as more groups of the same prompt)")
            short = turn_budget_warning(episodes, policy, rl.max_new_tokens, key="rl.max_new_tokens")
            if short is not None:  # the environment's own turns would be cut: said once, when the run starts
                warn(short)
        if latest is not None and cfg.model.lora is not None:
            # the checkpoint holds the adapter: the policy is built as the run built it, its adapter loaded into it
            policy = load_policy(cfg.model.path, **model_kw)
            load_weights(policy.model, latest[1])
            check_task_fits(task, policy, rl)
        elif latest is not None:
            policy = load_policy(str(latest[1]), **model_kw)
            check_task_fits(task, policy, rl)
        reference = None
        if rl.beta > 0 and policy.has_adapter:  # the base with the adapter disabled: no second model in memory
            reference = policy.without_adapter()
        elif rl.beta > 0:
            reference = load_policy(cfg.model.path, **{**model_kw, "lora": None})
            reference.model.eval().requires_grad_(False)
        critic = None  # a value model, only for estimators that need values (gae)
        if "values" in estimator_needs(rl.estimator) and "values" not in rl.estimator_options:
            critic = ValueModel(policy, lr=rl.critic_lr, value_clip=rl.value_clip, weight_decay=rl.weight_decay,
                                path=latest[1] / CRITIC_DIR if latest else None)
        optimizer = make_optimizer(policy.model, rl.lr, rl.weight_decay)
        scheduler = make_scheduler(optimizer, warmup_steps=rl.warmup_steps, total_steps=rl.steps,
                                   kind=rl.lr_schedule)
        sampler = make_curriculum(rl.curriculum, task.train, seed=cfg.seed, **rl.curriculum_options)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        start_step, saved_prefetch = 0, None
        if latest is not None:
            saved = restore_training_state(latest[1], optimizer, scheduler, sampler=sampler)  # weights: built above
            if critic is not None:
                critic.optimizer.load_state_dict(saved["critic_optimizer"])
            if reference is not None and saved.get("reference") is not None:
                reference.model.load_state_dict(saved["reference"])
            start_step = saved["step"]
            saved_prefetch = saved.get("prefetch")
        loss_options = resolve_loss_options(rl)
        _, agg_options = split_loss_options(rl.loss, rl.agg, loss_options)
        engine.publish(policy, version=start_step)  # the weights step start_step + 1 samples with
    except BaseException:
        run.close()
        close_env(episodes)
        engine.close()
        raise
    policy.model.train()
    return TrainState(cfg, task, reward, policy, reference, critic, optimizer, scheduler, sampler, run,
                      loss_options, agg_options, start_step=start_step, latest=latest, step=start_step,
                      episodes=episodes, engine=engine, saved_prefetch=saved_prefetch)


def collect(state: TrainState) -> Collected:
    """Step `state.step`'s rollouts, synchronously: `produce` them with the last published weights, stop on reward
    errors, then `finish` (the estimator's sampled inputs).

    Raises:
        RewardError: at least rl.max_reward_error_frac of the step's scored rollouts have a reward error; the run's
            state is put back to the end of the step before and checkpointed first (`stop_on_reward_errors`).
    """
    batch = produce(state, state.step)
    stop_on_reward_errors(state, batch.all_outputs, batch.before)
    return finish(state, batch)


def produce(state: TrainState, step: int, version: int | None = None) -> Collected:
    """The rollouts of step `step`, sampled by policy `version` (None: the last published): draw prompts, generate
    rl.group_size rollouts each (streams keyed by (seed, `step`, round)), score them, update the curriculum; with a
    group filter, keep the groups it passes and generate more rounds (up to rl.max_rounds) until rl.prompts_per_step
    groups are kept. Then leave out what the estimator must not see (`training_rollouts`). Generation is timed in
    `gen_s`. Touches the prompt sampler and the engine only (no global RNG), so the prefetch thread may run it while
    the learner updates (`Prefetch`).
    """
    rl, policy, sampler = state.cfg.rl, state.policy, state.sampler
    before = (sampler.state_dict(), rng_state())  # the end of the step before: what a stop for reward errors saves
    gen_s, gen_tokens, reward_s = 0.0, 0, 0.0
    rollouts, outputs, all_outputs, all_rollouts = [], [], [], []
    rows_of: dict[int, list[Rollout]] = {}
    rounds = dropped = 0
    next_group = step * rl.prompts_per_step * rl.max_rounds  # group ids unique across steps
    while rounds < rl.max_rounds and len(rollouts) < rl.prompts_per_step * rl.group_size:
        rounds += 1
        need = rl.prompts_per_step - len(rollouts) // rl.group_size
        indices = sampler.next_indices(need)
        rows = [state.task.train[i] for i in indices]
        tg = time.perf_counter()
        # each rollout (episode) draws from its own stream (seed, step, index in this round's batch, round[, turn]),
        # and the engine samples in rl.rollout_chunk chunks whatever its workers, so what a rollout samples depends
        # neither on the engine, the worker nor torch's global generator
        sampled = state.engine.generate(rows, n=rl.group_size, stream=(state.cfg.seed, step, rounds), version=version)
        gen_s += time.perf_counter() - tg
        gen_tokens += sum(r.sampled_tokens for r in sampled)
        for r in sampled:
            r.group += next_group
            if rl.step_separator is not None:
                policy.mark_steps(r, rl.step_separator)
        next_group += need
        new = episode_ends(sampled)  # one rollout per episode: the reward is called once per episode
        if state.episodes is not None:
            rows_of.update(episode_rows(sampled))
        tr = time.perf_counter()
        scored = state.engine.score(new)
        reward_s += time.perf_counter() - tr
        all_rollouts += new
        all_outputs += scored
        correct = torch.tensor([float(o.correct) for o in scored]).view(need, rl.group_size)
        sampler.update(indices, correct.mean(dim=1).tolist())
        if rl.group_filter is None:
            rollouts, outputs = new, scored
            break
        keep = filter_groups(rl.group_filter, metric=torch.tensor([filter_metric(o, rl.filter_metric) for o in scored]),
                             group=torch.tensor([r.group for r in new]), **rl.group_filter_options)
        dropped += int((~keep).sum()) // rl.group_size
        rollouts += [r for r, k in zip(new, keep) if k]
        outputs += [o for o, k in zip(scored, keep) if k]
    rollouts = rollouts[: rl.prompts_per_step * rl.group_size]
    outputs = outputs[: len(rollouts)]
    metrics = step_metrics(all_rollouts, all_outputs, rl.group_size)
    metrics["time/reward_s"] = reward_s  # the outcome reward's wall clock (every round), whatever the engine
    metrics.update(state.engine.metrics())  # engine ray: ray/weights_bytes, ray/rollout_s, ray/reward_s
    if state.episodes is not None:
        metrics.update(episode_metrics([rows_of[id(r)] for r in all_rollouts]))
    if rl.group_filter is not None:
        metrics.update({"filter/rounds": float(rounds), "filter/dropped_groups": float(dropped),
                        "filter/kept_groups": float(len(rollouts) // rl.group_size)})
    rollouts, outputs, skipped, dropped_groups = training_rollouts(
        rollouts, outputs, skip_errors=state.cfg.on_error == "skip",
        min_group_size=estimator_min_group_size(rl.estimator))
    metrics.update({"reward/skipped": float(skipped), "rollout/dropped_groups": float(dropped_groups)})
    return Collected(rollouts, outputs, all_rollouts, all_outputs, {}, metrics, gen_s, gen_tokens, rows_of,
                     before=before)


def finish(state: TrainState, batch: Collected) -> Collected:
    """Generate the estimator's sampled inputs (e.g. ReMax's greedy baseline) of a produced batch with the learner's
    current policy, timed in `gen_s`; returns `batch`."""
    rl = state.cfg.rl
    for provider in _providers(rl.estimator, rl.estimator_options, SAMPLED_INPUTS) if batch.rollouts else []:
        tg = time.perf_counter()
        more, generated = provider(state, batch.rollouts)
        batch.gen_s += time.perf_counter() - tg
        batch.gen_tokens += sum(r.sampled_tokens for r in generated)
        batch.inputs.update(more)
    return batch


class Prefetch:
    """The batches of later steps, produced ahead of the learner: asynchronous training with a fixed lag.

    With lag k = rl.max_staleness, step s trains on the batch of step s (prompts and streams keyed by s, as in a
    synchronous run) sampled by policy version `version_for(s)` = max(0, s - 1 - k): the batches of steps 1..k+1
    with the initial weights, then batch s + k + 1 as soon as step s has published version s. k = 0 is the
    synchronous loop (batch s sampled by version s - 1). Batches are produced one after the other, in step order,
    so the prompt sampler's draws and curriculum updates happen in the same order whatever k is; nothing produced
    is discarded (every batch up to rl.steps + k is produced, the last k are in flight when the run ends).

    On engine ray a background thread produces them (the workers generate and score while this process runs the
    update; `Engine.generate(..., version=v)` samples with the kept weights of version v); on engine local, each is
    produced in this thread when its step asks for it. Checkpoints wait for the batch in production and store the
    finished, untrained ones (`state_dict`); older weights are then never needed: after a resume from step s the
    next batch produced is s + k + 1, with version s, the weights the checkpoint holds.

    Args:
        state: the run (its engine holds the last published version).
        saved: `state_dict()` of the resumed checkpoint, or None (a new run, or a checkpoint whose trainer_state.pt
            holds no "prefetch" state, such as a synchronous run's: nothing prefetched).
        background: produce in a background thread; None: on engine ray only.
    """

    def __init__(self, state: TrainState, saved: dict[str, Any] | None = None, *,
                 background: bool | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        rl = state.cfg.rl
        self.state, self.lag = state, rl.max_staleness
        self.batches: dict[int, Any] = {}  # step -> Collected, or the Future of one in production
        self.next = state.start_step + 1  # the next step whose batch to produce
        self.trained = self.filtered = 0  # rollouts (episodes) trained and left out, cumulative
        if saved is not None:
            self.next, self.trained, self.filtered = saved["next"], saved["trained"], saved["filtered"]
            self.batches = {t: Collected.from_state(b) for t, b in saved["batches"].items()}
        if background is None:
            background = rl.engine != "local"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rewardlab-prefetch") if background else None

    def version_for(self, step: int) -> int:
        """The policy version that samples step `step`'s batch: max(0, step - 1 - lag)."""
        return max(0, step - 1 - self.lag)

    def submit(self) -> None:
        """Start producing, in step order, every batch up to rl.steps + lag whose weights are published."""
        state = self.state
        while (self.next <= state.cfg.rl.steps + self.lag
               and self.version_for(self.next) <= state.engine.version):
            t, v = self.next, self.version_for(self.next)
            self.batches[t] = self._pool.submit(produce, state, t, v) if self._pool else produce(state, t, v)
            self.next += 1

    def wait(self, upto: float) -> None:
        """Wait for the batches of steps up to `upto` (their production's exception, if any, raised here)."""
        for t in sorted(self.batches):
            if t <= upto and not isinstance(self.batches[t], Collected):
                self.batches[t] = self.batches[t].result()

    def take(self, step: int) -> Collected:
        """Step `step`'s batch (produced now if it was not yet), its reward errors checked
        (`stop_on_reward_errors`), finished (`finish`) and its staleness logged: async/staleness_mean and
        async/staleness_max, over the rollouts trained, of step - 1 - Rollout.policy_version (exactly
        min(step - 1, lag)).

        Raises:
            RewardError: see `stop_on_reward_errors` (with a lag, no roll-back: the later batches are drawn).
        """
        state = self.state
        self.submit()
        self.wait(step)
        batch = self.batches.pop(step)
        if self.lag == 0:
            self.next = step  # a stop for reward errors rolls the sampler back to before this batch
            stop_on_reward_errors(state, batch.all_outputs, batch.before)
            self.next = step + 1
        else:
            stop_on_reward_errors(state, batch.all_outputs, None)
        batch = finish(state, batch)
        stale = [step - 1 - r.policy_version for r in batch.rollouts or batch.all_rollouts]
        batch.metrics.update({"async/staleness_mean": sum(stale) / max(len(stale), 1),
                              "async/staleness_max": float(max(stale, default=0))})
        self.trained += len(batch.rollouts)
        self.filtered += len(batch.all_rollouts) - len(batch.rollouts)
        return batch

    def counts(self, step: int) -> dict[str, float]:
        """The accounting after step `step` trained: async/trained and async/filtered (rollouts trained, and left out
        by the group filter, on_error=skip or the estimator's minimum group size; cumulative over the run) and
        async/in_flight (finished rollouts of the batches of steps step+1 .. step+lag-1, waited for; batch
        step + lag, the newest, counts once finished). Every finished rollout is exactly one of the three."""
        self.wait(step + self.lag - 1)
        flight = sum(len(b.all_rollouts) for t, b in self.batches.items() if t <= step + self.lag - 1)
        return {"async/trained": float(self.trained), "async/filtered": float(self.filtered),
                "async/in_flight": float(flight)}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores, after waiting for every batch in production: the next step to produce, the
        finished untrained batches and the counts."""
        self.wait(float("inf"))
        return {"next": self.next, "trained": self.trained, "filtered": self.filtered,
                "batches": {t: b.to_state() for t, b in self.batches.items()}}

    def close(self) -> None:
        """Wait for the batch in production, if any, and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def stop_on_reward_errors(state: TrainState, outputs: list[RewardOutput], before: tuple[dict, dict] | None) -> None:
    """Stop the run when at least rl.max_reward_error_frac of step `state.step`'s scored rollouts (`outputs`, every
    round) have a reward error: a reward that fails that often (a wrong option, a crashing checker) would otherwise
    train on zeros for the rest of the run. Before raising, the prompt sampler and the RNGs are put back to `before`
    (their state at the end of the step before), that step is checkpointed unless it is the newest checkpoint, and a
    `reward_errors` event is logged; so a fixed reward goes on with --resume from exactly where the run was. With
    `before` None (asynchronous training: later batches are drawn and scored already) nothing is rolled back or
    saved: the event is logged and the error names the newest checkpoint.

    Raises:
        RewardError: one line naming the step, the fraction and the limit, the first cause and the checkpoint.
    """
    limit = state.cfg.rl.max_reward_error_frac
    failed = [o for o in outputs if o.error is not None]
    if limit is None or not outputs or len(failed) / len(outputs) < limit:
        return
    step = state.step
    first = "; ".join(f"{name}: {cause}" for name, cause in failed[0].errors[:1]) or failed[0].error
    if before is None:  # asynchronous: the later batches are drawn already; stop at the newest checkpoint
        stopped = f"Stopped; the newest checkpoint is {state.latest[1] if state.latest else '(none)'}"
    else:  # synchronous: back to the end of the step before, checkpointed
        state.sampler.load_state_dict(before[0])
        set_rng_state(before[1])
        if state.latest is None or state.latest[0] != step - 1:
            state.step = step - 1
            try:
                save_checkpoint(state)
            finally:
                state.step = step
        stopped = (f"Stopped after checkpoint {state.latest[1]} (step {step - 1}): fix the reward and rerun with "
                   "--resume")
    state.run.log_event("reward_errors", step=step, failed=len(failed), rollouts=len(outputs), limit=limit,
                        first=first, checkpoint=state.latest[1].name if state.latest else None)
    raise RewardError(f"rl.max_reward_error_frac: {len(failed)} of {len(outputs)} rollouts of step {step} "
                      f"({len(failed) / len(outputs):.0%}) have a reward error, the limit is {limit:g}; first: "
                      f"{first}. {stopped}")


def assign_credit(state: TrainState, batch: Collected) -> Credit | None:
    """Pack the kept rollouts' rows (an episode's rows, or one per single completion); outcome rewards on the last
    sampled token of each episode, minus rl.beta * KL(policy || reference) per sampled token when rl.kl_in = reward;
    advantages by the estimator on the episode view (`rl.episodes.episode_advantages`: an episode's credit does not
    depend on how many rows it became, and environment tokens get none), with the inputs it needs; the critic's
    returns. None when no rollout is left to learn from."""
    rl = state.cfg.rl
    if not batch.rollouts:
        return None
    rows, outputs, owner = batch.rows(batch.rollouts, batch.outputs)
    packed, old_logprobs = rollout_batch(state.policy, rows)
    metrics: dict[str, float] = {}
    scored = rows
    if rl.turn_rewards == "info_gain":  # IGPO: each turn's information gain replaces the environment's turn reward
        t0 = time.perf_counter()
        gains = info_gain_rewards(state.policy, [batch.rows_of.get(id(r), [r]) for r in batch.rollouts],
                                  batch_size=rl.micro_batch_size or 64)
        per_row = [g for r, episode_gains in zip(batch.rollouts, gains)
                   for g in _split_by_rows(batch.rows_of.get(id(r), [r]), episode_gains)]
        scored = [replace(row, turn_rewards=g) for row, g in zip(rows, per_row)]
        metrics["time/info_gain_s"] = time.perf_counter() - t0
        metrics["turn/info_gain_mean"] = sum(map(sum, gains)) / max(sum(map(len, gains)), 1)
    device = packed.mask.device
    ep = {k: v.to(device) for k, v in episode_tensors(scored, packed.mask.shape[1]).items()}
    sampled = packed.mask * ep["sampled"]  # 1 exactly on the tokens the policy sampled
    # every row its own episode (single completions): the estimators, losses and aggregations run as on rows
    episode = ep["episode"] if any(r.episode_id is not None for r in rows) else None
    order = ep["order"] if episode is not None else None
    token_rewards, group = reward_tensors(rows, outputs, sampled)
    ref_logprobs = None
    if state.reference is not None:
        ref_logprobs = state.reference.scored_logprobs(packed, temperature=rl.temperature,
                                                       micro_batch_size=rl.micro_batch_size, group=group)
        if rl.kl_in == "reward":
            kl_tokens = kl_penalty(rl.kl_estimator, old_logprobs, ref_logprobs) * sampled
            token_rewards = token_rewards - rl.beta * kl_tokens
            metrics["policy/kl_reward"] = (kl_tokens.sum() / sampled.sum().clamp(min=1)).item()
            metrics["policy/kl_clamped"] = float(kl_clamped(rl.kl_estimator, old_logprobs, ref_logprobs, sampled))
    index = torch.tensor(owner, dtype=torch.long)  # sampled inputs come one per episode; each row takes its own
    options = {k: v.index_select(0, index.to(v.device)) if v.shape[:1] == (len(batch.rollouts),) else v
               for k, v in batch.inputs.items()}
    for provider in _providers(rl.estimator, {**options, **rl.estimator_options}, BATCH_INPUTS):
        options.update(provider(state, rows, outputs, packed, sampled))
    options.update({k: ep[k] for k in ESTIMATORS.inputs(rl.estimator)})  # turn_rewards, turn_index, turn_key
    options.update(rl.estimator_options)
    advantages = episode_advantages(rl.estimator, token_rewards=token_rewards, mask=sampled, group=group,
                                    episode=episode, order=order, **options)
    values = returns = None
    if state.critic is not None:
        values = options["values"]
        returns = state.critic.returns(token_rewards, sampled, group, values, episode=episode, order=order,
                                       **rl.estimator_options)
    loss_mask = sampled
    if rl.mask_truncated:  # a loss weight per termination reason of the episode (0 masks all its rows)
        weight = rl.truncation_weights()
        ends = [batch.rollouts[i].termination or "stop" for i in owner]
        loss_mask = sampled * torch.tensor([weight[t] for t in ends], dtype=sampled.dtype, device=device)[:, None]
    return Credit(rows, outputs, packed, old_logprobs, ref_logprobs, sampled, episode, group, loss_mask, advantages,
                  values, returns, metrics)


def _split_by_rows(rows: list[Rollout], values: list[float]) -> list[list[float]]:
    """An episode's per-turn values, cut into one list per row (each row's `turns`)."""
    out, at = [], 0
    for r in rows:
        out.append(values[at:at + len(r.turns)])
        at += len(r.turns)
    return out


def update(state: TrainState, batch: Collected, credit: Credit | None) -> dict[str, float]:
    """rl.epochs passes over the kept rollouts in shuffled minibatches of rl.minibatch_size rollouts (whole
    episodes: an episode's rows are never split between minibatches): policy loss (+ beta *
    KL when rl.kl_in = loss, - entropy_coef * entropy), its gradient accumulated over micro-batches of
    rl.micro_batch_size rollouts (`accumulate_policy_gradient`), clipped gradient step, critic step. Then the
    learning-rate schedule steps and the reference is refreshed every rl.ref_refresh_every steps.

    The loss and every statistic are those of the whole minibatch, whatever the micro-batch: they are computed
    (without gradient) from the minibatch's log-probs and entropies, gathered from its micro-batches.

    Returns:
        each minibatch statistic averaged over the updates, and policy/updates (their number).
    """
    rl, policy = state.cfg.rl, state.policy
    sums: dict[str, float] = {}
    updates = 0
    n = len(credit.rows) if credit is not None else 0
    for _ in range(rl.epochs if n else 0):
        for idx in episode_minibatches(credit.episode, rl.minibatch_size, n=n):
            m = credit.loss_mask[idx]
            ep = credit.episode[idx] if credit.episode is not None else None  # an episode counts once
            state.optimizer.zero_grad(set_to_none=True)
            logprobs, entropy = accumulate_policy_gradient(state, credit, idx)
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), rl.grad_clip)
            state.optimizer.step()
            with torch.no_grad():  # the minibatch's loss and statistics, as one pass over it would give them
                loss, stats = compute_policy_loss(rl.loss, logprobs=logprobs, old_logprobs=credit.old_logprobs[idx],
                                                  advantages=credit.advantages[idx], mask=m, agg=rl.agg, episode=ep,
                                                  **state.loss_options)
                stats["policy/entropy"] = ((entropy * m).sum() / m.sum().clamp(min=1)).item()
                if rl.entropy_coef > 0:
                    loss = loss - rl.entropy_coef * aggregate(entropy, m, rl.agg, episode=ep, **state.agg_options)
                if credit.ref_logprobs is not None and rl.kl_in == "loss":
                    ref = credit.ref_logprobs[idx]
                    kl = aggregate(kl_penalty(rl.kl_estimator, logprobs, ref), m, rl.agg, episode=ep,
                                   **state.agg_options)
                    loss = loss + rl.beta * kl
                    stats["policy/kl"] = kl.item()
                    stats["policy/kl_clamped"] = float(kl_clamped(rl.kl_estimator, logprobs, ref, m))
            stats["policy/loss"] = loss.item()
            stats["policy/grad_norm"] = grad_norm.item()
            if state.critic is not None:
                parts = micro_batches(credit.group[idx], rl.micro_batch_size, ep)
                stats.update(state.critic.update(credit.packed.select(idx), credit.returns[idx], credit.values[idx],
                                                 credit.sampled[idx], rl.grad_clip, micro_batches=parts))
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            updates += 1
    state.scheduler.step()
    if state.reference is not None and rl.ref_refresh_every is not None and state.step % rl.ref_refresh_every == 0:
        state.reference.model.load_state_dict(policy.model.state_dict())
    return {**{k: v / updates for k, v in sums.items()}, "policy/updates": float(updates)}


def accumulate_policy_gradient(state: TrainState, credit: Credit, idx: torch.Tensor) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    """Accumulate into the policy's .grad the gradient of minibatch `idx`'s loss, one micro-batch of
    rl.micro_batch_size rollouts (whole episodes, a prompt group's together: `policy.batch.micro_batches`) at a
    time, so no forward pass holds more than one micro-batch's activations and logits.

    The minibatch's loss L = agg(l) - entropy_coef * agg(H) + beta * agg(KL) (the last for rl.kl_in = loss) is
    linear in the per-token terms, L = sum_{i,t} w_{i,t} (l - entropy_coef * H + beta * KL)_{i,t} with the token
    weights w of the minibatch's aggregation (`losses.aggregation_weights`: token-mean over all its tokens, not a
    mean of micro-batch means), so each micro-batch backpropagates its rows' part of that sum and the accumulated
    gradient equals the unsplit one up to float rounding. A policy loss reads at most its episode's rows (GSPO's
    sequence ratio), which a micro-batch holds whole.

    Returns:
        the minibatch's log-probs and entropies [n, T] float32 (detached), for its loss value and statistics.
    """
    rl, policy = state.cfg.rl, state.policy
    m = credit.loss_mask[idx]
    ep = credit.episode[idx] if credit.episode is not None else None
    weights = aggregation_weights(rl.agg, m, episode=ep, **state.agg_options)
    logprobs, entropy = torch.zeros_like(m), torch.zeros_like(m)
    for part in micro_batches(credit.group[idx], rl.micro_batch_size, ep):
        part = part.to(m.device)
        rows = idx.to(m.device)[part]
        lp, ent = policy.token_logprobs(credit.packed.select(rows), temperature=rl.temperature, with_entropy=True,
                                        entropy_grad=rl.entropy_coef > 0)
        per_token, _ = per_token_policy_loss(rl.loss, logprobs=lp, old_logprobs=credit.old_logprobs[rows],
                                             advantages=credit.advantages[rows], mask=m[part], agg=rl.agg,
                                             episode=ep[part] if ep is not None else None, **state.loss_options)
        w = weights[part]
        objective = (per_token * w).sum()
        if rl.entropy_coef > 0:
            objective = objective - rl.entropy_coef * (ent * w).sum()
        if credit.ref_logprobs is not None and rl.kl_in == "loss":
            objective = objective + rl.beta * (kl_penalty(rl.kl_estimator, lp, credit.ref_logprobs[rows]) * w).sum()
        objective.backward()
        logprobs[part], entropy[part] = lp.detach(), ent.detach()
    return logprobs, entropy


def log_step(state: TrainState, batch: Collected, credit: Credit | None, stats: dict[str, float], *,
             step_s: float, elapsed_s: float, evals: dict[str, float] | None = None) -> dict[str, float]:
    """Append step `state.step`'s metrics to metrics.jsonl and its rollouts to samples.jsonl (every one, or the
    first rl.log_samples of the step); returns the metrics.

    A single completion's line holds its prompt, completion, answer, reward, components, error, advantage (on its
    first token), whether the loss saw it (kept), truncated and the policy version that sampled it. An environment
    task writes one line per episode, `rewardlab.envs.episode_record` (each row's ids, loss mask and behaviour
    log-probs, the turns, messages, tool calls, termination, reward, turn rewards and the advantage of each turn on
    its first sampled token, which `rewardlab.envs.replay` rebuilds) plus step, kept and policy_version.

    Adds `rollout/generated` (the rollouts this step generated and scored, every group-filter round included: its
    samples.jsonl rows; a sampled estimator input such as ReMax's greedy baseline is not counted) to
    `state.generated_total`, logged as `rollout/generated_total`; and `evals` (the held-out evaluation's metrics,
    `HeldOutEval`) when given.
    """
    metrics = {**batch.metrics, **credit.metrics} if credit is not None else dict(batch.metrics)
    metrics.update({k: v for k, v in stats.items() if k != "policy/updates"})
    state.generated_total += len(batch.all_rollouts)
    metrics.update({"rollout/generated": float(len(batch.all_rollouts)),
                    "rollout/generated_total": float(state.generated_total), **(evals or {})})
    metrics.update({"lr": state.scheduler.get_last_lr()[0], "time/step_s": step_s, "time/gen_s": batch.gen_s,
                    "time/gen_tokens_per_s": batch.gen_tokens / max(batch.gen_s, 1e-9),
                    "policy/updates": stats["policy/updates"], "time/elapsed_s": elapsed_s})
    state.run.log_metrics(state.step, metrics)
    logged = list(zip(batch.all_rollouts, batch.all_outputs))[:state.cfg.rl.log_samples]
    if state.episodes is None:
        adv_seq = dict(zip((id(r) for r in credit.rows), credit.advantages[:, 0].tolist())) if credit else {}
        state.run.log_samples(
            {"step": state.step, "group": r.group, "prompt": r.row.get("prompt", r.prompt),
             "completion": r.completion, "answer": r.row.get("answer"), "reward": o.score, "components": o.components,
             "error": o.error, "advantage": adv_seq.get(id(r)), "kept": id(r) in adv_seq, "truncated": r.truncated,
             "policy_version": r.policy_version,
             **({"step_scores": o.step_scores} if o.step_scores is not None else {})}
            for r, o in logged
        )
        return metrics
    at = {id(row): i for i, row in enumerate(credit.rows)} if credit else {}
    records = []
    for r, o in logged:
        rows = batch.rows_of[id(r)]
        kept = id(rows[-1]) in at
        turn_adv = None
        if kept:  # each turn's advantage on its first sampled token
            turn_adv = [credit.advantages[at[id(row)], next((t for t in range(a, b) if row.loss_mask[t]), a)].item()
                        for row in rows for a, b in row.turns]
        records.append({"step": state.step, **episode_record(rows, o, turn_adv), "kept": kept,
                        "policy_version": r.policy_version})
    state.run.log_samples(records)
    return metrics


def save_checkpoint(state: TrainState) -> Path:
    """Checkpoint step `state.step` (weights, trainer_state.pt, the critic) atomically; records it as `latest`.
    trainer_state.pt holds the batches prefetched for later steps (`Prefetch.state_dict`, after waiting for the one
    in production), so a resume trains what the uninterrupted run trains.

    Raises:
        OSError: the checkpoint could not be written (the message names it and the intact previous one).
    """
    rl = state.cfg.rl
    # first: waits for the batches in production, whose prompts the sampler's state has already drawn
    prefetched = state.prefetch.state_dict() if state.prefetch is not None else None

    def write(tmp: Path) -> None:
        state.policy.save(tmp)
        refreshed = state.reference is not None and rl.ref_refresh_every is not None
        save_state(tmp, {"step": state.step, "prefetch": prefetched, "optimizer": state.optimizer.state_dict(),
                         "scheduler": state.scheduler.state_dict(), "sampler": state.sampler.state_dict(),
                         "rng": rng_state(), "reference": state.reference.model.state_dict() if refreshed else None,
                         "critic_optimizer": state.critic.optimizer.state_dict() if state.critic else None})
        if state.critic is not None:
            state.critic.save(tmp / CRITIC_DIR)

    path = state.run.save_checkpoint(state.step, write, keep=state.cfg.keep_checkpoints)
    state.latest = (state.step, path)
    return path


def train(cfg: TrainConfig, *, mode: RunMode = "new", show_progress: bool = True,
          time_budget_s: float | None = None) -> dict[str, Any]:
    """Optimize `cfg.model` on `cfg.task` with the configured estimator and policy loss.

    Writes the run directory `cfg.out` (see `rewardlab.runs`), opened with `RunDir.start` once the config, task,
    rewards and model are known to be good: a directory that already holds a run is refused unless "overwrite" (the
    old run is deleted first) or "resume". With "resume", continues from the newest checkpoint there that verifies
    against its manifest (an invalid newer one is skipped with a warning), after rolling the logs back to that
    checkpoint: weights, optimizer, schedule, prompt sampler and RNG state are restored, so step k+1 after a resume
    logs what an uninterrupted run logs, each step once; a resume whose settings differ from config.yaml in more
    than RESUME_MAY_CHANGE is refused, the changes allowed (e.g. more rl.steps, never fewer than the checkpoint's)
    are written to config.yaml and logged (`RunDir.resume_training`). With `time_budget_s` (seconds of wall clock
    since the first step began), the run stops after the first step that ends past the budget (or at
    `cfg.rl.steps`) and saves its final checkpoint there: for equal-wall-time comparisons (benchmarks/grpo_vs_trl.py).
    With `rl.eval_every`, the policy is evaluated greedily on held-out questions every that many steps and at the
    last (`rewardlab.evaluation.heldout`; eval/accuracy in metrics.jsonl and plots/train.png). A first Ctrl-C
    (SIGINT) or SIGTERM (main thread only) ends the run after the step it is in: a checkpoint of that step and the
    summary (`interrupted: true`) are written and `Interrupted` is raised; a second one raises KeyboardInterrupt at
    once. After a SIGTERM the process exits within the grace period whatever happens (`rewardlab.interrupt`). The
    SIGINT and SIGTERM handlers in place before the call are restored.
    With rl.max_staleness = k (engine ray), step s trains on the batch of step s sampled by policy version
    max(0, s - 1 - k), generated while the learner runs the steps before it (`Prefetch`); checkpoints hold the
    batches prefetched, so a resume stays exact, and the summary's `async` counts every finished rollout as trained,
    filtered or in flight.

    Returns:
        the summary (also written to summary.json); `final_checkpoint` is the last checkpoint this run saved (or
        resumed from).
    Raises:
        ValueError: unknown algorithm or reward names; an rl.ray_address nothing answers at (engine ray,
            `ray_engine.check_reachable`, within seconds); a task the model cannot read (`tasks.check_task_for_policy`:
            characters outside its vocabulary, chat rows without a chat template); a prompt that does not fit the
            model's context window with rl.max_new_tokens, named by its FILE:LINE (`tasks.check_prompt_lengths`;
            rl.max_prompt_length cuts long prompts instead); RunDirError (a ValueError):
            `cfg.out` holds a run and `mode` is "new", is in use by another process, "resume" with other
            settings, or "resume" finds no valid checkpoint.
        OSError: a checkpoint could not be written (the message names it and the intact previous one).
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C or SIGTERM after a step; names the step, its
            checkpoint and the `--resume` command.
        RewardError: rl.max_reward_error_frac of a step's rollouts had a reward error (after a checkpoint of the
            step before; see `stop_on_reward_errors`), or a reward failed with on_error=raise.
    """
    state = setup(cfg, mode=mode)
    rl, run = cfg.rl, state.run
    freeze_heap()  # the set-up's objects out of the cycle collector's full passes, until the run ends
    if show_progress:
        print(f"rewardlab: {describe_task(state.task)}", file=sys.stderr, flush=True)
    try:
        heldout = HeldOutEval(heldout_rows(state.task, rl.eval_every, rl.eval_n, field="rl.eval_every"),
                              state.task.reward, every=rl.eval_every, last_step=rl.steps,
                              max_new_tokens=rl.max_new_tokens, episodes=state.episodes,
                              max_prompt_length=rl.max_prompt_length)
        state.generated_total = generated_before(run, state.start_step)
        state.prefetch = prefetch = Prefetch(state, state.saved_prefetch)
        wall0, last, out_of_time = time.perf_counter(), {}, False
        with StopRequest() as stop:  # a first Ctrl-C or SIGTERM ends the run after the current step
            with stage(rl.estimator.upper(), rl.steps, enabled=show_progress) as bar:
                bar.advance(state.start_step)
                for step in range(state.start_step + 1, rl.steps + 1):
                    t0 = time.perf_counter()
                    state.step = step
                    batch = prefetch.take(step)  # 1. rollouts, rewards, group filter (sampled by step-1-lag)
                    credit = assign_credit(state, batch)  # 2. token rewards (- beta * KL) -> advantages
                    stats = update(state, batch, credit)  # 3. epochs x minibatches of the policy (and critic) loss
                    state.engine.publish(state.policy, version=step)  # the weights step + 1 + lag samples with
                    stats.update(prefetch.counts(step))
                    step_s = time.perf_counter() - t0
                    out_of_time = time_budget_s is not None and time.perf_counter() - wall0 >= time_budget_s
                    evals = heldout(state.policy) if heldout.due(step, last=out_of_time) else None  # 4. held out
                    last = log_step(state, batch, credit, stats, step_s=step_s,  # 5. log
                                    elapsed_s=time.perf_counter() - wall0, evals=evals)
                    bar.advance(1, reward=last["reward/mean"], acc=last["accuracy"])
                    if step % cfg.save_every == 0 or step == rl.steps or out_of_time or stop.requested:
                        save_checkpoint(state)
                    if out_of_time or stop.requested:
                        break
                    if prefetch.lag:
                        prefetch.submit()  # batch step + 1 + lag, on version step, while the next steps run
            run.plot(["reward/mean", "accuracy", "eval/accuracy", "policy/entropy", "rollout/len_mean"], "train.png")
            interrupted = stop.requested and state.step < rl.steps and not out_of_time
            summary = {
                "stage": "train",
                "estimator": rl.estimator,
                "loss": rl.loss,
                "steps": rl.steps,
                "steps_done": state.step,
                "resumed_from": state.start_step if mode == "resume" else None,
                "interrupted": interrupted,
                "wall_s": time.perf_counter() - wall0,
                "final_metrics": last or (run.read_metrics() or [{}])[-1],
                "final_checkpoint": str(state.latest[1]) if state.latest else None,
                "async": prefetch.counts(float("inf")),  # every finished rollout: trained, filtered or in flight
            }
            run.write_summary(summary)
        if interrupted:
            raise Interrupted("train", cfg.out, state.step, state.latest[1], signum=stop.signum)
        return summary
    finally:
        if state.prefetch is not None:
            state.prefetch.close()  # the batch in production, if any
        run.close()  # release the run directory's lock
        close_env(state.episodes)  # stop the environment's tool workers
        state.engine.close()  # engine ray: its workers
        gc.unfreeze()  # what the run froze is the collector's again (a caller's process goes on)


def generated_before(run: RunDir, step: int) -> int:
    """Rollouts generated by steps 1..`step` of the run in `run`: the sum of `rollout/generated` over its
    metrics.jsonl lines up to that step (each step counted once; 0 for a line without it)."""
    per_step = {r["step"]: r.get("rollout/generated", 0) for r in run.read_metrics() if 0 < r.get("step", 0) <= step}
    return int(sum(per_step.values()))
