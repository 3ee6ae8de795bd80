"""`rewardlab po`: preference optimization, offline from a pairs file (`rewardlab.po.train`) or online /
semi-online with a reward in the loop (`rewardlab.po.online`)."""

from __future__ import annotations

from typing import Any

import torch

from rewardlab.commands.common import announce_task, check_prompts, load_inputs, load_model, with_trained_task
from rewardlab.config import PoConfig, dump_config
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.po.data import load_preference_rows
from rewardlab.po.online import OnlineModels, train_online
from rewardlab.po.train import (REF_CACHE, LossSpec, OfflineData, cached_reference_logps, encode_pairs, loss_spec,
                                pairs_digest, reference_logps, train_offline)
from rewardlab.policy import Policy, load_policy
from rewardlab.rewards import build_reward, parse_rewards
from rewardlab.rm.fit import open_fit_run
from rewardlab.runs import RunDir, RunMode
from rewardlab.tasks import Task
from rewardlab.tasks import load as load_task
from rewardlab.threads import apply_threads
from rewardlab.trackers import open_trackers

#: Settings a resumed po run may change: checkpointing and the memory switches (they change the floats' rounding,
#: not the algorithm); an online run may also train longer. Any other change is refused.
RESUME_MAY_CHANGE = ("save_every", "keep_checkpoints", "po.micro_batch_size", "model.gradient_checkpointing",
                     "model.logprob_chunk_tokens")
ONLINE_RESUME_MAY_CHANGE = RESUME_MAY_CHANGE + ("po.steps",)


def run(cfg: PoConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """Check the loss settings (`rewardlab.po.train.loss_spec`, before anything loads), then train offline
    (`po.online` false: the pairs file `cfg.pairs`) or online (`po.online` true: pairs sampled from the task's
    training rows, labelled by `cfg.rewards` or the task's verifier).

    The run directory `cfg.out` (opened once the data and model load: "new" refuses a directory holding a run,
    "overwrite" replaces it, "resume" continues from its newest valid checkpoint and logs what the uninterrupted run
    logs) holds config.yaml, metrics.jsonl (module docs of `rewardlab.po.train` and `rewardlab.po.online`),
    checkpoints/step-K (the policy in HF format + trainer_state.pt), ref_logps.pt (offline: the reference's
    log-probs of every pair, computed once), samples.jsonl (online), plots/po.png and summary.json.

    Returns:
        the summary (`train_offline` / `train_online`), with skipped_pairs (offline).
    Raises:
        ValueError: one line naming the field: po.loss_type / po.loss_options / po.loss_weights / po.beta
            (`loss_spec`), po.ref_refresh with a reference-free loss, a bad pairs row (FILE:LINE), a prompt that
            does not fit the context window; `RunDirError`: as `RunDir.start`.
    """
    spec = loss_spec(cfg.po)
    if cfg.po.ref_refresh and not spec.reference:
        raise ValueError(f"po.ref_refresh: the loss {list(spec.names)} reads no reference model; drop the setting")
    apply_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    if cfg.po.online:
        return _online(cfg, spec, mode, show_progress)
    return _offline(cfg, spec, mode, show_progress)


def _reference(cfg: PoConfig, policy: Policy) -> Policy:
    """The starting model, frozen: the base with the adapter disabled under LoRA (no second copy), else a second
    load of model.path."""
    if policy.has_adapter:
        return policy.without_adapter()
    reference = load_policy(cfg.model.path, seed=cfg.seed, **{**cfg.model.policy_options(), "lora": None})
    reference.model.eval().requires_grad_(False)
    return reference


def _greedy_task(cfg: PoConfig) -> Task | None:
    """The task an offline run evaluates greedily on: the config's `task` when given, else the task its model was
    trained on (a rewardlab checkpoint's run, adopted as data only: `with_trained_task`); None when evaluation is off
    or no task is known."""
    if not cfg.po.eval_every:
        return None
    if "task" not in cfg.model_fields_set:
        cfg, info = with_trained_task(cfg)
        if info["trained_on"] is None:
            return None
    return load_task(cfg.task.spec, **cfg.task.options)


def _offline(cfg: PoConfig, spec: LossSpec, mode: RunMode, show_progress: bool) -> dict[str, Any]:
    rows, skipped = load_preference_rows(cfg.pairs, skip_invalid=cfg.skip_invalid)  # type: ignore[arg-type]
    eval_rows = load_preference_rows(cfg.eval_pairs, skip_invalid=cfg.skip_invalid)[0] if cfg.eval_pairs else []
    task = _greedy_task(cfg)
    policy = load_model(cfg)
    pairs, eval_pairs = encode_pairs(policy, rows), encode_pairs(policy, eval_rows)
    heldout = None
    if task is not None:
        held = heldout_rows(task, cfg.po.eval_every, cfg.po.eval_n, field="po.eval_every")
        heldout = HeldOutEval(held, task.reward, every=cfg.po.eval_every, last_step=0,  # fit says when
                              max_new_tokens=cfg.po.eval_max_new_tokens)
    with open_fit_run(cfg, mode=mode, may_change=RESUME_MAY_CHANGE) as (rundir, start_step, checkpoint, rng):
        ref = eval_ref = None
        if spec.reference:  # computed once, before the first step, and kept in the run directory
            reference: list[Policy] = []

            def compute(which: list) -> torch.Tensor:
                if not reference:
                    reference.append(_reference(cfg, policy))
                return reference_logps(reference[0], which, cfg.po.micro_batch_size)

            ref = cached_reference_logps(rundir, REF_CACHE, lambda: compute(pairs), pairs_digest(pairs))
            if eval_pairs:
                eval_ref = cached_reference_logps(rundir, "ref_logps_eval.pt", lambda: compute(eval_pairs),
                                                  pairs_digest(eval_pairs))
            reference.clear()  # a second copy of the model is not kept while training
        data = OfflineData(pairs, ref, eval_pairs, eval_ref, heldout)
        summary = train_offline(cfg, policy, data, spec, rundir, start=(start_step, checkpoint, rng),
                                show_progress=show_progress)
        summary["skipped_pairs"] = skipped
        rundir.write_summary(summary)
    return summary


def _online(cfg: PoConfig, spec: LossSpec, mode: RunMode, show_progress: bool) -> dict[str, Any]:
    p = cfg.po
    specs = parse_rewards(cfg.rewards, on_error=cfg.on_error) if cfg.rewards is not None else None  # before loading
    task, policy = load_inputs(cfg)
    assert policy is not None
    check_prompts(task, policy, max_new_tokens=p.max_new_tokens, key="po.max_new_tokens")
    reward = build_reward(specs if specs is not None else task.reward, on_error=cfg.on_error)
    held = heldout_rows(task, p.eval_every, p.eval_n, field="po.eval_every")
    heldout = HeldOutEval(held, task.reward, every=p.eval_every, last_step=p.steps,
                          max_new_tokens=p.eval_max_new_tokens) if held else None
    sampler = policy
    if p.sync_every != 1:  # a copy, synced every sync_every steps (never: the starting policy)
        sampler = load_policy(cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())
        sampler.load_trained_weights(policy.trained_weights())  # (its trainable parameters name what a sync copies)
    reference = None
    if spec.reference:
        never_synced = p.sync_every is None and sampler is not policy
        reference = sampler if p.ref_refresh or never_synced else _reference(cfg, policy)
    announce_task(task, show_progress)
    with RunDir.start(cfg.out, mode=mode) as rundir:
        checkpoint = None
        if mode == "resume":
            checkpoint = rundir.resume_training(dump_config(cfg), may_change=ONLINE_RESUME_MAY_CHANGE, steps=p.steps,
                                                steps_key="po.steps")
        else:
            rundir.write_config(dump_config(cfg))
        rundir.attach_trackers(open_trackers(cfg.report_to, rundir.path, run_name=cfg.out,
                                             config=cfg.model_dump(mode="json"),
                                             resume_step=checkpoint[0] if checkpoint else None))
        models = OnlineModels(policy, sampler, reference, reward, list(task.train))
        return train_online(cfg, models, spec, rundir, heldout=heldout, checkpoint=checkpoint,
                            show_progress=show_progress)
