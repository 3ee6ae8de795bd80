"""Multi-turn environments and tools, with token-exact episodes (see docs/agents.md once written).

Public API (being built in steps): `Environment`, `StepResult` here; `MultiTurnEnv`, `ToolEnv`, `ENVIRONMENTS`,
`run_episodes` and `replay` as they land.
"""

from rewardlab.envs.base import Environment, State, StepResult
from rewardlab.envs.episode import Episode, EpisodeLimits, run_episodes
from rewardlab.envs.replay import episode_record, replay

__all__ = ["Environment", "State", "StepResult", "Episode", "EpisodeLimits", "run_episodes", "episode_record",
           "replay"]
