"""`rewardlab sft`: supervised warm start on a task's training rows."""

from __future__ import annotations

from typing import Any

from rewardlab.commands.common import announce_task, load_inputs
from rewardlab.config import SFTConfig
from rewardlab.evaluation.heldout import heldout_rows
from rewardlab.runs import RunDir
from rewardlab.sft import check_target, train_sft


def refuse_environment_task(spec: str) -> None:
    """SFT on an environment task needs multi-turn traces (each row's transcript, trained with a loss mask on the
    assistant turns only), and environment rows have none yet: `spec` env:NAME is a one-line ValueError naming
    task.spec, raised before anything loads or is written."""
    if spec.startswith("env:"):
        raise ValueError(f"task.spec: sft cannot train on {spec!r} yet: environment rows hold no multi-turn traces "
                         "(a transcript per row, trained on its assistant turns only); train (RL) and evaluate run "
                         "environment tasks")


def run(cfg: SFTConfig, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """Load `cfg.task` and `cfg.model`, open `cfg.out` (`RunDir.start`: a new run needs an empty or missing
    directory; `overwrite` replaces the run there; `resume` continues it from its newest valid checkpoint) and train
    with `rewardlab.sft.train_sft`, which documents what the run directory holds.

    Returns:
        the summary: final loss, steps, wall seconds, `final_checkpoint` path, `resumed_from` (step, or None).
    Raises:
        ValueError: an environment task (task.spec env:NAME; `refuse_environment_task`), a training row without the
            target field, or sft.eval_every with no held-out rows (before the
            directory is touched); `RunDirError` (a ValueError): the directory holds a run and neither `resume` nor
            `overwrite` is given, is in use, or has no valid checkpoint to resume; and what `tasks.load` and
            `load_policy` raise.
        Interrupted (a KeyboardInterrupt): stopped by a Ctrl-C after a step, with its checkpoint (`train_sft`).
    """
    refuse_environment_task(cfg.task.spec)
    task, policy = load_inputs(cfg)
    check_target(task, cfg.sft.target, cfg.task.spec)
    heldout_rows(task, cfg.sft.eval_every, cfg.sft.eval_n, field="sft.eval_every")  # eval_every needs held-out rows
    announce_task(task, show_progress)
    with RunDir.start(cfg.out, resume=resume, overwrite=overwrite) as run:  # only once the task and model load
        return train_sft(cfg, task, policy, run, resume=resume, show_progress=show_progress)
