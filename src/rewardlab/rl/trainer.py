"""The RL training loop (GRPO family), as CleanRL would write it: `train(cfg)` is `setup`, then per step

    batch = progress.prefetch.take(step)           # 1. rollouts and rewards (rl.rollouts), by policy step-1-lag
    stop_on_reward_errors(run, progress, batch, step)
    canary_step(run, step)                         #    hack canaries beside the batch, never trained on (rl.canaries)
    credit = assign_credit(run, batch)             # 2. token rewards (- beta * KL) -> advantages (rl.credit)
    stats = update(run, credit, step)              # 3. epochs x minibatches of the policy loss (rl.update)
    run.engine.publish(run.policy, version=step)   #    the weights step + 1 + lag samples with
    evals = run.heldout(run.policy)                # 4. held-out accuracy, every rl.eval.every steps
    probe(run, progress, step, say=warn)           #    the over-optimization monitor, every rl.monitor.every steps
    log_step(run, progress, batch, credit, stats)  # 5. metrics.jsonl, samples.jsonl (rl.logs)
    save_checkpoint(run, progress, step)           # 6. every save_every steps and at the end

- `setup(cfg, mode)` -> (`TrainRun`, `Progress`): the config resolved into specs (`rl.specs.resolve_specs`), the
  task, reward, policy, reference, critic, optimizer, schedule, prompt sampler, an environment task's environment
  and budgets, the rollout engine (`rl.engines`, rl.engine local or ray) with the policy's weights published, the
  held-out evaluation; the run directory opened and, on a resume, the newest valid checkpoint restored.
- `TrainRun` is what is fixed for the run; `Progress` is what changes: the step, the newest checkpoint, the rollouts
  generated and the batches prefetched (`rl.rollouts.Prefetch`, the one production path: lag rl.ray.max_staleness, 0
  for the synchronous loop), which a checkpoint saves.

A first Ctrl-C (SIGINT) or SIGTERM ends the run after the step it is in, with a checkpoint and the summary
(`Interrupted`); after a SIGTERM, within its grace period (`rewardlab.interrupt`).

The loop never branches on an algorithm name: estimators, losses, aggregations, KL estimators, curricula, group
filters, estimator inputs and turn-reward sources are looked up in their registries.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import RLConfig, TrainConfig, dump_config, renamed_keys
from rewardlab.envs.sampling import EpisodeSettings, close_env, load_episodes, turn_budget_warning
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.modeldir import check_model_dir
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy, load_policy
from rewardlab.progress import stage
from rewardlab.rewards import Reward, RewardError, build_reward
from rewardlab.rl.canaries import Canaries, canary_step, make_canaries
from rewardlab.rl.credit import assign_credit
from rewardlab.rl.critic import CRITIC_DIR, ValueModel
from rewardlab.rl.curricula import make_curriculum
from rewardlab.rl.engines import Engine, make_engine
from rewardlab.rl.logs import log_step
from rewardlab.rl.monitor import Monitor, make_monitor, parse_gold, probe, probe_rows
from rewardlab.rl.online_prm import ONLINE_PRM_DIR, make_online_prm
from rewardlab.rl.rollouts import Prefetch, StepBatch, reward_error_share
from rewardlab.rl.specs import TrainSpecs, resolve_specs
from rewardlab.rl.update import update
from rewardlab.runs import RunDir, RunMode, warn
from rewardlab.tasks import Task, check_prompt_lengths, check_task_for_policy, describe_task, load as load_task
from rewardlab.threads import apply_threads, freeze_heap
from rewardlab.trackers import open_trackers
from rewardlab.train_state import load_weights, restore_training_state, rng_state, save_state

#: Settings a resumed run may change (train longer, checkpoint differently, fit in less memory: the memory switches
#: change the floats' rounding, not the algorithm); any other change is refused.
RESUME_MAY_CHANGE = ("rl.steps", "save_every", "keep_checkpoints", "rl.micro_batch_size",
                     "model.gradient_checkpointing", "model.logprob_chunk_tokens", "rl.logging.log_completions",
                     "rl.logging.log_tokens", "rl.monitor.stop_on_alarm")
#: The metrics plotted to plots/train.png at the end of a run.
PLOTTED = ["reward/mean", "accuracy", "eval/accuracy", "policy/entropy", "rollout/len_mean", "monitor/proxy",
           "monitor/gold"]


@dataclass(frozen=True)
class TrainRun:
    """What is fixed for a run, built by `setup`.

    Attributes:
        cfg: the run's config. specs: its `rl` section resolved (`rl.specs.TrainSpecs`). task, reward: the task and
            its reward (or `cfg.rewards`). policy: the trained model.
        reference: the frozen KL reference (rl.beta > 0), else None: a second copy of the starting model, or with
            model.lora the policy's own base with its adapter disabled (`Policy.without_adapter`). critic: the value
            model (estimators that need values, e.g. gae), else None. optimizer, scheduler: the policy's AdamW and
            its learning-rate schedule. sampler: the prompt curriculum. rundir: the open run directory.
        episodes: an environment task's environment and budgets (`task.spec` env:NAME, the `env` section), else
            None (single completions).
        engine: where rollouts are generated and scored (`rewardlab.rl.engines`, rl.engine); its `version` is the
            last published policy version.
        heldout: the held-out evaluation (`rewardlab.evaluation.heldout`; never due with rl.eval.every 0).
        monitor: the over-optimization monitor (`rewardlab.rl.monitor`, rl.monitor), else None (off).
        canaries: the hack canaries (`rewardlab.rl.canaries`, rl.canaries), else None (off).
        online_prm: the process reward model trained beside the policy (`rewardlab.rl.online_prm`, rl.online_prm,
            e.g. PRIME's implicit PRM), else None.
    """

    cfg: TrainConfig
    specs: TrainSpecs
    task: Task
    reward: Reward
    policy: Policy
    reference: Policy | None
    critic: ValueModel | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    rundir: RunDir
    episodes: EpisodeSettings | None
    engine: Engine
    heldout: HeldOutEval
    monitor: Monitor | None = None
    canaries: Canaries | None = None
    online_prm: Any = None


@dataclass
class Progress:
    """What a run changes as it goes, and its checkpoints save.

    Attributes:
        start_step: the last step done before this process (0, or the resumed checkpoint's step).
        step: the step being run (1-based; start_step before the first).
        latest: (step, path) of the newest checkpoint, None before the first.
        generated_total: rollouts generated by the run so far, every step and filter round (an episode counts once;
            recounted from metrics.jsonl on a resume, `generated_before`).
        prefetch: the batches produced ahead of the steps that train them (`rl.rollouts.Prefetch`).
    """

    start_step: int
    step: int
    latest: tuple[int, Path] | None
    generated_total: int
    prefetch: Prefetch


def check_task_fits(task: Task, policy: Policy, rl: RLConfig) -> None:
    """The model can read the task (`tasks.check_task_for_policy`) and its prompts fit the context window with
    rl.sampling.max_new_tokens (`tasks.check_prompt_lengths`); prompts that rl.sampling.max_prompt_length cuts are
    counted in one warning. Raises the one-line ValueErrors of those checks."""
    check_task_for_policy(task, policy)
    note = check_prompt_lengths(task, policy, max_new_tokens=rl.sampling.max_new_tokens,
                                key="rl.sampling.max_new_tokens", max_prompt_length=rl.sampling.max_prompt_length,
                                prompt_key="rl.sampling.max_prompt_length")
    if note:
        warn(note)


def check_config(cfg: TrainConfig, mode: RunMode) -> TrainSpecs:
    """Everything about `cfg` that can be checked before the task or a model loads: the `rl` section resolved into
    specs with the parsed `rewards` tree (`rl.specs.resolve_specs`), rl.ray.address answering (engine ray), a local
    model path. Raises the one-line ValueError of the first problem."""
    specs = resolve_specs(cfg)
    if cfg.rl.engine == "ray" and cfg.rl.ray.address is not None:
        from rewardlab.rl.engines.ray_engine import check_reachable

        check_reachable(cfg.rl.ray.address)  # a cluster nothing answers at, refused before the task and model load
    if cfg.model.path != "tiny" and (mode != "resume" or cfg.rl.beta > 0 or cfg.model.lora is not None):
        # a bad path is refused before the run directory is created (a LoRA run resumes on its base, so needs it)
        check_model_dir(cfg.model.path, adapters=True)
    return specs


def load_task_and_reward(cfg: TrainConfig, specs: TrainSpecs) -> tuple[Task, Reward]:
    """The task and the reward the run trains on (the parsed `cfg.rewards`, `specs.rewards`, else the task's own).

    Raises:
        ValueError: one line: what loading them raises, rl.turn_rewards other than env on a single-turn task, or
            rl.step_separator on an environment task.
    """
    task = load_task(cfg.task.spec, **cfg.task.options)
    reward = build_reward(specs.rewards if specs.rewards is not None else task.reward, on_error=cfg.on_error)
    if task.env is None and cfg.rl.turn_rewards != "env":
        raise ValueError(f"rl.turn_rewards: {cfg.rl.turn_rewards!r} scores the turns of an episode, and "
                         f"{cfg.task.spec} is a single-turn task (use an environment task, task.spec env:NAME)")
    if task.env is not None and cfg.rl.online_prm is not None:
        raise ValueError(f"rl.online_prm: {cfg.task.spec} is an environment task, and the online PRM scores single "
                         "completions; unset it")
    if task.env is not None and cfg.rl.step_separator is not None:
        raise ValueError(f"rl.step_separator: {cfg.task.spec} is an environment task, whose episodes are not split "
                         "into reasoning steps (process rewards score single completions); unset it")
    return task, reward


def open_rundir(cfg: TrainConfig, mode: RunMode, task: Task, episodes: EpisodeSettings | None,
                policy: Policy | None) -> tuple[RunDir, tuple[int, Path] | None]:
    """Open the run directory: a new run writes config.yaml and says once what its settings will repeat or cut; a
    resume rolls the logs back to the newest valid checkpoint and returns it as (step, path)."""
    rl = cfg.rl
    rundir = RunDir.start(cfg.out, mode=mode)
    if mode == "resume":  # the newest valid checkpoint, logs rolled back to it; allowed changes to config.yaml
        try:
            return rundir, rundir.resume_training(dump_config(cfg), may_change=RESUME_MAY_CHANGE, steps=rl.steps,
                                                  steps_key="rl.steps", renamed=renamed_keys(type(cfg)))
        except BaseException:
            rundir.close()
            raise
    rundir.write_config(dump_config(cfg))
    if rl.prompts_per_step > len(task.train):  # said once, when the run starts (a resume keeps the setting)
        warn(f"rl.prompts_per_step={rl.prompts_per_step} is more than the {len(task.train)} training rows of "
             f"{cfg.task.spec}: every step repeats prompts (each row about "
             f"{rl.prompts_per_step / len(task.train):.1f} times, as more groups of the same prompt)")
    short = turn_budget_warning(episodes, policy, rl.sampling.max_new_tokens, key="rl.sampling.max_new_tokens")
    if short is not None:  # the environment's own turns would be cut: said once, when the run starts
        warn(short)
    return rundir, None


def build_models(cfg: TrainConfig, specs: TrainSpecs, task: Task, policy: Policy | None,
                 latest: tuple[int, Path] | None) -> tuple[Policy, Policy | None, ValueModel | None]:
    """The policy (from the resumed checkpoint's weights, or `policy` for a new run), the KL reference (rl.beta > 0)
    and the value model (an estimator input `values` the trainer provides)."""
    rl, model_kw = cfg.rl, {"seed": cfg.seed, **cfg.model.policy_options()}
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
    critic = None
    if "values" in specs.estimator.provided:
        critic = ValueModel(policy, lr=rl.critic_lr, value_clip=rl.value_clip, weight_decay=rl.weight_decay,
                            path=latest[1] / CRITIC_DIR if latest else None)
    return policy, reference, critic


def setup(cfg: TrainConfig, *, mode: RunMode = "new") -> tuple[TrainRun, Progress]:
    """Check `cfg` (`check_config`), load the task, reward and models, check that the model can read the task and
    that its prompts fit the context window (`check_task_fits`), open the run directory and, with "resume", restore
    the newest valid checkpoint (weights, optimizer, schedule, sampler, RNG state, critic, refreshed reference and
    the batches prefetched).

    The model is loaded before the directory is touched (an overwrite deletes the old run); the RNGs are seeded
    with `cfg.seed` after every model is built, then a resume restores their saved state. What was opened is closed
    again when a later part of the set-up fails.

    Raises:
        see `train`.
    """
    specs = check_config(cfg, mode)
    gold = parse_gold(cfg)
    threads = apply_threads(cfg.threads)
    task, reward = load_task_and_reward(cfg, specs)
    canaries = make_canaries(cfg, task)  # its generator checked on a row before the run directory is touched
    policy = None
    if mode != "resume":
        policy = load_policy(cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())
        check_task_fits(task, policy, cfg.rl)  # before the run directory is touched
    # the environment and the env section's budgets, its keys checked against the environment (and the model's
    # tokenizer, known here unless resuming), the held-out rows and the rollout engine (rl.engine ray: its workers)
    episodes = load_episodes(task, cfg.env, policy)
    heldout = heldout_rows(task, cfg.rl.eval.every, cfg.rl.eval.n, field="rl.eval.every")
    probes = probe_rows(cfg, task)  # the monitor's (rl.monitor), checked after the evaluation's
    engine = make_engine(cfg, episodes=episodes, reward=reward, threads=threads, task=task)
    rundir = None
    try:
        rundir, latest = open_rundir(cfg, mode, task, episodes, policy)
        rundir.attach_trackers(open_trackers(cfg.report_to, rundir.path, run_name=cfg.out,
                                             config=cfg.model_dump(mode="json"),
                                             resume_step=latest[0] if latest is not None else None))
        policy, reference, critic = build_models(cfg, specs, task, policy, latest)
        monitor = make_monitor(cfg, probes, task, reward, gold, policy, reference)
        online_prm = make_online_prm(cfg, reference, latest)  # a model built before the RNGs are seeded
        optimizer = make_optimizer(policy.model, cfg.rl.lr, cfg.rl.weight_decay)
        scheduler = make_scheduler(optimizer, warmup_steps=cfg.rl.warmup_steps, total_steps=cfg.rl.steps,
                                   kind=cfg.rl.lr_schedule)
        sampler = make_curriculum(cfg.rl.filtering.curriculum, task.train, seed=cfg.seed,
                                  **cfg.rl.filtering.curriculum_options)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        saved = restore_state(latest, optimizer, scheduler, sampler, critic, reference)
        if monitor is not None:
            monitor.load_state_dict(saved.get("monitor"))
        if online_prm is not None and latest is not None:
            online_prm.load_state_dict(saved["online_prm"])
        start = saved.get("step", 0)
        engine.publish(policy, version=start)  # the weights step start + 1 samples with
        evaluation = HeldOutEval(heldout, task.reward, every=cfg.rl.eval.every, last_step=cfg.rl.steps,
                                 max_new_tokens=cfg.rl.sampling.max_new_tokens, episodes=episodes,
                                 max_prompt_length=cfg.rl.sampling.max_prompt_length)
        run = TrainRun(cfg, specs, task, reward, policy, reference, critic, optimizer, scheduler, sampler, rundir,
                       episodes, engine, evaluation, monitor, canaries, online_prm)
        progress = Progress(start, start, latest, generated_before(rundir, start),
                            Prefetch(run, start, saved.get("prefetch")))
    except BaseException:
        if rundir is not None:
            rundir.close()
        close_env(episodes)
        engine.close()
        raise
    policy.model.train()
    return run, progress


def restore_state(latest: tuple[int, Path] | None, optimizer: torch.optim.Optimizer, scheduler: Any, sampler: Any,
                  critic: ValueModel | None, reference: Policy | None) -> dict[str, Any]:
    """The resumed checkpoint's trainer_state.pt (`train_state.restore_training_state`: optimizer, schedule, prompt
    sampler and RNG state restored), with the critic's optimizer and a refreshed reference loaded; {} for a new run
    (`latest` None). The weights were loaded when the models were built."""
    if latest is None:
        return {}
    saved = restore_training_state(latest[1], optimizer, scheduler, sampler=sampler)
    if critic is not None:
        critic.optimizer.load_state_dict(saved["critic_optimizer"])
    if reference is not None and saved.get("reference") is not None:
        reference.model.load_state_dict(saved["reference"])
    return saved


def save_checkpoint(run: TrainRun, progress: Progress, step: int) -> Path:
    """Checkpoint step `step` (weights, trainer_state.pt, the critic, the online PRM) atomically; records it as
    `progress.latest`.
    trainer_state.pt holds the batches prefetched for later steps (`Prefetch.state_dict`, after waiting for the one
    in production), so a resume trains what the uninterrupted run trains.

    Raises:
        OSError: the checkpoint could not be written (the message names it and the intact previous one).
    """
    refreshed = run.reference is not None and run.cfg.rl.ref_refresh_every is not None
    # first: waits for the batches in production, whose prompts the sampler's state has already drawn
    prefetched = progress.prefetch.state_dict()

    def write(tmp: Path) -> None:
        run.policy.save(tmp)
        save_state(tmp, {"step": step, "prefetch": prefetched, "optimizer": run.optimizer.state_dict(),
                         "scheduler": run.scheduler.state_dict(), "sampler": run.sampler.state_dict(),
                         "rng": rng_state(), "reference": run.reference.model.state_dict() if refreshed else None,
                         "critic_optimizer": run.critic.optimizer.state_dict() if run.critic else None,
                         "monitor": run.monitor.state_dict() if run.monitor is not None else None,
                         "online_prm": run.online_prm.state_dict() if run.online_prm is not None else None})
        if run.critic is not None:
            run.critic.save(tmp / CRITIC_DIR)
        if run.online_prm is not None:
            run.online_prm.save(tmp / ONLINE_PRM_DIR)

    path = run.rundir.save_checkpoint(step, write, keep=run.cfg.keep_checkpoints)
    progress.latest = (step, path)
    return path


def stop_on_reward_errors(run: TrainRun, progress: Progress, batch: StepBatch, step: int) -> None:
    """Stop the run when at least rl.max_reward_error_frac of step `step`'s scored episodes (every round) have a
    reward error: a reward that fails that often (a wrong option, a crashing checker) would otherwise train on zeros
    for the rest of the run. Synchronously (lag 0), the batch is put back (`Prefetch.rewind`: the prompt sampler and
    the RNGs as at the end of the step before), that step is checkpointed unless it is the newest checkpoint, so a
    fixed reward goes on with --resume from exactly where the run was; with a lag (later batches drawn already)
    nothing is put back and the error names the newest checkpoint. A `reward_errors` event is logged either way.

    Raises:
        RewardError: one line naming the step, the fraction and the limit, the first cause and the checkpoint.
    """
    limit = run.cfg.rl.max_reward_error_frac
    share = reward_error_share(batch, limit)
    if share is None:
        return
    failed, scored, first = share
    if progress.prefetch.rewind(step, batch):
        if progress.latest is None or progress.latest[0] != step - 1:
            save_checkpoint(run, progress, step - 1)
        stopped = (f"Stopped after checkpoint {progress.latest[1]} (step {step - 1}): fix the reward and rerun with "
                   "--resume")
    else:
        stopped = f"Stopped; the newest checkpoint is {progress.latest[1] if progress.latest else '(none)'}"
    run.rundir.log_event("reward_errors", step=step, failed=failed, rollouts=scored, limit=limit, first=first,
                         checkpoint=progress.latest[1].name if progress.latest else None)
    raise RewardError(f"rl.max_reward_error_frac: {failed} of {scored} rollouts of step {step} "
                      f"({failed / scored:.0%}) have a reward error, the limit is {limit:g}; first: {first}. {stopped}")


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
    With `rl.eval.every`, the policy is evaluated greedily on held-out questions every that many steps and at the
    last (`rewardlab.evaluation.heldout`; eval/accuracy in metrics.jsonl and plots/train.png). The
    over-optimization monitor (`rewardlab.rl.monitor`) probes at rl.monitor.every (default: the evaluation's cadence)
    and, with rl.monitor.stop_on_alarm, ends the run at its first alarm without checkpointing that step (summary
    `stop_reason` "monitor_alarm"); with rl.canaries.fraction, hack canaries are sampled beside each step's batch
    and never trained on (`rewardlab.rl.canaries`). Neither changes what the run trains. A first Ctrl-C
    (SIGINT) or SIGTERM (main thread only) ends the run after the step it is in: a checkpoint of that step and the
    summary (`interrupted: true`) are written and `Interrupted` is raised; a second one raises KeyboardInterrupt at
    once. After a SIGTERM the process exits within the grace period whatever happens (`rewardlab.interrupt`). The
    SIGINT and SIGTERM handlers in place before the call are restored.
    With rl.ray.max_staleness = k (engine ray), step s trains on the batch of step s sampled by policy version
    max(0, s - 1 - k), generated while the learner runs the steps before it (`rl.rollouts.Prefetch`); checkpoints hold the
    batches prefetched, so a resume stays exact, and the summary's `async` counts every finished rollout as trained,
    filtered or in flight.

    Returns:
        the summary (also written to summary.json); `final_checkpoint` is the last checkpoint this run saved (or
        resumed from).
    Raises:
        ValueError: unknown algorithm or reward names; an rl.ray.address nothing answers at (engine ray,
            `ray_engine.check_reachable`, within seconds); a task the model cannot read (`tasks.check_task_for_policy`:
            characters outside its vocabulary, chat rows without a chat template); a prompt that does not fit the
            model's context window with rl.sampling.max_new_tokens, named by its FILE:LINE
            (`tasks.check_prompt_lengths`; rl.sampling.max_prompt_length cuts long prompts instead); RunDirError (a
            ValueError): `cfg.out` holds a run and `mode` is "new", is in use by another process, "resume" with other
            settings, or "resume" finds no valid checkpoint.
        OSError: a checkpoint could not be written (the message names it and the intact previous one).
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C or SIGTERM after a step; names the step, its
            checkpoint and the `--resume` command.
        RewardError: rl.max_reward_error_frac of a step's rollouts had a reward error (after a checkpoint of the
            step before; see `stop_on_reward_errors`), or a reward failed with on_error=raise.
    """
    run, progress = setup(cfg, mode=mode)
    rl, prefetch = cfg.rl, progress.prefetch
    freeze_heap()  # the set-up's objects out of the cycle collector's full passes, until the run ends
    if show_progress:
        print(f"rewardlab: {describe_task(run.task)}", file=sys.stderr, flush=True)
    try:
        wall0, last, out_of_time, alarm_stop = time.perf_counter(), {}, False, False
        with StopRequest() as stop:  # a first Ctrl-C or SIGTERM ends the run after the current step
            with stage(rl.estimator.upper(), rl.steps, enabled=show_progress) as bar:
                bar.advance(progress.start_step)
                for step in range(progress.start_step + 1, rl.steps + 1):
                    t0 = time.perf_counter()
                    progress.step = step
                    batch = prefetch.take(step)  # 1. rollouts, rewards, group filter (sampled by step-1-lag)
                    stop_on_reward_errors(run, progress, batch, step)
                    canaries = canary_step(run, step)  # rl.canaries, sampled and scored beside the batch
                    credit = assign_credit(run, batch)  # 2. token rewards (- beta * KL) -> advantages
                    stats = update(run, credit, step)  # 3. epochs x minibatches of the policy (and critic) loss
                    run.engine.publish(run.policy, version=step)  # the weights step + 1 + lag samples with
                    stats.update(prefetch.counts(step))
                    timing = {"step_s": time.perf_counter() - t0}
                    out_of_time = time_budget_s is not None and time.perf_counter() - wall0 >= time_budget_s
                    evals = run.heldout(run.policy) if run.heldout.due(step, last=out_of_time) else None  # 4.
                    probed, alarm = probe(run, progress, step, say=warn, last=out_of_time)  # rl.monitor
                    alarm_stop = alarm and rl.monitor.stop_on_alarm  # the newest checkpoint: the last before it
                    timing["elapsed_s"] = time.perf_counter() - wall0
                    last = log_step(run, progress, batch, credit, stats, timing=timing,  # 5. log
                                    evals={**(evals or {}), **probed, **canaries})
                    bar.advance(1, reward=last["reward/mean"], acc=last["accuracy"])
                    if not alarm_stop and (step % cfg.save_every == 0 or step == rl.steps or out_of_time
                                           or stop.requested):
                        save_checkpoint(run, progress, step)  # 6.
                    if out_of_time or stop.requested or alarm_stop:
                        break
                    if prefetch.lag:
                        prefetch.submit()  # batch step + 1 + lag, on version step, while the next steps run
            interrupted = stop.requested and progress.step < rl.steps and not out_of_time and not alarm_stop
            summary = write_summary(run, progress, last, wall_s=time.perf_counter() - wall0,
                                    resumed=mode == "resume", interrupted=interrupted, alarm_stop=alarm_stop)
        if alarm_stop and show_progress:
            checkpoint = progress.latest[1] if progress.latest else "(none: no checkpoint before the alarm)"
            print(f"rewardlab: stopped by the over-optimization alarm at step {progress.step} "
                  f"(rl.monitor.stop_on_alarm); the newest checkpoint is {checkpoint}", file=sys.stderr, flush=True)
        if interrupted:
            raise Interrupted("train", cfg.out, progress.step, progress.latest[1], signum=stop.signum)
        return summary
    finally:
        close(run, progress)


def write_summary(run: TrainRun, progress: Progress, last: dict[str, float], *, wall_s: float, resumed: bool,
                  interrupted: bool, alarm_stop: bool = False) -> dict[str, Any]:
    """Plot the run's curves (plots/train.png) and write summary.json; returns the summary. `final_checkpoint` is
    the last checkpoint this run saved (or resumed from); `async` counts every finished rollout as trained,
    filtered or in flight. With the monitor on, `monitor` holds the steps whose probe raised the alarm, and
    `stop_reason` is "monitor_alarm" when rl.monitor.stop_on_alarm ended the run (`alarm_stop`)."""
    rl = run.cfg.rl
    run.rundir.plot(PLOTTED, "train.png")
    summary = {
        "stage": "train",
        "estimator": rl.estimator,
        "loss": rl.loss,
        "steps": rl.steps,
        "steps_done": progress.step,
        "resumed_from": progress.start_step if resumed else None,
        "interrupted": interrupted,
        "wall_s": wall_s,
        "final_metrics": last or (run.rundir.read_metrics() or [{}])[-1],
        "final_checkpoint": str(progress.latest[1]) if progress.latest else None,
        "async": progress.prefetch.counts(float("inf")),  # every finished rollout: trained, filtered or in flight
    }
    if run.monitor is not None:
        summary["monitor"] = {"alarms": list(run.monitor.alarms), "probes": len(run.monitor.history)}
    if alarm_stop:
        summary["stop_reason"] = "monitor_alarm"
    run.rundir.write_summary(summary)
    return summary


def close(run: TrainRun, progress: Progress) -> None:
    """Release what the run holds: the batch in production, the run directory's lock, the environment's tool
    workers, the engine's workers; what the run froze is the collector's again (a caller's process goes on)."""
    try:
        progress.prefetch.close()
    finally:
        run.rundir.close()
        close_env(run.episodes)
        run.engine.close()
        gc.unfreeze()


def generated_before(run: RunDir, step: int) -> int:
    """Rollouts generated by steps 1..`step` of the run in `run`: the sum of `rollout/generated` over its
    metrics.jsonl lines up to that step (each step counted once; 0 for a line without it)."""
    per_step = {r["step"]: r.get("rollout/generated", 0) for r in run.read_metrics() if 0 < r.get("step", 0) <= step}
    return int(sum(per_step.values()))
