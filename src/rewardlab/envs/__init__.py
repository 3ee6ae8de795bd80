"""Multi-turn environments and tools, with token-exact episodes (see docs/agents.md once written).

Public API (being built in steps): `Environment`, `StepResult` here; `MultiTurnEnv`, `ToolEnv`, `ENVIRONMENTS`,
`run_episodes` and `replay` as they land.
"""

from rewardlab.envs.base import Environment, State, StepResult
from rewardlab.envs.render import ChatRenderer, RawRenderer, Renderer, make_renderer

__all__ = ["Environment", "State", "StepResult", "Renderer", "RawRenderer", "ChatRenderer", "make_renderer"]
