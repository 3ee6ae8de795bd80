"""Credit: the second phase of a step, `assign_credit(run, batch)` -> `Credit`.

The kept episodes' rows are packed; outcome rewards go on the last sampled token of each episode (minus
rl.beta * KL per sampled token when rl.kl_in = reward); the estimator computes advantages on the episode view
(`rl.episodes.episode_advantages`: an episode's credit does not depend on how many rows it became, and environment
tokens get none), with the inputs it needs; the critic computes its returns.

Two registries keep the trainer free of algorithm names:

- `ESTIMATOR_INPUTS`: input name -> provider, for the inputs an estimator declares in `meta["needs"]` (ReMax's
  greedy `baseline`, GDPO's `components`/`weights`, process rewards `step_rewards`/`step_mask`, GAE's `values`).
  Every provider has one signature, `provider(view: CreditView) -> Provided` (tensors with one entry per training
  row, or a whole-batch value such as GDPO's weights); one registered with `generates=True` samples text, and its
  time and tokens count in time/gen_s and time/gen_tokens_per_s.
- `TURN_REWARD_SOURCES`: rl.turn_rewards -> `source(view) -> (rows, metrics)`, the rows with the per-turn rewards
  a turn-level estimator reads: "env" (the environment's, as sampled) or "info_gain" (IGPO).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple

import torch

from rewardlab.envs.sampling import episode_ends, sample_rollouts
from rewardlab.policy import Batch, SamplingSettings, rollout_batch
from rewardlab.registry import Registry
from rewardlab.rewards.compose import component_weights
from rewardlab.rl.episodes import episode_advantages, episode_tensors
from rewardlab.rl.info_gain import info_gain_rewards
from rewardlab.rl.losses import kl_clamped, kl_penalty
from rewardlab.types import Rollout, RewardOutput

class Provided(NamedTuple):
    """What an estimator-input provider returns: the inputs by name, the tokens it generated (if any), and metrics
    to log with the step (e.g. the online PRM's prm/loss)."""

    inputs: dict[str, torch.Tensor]
    generated_tokens: int = 0
    metrics: dict[str, float] = {}


#: Estimator input name -> its provider (see the module doc).
ESTIMATOR_INPUTS: Registry[Callable[..., Provided]] = Registry("estimator input")
#: rl.turn_rewards -> the source of the per-turn rewards (see the module doc).
TURN_REWARD_SOURCES: Registry[Callable[..., tuple[list[Rollout], dict[str, float]]]] = Registry("turn-reward source")


@dataclass(frozen=True)
class CreditView:
    """What the estimator-input providers and the turn-reward sources read: one step's training rows.

    Attributes:
        run: the run (`rl.trainer.TrainRun`: policy, reward, critic, episode settings, config).
        episodes: the kept episodes (`rl.rollouts.ScoredEpisode`), in order.
        rows, outputs: the N training rows (each episode's rows in order) and each row's reward output (its
            episode's). owner: [N] int64, each row's index in `episodes`.
        packed: the rows as tensors. sampled: [N, T] float32, 1 exactly on the tokens the policy sampled (None
            while the turn-reward source runs, which reads no tensor).
    """

    run: Any
    episodes: list[Any]
    rows: list[Rollout]
    outputs: list[RewardOutput]
    owner: torch.Tensor
    packed: Batch
    sampled: torch.Tensor | None = None


@dataclass
class Credit:
    """The credit assigned to one step's kept episodes (N training rows, T tokens).

    Attributes:
        rows, outputs, owner: as `CreditView`.
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
        metrics: the KL-in-reward metrics (policy/kl_reward, policy/kl_clamped) when rl.kl_in = reward, and the
            turn-reward source's. gen_s, gen_tokens: the generation of inputs such as ReMax's greedy baseline.
        first_epoch: filled by the update (`rl.update.record_first_epoch`): name -> [N, T], the per-token values the
            loss used in the first epoch (logprob, entropy, ratio, clip, kl), which the rollout log writes.
    """

    rows: list[Rollout]
    outputs: list[RewardOutput]
    owner: torch.Tensor
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
    gen_s: float = 0.0
    gen_tokens: int = 0
    first_epoch: dict[str, torch.Tensor] = field(default_factory=dict)


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


# ---------------------------------------------------------------------------------------------- estimator inputs
@ESTIMATOR_INPUTS.register("baseline", generates=True)
def greedy_baseline(view: CreditView) -> Provided:
    """ReMax's baseline: the reward of one greedy completion (for an environment task, one greedy episode) of each
    prompt, broadcast to its group's rows (Li et al., 2023, arXiv:2310.10505)."""
    run, rl = view.run, view.run.cfg.rl
    first: dict[int, Any] = {}
    for e in view.episodes:
        first.setdefault(e.last.group, e.last)
    groups = list(first)
    greedy = sample_rollouts(run.policy, [first[g].row for g in groups], SamplingSettings(
        max_new_tokens=rl.sampling.max_new_tokens, greedy=True, max_prompt_length=rl.sampling.max_prompt_length),
        episodes=run.episodes)
    if rl.step_separator is not None:
        for r in greedy:
            run.policy.mark_steps(r, rl.step_separator)
    score = {g: o.score for g, o in zip(groups, run.reward(episode_ends(greedy)))}
    return Provided({"baseline": torch.tensor([score[r.group] for r in view.rows], dtype=torch.float32)},
                    sum(r.sampled_tokens for r in greedy))


@ESTIMATOR_INPUTS.register("components")
@ESTIMATOR_INPUTS.register("weights")
def reward_components(view: CreditView) -> Provided:
    """GDPO's inputs: each member reward's score as a column of components [N, K], and the members' weights [K]."""
    pairs = component_weights(view.run.reward)
    labels = [label for label, _ in pairs]
    comps = [[o.components.get(label, o.score if len(labels) == 1 else 0.0) for label in labels]
             for o in view.outputs]
    return Provided({"components": torch.tensor(comps, dtype=torch.float32),
                     "weights": torch.tensor([w for _, w in pairs], dtype=torch.float32)})


@ESTIMATOR_INPUTS.register("values")
def critic_values(view: CreditView) -> Provided:
    """GAE's values: the value model's V_t on the sampled tokens of the batch, before this step's updates (no
    gradient)."""
    group = torch.tensor([r.group for r in view.rows], dtype=torch.long)
    values = view.run.critic.scored_values(view.packed, micro_batch_size=view.run.cfg.rl.micro_batch_size,
                                           group=group)
    return Provided({"values": values * view.sampled})


@ESTIMATOR_INPUTS.register("step_rewards")
@ESTIMATOR_INPUTS.register("step_mask")
def step_rewards(view: CreditView) -> Provided:
    """Process rewards: the online PRM's on every sampled token (`rl.online_prm`, which it updates on the step's rows
    first), else the reward's step scores on the last token of each reasoning step
    (`process_reward_tensors`)."""
    if view.run.online_prm is not None:
        return view.run.online_prm.provide(view)
    rewards, mask = process_reward_tensors(view.rows, view.outputs, view.sampled)
    return Provided({"step_rewards": rewards, "step_mask": mask})


# ------------------------------------------------------------------------------------------- turn-reward sources
@TURN_REWARD_SOURCES.register("env")
def environment_turn_rewards(view: CreditView) -> tuple[list[Rollout], dict[str, float]]:
    """The per-turn rewards the environment gave, as sampled."""
    return view.rows, {}


@TURN_REWARD_SOURCES.register("info_gain")
def info_gain_turn_rewards(view: CreditView) -> tuple[list[Rollout], dict[str, float]]:
    """IGPO: each turn's information gain replaces the environment's turn reward (`rl.info_gain`; Wang et al.,
    2025, "Information Gain-based Policy Optimization"): r_k = log p(answer | history after turn k) - log p(answer |
    history before it) under the current policy."""
    t0 = time.perf_counter()
    gains = info_gain_rewards(view.run.policy, [list(e.rows) for e in view.episodes],
                              batch_size=view.run.cfg.rl.micro_batch_size or 64)
    per_row = [g for e, episode_gains in zip(view.episodes, gains) for g in _split_by_rows(e.rows, episode_gains)]
    metrics = {"time/info_gain_s": time.perf_counter() - t0,
               "turn/info_gain_mean": sum(map(sum, gains)) / max(sum(map(len, gains)), 1)}
    return [replace(row, turn_rewards=g) for row, g in zip(view.rows, per_row)], metrics


def _split_by_rows(rows: Any, values: list[float]) -> list[list[float]]:
    """An episode's per-turn values, cut into one list per row (each row's `turns`)."""
    out, at = [], 0
    for r in rows:
        out.append(values[at:at + len(r.turns)])
        at += len(r.turns)
    return out


# ---------------------------------------------------------------------------------------------------- the phase
def training_view(run: Any, episodes: list[Any]) -> tuple[CreditView, torch.Tensor]:
    """The kept episodes' rows packed (`policy.rollout_batch`), without `sampled` yet, and the behaviour log-probs
    [N, T] float32."""
    rows = [row for e in episodes for row in e.rows]
    outputs = [e.output for e in episodes for _ in e.rows]
    owner = torch.tensor([i for i, e in enumerate(episodes) for _ in e.rows], dtype=torch.long)
    packed, old_logprobs = rollout_batch(run.policy, rows)
    return CreditView(run, episodes, rows, outputs, owner, packed), old_logprobs


def provide_inputs(view: CreditView) -> tuple[dict[str, torch.Tensor], float, int, dict[str, float]]:
    """The estimator's inputs its spec says the trainer provides (`EstimatorSpec.provided`), each provider run once;
    returns them with the seconds and tokens of the generating ones and the providers' metrics."""
    inputs: dict[str, torch.Tensor] = {}
    metrics: dict[str, float] = {}
    gen_s, gen_tokens = 0.0, 0
    for key in view.run.specs.estimator.provided:
        t0 = time.perf_counter()
        out = ESTIMATOR_INPUTS[key](view)
        if ESTIMATOR_INPUTS.meta(key).get("generates"):
            gen_s += time.perf_counter() - t0
            gen_tokens += out.generated_tokens
        inputs.update(out.inputs)
        metrics.update(out.metrics)
    return inputs, gen_s, gen_tokens, metrics


def reference_kl(run: Any, view: CreditView, old_logprobs: torch.Tensor, token_rewards: torch.Tensor,
                 group: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """The reference's log-probs of the rows (rl.beta > 0, else None), and the token rewards minus
    rl.beta * KL(behaviour || reference) on sampled tokens when rl.kl_in = reward, with its metrics."""
    rl = run.cfg.rl
    if run.reference is None:
        return None, token_rewards, {}
    ref = run.reference.scored_logprobs(view.packed, temperature=rl.sampling.temperature,
                                        micro_batch_size=rl.micro_batch_size, group=group)
    if rl.kl_in != "reward":
        return ref, token_rewards, {}
    kl_tokens = kl_penalty(rl.kl_estimator, old_logprobs, ref) * view.sampled
    metrics = {"policy/kl_reward": (kl_tokens.sum() / view.sampled.sum().clamp(min=1)).item(),
               "policy/kl_clamped": float(kl_clamped(rl.kl_estimator, old_logprobs, ref, view.sampled))}
    return ref, token_rewards - rl.beta * kl_tokens, metrics


def truncation_mask(run: Any, view: CreditView) -> torch.Tensor:
    """`view.sampled` times each episode's loss weight for its termination reason (rl.mask_truncated: 0 masks all
    of an episode's rows); `view.sampled` itself when rl.mask_truncated is off."""
    rl = run.cfg.rl
    if not rl.mask_truncated:
        return view.sampled
    weight = rl.truncation_weights()
    ends = [view.episodes[i].last.termination or "stop" for i in view.owner.tolist()]
    return view.sampled * torch.tensor([weight[t] for t in ends], dtype=view.sampled.dtype,
                                       device=view.sampled.device)[:, None]


def assign_credit(run: Any, batch: Any) -> Credit | None:
    """Credit for the kept episodes of `batch` (`rl.rollouts.StepBatch`), None when none is left (see the module
    doc). The estimator and its options come from `run.specs.estimator`; its episode-view inputs (turn rewards,
    turn index, turn key) from the rows the turn-reward source returns."""
    if not batch.kept:
        return None
    spec = run.specs.estimator
    view, old_logprobs = training_view(run, batch.trained)
    scored, metrics = TURN_REWARD_SOURCES[spec.turn_rewards](view)
    device = view.packed.mask.device
    ep = {k: v.to(device) for k, v in episode_tensors(scored, view.packed.mask.shape[1]).items()}
    view = replace(view, sampled=view.packed.mask * ep["sampled"])  # 1 exactly on the tokens the policy sampled
    # every row its own episode (single completions): the estimators, losses and aggregations run as on rows
    episode = ep["episode"] if any(r.episode_id is not None for r in view.rows) else None
    order = ep["order"] if episode is not None else None
    token_rewards, group = reward_tensors(view.rows, view.outputs, view.sampled)
    ref_logprobs, token_rewards, kl_metrics = reference_kl(run, view, old_logprobs, token_rewards, group)
    inputs, gen_s, gen_tokens, input_metrics = provide_inputs(view)
    options = {**inputs, **{k: ep[k] for k in spec.inputs}, **spec.options}
    advantages = episode_advantages(spec.name, token_rewards=token_rewards, mask=view.sampled, group=group,
                                    episode=episode, order=order, **options)
    values = returns = None
    if run.critic is not None:
        values = options["values"]
        returns = run.critic.returns(token_rewards, view.sampled, group, values, episode=episode, order=order,
                                     **spec.options)
    return Credit(view.rows, view.outputs, view.owner, view.packed, old_logprobs, ref_logprobs, view.sampled,
                  episode, group, truncation_mask(run, view), advantages, values, returns,
                  {**kl_metrics, **metrics, **input_metrics},
                  gen_s, gen_tokens)
