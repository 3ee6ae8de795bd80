"""reasoning-gym verifiers: each dataset's own `score_answer`."""

from __future__ import annotations

from rewardlab.rewards.base import reward
from rewardlab.rewards.extract import extract_tagged_answer
from rewardlab.tasks.reasoning_gym import score_answer


@reward(name="reasoning_gym", row_fields=("dataset", "question", "answer", "metadata"))
def reasoning_gym_reward(completion: str, row: dict, partial: bool = False) -> dict:
    """Score with the row's dataset's own `score_answer` (rows made by `tasks.load("reasoning_gym:NAME")`).

    The answer is the last `<answer>` tag's content, else the whole completion, stripped. Components:
    `correct` = 1.0 when score_answer == 1.0 (exact match), `partial` = the raw score_answer value (0..1).
    The score is `correct`, or `partial` when `partial=True` (datasets that give partial credit). Reads the row's
    `dataset`, `question`, `answer` and `metadata` (and `dataset_config` when present): its `row_fields`.
    """
    s = score_answer(row, extract_tagged_answer(completion))
    correct = float(s == 1.0)
    return {"score": s if partial else correct, "correct": correct, "partial": s}
