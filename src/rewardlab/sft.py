"""Supervised warm start: next-token cross-entropy on the answer tokens of task rows (prompt tokens masked).

During training:
- with `sft.eval_every`, the policy is evaluated greedily on the first `sft.eval_n` held-out questions every that
  many steps and at the last (`rewardlab.evaluation.heldout`; completions up to the longest training target's
  tokens), logged as eval/accuracy and plotted in plots/sft_loss.png; a task without held-out rows is a ValueError
  naming sft.eval_every (`heldout_rows`, to be called before the run directory is opened);
- a first Ctrl-C (SIGINT) or SIGTERM (main thread only) ends the run after the step it is in: a checkpoint of that
  step and the summary (`interrupted: true`) are written and `rewardlab.interrupt.Interrupted` is raised; a second
  one raises KeyboardInterrupt at once; after a SIGTERM the process exits within its grace period whatever happens.
  The SIGINT and SIGTERM handlers in place before are restored.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import SFTConfig, dump_config
from rewardlab.envs.episode import EpisodeLimits
from rewardlab.evaluation.heldout import HeldOutEval, heldout_rows
from rewardlab.interrupt import Interrupted, StopRequest
from rewardlab.optim import make_optimizer, make_scheduler
from rewardlab.policy import Policy
from rewardlab.progress import stage
from rewardlab.runs import RunDir, warn
from rewardlab.tasks import Task, check_target_lengths, check_task_for_policy
from rewardlab.tasks.sampler import RowSampler
from rewardlab.threads import apply_threads
from rewardlab.trackers import open_trackers
from rewardlab.train_state import restore_training_state, rng_state, save_state
from rewardlab.types import ProgressBar


def sft_loss(policy: Policy, prompt_ids: list[list[int]], target_ids: list[list[int]],
             loss_masks: list[list[int] | None] | None = None, *,
             denominator: float | None = None) -> tuple[torch.Tensor, int]:
    """Mean negative log-likelihood per trained token (nats), and the number of trained tokens.

    loss = -sum_{i,t} m_{i,t} log p(y_{i,t} | x_i, y_{i,<t}) / sum m, where m = 1 on the target tokens (EOS
    included) and, for a row with a loss mask (a multi-turn trace, `rewardlab.envs.trace_rollouts`), m = its mask:
    1 on the assistant turns' tokens, 0 on observation and template tokens, which are conditioned on but never
    trained on (no gradient flows to their log-probs).

    Args:
        prompt_ids: per row, the prompt ids. target_ids: per row, the completion ids (length T_i).
        loss_masks: per row, None (every target token trained) or T_i ints in {0, 1}; None: all rows unmasked.
        denominator: divide by this instead of these rows' sum m: a micro-batch's share of its batch's mean is
            its sum divided by the whole batch's trained tokens (`trained_tokens`).
    Raises:
        ValueError: a loss mask whose length is not its row's target length.
    """
    batch = policy.collate(prompt_ids, target_ids)
    mask = batch.mask
    if loss_masks is not None and any(m is not None for m in loss_masks):
        given = torch.zeros_like(mask)
        for i, (m, t) in enumerate(zip(loss_masks, target_ids)):
            if m is None:
                given[i, :len(t)] = 1.0
                continue
            if len(m) != len(t):
                raise ValueError(f"sft_loss: row {i}'s loss mask has {len(m)} entries for {len(t)} target ids")
            given[i, :len(t)] = torch.tensor(m, dtype=mask.dtype)
        mask = mask * given
    logprobs, _ = policy.token_logprobs(batch)
    n_tokens = mask.sum()
    denom = n_tokens.clamp(min=1) if denominator is None else max(float(denominator), 1.0)
    return -(logprobs * mask).sum() / denom, int(n_tokens.item())


def trained_tokens(target_ids: list[int], loss_mask: list[int] | None) -> int:
    """The tokens of one row that `sft_loss` trains: its target's length, or the ones of its loss mask."""
    return len(target_ids) if loss_mask is None else int(sum(1 for m in loss_mask if m))


def sft_gradient(policy: Policy, rows: list[tuple[list[int], list[int], list[int] | None]],
                 micro_batch_size: int | None = None) -> tuple[float, int]:
    """Accumulate into the policy's .grad the gradient of `sft_loss` over `rows` (prompt ids, target ids, loss mask
    or None), `micro_batch_size` rows per forward/backward pass (None: all at once). Each micro-batch's summed
    negative log-likelihood is divided by the trained tokens of all `rows`, so the accumulated gradient is that of
    the batch's mean per token (not a mean of micro-batch means) up to float rounding.

    Returns:
        (the batch's loss in nats per trained token, its trained tokens).
    Raises:
        ValueError: as `sft_loss`; micro_batch_size < 1.
    """
    if micro_batch_size is not None and micro_batch_size < 1:
        raise ValueError(f"sft.micro_batch_size: must be >= 1, got {micro_batch_size}")
    total = sum(trained_tokens(t, m) for _, t, m in rows)
    size = micro_batch_size or max(len(rows), 1)
    value = 0.0
    for start in range(0, len(rows), size):
        part = rows[start:start + size]
        loss, _ = sft_loss(policy, [p for p, _, _ in part], [t for _, t, _ in part], [m for _, _, m in part],
                           denominator=total)
        loss.backward()
        value += loss.item()
    return value, total


def encode_rows(task: Task, policy: Policy, target: str, *, seed: int = 0, tool_frac: float | None = None,
                limits: EpisodeLimits | None = None, notes: list[str] | None = None
                ) -> list[tuple[list[int], list[int], list[int] | None]]:
    """The training rows of `task` as (prompt ids, target ids, loss mask or None).

    - A row with a `trace` (chat messages: prompt, assistant turns, observations) becomes the ids an episode holds
      after a model sampled those turns (`rewardlab.envs.trace_rollouts`, with the renderer, stop strings and tool
      rendering of the task's environment when it has one), its loss mask 1 on the assistant turns only: one
      item, or one per row where the chat template rewrites earlier turns (as the episode would be split).
    - On an environment task (`task.env` set), a row without a trace gets one from the environment's generator
      (`env.traces(rows, seed=seed, tool_frac=tool_frac)`, e.g. calculator: a tool-call trace or a direct answer;
      guess_number: binary search).
    - Any other row: prompt -> row[`target`] + EOS, every target token trained (mask None).

    With `limits` (an environment task's budgets: env.max_turns, env.max_episode_tokens, env.max_tool_tokens,
    env.tool_keep and the model's context window), each trace holds what an episode under those budgets holds
    (`trace_rollouts(limits=...)`): tool outputs clipped, cut where the episode would end (after turn max_turns,
    at the episode token budget, at the context window). One line counting the cut traces and naming the first is
    appended to `notes` (for the caller to print).

    Raises:
        ValueError: `tool_frac` given for a task whose rows get no generated traces, or for an environment that
            has no tool choice; an environment without a trace generator; a malformed trace (naming the row).
    """
    needs_traces = task.env is not None and any("trace" not in r for r in task.train)
    env, renderer, stop = _trace_renderer(task, policy)
    if tool_frac is not None and not needs_traces:
        raise ValueError(f"sft.tool_frac: applies to environment tasks whose rows get generated traces; task "
                         f"{task.name} has none")
    try:
        traces = _generated_traces(task, env, seed, tool_frac) if needs_traces else {}
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    from rewardlab.envs.trace import trace_rollouts

    out = []
    cut: list[tuple[int, str]] = []  # (training row, termination) of the traces the budgets cut
    for i, r in enumerate(task.train):
        trace = r.get("trace", traces.get(i))
        if trace is None:
            out.append((policy.encode_prompt(policy.format_prompt(r["prompt"], r.get("messages"))),
                        policy.encode_target(str(r[target])), None))
            continue
        rows = trace_rollouts(renderer, trace, eos_id=policy.tokenizer.eos_token_id, stop=stop,
                              where=f"sft: training row {i}", limits=limits)
        if rows[-1].termination not in ("stop", "env_done"):
            cut.append((i, str(rows[-1].termination)))
        out += [(ro.prompt_ids, ro.completion_ids, ro.loss_mask) for ro in rows]
    if cut and notes is not None and limits is not None:
        n_traces = sum(1 for i, r in enumerate(task.train) if "trace" in r or i in traces)
        notes.append(f"env: {len(cut)} of {n_traces} training traces of task {task.name} do not fit the episode "
                     f"budgets (env.max_turns={limits.max_turns}, env.max_episode_tokens={limits.max_episode_tokens}, "
                     f"context window {limits.context_window}); each is cut where its episode would end (first: "
                     f"training row {cut[0][0]}, {cut[0][1]})")
    return out


def _trace_renderer(task: Task, policy: Policy) -> tuple[Any, Any, list[str]]:
    """(the task's environment or None, the renderer its traces are encoded with, its stop strings); (None, None,
    []) for a task with neither an environment nor a row with a trace. The caller closes the environment."""
    env = renderer = None
    stop: list[str] = []
    if task.env is not None or any("trace" in r for r in task.train):
        from rewardlab.envs import make_env, make_renderer
        from rewardlab.envs.base import env_stop

        if task.env is not None:
            env = make_env(task.env["name"], **dict(task.env.get("options") or {}))
        renderer = make_renderer(policy.tokenizer, policy.prompt_format, tools=getattr(env, "tools", None),
                                 raw_text=getattr(env, "raw_text", None))
        stop = list(env_stop(env))
    return env, renderer, stop


def _generated_traces(task: Task, env: Any, seed: int, tool_frac: float | None) -> dict[int, list[dict]]:
    """Traces from `env`'s generator for the training rows without one, by row index.

    Raises:
        ValueError: an environment without a trace generator; `tool_frac` for one whose traces have no tool choice.
    """
    generate = getattr(env, "traces", None)
    if generate is None:
        raise ValueError(f"sft: environment {task.env['name']!r} has no trace generator; give each training "
                         "row a 'trace' (chat messages)")
    todo = [i for i, r in enumerate(task.train) if "trace" not in r]
    if tool_frac is not None and "tool_frac" not in inspect.signature(generate).parameters:
        raise ValueError(f"sft.tool_frac: environment {task.env['name']!r} has no tool choice in its "
                         "traces; unset it")
    options = {} if tool_frac is None else {"tool_frac": tool_frac}
    return dict(zip(todo, generate([task.train[i] for i in todo], seed=seed, **options)))


def check_target(task: Task, target: str, spec: str) -> None:
    """Every training row of `task` (loaded from `spec`) must have the field `target`, or a `trace`; an environment
    task's rows need neither (they train on traces, their own or generated: `encode_rows`).

    Raises:
        ValueError: "sft.target: training row I of SPEC has no field 'T'".
    """
    if task.env is not None:  # environment rows train on traces (their own or generated)
        return
    missing = next((i for i, r in enumerate(task.train) if target not in r and "trace" not in r), None)
    if missing is not None:
        raise ValueError(f"sft.target: training row {missing} of {spec} has no field {target!r}")


#: Settings a resumed run may change (train longer, checkpoint differently, fit in less memory: the memory switches
#: change the floats' rounding, not the algorithm); any other change is refused.
RESUME_MAY_CHANGE = ("sft.steps", "save_every", "keep_checkpoints", "sft.micro_batch_size",
                     "model.gradient_checkpointing", "model.logprob_chunk_tokens")


def train_sft(cfg: SFTConfig, task: Task, policy: Policy, run: RunDir, *, resume: bool = False,
              show_progress: bool = True) -> dict[str, Any]:
    """Train `policy` on `task`'s training rows (prompt -> row[`cfg.sft.target`] + EOS, the target field defaulting
    to `answer`; multi-turn traces, given or generated for an environment task, on their assistant turns only:
    `encode_rows`) for `cfg.sft.steps` steps, in the run directory `run` (opened by the caller with `RunDir.start`).

    Records the config (a resume checks it: only RESUME_MAY_CHANGE may differ) and writes metrics.jsonl (`sft/loss`,
    `lr`, `time/step_s`, `time/tokens_per_s`), checkpoints/step-K every `cfg.save_every` steps and at the end (HF
    format plus trainer_state.pt: optimizer, schedule, row sampler and RNG state; the `cfg.keep_checkpoints` most
    recent kept), plots/sft_loss.png and summary.json. With `resume`, training continues from the newest valid
    checkpoint, so step k+1 logs exactly (bit for bit) what the uninterrupted run logs.

    Returns:
        the summary: final loss, steps, wall seconds, `final_checkpoint` path, `resumed_from` (step, or None).
    Raises:
        ValueError: a training row without the target field; sft.eval_every > 0 with no held-out rows
            (`heldout_rows`); a row whose prompt + target does not fit the model's context window (FILE:LINE,
            `tasks.check_target_lengths`); `RunDirError` (a ValueError): a resume with other settings or no valid
            checkpoint.
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C or SIGTERM after a step (see the module docstring).
    """
    p = cfg.sft
    check_target(task, p.target, cfg.task.spec)
    check_task_for_policy(task, policy)  # characters the tokenizer cannot encode, chat rows without a template
    rows = heldout_rows(task, p.eval_every, p.eval_n, field="sft.eval_every")
    check_target_lengths(task, policy, target=p.target, eval_rows=rows)  # prompt + target within the context window
    apply_threads(cfg.threads)
    start_step, checkpoint = 0, None
    if resume:  # the newest valid checkpoint, logs rolled back to it; allowed changes written to config.yaml
        start_step, checkpoint = run.resume_training(dump_config(cfg), may_change=RESUME_MAY_CHANGE, steps=p.steps,
                                                     steps_key="sft.steps")
    else:
        run.write_config(dump_config(cfg))
    run.attach_trackers(open_trackers(cfg.report_to, run.path, run_name=cfg.out, config=cfg.model_dump(mode="json"),
                                      resume_step=start_step if resume else None))
    training = _SFTTraining.create(cfg, task, policy, run)
    if checkpoint is not None:
        state = restore_training_state(checkpoint, training.optimizer, training.scheduler, model=policy.model,
                                       sampler=training.sampler)
        training.loss = state["loss"]
    heldout = HeldOutEval(rows, task.reward, every=p.eval_every, last_step=p.steps,
                          max_new_tokens=max((len(t) for _, t, _ in training.encoded), default=1))
    policy.model.train()
    start = time.perf_counter()
    with StopRequest() as stop:  # a first Ctrl-C or SIGTERM ends the run after the current step
        with stage("SFT", p.steps, enabled=show_progress) as bar:
            bar.advance(start_step)
            step, saved = training.run_steps(start_step, heldout, stop, bar)
        final = saved if saved is not None else checkpoint
        if final is None:  # sft.steps=0: the initial model is the result
            final = training.save(0)
        run.plot(["sft/loss", "eval/accuracy"], "sft_loss.png")
        interrupted = stop.requested and step < p.steps
        summary = {"stage": "sft", "steps": p.steps, "final_loss": training.loss,
                   "wall_s": time.perf_counter() - start, "train_rows": len(task.train), "final_checkpoint": str(final),
                   "resumed_from": start_step if resume else None, "steps_done": step, "interrupted": interrupted}
        run.write_summary(summary)
    if interrupted:
        raise Interrupted("sft", cfg.out, step, final, signum=stop.signum)
    return summary


def _env_limits(cfg: SFTConfig, task: Task, policy: Policy) -> EpisodeLimits | None:
    """The episode budgets an environment task's traces are cut to (`encode_rows`); None for other tasks."""
    if task.env is None:
        return None
    return EpisodeLimits(max_turns=cfg.env.max_turns, max_new_tokens=cfg.env.max_episode_tokens,
                         max_episode_tokens=cfg.env.max_episode_tokens, context_window=policy.context_window,
                         max_tool_tokens=cfg.env.max_tool_tokens, tool_keep=cfg.env.tool_keep)


@dataclasses.dataclass
class _SFTTraining:
    """What an SFT run trains with: the encoded rows (`encode_rows`), the row sampler, AdamW with warm-up and a
    cosine schedule, the loss of the last step (nats per trained token; nan before the first), and what a
    checkpoint saves them into."""

    cfg: SFTConfig
    policy: Policy
    run: RunDir
    encoded: list[tuple[list[int], list[int], list[int] | None]]
    sampler: RowSampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    loss: float = float("nan")

    @classmethod
    def create(cls, cfg: SFTConfig, task: Task, policy: Policy, run: RunDir) -> _SFTTraining:
        """Encode `task`'s training rows (the notes about cut traces printed as warnings) and build the sampler,
        optimizer and schedule."""
        p, notes = cfg.sft, []
        encoded = encode_rows(task, policy, p.target, seed=cfg.seed, tool_frac=p.tool_frac,
                              limits=_env_limits(cfg, task, policy), notes=notes)
        for note in notes:
            warn(note)
        sampler = RowSampler(list(range(len(encoded))), seed=cfg.seed)  # type: ignore[arg-type]
        optimizer = make_optimizer(policy.model, p.lr, p.weight_decay)
        scheduler = make_scheduler(optimizer, warmup_steps=p.warmup_steps, total_steps=p.steps, kind="cosine")
        return cls(cfg, policy, run, encoded, sampler, optimizer, scheduler)

    def step(self) -> int:
        """One optimizer step on the sampler's next `sft.batch_size` rows (gradient clipped to `sft.grad_clip`);
        sets `loss`, returns the step's trained tokens."""
        p = self.cfg.sft
        idx = self.sampler.next(p.batch_size)
        self.optimizer.zero_grad(set_to_none=True)
        self.loss, n_tokens = sft_gradient(self.policy, [self.encoded[i] for i in idx], p.micro_batch_size)
        torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), p.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return n_tokens

    def run_steps(self, start_step: int, heldout: HeldOutEval, stop: StopRequest,
                  bar: ProgressBar) -> tuple[int, Path | None]:
        """Steps start_step+1 .. sft.steps, each logged (and evaluated when `heldout` is due) and checkpointed every
        `save_every` steps, at the last and when `stop` is requested (the loop then ends). Returns (the last step
        run, or `start_step` when none; the last checkpoint saved, or None)."""
        p, step, saved = self.cfg.sft, start_step, None
        for step in range(start_step + 1, p.steps + 1):
            t0 = time.perf_counter()
            n_tokens = self.step()
            dt = time.perf_counter() - t0
            evals = heldout(self.policy) if heldout.due(step) else {}
            self.run.log_metrics(step, {"sft/loss": self.loss, "lr": self.scheduler.get_last_lr()[0],
                                        "time/step_s": dt, "time/tokens_per_s": n_tokens / dt, **evals})
            bar.advance(1, loss=self.loss)
            if step % self.cfg.save_every == 0 or step == p.steps or stop.requested:
                saved = self.save(step)
            if stop.requested:
                break
        return step, saved

    def save(self, step: int) -> Path:
        """Checkpoint step-`step`: the policy and trainer_state.pt (optimizer, schedule, sampler, RNG states, loss)."""

        def write(tmp: Path) -> None:
            self.policy.save(tmp)
            save_state(tmp, {"step": step, "optimizer": self.optimizer.state_dict(),
                             "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                             "rng": rng_state(), "loss": self.loss})

        return self.run.save_checkpoint(step, write, keep=self.cfg.keep_checkpoints)
