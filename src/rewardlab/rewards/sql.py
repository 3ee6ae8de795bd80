"""`sql`: execution match of a predicted SQL query against the reference query on a read-only SQLite database."""

from __future__ import annotations

import collections
import os
import re
import sqlite3
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

from rewardlab.rewards.base import register_reward
from rewardlab.rewards.extract import last_tag
from rewardlab.types import Rollout, RewardOutput

#: Authorizer actions a read-only query needs; everything else (writes, ATTACH, PRAGMA, DDL, transactions) is denied.
_ALLOWED = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
#: Longest string or blob a query may build, bytes (SQLite's own default is 1e9).
MAX_VALUE_BYTES = 10_000_000
_SYNTAX = ("syntax error", "incomplete input", "unrecognized token")
_CODE_BLOCK = re.compile(r"```(?:sql|sqlite)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_COMPONENTS = ("correct", "parses", "executes", "timed_out", "denied", "too_many_rows")


def extract_sql(completion: str) -> str:
    """The predicted query: the last fenced code block (```sql ... ``` or ``` ... ```), else the last
    `<answer>...</answer>`, else the whole completion; stripped."""
    blocks = _CODE_BLOCK.findall(completion)
    if blocks:
        return blocks[-1].strip()
    tagged = last_tag(completion)
    return (tagged if tagged is not None else completion).strip()


def has_top_level_order_by(sql: str) -> bool:
    """True when `sql` has ORDER BY outside parentheses, string literals, quoted names and comments - i.e. the order
    of the final result is specified (an ORDER BY in a subquery or a window `OVER (...)` does not count)."""
    depth, i, n, out = 0, 0, len(sql), []
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
            continue
        if sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if c in "'\"`[":
            close = "]" if c == "[" else c
            end = sql.find(close, i + 1)
            i = n if end < 0 else end + 1
            out.append(" ")
            continue
        if c in "()":
            depth = depth + 1 if c == "(" else max(0, depth - 1)
            out.append(" ")
        elif depth == 0:
            out.append(c)
        i += 1
    return re.search(r"\border\s+by\b", "".join(out), re.IGNORECASE) is not None


def open_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot change anything: the `file:...?mode=ro` URI (SQLite refuses writes to the file),
    `PRAGMA query_only`, and an authorizer that allows only SELECT, column reads, functions and recursive CTEs (so
    no ATTACH, PRAGMA, DDL or DML either); strings and blobs are capped at `MAX_VALUE_BYTES`.

    Raises:
        sqlite3.OperationalError: the file does not exist or is not a database.
    """
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    conn.execute("PRAGMA query_only = ON")
    conn.execute("SELECT count(*) FROM sqlite_master").fetchall()  # fails here if it is not a database
    conn.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    return conn


class _TooManyRows(Exception):
    pass


def run_query(conn: sqlite3.Connection, sql: str, timeout: float, max_rows: int) -> list[tuple]:
    """All rows of `sql`, with a wall-clock limit enforced by SQLite's progress handler (checked every 1000 VM
    instructions) and at most `max_rows` rows.

    Raises:
        sqlite3.Error: the query fails; "interrupted" when it ran past `timeout` seconds.
        _TooManyRows: more than `max_rows` rows.
    """
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        cursor = conn.execute(sql)
        rows: list[tuple] = []
        while batch := cursor.fetchmany(1000):
            rows.extend(batch)
            if len(rows) > max_rows:
                raise _TooManyRows
        return rows
    finally:
        conn.set_progress_handler(None, 0)


def _same_result(got: list[tuple], want: list[tuple], ordered: bool) -> bool:
    if ordered:
        return got == want
    return collections.Counter(got) == collections.Counter(want)


class SQLReward:
    """Execution accuracy: 1.0 when the predicted query returns the same rows as the reference query, else 0.0.

    Both queries run on the SQLite database at the `db_path` option, or else the row's `db_path` field (relative
    paths are joined to `db_dir` when given), opened read-only (see `open_read_only`: writes, ATTACH and PRAGMA are
    impossible), each under a wall-clock limit of `timeout` seconds (SQLite progress handler) and `max_rows` rows.
    Results are compared as multisets of rows (Counter equality), or as lists when the reference has a top-level
    ORDER BY. Column names do not matter; column order and values do (execution accuracy as in Spider, Yu et al.
    2018, and BIRD, Li et al. 2023).

    The predicted query: the last fenced code block of the completion, else the last `<answer>` tag, else the whole
    completion (`extract_sql`). The reference query: the row's `answer`.

    Score range {0, 1}. A predicted query that is blank, does not parse, fails, is denied, runs too long or returns
    too many rows scores 0 with the reason in components (never an error): `parses` (SQLite accepted the syntax),
    `executes` (it ran to the end), `timed_out`, `denied` (a write, ATTACH, PRAGMA or several statements),
    `too_many_rows`, and `correct` (= score).

    Errors (RewardOutput.error, score 0): no database path, a database that cannot be opened, a row without
    `answer`, or a reference query that fails ("sql: reference query failed: no such table: t").

    Args:
        db_path: the database for every row (overrides the row's `db_path`).
        db_dir: base directory for relative row paths.
        timeout: per-query wall-clock limit, seconds (default 5).
        max_rows: most rows a query may return (default 100000).
    Raises:
        ValueError: timeout <= 0 or max_rows < 1.
    """

    name = "sql"

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The row fields it cannot score without (read by the TRL adapter's column check): `answer` (the reference
        query), and `db_path` unless the `db_path` option is given."""
        return ("answer",) if self.db_path else ("answer", "db_path")

    def __init__(self, db_path: str | None = None, db_dir: str | None = None, timeout: float = 5.0,
                 max_rows: int = 100_000) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout}")
        if max_rows < 1:
            raise ValueError(f"max_rows: expected >= 1, got {max_rows}")
        self.db_path, self.db_dir, self.timeout, self.max_rows = db_path, db_dir, float(timeout), int(max_rows)

    def _path(self, row: dict[str, Any]) -> str:
        path = self.db_path or row.get("db_path")
        if not path:
            raise ValueError("no database: give the db_path option or a 'db_path' row field")
        if self.db_dir and not os.path.isabs(path) and not self.db_path:
            path = os.path.join(self.db_dir, path)
        return str(path)

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        connections: dict[str, sqlite3.Connection | Exception] = {}
        references: dict[tuple[str, str], list[tuple] | str] = {}
        try:
            return [self._score(r, connections, references) for r in rollouts]
        finally:
            for conn in connections.values():
                if isinstance(conn, sqlite3.Connection):
                    conn.close()

    def _score(self, rollout: Rollout, connections: dict, references: dict) -> RewardOutput:
        flags = dict.fromkeys(_COMPONENTS, 0.0)
        try:
            path = self._path(rollout.row)
        except ValueError as exc:
            return RewardOutput(0.0, flags, error=f"sql: {exc}")
        reference = rollout.row.get("answer")
        if reference is None:
            return RewardOutput(0.0, flags, error="sql: row has no 'answer'")
        if path not in connections:
            try:
                connections[path] = open_read_only(path)
            except sqlite3.Error as exc:
                connections[path] = exc
        conn = connections[path]
        if isinstance(conn, Exception):
            return RewardOutput(0.0, flags, error=f"sql: cannot open database {path!r}: {conn}")

        key = (path, str(reference))
        if key not in references:
            try:
                references[key] = run_query(conn, str(reference), self.timeout, self.max_rows)
            except (sqlite3.Error, _TooManyRows) as exc:
                references[key] = str(exc) or f"more than {self.max_rows} rows"
        want = references[key]
        if isinstance(want, str):
            return RewardOutput(0.0, flags, error=f"sql: reference query failed: {want}")

        predicted = extract_sql(rollout.completion)
        if not predicted.strip(";").strip():
            return RewardOutput(0.0, flags)
        started = time.monotonic()
        try:
            got = run_query(conn, predicted, self.timeout, self.max_rows)
        except _TooManyRows:
            flags.update(parses=1.0, too_many_rows=1.0)
            return RewardOutput(0.0, flags)
        except (sqlite3.Error, ValueError) as exc:  # ValueError: e.g. a NUL character in the query
            message = str(exc)
            syntax = any(s in message for s in _SYNTAX)
            flags["parses"] = 0.0 if syntax else 1.0
            flags["denied"] = float("not authorized" in message or "one statement at a time" in message)
            flags["timed_out"] = float("interrupted" in message and time.monotonic() - started >= self.timeout)
            return RewardOutput(0.0, flags)
        flags.update(parses=1.0, executes=1.0)
        flags["correct"] = float(_same_result(got, want, has_top_level_order_by(str(reference))))
        return RewardOutput(flags["correct"], flags)


register_reward("sql")(SQLReward)
