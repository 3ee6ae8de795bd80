"""Multi-turn environments and tools, with token-exact episodes (docs/agents.md).

Public API: `Environment`, `StepResult` (the protocol); `MultiTurnEnv`, `ToolEnv` (base classes to write one); the
built-in environments, `ENVIRONMENTS`, `make_env` and `resolve_env` (a user's class named MODULE:CLASS or
PATH.py:CLASS, the task `env:MODULE:CLASS`); the loader of the task kind `env:NAME` (`envs.task`, registered into
`rewardlab.tasks.LOADERS` on import); renderers; `run_episodes`, `Episode`; `replay`; `trace_rollouts`; the sampling
helpers the verbs share (`sample_rollouts`, `load_episodes`, ...).
"""

from rewardlab.envs.base import Environment, State, StepResult
from rewardlab.envs.multiturn import MultiTurnEnv, initial_messages
from rewardlab.envs.tools import CALL_STATUSES, TOOL_PARSERS, ToolEnv, check_arguments, tool_schema
from rewardlab.envs.builtin import (ENVIRONMENTS, CalculatorEnv, GuessNumberEnv, PythonEnv, calc,
                                    evaluate_arithmetic, make_env, parse_guess, resolve_env, run_python)
from rewardlab.envs import task as _task  # noqa: F401  (registers the task kind env:NAME)
from rewardlab.envs.render import ChatRenderer, RawRenderer, Renderer, make_renderer
from rewardlab.envs.episode import Episode, EpisodeLimits, run_episodes
from rewardlab.envs.replay import episode_record, replay
from rewardlab.envs.trace import trace_rollouts
from rewardlab.envs.sampling import (EpisodeSettings, check_episode_keys, close_env, episode_ends, episode_metrics,
                                     episode_rows, episode_settings, load_episodes, sample_rollouts,
                                     split_episodes)

__all__ = ["Environment", "State", "StepResult",
           "CALL_STATUSES", "ENVIRONMENTS", "TOOL_PARSERS", "CalculatorEnv", "GuessNumberEnv", "MultiTurnEnv",
           "PythonEnv", "ToolEnv", "calc", "check_arguments", "evaluate_arithmetic", "initial_messages", "make_env",
           "parse_guess", "resolve_env", "run_python", "tool_schema",
           "Renderer", "RawRenderer", "ChatRenderer", "make_renderer",
           "Episode", "EpisodeLimits", "run_episodes", "episode_record", "replay",
           "EpisodeSettings", "check_episode_keys", "close_env", "episode_ends", "episode_metrics", "episode_rows",
           "split_episodes", "load_episodes", "episode_settings", "sample_rollouts", "trace_rollouts"]
