"""Text-matching rewards."""

from __future__ import annotations

import re

from rewardlab.rewards.base import reward

_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_tagged_answer(completion: str) -> str:
    """The content of the last `<answer>...</answer>` tag, else the whole completion; stripped."""
    found = _ANSWER_TAG.findall(completion)
    return (found[-1] if found else completion).strip()


@reward(name="exact_match")
def exact_match(completion: str, answer: str, case: bool = True, whitespace: bool = True) -> dict:
    """1.0 when the extracted answer equals the reference, else 0.0.

    The answer is the last `<answer>` tag's content or the whole completion, stripped. `case=False` ignores
    letter case; `whitespace=False` ignores all whitespace. Components: `correct` (same value).
    """
    got, want = extract_tagged_answer(completion), str(answer).strip()
    if not case:
        got, want = got.lower(), want.lower()
    if not whitespace:
        got, want = re.sub(r"\s+", "", got), re.sub(r"\s+", "", want)
    value = float(got == want)
    return {"score": value, "correct": value}
