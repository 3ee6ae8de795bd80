"""The LLM judge's texts: built-in rubric templates, and the parsing of replies into verdicts.

Pure functions over strings and decoded JSON (no I/O). Every parser raises `JudgeError` with a one-line cause for a
reply it cannot read, never guesses a score. The formulas of each mode are in `rewardlab.rewards.judge`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

MODES = ("score", "yes_no", "pairwise")

#: Built-in rubric templates (`template: NAME`); a custom template is any `str.format` string over the same fields.
TEMPLATES: dict[str, str] = {
    "score": (
        "Evaluate the response to the task below.\n\n[Task]\n{prompt}\n\n[Response]\n{completion}\n\n"
        "Rate how correct and helpful the response is on a scale from {scale_min} (worst) to {scale_max} (best). "
        'Reply with "Score: <number>" and nothing else.'
    ),
    "score_reference": (
        "Evaluate the response to the task below against the reference answer.\n\n[Task]\n{prompt}\n\n"
        "[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\n"
        "Rate how well the response's answer agrees with the reference on a scale from {scale_min} (wrong) to "
        '{scale_max} (fully correct). Reply with "Score: <number>" and nothing else.'
    ),
    "yes_no": (
        "[Task]\n{prompt}\n\n[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\n"
        "Is the response's final answer correct, that is, equivalent to the reference answer? Answer Yes or No."
    ),
    "yes_no_solved": (
        "[Task]\n{prompt}\n\n[Response]\n{completion}\n\n"
        "Does the response solve the task completely and correctly? Answer Yes or No."
    ),
    "pairwise": (
        "[Task]\n{prompt}\n\n[Response A]\n{completion_a}\n\n[Response B]\n{completion_b}\n\n"
        "Which response answers the task better? Answer A or B."
    ),
}
DEFAULT_TEMPLATE = {"score": "score", "yes_no": "yes_no", "pairwise": "pairwise"}
#: The row fields each mode's prompt needs (the reward names the missing one).
REQUIRED_FIELDS = {"score": ("completion",), "yes_no": ("completion",), "pairwise": ("completion_a", "completion_b")}

#: The two answers of each probabilistic mode, as normalized first tokens, and their spellings for a local tokenizer.
CHOICES = {"yes_no": ("yes", "no"), "pairwise": ("a", "b")}
SPELLINGS = {"yes": ("Yes", "yes", "YES", " Yes", " yes"), "no": ("No", "no", "NO", " No", " no"),
             "a": ("A", " A"), "b": ("B", " B")}

# "Score: 7", "score=7", "**Score:** 7", "**Score**: 7". Each run of spaces or stars belongs to one group only:
# the older `score\s*[:=]?\s*\**\s*` let three `\s*` share a run of spaces and backtracked cubically (a reply of
# "Score" and 1,000 spaces took 4 s to reject, 4,000 spaces minutes).
_SCORE_RE = re.compile(r"score\s*(?:\*+\s*)?(?:[:=]\s*(?:\*+\s*)?)?(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:\.\s*)?")
_VERDICT_RE = re.compile(r"\[\[\s*([AB])\s*\]\]")


class JudgeError(RuntimeError):
    """A judge call failed: bad reply, HTTP error, timeout. The message is one line, the cause only."""


def short_repr(text: str, n: int = 80) -> str:
    """`text` with its runs of white space made one space, cut to `n` characters ("..." at the end) and quoted
    (`repr`): how a judge error shows a reply."""
    text = " ".join(str(text).split())
    return repr(text if len(text) <= n else text[: n - 3] + "...")


# ---------------------------------------------------------------------------------------------- reply parsing
def parse_score(text: str, lo: float, hi: float) -> float:
    """The number after the last "Score:" in `text` (or `text` itself when it is a bare number), checked to lie on
    the scale [lo, hi]. Raises JudgeError otherwise."""
    found = _SCORE_RE.findall(text or "")
    if found:
        value = float(found[-1])
    else:
        bare = _NUMBER_RE.fullmatch(text or "")
        if bare is None:
            raise JudgeError(f"cannot parse a score from reply {short_repr(text)}")
        value = float(bare.group(1))
    if not lo <= value <= hi:  # also a number too long for a float (inf)
        raise JudgeError(f"score {value:g} is outside the scale [{lo:g}, {hi:g}] (reply {short_repr(text)})")
    return value


def parse_choice(text: str, mode: str) -> float:
    """1.0 / 0.0 for a "Yes" / "No" reply (yes_no) or an "A" / "B" verdict (pairwise: "[[A]]" anywhere, or a reply
    that is just the letter). Raises JudgeError for anything else."""
    text = text or ""
    if mode == "pairwise":
        found = _VERDICT_RE.findall(text)
        letter = found[-1] if found else None
        if letter is None:
            bare = re.fullmatch(r"\W*([ABab])\W*", text)
            letter = bare.group(1).upper() if bare else None
        if letter is None:
            raise JudgeError(f"cannot parse A or B from reply {short_repr(text)}")
        return 1.0 if letter == "A" else 0.0
    word = re.match(r"\W*(\w+)", text)
    answer = word.group(1).lower() if word else ""
    if answer not in ("yes", "no"):
        raise JudgeError(f"cannot parse Yes or No from reply {short_repr(text)}")
    return 1.0 if answer == "yes" else 0.0


def choice_probability(top_logprobs: Sequence[tuple[str, float]], mode: str) -> float:
    """p(first) / (p(first) + p(second)) over the first reply token's top log-probs (natural log), where first /
    second are "yes" / "no" (yes_no) or "a" / "b" (pairwise) after stripping spaces and punctuation and lower-casing
    each token; each distinct token counts once. Raises JudgeError when neither appears, or when a counted log-prob
    is NaN or above 1e-6 (not a log-probability; values in (0, 1e-6] are rounding and count as 0)."""
    pos, neg = CHOICES[mode]
    mass = {pos: 0.0, neg: 0.0}
    seen = set()
    for token, logprob in top_logprobs:
        if token in seen:
            continue
        seen.add(token)
        key = token.strip().strip(".,:;!?*[]()\"'").lower()
        if key in mass:
            if not logprob <= 1e-6:  # NaN, +inf or a positive log-probability: exp() would give no probability
                raise JudgeError(f"top log-prob of token {short_repr(token)} is {logprob!r}, not a log-probability")
            mass[key] += math.exp(min(logprob, 0.0))
    total = mass[pos] + mass[neg]
    if total <= 0:
        raise JudgeError(f"neither {pos!r} nor {neg!r} among the {len(seen)} top log-probs of the first token")
    return mass[pos] / total


def read_choice(reply: Mapping[str, Any]) -> tuple[str, list[tuple[str, float]] | None]:
    """The first choice's text and its first token's top log-probs ([(token, logprob)], None when absent)."""
    try:
        choice = reply["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise JudgeError("unexpected reply shape (no choices[0].message): "
                         f"{short_repr(json.dumps(reply))}") from None
    if not isinstance(text, str):
        raise JudgeError(f"unexpected reply shape (choices[0].message.content is a {type(text).__name__}, not text): "
                         f"{short_repr(json.dumps(reply))}")
    try:
        content = (choice.get("logprobs") or {}).get("content") or []
        if not content:
            return text, None
        first = content[0]
        top = [(str(t["token"]), float(t["logprob"])) for t in first.get("top_logprobs") or []]
        if "token" in first and "logprob" in first:
            top.append((str(first["token"]), float(first["logprob"])))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise JudgeError(f"unexpected logprobs shape: {short_repr(json.dumps(choice.get('logprobs')))}") from None
    return text, top
