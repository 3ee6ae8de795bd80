"""`rewardlab train`: RL training of a policy against rewards (the GRPO family; `rewardlab.rl.trainer`)."""

from __future__ import annotations

from typing import Any

from rewardlab.config import TrainConfig
from rewardlab.rl.trainer import train
from rewardlab.runs import RunMode


def run(cfg: TrainConfig, *, mode: RunMode = "new", show_progress: bool = True) -> dict[str, Any]:
    """`rewardlab.rl.trainer.train(cfg, ...)`: its set-up opens the run directory itself, because a resume loads the
    policy from the run's checkpoint (see `rewardlab.rl.trainer.setup`).

    Returns:
        the training summary (see `train`).
    Raises:
        what `train` raises.
    """
    return train(cfg, mode=mode, show_progress=show_progress)
