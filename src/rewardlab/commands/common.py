"""What every verb needs: its inputs loaded from the config, and its run directory opened."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rewardlab.config import dump_config
from rewardlab.policy import Policy, load_policy
from rewardlab.runs import RunDir
from rewardlab.tasks import Task
from rewardlab.tasks import load as load_task


def load_model(cfg: Any, path: str | None = None) -> Policy:
    """The policy that `cfg.model` names (or the model at `path`, with `cfg.model`'s other settings), seeded with
    `cfg.seed`.

    Raises:
        what `rewardlab.policy.load_policy` raises (a bad model directory: one line naming it).
    """
    return load_policy(path or cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())


def load_inputs(cfg: Any, *, model: bool = True) -> tuple[Task, Policy | None]:
    """Seed torch with `cfg.seed`, then load `cfg.task` and (with `model`) the policy `cfg.model` names.

    Raises:
        what `rewardlab.tasks.load` and `load_model` raise (one line naming the bad field, file or line).
    """
    torch.manual_seed(cfg.seed)
    task = load_task(cfg.task.spec, **cfg.task.options)
    return task, (load_model(cfg) if model else None)


def open_run(cfg: Any, *, resume: bool = False, overwrite: bool = False, may_change: Iterable[str] = ()) -> RunDir:
    """Open `cfg.out` with `RunDir.start` and record `cfg` in its config.yaml (a resume checks it instead: only the
    dotted keys in `may_change` may differ). Call it once the inputs load, so that bad input creates or deletes
    nothing. Use the result as a context manager; it is closed again if recording the config fails.

    Raises:
        RunDirError (a ValueError): `cfg.out` holds a run and neither flag is given, is in use, or `resume` with
            other settings.
    """
    run = RunDir.start(cfg.out, resume=resume, overwrite=overwrite)
    try:
        run.record_config(dump_config(cfg), resume=resume, may_change=may_change)
    except BaseException:
        run.close()
        raise
    return run
