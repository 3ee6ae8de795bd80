"""Verifier of worked solutions (`worked:NAME` tasks): the final number against the row's `final` answer."""

from __future__ import annotations

from rewardlab.rewards.base import reward
from rewardlab.tasks.worked import final_number


@reward(name="worked_answer")
def worked_answer(completion: str, final: str) -> dict:
    """1.0 when the number after the completion's last "=" equals the row's `final` answer as an integer, else 0.0.

    A completion without "=" is read whole. A final answer that is not an integer scores 0 (not an error).
    Components: `correct` (same value). Rows: those of `tasks.load("worked:NAME")`, which carry `final`.
    """
    got = final_number(completion)
    try:
        value = float(int(got) == int(str(final).strip()))
    except ValueError:
        value = 0.0
    return {"score": value, "correct": value}
