"""Preference data for `rewardlab po`: JSONL rows in the pairs format `rm pairs` writes, or in TRL's preference
formats, read into `PreferenceRow`s with one-line `FILE:LINE` errors.

Accepted rows (other fields are kept in `row`):

- standard: `{"prompt": str, "chosen": str, "rejected": str}` (what `rewardlab rm pairs` writes; its `row` field,
  the task row, is kept);
- conversational: `{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`, each message
  `{"role": str, "content": str}` (TRL's conversational preference format; the responses are assistant turns);
- implicit prompt: `{"chosen": ..., "rejected": ...}` without `prompt`, both full conversations (lists of messages)
  that share their first messages: the longest shared prefix of whole messages is the prompt (TRL's
  `maybe_extract_prompt`). Strings without a prompt are refused (no message boundary to split at).

A row with a missing or mistyped field is an error. A row whose chosen or rejected response is empty (blank text, or
messages whose contents are all blank) or whose responses are equal is an error too, or, with
`skip_invalid=True`, skipped and counted by reason (`empty_chosen`, `empty_rejected`, `identical`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from rewardlab.rm.data import read_jsonl

#: A prompt or a response: text, or chat messages ({"role", "content"} dicts).
Content = Union[str, list[dict[str, str]]]
#: Why a row is refused or skipped: the counters `load_preference_rows` returns.
SKIP_REASONS = ("empty_chosen", "empty_rejected", "identical")


@dataclass(frozen=True)
class PreferenceRow:
    """One preference: `chosen` is preferred to `rejected` as a response to `prompt` (text, or messages)."""

    prompt: Content
    chosen: Content
    rejected: Content
    row: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # FILE:LINE it was read from, for errors about it

    @property
    def conversational(self) -> bool:
        return not isinstance(self.prompt, str)


def _messages(value: Any, key: str, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                              and isinstance(m.get("content"), str) for m in value):
        raise ValueError(f"{where}: field '{key}' must be a string or a list of {{role, content}} messages with "
                         "string values")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _content(obj: dict, key: str, where: str) -> Content:
    if key not in obj:
        raise ValueError(f"{where}: missing field '{key}'")
    value = obj[key]
    return value if isinstance(value, str) else _messages(value, key, where)


def _blank(value: Content) -> bool:
    return not value.strip() if isinstance(value, str) else all(not m["content"].strip() for m in value)


def split_implicit_prompt(chosen: list[dict[str, str]], rejected: list[dict[str, str]], where: str):
    """(prompt, chosen response, rejected response): the longest shared prefix of whole messages, and the rest.

    Raises:
        ValueError: `where`: nothing is shared (no prompt), or one conversation is the other's prefix.
    """
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise ValueError(f"{where}: no field 'prompt', and 'chosen' and 'rejected' share no first message to take "
                         "as the prompt")
    if n == len(chosen) or n == len(rejected):
        raise ValueError(f"{where}: no field 'prompt', and one of 'chosen'/'rejected' is all prompt (no response)")
    return chosen[:n], chosen[n:], rejected[n:]


def parse_preference_row(obj: dict[str, Any], where: str) -> PreferenceRow:
    """A `PreferenceRow` from one JSONL object (see the module doc). Raises ValueError naming `where` and the field;
    the empty and identical responses are raised with the reason as the error's `reason` attribute."""
    chosen, rejected = _content(obj, "chosen", where), _content(obj, "rejected", where)
    if "prompt" in obj:
        prompt = _content(obj, "prompt", where)
    elif isinstance(chosen, list) and isinstance(rejected, list):
        prompt, chosen, rejected = split_implicit_prompt(chosen, rejected, where)
    else:
        raise ValueError(f"{where}: missing field 'prompt' (an implicit prompt needs 'chosen' and 'rejected' as "
                         "conversations)")
    if isinstance(prompt, str) != isinstance(chosen, str) or isinstance(chosen, str) != isinstance(rejected, str):
        raise ValueError(f"{where}: 'prompt', 'chosen' and 'rejected' must all be strings or all be messages")
    for reason, bad in (("empty_chosen", _blank(chosen)), ("empty_rejected", _blank(rejected)),
                        ("identical", chosen == rejected)):
        if bad:
            what = {"empty_chosen": "field 'chosen' is empty", "empty_rejected": "field 'rejected' is empty",
                    "identical": "'chosen' and 'rejected' are the same response"}[reason]
            error = ValueError(f"{where}: {what} (to skip such rows and count them: skip_invalid=true)")
            error.reason = reason  # type: ignore[attr-defined]
            raise error
    row = obj.get("row", {})
    if not isinstance(row, dict):
        raise ValueError(f"{where}: field 'row' must be an object")
    extra = {k: v for k, v in obj.items() if k not in ("prompt", "chosen", "rejected", "row")}
    return PreferenceRow(prompt, chosen, rejected, {**extra, **row}, where)


def load_preference_rows(path: str | Path, *, skip_invalid: bool = False) -> tuple[list[PreferenceRow],
                                                                                   dict[str, int]]:
    """The preference rows of a JSONL file, and the rows skipped by reason (all 0 unless `skip_invalid`).

    Raises:
        FileNotFoundError: no such file.
        ValueError: one line `PATH:LINE: ...` for a malformed row, or (without `skip_invalid`) an empty or identical
            response; `PATH: no rows` for an empty file, `PATH: every row was skipped (...)` when none is left.
    """
    rows, skipped = [], dict.fromkeys(SKIP_REASONS, 0)
    for lineno, obj in read_jsonl(path):
        try:
            rows.append(parse_preference_row(obj, f"{path}:{lineno}"))
        except ValueError as exc:
            reason = getattr(exc, "reason", None)
            if not (skip_invalid and reason):
                raise
            skipped[reason] += 1
    if not rows:
        counts = ", ".join(f"{k} {v}" for k, v in skipped.items() if v)
        raise ValueError(f"{path}: every row was skipped ({counts})")
    return rows, skipped
