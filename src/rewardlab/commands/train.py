"""`rewardlab train`: RL training of a policy against rewards (the GRPO family; `rewardlab.rl.trainer`)."""

from __future__ import annotations

from typing import Any

from rewardlab.config import TrainConfig
from rewardlab.rl.trainer import train


def run(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab.rl.trainer.train(cfg, ...)`: its set-up opens the run directory itself, because a resume loads the
    policy from the run's checkpoint (see `rewardlab.rl.trainer.setup`).

    Returns:
        the training summary (see `train`).
    Raises:
        what `train` raises.
    """
    return train(cfg, resume=resume, overwrite=overwrite, show_progress=show_progress)
