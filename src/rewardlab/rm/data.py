"""Reward-model data: the row schema and JSONL readers for preference pairs, best-of-k rows and step-labelled
solutions. Generated preference pairs (`rewardlab rm pairs`) are in `rewardlab.rm.pairs`.

Row formats (one JSON object per line; other fields are kept):

- pair (RewardBench, Lambert et al. 2024): `{"prompt": str, "chosen": str, "rejected": str, "subset": str}`, with an
  optional `margin` (float, for the margin Bradley–Terry loss) and `row` (the task row, so verifiable rewards can
  score the responses).
- best-of-k (RewardBench 2 style): `{"prompt": str, "chosen": [str], "rejected": [str, ...], "subset": str}`.
- steps (PRM training / ProcessBench-style evaluation): `{"prompt": str, "steps": [str, ...], "labels": [float, ...]}`
  (labels in [0, 1] per step, soft allowed) or ProcessBench's `{"problem": str, "steps": [...], "label": int}`
  (index of the first wrong step, -1 when none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewardlab.types import Rollout


@dataclass
class Pair:
    """A preference pair: `chosen` is preferred to `rejected` as a response to `prompt`."""

    prompt: str
    chosen: str
    rejected: str
    subset: str = "default"
    margin: float = 0.0
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class BestOfK:
    """One chosen and k-1 rejected responses to one prompt (RewardBench 2 best-of-4 has k = 4)."""

    prompt: str
    chosen: str
    rejected: list[str]
    subset: str = "default"
    row: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepRow:
    """A solution split into steps with per-step labels in [0, 1] (1: correct; soft labels allowed)."""

    prompt: str
    steps: list[str]
    labels: list[float]
    subset: str = "default"
    row: dict[str, Any] = field(default_factory=dict)

    @property
    def first_error(self) -> int:
        """Index of the first step labelled 0 (a Monte Carlo value of 0 or a hard 0 label), -1 when none."""
        return next((i for i, y in enumerate(self.labels) if y <= 0.0), -1)


def json_safe(value: Any) -> Any:
    """A copy fit for strict JSON: NaN -> null, +-inf -> "inf" / "-inf", recursively through dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def read_jsonl(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: `PATH:LINE: ...` for a line that is not UTF-8, not JSON or not a JSON object (the task reader's
            rules, `rewardlab.tasks.jsonl.json_lines`); `PATH: no rows` for an empty file.
    """
    from rewardlab.tasks.jsonl import json_lines

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path}: not found")
    out = []
    for lineno, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        out.append((lineno, obj))
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def _str(obj: dict, key: str, where: str) -> str:
    if key not in obj:
        raise ValueError(f"{where}: missing field '{key}'")
    if not isinstance(obj[key], str):
        raise ValueError(f"{where}: field '{key}' must be a string, got {type(obj[key]).__name__}")
    return obj[key]


def _str_list(obj: dict, key: str, where: str) -> list[str]:
    value = obj.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: field '{key}' must be a non-empty list of strings")
    return value


def row_kind(obj: dict[str, Any]) -> str:
    """"pair", "best_of_k" or "steps" for a row of any of the three formats, "" when it is none of them."""
    if "steps" in obj:
        return "steps"
    if isinstance(obj.get("chosen"), list):
        return "best_of_k"
    if "chosen" in obj:
        return "pair"
    return ""


def parse_pair(obj: dict[str, Any], where: str) -> Pair:
    """A `Pair` from a RewardBench row. Raises ValueError naming `where` (FILE:LINE) and the field."""
    margin = obj.get("margin", 0.0)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not math.isfinite(margin):
        raise ValueError(f"{where}: field 'margin' must be a finite number, got {margin!r}")
    row = obj.get("row", {})
    if not isinstance(row, dict):
        raise ValueError(f"{where}: field 'row' must be an object")
    return Pair(_str(obj, "prompt", where), _str(obj, "chosen", where), _str(obj, "rejected", where),
                str(obj.get("subset", "default")), float(margin), row)


def parse_best_of_k(obj: dict[str, Any], where: str) -> BestOfK:
    """A `BestOfK` from a RewardBench-2 row (`chosen` must hold exactly one response)."""
    chosen = _str_list(obj, "chosen", where)
    if len(chosen) != 1:
        raise ValueError(f"{where}: field 'chosen' must hold exactly one response for best-of-k, got {len(chosen)}")
    row = obj.get("row", {})
    return BestOfK(_str(obj, "prompt", where), chosen[0], _str_list(obj, "rejected", where),
                   str(obj.get("subset", "default")), row if isinstance(row, dict) else {})


def parse_steps(obj: dict[str, Any], where: str) -> StepRow:
    """A `StepRow` from `{prompt, steps, labels}` or ProcessBench's `{problem, steps, label}`."""
    prompt = _str(obj, "prompt" if "prompt" in obj else "problem", where)
    steps = _str_list(obj, "steps", where)
    if "labels" in obj:
        labels = obj["labels"]
        if not isinstance(labels, list) or len(labels) != len(steps):
            raise ValueError(f"{where}: field 'labels' must be a list with one label per step ({len(steps)})")
        out = []
        for y in labels:
            if isinstance(y, bool):
                y = float(y)
            if not isinstance(y, (int, float)) or not 0.0 <= y <= 1.0:
                raise ValueError(f"{where}: field 'labels' must hold numbers in [0, 1] (or booleans), got {y!r}")
            out.append(float(y))
    elif "label" in obj:
        first = obj["label"]
        if not isinstance(first, int) or isinstance(first, bool) or not -1 <= first < len(steps):
            raise ValueError(f"{where}: field 'label' must be -1 or a step index below {len(steps)}, got {first!r}")
        out = [1.0] * len(steps) if first == -1 else [1.0] * first + [0.0] * (len(steps) - first)
    else:
        raise ValueError(f"{where}: missing field 'labels' (per step) or 'label' (first wrong step)")
    row = obj.get("row", {})
    return StepRow(prompt, steps, out, str(obj.get("subset", "default")), row if isinstance(row, dict) else {})


def load_pairs(path: str | Path) -> list[Pair]:
    """Preference pairs from a RewardBench-format JSONL file. Raises ValueError `PATH:LINE: ...` on a bad row."""
    return [parse_pair(o, f"{path}:{n}") for n, o in read_jsonl(path)]


def load_step_rows(path: str | Path) -> list[StepRow]:
    """Step-labelled solutions from a JSONL file. Raises ValueError `PATH:LINE: ...` on a bad row."""
    return [parse_steps(o, f"{path}:{n}") for n, o in read_jsonl(path)]


def load_eval_rows(path: str | Path) -> dict[str, list]:
    """All rows of a mixed evaluation file, by kind: {"pair": [Pair], "best_of_k": [BestOfK], "steps": [StepRow]}.

    Raises:
        ValueError: `PATH:LINE: ...` for a row of no known kind or a bad row.
    """
    out: dict[str, list] = {"pair": [], "best_of_k": [], "steps": []}
    parse = {"pair": parse_pair, "best_of_k": parse_best_of_k, "steps": parse_steps}
    for n, obj in read_jsonl(path):
        kind = row_kind(obj)
        if not kind:
            raise ValueError(f"{path}:{n}: not a pair, best-of-k or steps row (needs 'chosen'/'rejected' or 'steps')")
        out[kind].append(parse[kind](obj, f"{path}:{n}"))
    return out


def make_rollout(prompt: str, completion: str, row: dict[str, Any] | None = None,
                 step_text: Sequence[str] | None = None) -> Rollout:
    """A token-free Rollout for scoring a fixed text with any Reward (evaluation data has no token ids).

    `row` defaults to `{"prompt": prompt}`; with `step_text`, `steps` holds each step's character span in
    `completion` (there are no tokens to index), so process rewards read the given steps as they are.
    """
    row = dict(row or {})
    row.setdefault("prompt", prompt)
    spans: list[tuple[int, int]] = []
    if step_text:
        pos = 0
        for s in step_text:
            at = completion.find(s, pos)
            start = at if at >= 0 else pos
            spans.append((start, start + len(s)))
            pos = start + len(s)
    return Rollout(prompt=prompt, prompt_ids=[], completion=completion, completion_ids=[], logprobs=[], row=row,
                   steps=spans, step_text=list(step_text or []))
