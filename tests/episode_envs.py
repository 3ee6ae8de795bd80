"""Test environments and rewards shared by the trainer and config tests (registered once, on import)."""

from __future__ import annotations

from rewardlab.envs import ENVIRONMENTS, MultiTurnEnv
from rewardlab.rewards import REWARDS, reward
from rewardlab.tasks import Task
from rewardlab.types import RewardOutput

if "test_ep_digits" not in REWARDS:

    @reward(name="test_ep_digits")
    def _digits(completion):
        """The fraction of digits in the final model turn: a dense outcome."""
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


if "test_turns" not in ENVIRONMENTS:

    @ENVIRONMENTS.register("test_turns")
    class TurnsEnv(MultiTurnEnv):
        """Three turns: every turn is answered `<o>K</o>` with turn reward 0.25 * K (K = the turn, from 1); the random
        model's turns end at any lowercase letter or digit, so episodes have several turns."""

        stop = tuple("abcdefghijklmnopqrstuvwxyz0123456789")
        reward = "test_ep_digits"

        def __init__(self, *, size: int = 20) -> None:
            super().__init__(max_turns=3)
            self.size = size

        def task(self, seed: int = 0) -> Task:
            rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(self.size + 4)]
            return Task(name="env:test_turns", train=rows[:self.size], test=rows[self.size:], reward=self.reward)

        def env_response(self, messages, state):
            return f"<o>{state['turn']}</o>", 0.25 * state["turn"]

        def is_done(self, messages, state):
            return False


if "test_walk_steps" not in REWARDS:

    @reward(name="test_walk_steps")
    def _walk_steps(completion, steps):
        """A process reward: each step's digit fraction; the outcome is the completion's."""
        frac = [sum(c.isdigit() for c in s) / max(1, len(s)) for s in steps]
        return RewardOutput(score=sum(c.isdigit() for c in completion) / max(1, len(completion)), step_scores=frac)
