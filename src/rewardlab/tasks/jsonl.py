"""Tasks from JSON-lines files whose lines hold `prompt` and `answer` (other fields are passed to rewards)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task, dedup_and_split

REQUIRED = ("prompt", "answer")


def _unicode_error(value: str) -> str | None:
    """The first lone surrogate in `value` (as JSON's "\\ud800" escapes can make) as repr text, or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return repr(value[exc.start])
    return None


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value) for each non-blank line of the JSONL file `path`: UTF-8 (a leading
    byte-order mark is accepted), lines ending in "\\n" or "\\r\\n".

    Raises:
        ValueError: one line, `PATH:LINE: ...`, for a line that is not UTF-8 or not JSON (malformed, nested too
            deeply, or an integer of more digits than Python reads).
    """
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                                 f"{exc.start + 1})") from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                cause = exc.msg.removesuffix(" at")  # json's "Invalid control character ... at": the column follows
                raise ValueError(f"{path}:{lineno}: malformed JSON ({cause} at column {exc.colno})") from None
            except RecursionError:
                raise ValueError(f"{path}:{lineno}: malformed JSON (nested too deeply)") from None
            except ValueError as exc:  # e.g. an integer longer than Python's int() reads
                cause = " ".join(str(exc).split(";")[0].split())
                raise ValueError(f"{path}:{lineno}: malformed JSON ({cause})") from None


def read_rows(path: str | Path, required: tuple[str, ...] = REQUIRED) -> list[Row]:
    """Read a JSONL file of task rows (see `json_lines` for the format); blank lines are skipped. A non-string
    `answer` becomes its JSON text.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: one line, named as `PATH:LINE`: a line that is not UTF-8, not JSON (see `json_lines`), not a
            JSON object, lacks a required field, or has a `prompt` that is not a string; a `prompt` or `answer` that
            is not valid Unicode (a lone surrogate, which tokenizers refuse). "PATH: no rows" for a file without rows.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path}: not found")
    rows = []
    for lineno, row in json_lines(path):
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        for name in required:
            if name not in row:
                raise ValueError(f"{path}:{lineno}: missing field '{name}'")
        if not isinstance(row["prompt"], str):
            raise ValueError(f"{path}:{lineno}: field 'prompt' must be a string")
        row["answer"] = row["answer"] if isinstance(row["answer"], str) else json.dumps(row["answer"])
        for name in ("prompt", "answer"):
            bad = _unicode_error(row[name])
            if bad is not None:
                raise ValueError(f"{path}:{lineno}: field '{name}' is not valid Unicode (lone surrogate {bad})")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


@register_loader("jsonl")
def load_jsonl(
    path: str, /, *, test_path: str | None = None, test_size: int | float | None = None, seed: int = 0,
    reward: str = "exact_match",
) -> Task:
    """Load `jsonl:PATH` as a Task.

    Args:
        path: JSONL file of rows with `prompt` and `answer`.
        test_path: optional JSONL file of held-out rows; when given, `path` is all training data (rows whose
            prompt also occurs in `test_path` are dropped from training).
        test_size: held-out prompts split off `path` when no `test_path` (int count or float fraction). Default:
            0.1, and 0 for a file of a single question (which cannot be split; it is all training data and what
            `evaluate` scores).
        seed: split seed.
        reward: name of the reward that verifies answers (default `exact_match`).
    Returns:
        the Task; its `eval_split` (what `evaluate` scores unless a split is asked for) is "all" (the whole file, in
        file order, duplicate prompts dropped) without `test_path`, and "test" (the whole `test_path` file) with it.
    Raises:
        ValueError / FileNotFoundError: see `read_rows`.
    """
    rows = read_rows(path)
    if test_path is None:
        unique: dict[str, Row] = {}
        for r in rows:
            unique.setdefault(r["prompt"], r)
        if test_size is None:
            test_size = 0.1 if len(unique) > 1 else 0
        train, test = dedup_and_split(rows, key=lambda r: r["prompt"], test_size=test_size, seed=seed)
        # The user's file is evaluated whole unless a split is asked for.
        return Task(name=f"jsonl:{path}", train=train, test=test, reward=reward, eval_split="all",
                    all_rows=list(unique.values()))
    test, _ = dedup_and_split(read_rows(test_path), key=lambda r: r["prompt"], test_size=0, seed=seed)
    held = {r["prompt"] for r in test}
    train, _ = dedup_and_split(
        [r for r in rows if r["prompt"] not in held], key=lambda r: r["prompt"], test_size=0, seed=seed
    )
    return Task(name=f"jsonl:{path}", train=train, test=test, reward=reward)  # evaluate: the test_path file, whole
