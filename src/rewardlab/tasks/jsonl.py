"""Tasks from JSON-lines files whose lines hold `prompt` and `answer` (other fields are passed to rewards), or chat
rows with `messages` (TRL's conversational format)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rewardlab.tasks import check_reward_name, register_loader
from rewardlab.tasks.base import Row, Task, dedup_and_split, row_key

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


def _chat_row(row: Row, where: str) -> Row:
    """A chat row (TRL's conversational format, `{"messages": [{"role", "content"}, ...]}`) as a task row.

    The last user turn is the `prompt`; `messages` keeps the conversation up to and including it (what a chat
    template formats, system prompt and earlier turns included). An assistant turn after it is the reply: it is the
    `answer` when the row has no `answer` field, and the row's `target` (the SFT target with `sft.target=target`)
    when it has one.

    Raises:
        ValueError: `where: ...` for messages that are not a non-empty list of {role, content} string turns, without
            a user turn, with more than one turn (or a non-assistant one) after the last user turn, a row that also
            has `prompt`, or one with both a reply and a `target` field.
    """
    messages = row["messages"]
    if "prompt" in row:
        raise ValueError(f"{where}: a row holds either 'prompt' or 'messages' (chat format), not both")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: field 'messages' must be a non-empty list of {{\"role\", \"content\"}} turns")
    for i, turn in enumerate(messages):
        if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
            raise ValueError(f"{where}: messages[{i}] must be an object with string 'role' and 'content'")
        bad = _unicode_error(turn["content"])
        if bad is not None:
            raise ValueError(f"{where}: messages[{i}].content is not valid Unicode (lone surrogate {bad})")
    users = [i for i, turn in enumerate(messages) if turn["role"] == "user"]
    if not users:
        raise ValueError(f"{where}: messages has no user turn (the last user turn is the prompt)")
    last = users[-1]
    after = messages[last + 1:]
    if len(after) > 1 or (after and after[0]["role"] != "assistant"):
        roles = ", ".join(t["role"] for t in after)
        raise ValueError(f"{where}: after the last user turn, messages may hold one assistant turn (the reply), "
                         f"got: {roles}")
    out = {k: v for k, v in row.items() if k != "messages"}
    out["prompt"] = messages[last]["content"]
    out["messages"] = messages[: last + 1]
    if after:
        reply = after[0]["content"]
        if "answer" not in row:
            out["answer"] = reply
        elif "target" in row:
            raise ValueError(f"{where}: the assistant turn would be the row's 'target', which it already has")
        else:
            out["target"] = reply
    return out


def read_numbered_rows(path: str | Path, required: tuple[str, ...] = REQUIRED) -> list[tuple[int, Row]]:
    """(line number, row) for each row of a JSONL task file (see `json_lines` for the format); blank lines are
    skipped. A row holds `prompt` and `answer` (other fields are passed to rewards), or is a chat row with `messages`
    (see `_chat_row`). A non-string `answer` (a number, a list) becomes its JSON text.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: one line, named as `PATH:LINE`: a line that is not UTF-8, not JSON (see `json_lines`), not a
            JSON object, lacks a required field, has a `prompt` that is not a string, an empty `prompt`, an `answer`
            that is null or empty, bad chat `messages` (see `_chat_row`); a `prompt` or `answer` that is not valid
            Unicode (a lone surrogate, which tokenizers refuse). "PATH: no rows" for a file without rows.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path}: not found")
    rows = []
    for lineno, row in json_lines(path):
        where = f"{path}:{lineno}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if "messages" in row:
            row = _chat_row(row, where)
            if "answer" not in row:
                raise ValueError(f"{where}: missing field 'answer' (a chat row takes it from an assistant turn after "
                                 "the last user turn, or from an 'answer' field)")
        for name in required:
            if name not in row:
                raise ValueError(f"{where}: missing field '{name}'")
        if not isinstance(row["prompt"], str):
            raise ValueError(f"{where}: field 'prompt' must be a string")
        if row["answer"] is None:
            raise ValueError(f"{where}: field 'answer' is null; give the reference answer (a string or a number)")
        row["answer"] = row["answer"] if isinstance(row["answer"], str) else json.dumps(row["answer"])
        for name in ("prompt", "answer"):
            bad = _unicode_error(row[name])
            if bad is not None:
                raise ValueError(f"{where}: field '{name}' is not valid Unicode (lone surrogate {bad})")
            if not row[name].strip():
                raise ValueError(f"{where}: field '{name}' is empty")
        rows.append((lineno, row))
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def read_rows(path: str | Path, required: tuple[str, ...] = REQUIRED) -> list[Row]:
    """The rows of a JSONL task file without their line numbers (see `read_numbered_rows`, whose errors it raises)."""
    return [row for _, row in read_numbered_rows(path, required)]


def _unique(numbered: list[tuple[int, Row]], path: Path) -> tuple[list[Row], dict[str, str]]:
    """Rows with their first occurrence of each question kept (`row_key`), in file order, and their `PATH:LINE`."""
    unique: dict[str, Row] = {}
    origins: dict[str, str] = {}
    for lineno, row in numbered:
        key = row_key(row)
        if key not in unique:
            unique[key] = row
            origins[key] = f"{path}:{lineno}"
    return list(unique.values()), origins


def _check_options(test_path: Any, test_size: Any, seed: Any, reward: Any) -> None:
    """One-line errors naming `task.options.<name>` for option values of the wrong type."""
    if test_path is not None and (not isinstance(test_path, str) or not test_path):
        raise ValueError(f"task.options.test_path: expected the path of a JSONL file, got {test_path!r}")
    if test_path is not None and test_size is not None:
        raise ValueError("task.options: test_size and test_path exclude each other (test_path: the held-out rows "
                         "are that whole file; test_size: they are split off the task file)")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task.options.seed: expected an integer, got {seed!r}")
    if not isinstance(reward, str) or not reward:
        raise ValueError(f"task.options.reward: expected the name of a registered reward, got {reward!r}")
    check_reward_name(reward, field="task.options.reward")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


@register_loader("jsonl", example="jsonl:PATH")
def load_jsonl(
    path: str, /, *, test_path: str | None = None, test_size: int | float | None = None, seed: int = 0,
    reward: str = "exact_match",
) -> Task:
    """Load `jsonl:PATH` as a Task.

    Args:
        path: JSONL file of rows with `prompt` and `answer`, or chat rows with `messages` (see `read_numbered_rows`).
        test_path: optional JSONL file of held-out rows; when given, `path` is all training data (rows whose
            question also occurs in `test_path` are dropped from training). Excludes `test_size`.
        test_size: held-out prompts split off `path` when no `test_path` (int count or float fraction). Default:
            0.1, and 0 for a file of a single question (which cannot be split; it is all training data and what
            `evaluate` scores).
        seed: split seed.
        reward: name of the reward that verifies answers (default `exact_match`).
    Returns:
        the Task; its `eval_split` (what `evaluate` scores unless a split is asked for) is "all" (the whole file, in
        file order, duplicate questions dropped) without `test_path`, and "test" (the whole `test_path` file) with
        it. Its `origins` give each row's `PATH:LINE`, its `source` the file(s) and the split (`describe_task`).
    Raises:
        ValueError / FileNotFoundError: see `read_numbered_rows`; one line naming `task.options.<name>` for an
            option of the wrong type, an unknown reward name, a `test_path` that does not exist, `test_size` together
            with `test_path`, a `test_path` that is the task file itself, or one that holds every question of the
            task file (no training rows left).
    """
    _check_options(test_path, test_size, seed, reward)
    file = Path(path)
    numbered = read_numbered_rows(file)
    rows, origins = _unique(numbered, file)
    dupes = len(numbered) - len(rows)
    counted = f"{_plural(len(numbered), 'row')}" + (f", {len(rows)} unique" if dupes else "")
    if test_path is None:
        return _split_task(path, rows, origins, counted, test_size=test_size, seed=seed, reward=reward)
    return _held_out_task(path, test_path, rows, origins, counted, seed=seed, reward=reward)


def _split_task(path: str, rows: list[Row], origins: dict[str, str], counted: str, *,
                test_size: int | float | None, seed: int, reward: str) -> Task:
    """The Task of `jsonl:PATH` without `test_path`: `test_size` of the unique `rows` (None: 0.1, and 0 for a single
    question) split off as its test rows with `seed`; `evaluate` scores the whole file (`eval_split="all"`).
    `counted` says how many rows the file holds (for `source`)."""
    if test_size is None:
        test_size = 0.1 if len(rows) > 1 else 0
    train, test = dedup_and_split(rows, key=row_key, test_size=test_size, seed=seed)
    held = (f"the {len(test)} held out are task.options.test_size={test_size!r} of its unique questions, split "
            f"seed {seed}" if test else "none held out: task.options.test_size=0")
    # The user's file is evaluated whole unless a split is asked for.
    return Task(name=f"jsonl:{path}", train=train, test=test, reward=reward, eval_split="all", all_rows=rows,
                source=f"both from {path} ({counted}; {held})", origins=origins)


def _test_file(path: str, test_path: str) -> Path:
    """`task.options.test_path` as a Path: an existing file other than the task file `path`.

    Raises:
        FileNotFoundError: `test_path` does not exist.
        ValueError: `test_path` is the task file itself.
    """
    tfile = Path(test_path)
    if not tfile.is_file():
        raise FileNotFoundError(f"task.options.test_path: {test_path}: not found")
    if Path(path).resolve() == tfile.resolve():
        raise ValueError(f"task.options.test_path: {test_path} is the task file itself; give a separate file of "
                         "held-out rows, or leave test_path out to hold out task.options.test_size (default 0.1) of "
                         f"{path}")
    return tfile


def _held_out_task(path: str, test_path: str, rows: list[Row], origins: dict[str, str], counted: str, *,
                   seed: int, reward: str) -> Task:
    """The Task of `jsonl:PATH` with `test_path`: the test rows are that whole file (what `evaluate` scores), the
    training rows the unique `rows` of `path` whose question it does not hold. `counted` says how many rows the task
    file holds (for `source`).

    Raises:
        FileNotFoundError / ValueError: see `_test_file` and `read_numbered_rows`; ValueError when `test_path` holds
            every question of `path`.
    """
    tfile = _test_file(path, test_path)
    numbered_test = read_numbered_rows(tfile)
    test, test_origins = _unique(numbered_test, tfile)
    heldout = {row_key(r) for r in test}
    train = [r for r in rows if row_key(r) not in heldout]
    if not train:
        raise ValueError(f"task.options.test_path: every question of {path} ({len(rows)}) is also in {test_path}, "
                         "which leaves no training rows")
    dropped = len(rows) - len(train)
    train, _ = dedup_and_split(train, key=row_key, test_size=0, seed=seed)
    note = f"{counted}" + (f"; {dropped} dropped because {test_path} holds them" if dropped else "")
    source = (f"from {path} ({note}); the held-out rows are task.options.test_path {test_path} "
              f"({_plural(len(numbered_test), 'row')})")
    # evaluate: the test_path file, whole
    return Task(name=f"jsonl:{path}", train=train, test=test, reward=reward, source=source,
                origins={**origins, **test_origins})
