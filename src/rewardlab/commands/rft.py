"""`rewardlab rft`: rejection-sampling fine-tuning (STaR / RAFT / RAFT++) on a task's training prompts."""

from __future__ import annotations

from typing import Any

from rewardlab.commands.common import announce_task, check_prompts, load_inputs
from rewardlab.config import RftConfig
from rewardlab.evaluation.heldout import heldout_rows
from rewardlab.po.rft import train_rft
from rewardlab.rewards import build_reward, parse_rewards
from rewardlab.runs import RunDir, RunMode


def run(cfg: RftConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """Load `cfg.task`, `cfg.model` and the reward (`cfg.rewards`, parsed with `cfg.on_error`; default the task's
    own verifier), check that every prompt leaves room for rft.max_new_tokens in the model's context window, open
    `cfg.out` (`RunDir.start`: a new run needs an empty or missing directory; "overwrite" replaces the run there;
    "resume" continues it from its newest valid checkpoint) and train with `rewardlab.po.rft.train_rft`, which
    documents what the run directory holds.

    Returns:
        the summary (`train_rft`).
    Raises:
        ValueError: a bad reward spec, rft.eval_every with no held-out rows, a prompt that does not fit the context
            window with rft.max_new_tokens (FILE:LINE) — all before the directory is touched; `RunDirError` (a
            ValueError): the directory holds a run and `mode` is "new", is in use, or has no valid checkpoint to
            resume; and what `tasks.load` and `load_policy` raise.
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C or SIGTERM after a round, with its checkpoint.
    """
    specs = parse_rewards(cfg.rewards, on_error=cfg.on_error) if cfg.rewards is not None else None
    task, policy = load_inputs(cfg)
    heldout_rows(task, cfg.rft.eval_every, cfg.rft.eval_n, field="rft.eval_every")  # needs held-out rows
    check_prompts(task, policy, max_new_tokens=cfg.rft.max_new_tokens, key="rft.max_new_tokens")
    reward = build_reward(specs if specs is not None else task.reward, on_error=cfg.on_error)
    announce_task(task, show_progress)
    with RunDir.start(cfg.out, mode=mode) as run:  # only once the task, model and reward load
        return train_rft(cfg, task, reward, policy, run, resume=mode == "resume", show_progress=show_progress)
