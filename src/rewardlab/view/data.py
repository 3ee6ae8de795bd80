"""What `rewardlab view` reads from run directories, read-only: the runs, their status, metrics, rollouts and reports.

Nothing here writes, creates or locks a file: the status probe opens `.lock` read-only (never creating it) and takes
a shared non-blocking flock that it drops at once. Every path read is checked to resolve inside its run directory
(`Run.confined`), so a symlink out of a run is refused like `../`. Problems are `ViewError`s: one line and the HTTP
status the server answers with (404 missing, 400 bad request, 422 unreadable data).

Speed on large runs (docs/viewer.md): the steps come from the rollouts files' names; a step's table is one file's
scalar columns (cached by file size and mtime); metrics are read from a byte offset, so polling re-reads only the new
lines; the prompt-across-steps index reads only the `prompt_key` column of each file once (cached per file).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rewardlab.rollout_log import ROLLOUTS_DIR, STEP_FILES, TOKEN_COLUMNS, read_rollout, rollouts_path
from rewardlab.runs import EVENTS, LOCK, RUN_MARKERS

#: How deep below a directory given to `rewardlab view` runs are searched for (runs/quickstart/grpo is 2 deep).
SEARCH_DEPTH = 4
#: Report files a run may hold (rm eval, search: report.json).
REPORTS = ("report.json",)
#: Files the file route serves: the run's plots and reports.
SERVED_SUFFIXES = {".png": "image/png", ".json": "application/json", ".md": "text/plain; charset=utf-8",
                   ".yaml": "text/plain; charset=utf-8", ".txt": "text/plain; charset=utf-8"}
#: Columns of a rollouts file the table leaves out (long texts and JSON), besides the per-token ones.
WIDE_COLUMNS = ("prompt", "answer", "turns")
#: Characters of a completion the rollouts table shows.
COMPLETION_CHARS = 200
#: Final metrics the runs page shows first when a run has them.
FINAL_METRICS = ("reward/mean", "accuracy", "eval/accuracy", "sft/loss", "loss", "pass@1")


class ViewError(Exception):
    """A request the viewer cannot answer: `message` (one line) and the HTTP `status` (4xx)."""

    def __init__(self, message: str, status: int = 404) -> None:
        """`message`'s first line, and the HTTP status."""
        super().__init__(message.splitlines()[0] if message else "error")
        self.status = status


def finite(value: Any) -> Any:
    """`value` with NaN and +-inf floats (also inside lists and dicts) as None, so that it is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# ------------------------------------------------------------------------------------------------------ runs
@dataclass
class Run:
    """One run directory given to (or found by) the viewer: `index` and `name` address it in URLs; `error` is set
    when it cannot be read (missing, not a run)."""

    index: int
    name: str
    path: Path
    error: str | None = None
    _metrics_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def confined(self, relative: str | Path) -> Path:
        """The path `relative` names inside the run, resolved (symlinks followed).

        Raises:
            ViewError (400): an absolute path, a `..` part, or a path that resolves outside the run directory.
        """
        rel = str(relative)
        parts = Path(rel).parts
        if rel.startswith(("/", "\\")) or Path(rel).is_absolute() or ".." in parts or "\x00" in rel:
            raise ViewError(f"path {rel!r} is outside run {self.name}", 400)
        root = self.path.resolve()
        target = (root / rel).resolve()
        if target != root and root not in target.parents:
            raise ViewError(f"path {rel!r} is outside run {self.name}", 400)
        return target

    def check(self) -> None:
        """Raise the run's error (ViewError 404) when it cannot be read."""
        if self.error:
            raise ViewError(self.error, 404)


def holds_run(path: Path) -> bool:
    """Whether `path` is a rewardlab run directory (holds one of `rewardlab.runs.RUN_MARKERS`)."""
    return any((path / m).exists() for m in RUN_MARKERS)


#: Subdirectories of a run that hold its own files, not other runs.
RUN_FOLDERS = {"checkpoints", "plots", ROLLOUTS_DIR, "completions", "rolled_back"}


def _found_below(root: Path) -> list[Path]:
    """Run directories below `root` (not following symlinks), at most `SEARCH_DEPTH` levels down. A run's
    subdirectories are searched too (the quickstart's stages are runs inside its run), but not its own folders
    (`RUN_FOLDERS`)."""
    found, frontier = [], [root]
    for _ in range(SEARCH_DEPTH):
        nxt = []
        for folder in frontier:
            try:
                children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()
                                  and p.name not in RUN_FOLDERS and not p.name.startswith("."))
            except OSError:
                continue
            found += [c for c in children if holds_run(c)]
            nxt += children
        frontier = nxt
    return sorted(found)


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs `paths` give: each path that is a run and the runs found below it; a path that does not exist or
    holds none becomes a `Run` with its `error` set. Names are the directories' base names, or their paths relative
    to the directory given when base names repeat (with `/` as `-`, so that a name is one URL segment)."""
    entries: list[tuple[Path, Path | None, str | None]] = []  # (path, given root, error)
    for given in paths:
        p = Path(given)
        if not p.exists():
            entries.append((p, None, f"{p}: no such directory"))
        elif not p.is_dir():
            entries.append((p, None, f"{p}: not a directory"))
        else:
            below = _found_below(p)
            if holds_run(p):
                entries.append((p, None, None))
            elif not below:
                entries.append((p, None, f"{p}: not a rewardlab run (none of {', '.join(RUN_MARKERS)}) and no run "
                                          f"found below it"))
            entries += [(run, p, None) for run in below]
    seen: set[Path] = set()  # a run given twice, or found below two of the paths, is listed once
    entries = [e for e in entries if e[2] is not None or not (e[0].resolve() in seen or seen.add(e[0].resolve()))]
    base = [e[0].name or str(e[0]) for e in entries]
    runs = []
    for i, (path, root, error) in enumerate(entries):
        name = base[i]
        if base.count(name) > 1:
            name = (path.relative_to(root).as_posix() if root is not None else path.as_posix()).strip("/")
            name = name.replace("/", "-") or str(i)
            if [r.name for r in runs].count(name):
                name = f"{name}-{i}"
        runs.append(Run(i, name, path, error))
    return runs


def get_run(runs: Sequence[Run], key: str) -> Run:
    """The run `key` names: its index among `runs` or its name.

    Raises:
        ViewError (404): no such run (names the choices).
    """
    if key.isdigit() and int(key) < len(runs):
        return runs[int(key)]
    for run in runs:
        if run.name == key:
            return run
    raise ViewError(f"no run {key!r}; runs: {', '.join(f'{r.index} ({r.name})' for r in runs) or 'none'}", 404)


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is missing or not JSON (being written)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_summary(run: Run) -> Any:
    """The run's summary.json (None when missing, unreadable, or a link out of the run)."""
    try:
        path = run.confined("summary.json")
    except ViewError:
        return None
    return _read_json(path) if path.is_file() else None


def read_config(run: Run) -> dict[str, Any]:
    """The run's config.yaml as a dict ({} when missing or unreadable; YAML read as data only)."""
    try:
        data = yaml.safe_load(run.confined("config.yaml").read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError, ViewError):
        return {}
    return data if isinstance(data, dict) else {}


def verb_of(config: dict[str, Any]) -> str:
    """The verb that wrote a run, told by its config's sections ("?" when none fits)."""
    keys = set(config)
    rules = [("preset", "quickstart"), ("rl", "train"), ("sft", "sft"), ("rft", "rft"), ("search", "search"),
             ("label", "prm label"), ("pairs", "rm pairs")]
    for key, verb in rules:
        if key in keys:
            return verb
    if "eval" in keys:
        return "rm eval" if "scorer" in keys else "evaluate"
    if "train" in keys:
        return "rm/prm train"
    if keys and keys <= {"model", "out", "threads"}:
        return "merge"
    return "?"


def is_locked(run: Run) -> bool:
    """Whether a live process holds the run's `.lock` (flock): the run is being written. The file is opened
    read-only, never created, and the probe's shared lock is dropped at once."""
    try:
        fd = os.open(run.confined(LOCK), os.O_RDONLY)
    except (OSError, ViewError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def read_events(run: Run) -> list[dict[str, Any]]:
    """events.jsonl's records (a torn or bad line skipped)."""
    out = []
    try:
        text = run.confined(EVENTS).read_text(encoding="utf-8", errors="replace")
    except (OSError, ViewError):
        return []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def status_of(run: Run, summary: Any) -> str:
    """running (its lock is held), finished (summary.json), interrupted (the summary says so: a Ctrl-C or SIGTERM
    stop with a checkpoint), crashed (no summary and no writer), missing (`run.error`). `status_reason` says why."""
    if run.error:
        return "missing"
    if is_locked(run):
        return "running"
    if isinstance(summary, dict):
        return "interrupted" if summary.get("interrupted") else "finished"
    return "crashed"


def status_reason(run: Run, status: str, summary: Any) -> str:
    """One line on the run's status, from its summary and events.jsonl (a stop for reward errors, a resume)."""
    if status == "missing":
        return run.error or ""
    events = read_events(run)
    stops = [e for e in events if e.get("event") == "reward_errors"]
    if status == "crashed":
        if stops:
            return (f"stopped at step {stops[-1].get('step')}: {stops[-1].get('failed')} of "
                    f"{stops[-1].get('rollouts')} rollouts failed their reward (reward_errors event)")
        return "no summary.json and no process holds the run: it stopped before finishing; --resume continues it"
    if status == "interrupted":
        return "stopped by Ctrl-C or SIGTERM after a checkpoint; --resume continues it"
    resumes = sum(e.get("event") == "resume" for e in events)
    return f"{status}{f' (resumed {resumes} time(s))' if resumes else ''}"


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: leaf}."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): value}


def config_diff(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dotted config keys whose value differs from the first run's: [{"key", "values": one per run (None where
    a run lacks the key)}], sorted by key."""
    flat = [_flatten(c) if c else {} for c in configs]
    if len(flat) < 2:
        return []
    keys = sorted(set().union(*flat))
    rows = []
    for key in keys:
        values = [f.get(key) for f in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append({"key": key, "values": [json.dumps(v, default=str) if v is not None else None
                                                for v in values]})
    return rows


def _numeric(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a flat record (bools left out)."""
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def run_info(run: Run) -> dict[str, Any]:
    """What the runs page shows of a run: index, name, path, verb, task, status, steps (last logged step), logged
    rollout steps, final metrics (the last metrics line's numbers, else the summary's), error."""
    info: dict[str, Any] = {"index": run.index, "name": run.name, "path": str(run.path), "error": run.error}
    if run.error:
        return {**info, "verb": None, "task": None, "status": "missing", "status_reason": run.error, "steps": None,
                "logged_steps": 0, "final": {}}
    config = read_config(run)
    summary = read_summary(run)
    last = last_metrics(run)
    final = {k: v for k, v in _numeric(last).items() if k != "step" and not k.startswith("time/")}
    if not final and isinstance(summary, dict):
        final = {k: v for k, v in _numeric(summary).items() if not k.endswith("_s")}
    task = config.get("task", {}).get("spec") if isinstance(config.get("task"), dict) else config.get("data")
    status = status_of(run, summary)
    return {**info, "verb": verb_of(config), "task": task, "status": status,
            "status_reason": status_reason(run, status, summary),
            "steps": last.get("step"), "logged_steps": len(step_files(run)), "final": final}


def runs_overview(runs: Sequence[Run]) -> dict[str, Any]:
    """`/api/runs`: every run's `run_info`, the final-metric columns to show, and the config diff against the first
    readable run."""
    infos = [run_info(r) for r in runs]
    present = [k for k in FINAL_METRICS if any(k in i["final"] for i in infos)]
    if not present:
        present = sorted({k for i in infos for k in i["final"]})[:4]
    readable = [r for r in runs if not r.error]
    diff = config_diff([read_config(r) for r in readable])
    return {"runs": infos, "final_columns": present, "config_diff": diff,
            "config_runs": [r.index for r in readable]}


# --------------------------------------------------------------------------------------------------- metrics
def read_metrics(run: Run, since: int = 0) -> dict[str, Any]:
    """metrics.jsonl's complete lines from byte offset `since`: {"records", "next" (the offset to ask from next
    time), "reset" (the file is now shorter than `since`: rolled back by a resume; records are then from 0),
    "torn" (a last line without its newline was left out: being written or torn)}. Lines that are not JSON objects
    are skipped.

    Raises:
        ViewError (400): a negative offset.
    """
    run.check()
    if since < 0:
        raise ViewError(f"since must be >= 0, not {since}", 400)
    try:
        path = run.confined("metrics.jsonl")
        size = path.stat().st_size
    except OSError:
        return {"records": [], "next": 0, "reset": since > 0, "torn": False}
    reset = since > size
    start = 0 if reset else since
    with path.open("rb") as fh:
        fh.seek(start)
        data = fh.read(size - start)
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), (int, float)):
            records.append(finite(rec))
    return {"records": records, "next": start + end, "reset": reset, "torn": end < len(data)}


def last_metrics(run: Run, tail: int = 1 << 16) -> dict[str, Any]:
    """The last complete line of metrics.jsonl that is a JSON object with a step ({} when none), read from the
    file's last `tail` bytes (the whole file when a line is longer)."""
    try:
        path = run.confined("metrics.jsonl")
        size = path.stat().st_size
    except (OSError, ViewError):
        return {}
    start = max(0, size - tail)
    while True:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        lines = data[: data.rfind(b"\n") + 1].splitlines()[1 if start else 0:]  # the first may be cut
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), (int, float)):
                return finite(rec)
        if start == 0:
            return {}
        start = 0


# -------------------------------------------------------------------------------------------------- rollouts
def step_files(run: Run) -> dict[int, Path]:
    """{step: its rollouts file} from the file names (no file is opened; a symlink is left out, as it may point
    out of the run); {} when the run logs none."""
    folder = run.path / ROLLOUTS_DIR
    pattern = STEP_FILES[ROLLOUTS_DIR]
    try:
        if not folder.is_dir():
            return {}
        run.confined(ROLLOUTS_DIR)
        with os.scandir(folder) as entries:
            return {int(m.group(1)): folder / e.name for e in entries
                    if not e.is_symlink() and (m := pattern.fullmatch(e.name))}
    except (OSError, ViewError):
        return {}


def _step_path(run: Run, step: int) -> Path:
    """The rollouts file of `step`, confined to the run.

    Raises:
        ViewError (404): the step has no rollouts file (names the logged range).
    """
    run.check()
    files = step_files(run)
    if step not in files:
        logged = sorted(files)
        span = f"{len(logged)} logged steps, {logged[0]}..{logged[-1]}" if logged else "no rollouts files"
        raise ViewError(f"run {run.name}: step {step} has no rollouts file ({span})", 404)
    return run.confined(rollouts_path("", step))


class _Cache:
    """A small LRU of values keyed by (path, size, mtime): a rewritten file is read again."""

    def __init__(self, size: int) -> None:
        """Keep at most `size` values."""
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()

    def get(self, path: Path, load):
        """The cached value of `path`, or `load(path)` stored."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = load(path)
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


_TABLES = _Cache(32)


def _unreadable(path: Path, exc: BaseException) -> ViewError:
    """The 422 of a rollouts file that cannot be read: one line naming the file and the reader's complaint."""
    return ViewError(f"{path.parent.name}/{path.name}: unreadable ({type(exc).__name__}: "
                     f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}; half-written or corrupt)", 422)


def _load_rows(path: Path) -> list[dict[str, Any]]:
    """A step file's scalar columns as row dicts: completion cut to `COMPLETION_CHARS`, `logged` (per-token values
    present)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = [n for n in pf.schema_arrow.names if n not in TOKEN_COLUMNS and n not in WIDE_COLUMNS]
        table = pf.read(columns=names + (["loss_mask"] if "loss_mask" in pf.schema_arrow.names else []))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a torn file
        raise _unreadable(path, exc) from None
    logged = table["loss_mask"].is_valid().to_pylist() if "loss_mask" in table.column_names else []
    rows = table.select(names).to_pylist()
    for i, row in enumerate(rows):
        text = row.get("completion") or ""
        row["completion"] = text if len(text) <= COMPLETION_CHARS else text[:COMPLETION_CHARS] + "…"
        row["logged"] = bool(logged[i]) if logged else False
    return finite(rows)


def step_rows(run: Run, step: int) -> list[dict[str, Any]]:
    """Step `step`'s rollouts as row dicts of the scalar columns (cached per file)."""
    path = _step_path(run, step)
    try:
        return _TABLES.get(path, _load_rows)
    except OSError as exc:
        raise _unreadable(path, exc) from None


_COMPARISON = re.compile(r"^([A-Za-z_][\w/.\-]*)\s*(>=|<=|!=|=|>|<)\s*(.*)$")


def _value(text: str) -> Any:
    """A filter's value: a number, true/false, null, or text (quotes stripped)."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        return text.strip("\"'")


def _term(term: str, columns: set[str]):
    """One filter term as a predicate on a row dict (see `parse_filter`)."""
    negate = term.startswith("!")
    term = term[1:] if negate else term
    m = _COMPARISON.match(term)
    if m:
        col, op, raw = m.groups()
        if col not in columns:
            raise ViewError(f"filter: unknown column {col!r}; columns: {', '.join(sorted(columns))}", 400)
        want = _value(raw)

        def compare(row: dict[str, Any]) -> bool:
            """Whether the row's value compares to the term's as `op` says."""
            have = row.get(col)
            if op in ("=", "!="):
                same = have == want or (isinstance(have, str) and str(want) == have)
                return same if op == "=" else not same
            if have is None or want is None or isinstance(have, str) != isinstance(want, str):
                return False
            return {">": have > want, "<": have < want, ">=": have >= want, "<=": have <= want}[op]

        pred = compare
    elif term in columns:
        pred = (lambda row, c=term: bool(row.get(c)))  # noqa: E731 - error: has one; truncated/kept: true
    else:
        needle = term.strip("\"'").lower()
        pred = (lambda row: needle in (row.get("completion") or "").lower()  # noqa: E731
                or needle in (row.get("prompt_key") or "").lower())
    return (lambda row: not pred(row)) if negate else pred


def parse_filter(text: str, columns: Iterable[str]):
    """A predicate on row dicts from the filter grammar (docs/viewer.md): terms separated by spaces, all must
    hold; `COL OP VALUE` (OP one of = != > < >= <=; VALUE a number, true, false, null or text); a bare column name
    (`error`, `truncated`, `kept`: the value is set and true); any other word: text in the completion or the
    prompt key; `!` before a term negates it.

    Raises:
        ViewError (400): a comparison names an unknown column (names the columns).
    """
    cols = set(columns)
    preds = [_term(t, cols) for t in text.split()]
    return lambda row: all(p(row) for p in preds)


def _sort_key(col: str):
    """A sort key that puts None last and compares numbers with numbers, text with text."""
    def key(row: dict[str, Any]):
        """(is None, is text, value)."""
        v = row.get(col)
        return (v is None, isinstance(v, str), v if v is not None else 0)
    return key


def rollouts_page(run: Run, step: int, *, offset: int = 0, limit: int = 100, sort: str | None = None,
                  desc: bool = False, filter_text: str = "") -> dict[str, Any]:
    """`/api/runs/{run}/steps/{step}/rollouts`: the rows of one page of the step's table, filtered and sorted
    server-side: {"step", "total" (rows in the file), "matched" (rows the filter keeps), "offset", "limit",
    "columns", "rows"}.

    Raises:
        ViewError: 404 no such step, 400 a bad offset, limit, sort column or filter, 422 an unreadable file.
    """
    if offset < 0 or not 1 <= limit <= 5000:
        raise ViewError(f"offset must be >= 0 and limit in 1..5000 (got offset={offset}, limit={limit})", 400)
    rows = step_rows(run, step)
    columns = list(rows[0]) if rows else []
    if sort is not None and sort not in columns:
        raise ViewError(f"sort: unknown column {sort!r}; columns: {', '.join(columns)}", 400)
    kept = [r for r in rows if parse_filter(filter_text, columns)(r)] if filter_text.strip() else rows
    if sort is not None:
        kept = sorted(kept, key=_sort_key(sort))
        if desc:  # None stays last
            kept = [r for r in kept if r.get(sort) is not None][::-1] + [r for r in kept if r.get(sort) is None]
    return {"step": step, "total": len(rows), "matched": len(kept), "offset": offset, "limit": limit,
            "columns": columns, "rows": kept[offset:offset + limit]}


def rollout_record(run: Run, step: int, index: int) -> dict[str, Any]:
    """`read_rollout`'s record of rollout `index` at `step` (per-token lists, `components`, `turns` parsed), with
    `logged` (whether it has per-token values).

    Raises:
        ViewError: 404 no such step or index, 422 an unreadable file.
    """
    path = _step_path(run, step)
    try:
        rec = read_rollout(run.path, step, index)
    except IndexError as exc:
        raise ViewError(str(exc), 404) from None
    except Exception as exc:  # noqa: BLE001 - a torn file: pyarrow raises several kinds
        raise _unreadable(path, exc) from None
    rec["logged"] = rec.get("tokens") is not None or rec.get("token_ids") is not None
    return finite(rec)


def group_rollouts(run: Run, step: int, group: int) -> dict[str, Any]:
    """The rollouts of prompt group `group` at `step`, full prompt and completion texts: {"step", "group", "prompt",
    "rollouts": [{index, completion, reward, components, advantage, kept, error, truncated, termination}]}.

    Raises:
        ViewError: 404 no such step or group, 422 an unreadable file.
    """
    path = _step_path(run, step)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        names = [n for n in pf.schema_arrow.names if n not in TOKEN_COLUMNS and n not in ("answer", "turns")]
        table = pf.read(columns=names, use_threads=False)
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(path, exc) from None
    rows = table.filter(pc.equal(table["group"], group)).to_pylist()
    if not rows:
        raise ViewError(f"run {run.name}: step {step} has no group {group}", 404)
    return finite({"step": step, "group": group, "prompt": rows[0].get("prompt"),
                   "prompt_key": rows[0].get("prompt_key"), "rollouts": [_short(r) for r in rows]})


def _short(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout for side-by-side views: its scalars and full completion, components gathered."""
    out = {k: v for k, v in row.items() if not k.startswith("reward/") and k != "prompt"}
    out["components"] = {k.removeprefix("reward/"): v for k, v in row.items() if k.startswith("reward/")}
    return out


# ---------------------------------------------------------------------------------------------------- prompts
def _keys_of(path: Path):
    """A step file's (prompt_key, group) columns as Arrow arrays."""
    import pyarrow.parquet as pq

    try:  # one file's two columns, on this thread: ~1 ms a file (read_table's thread pool costs more than it gives)
        t = pq.ParquetFile(path).read(columns=["prompt_key", "group"], use_threads=False)
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(path, exc) from None
    return t["prompt_key"].combine_chunks(), t["group"].combine_chunks()


class PromptIndex:
    """Which (step, group) sampled each prompt key, over all of a run's rollouts files: one Arrow table (step,
    prompt_key, group) of every logged rollout, searched with one vectorised comparison. Built from the files'
    two columns, read in parallel, each file once (by size and mtime): a new step adds one file's read."""

    #: Threads reading files (Parquet decoding releases the GIL).
    WORKERS = 8

    def __init__(self) -> None:
        """An empty index (`refresh` fills it)."""
        self.files: dict[int, tuple[tuple[int, int], Any, Any]] = {}  # step -> ((size, mtime), keys, groups)
        self.table = None
        self.skipped: list[int] = []
        self.lock = threading.Lock()

    def refresh(self, files: dict[int, Path]) -> None:
        """Read the files that are new or changed since the last refresh; drop the steps that are gone."""
        import pyarrow as pa
        from concurrent.futures import ThreadPoolExecutor

        with self.lock:
            stamps = {}
            for step, path in files.items():
                try:
                    st = path.stat()
                except OSError:
                    continue
                stamps[step] = (st.st_size, st.st_mtime_ns)
            todo = [s for s, stamp in stamps.items() if s not in self.files or self.files[s][0] != stamp]
            if not todo and self.table is not None and set(self.files) == set(stamps):
                return

            def read(step: int):
                """(step, its two columns), or (step, None) when the file cannot be read."""
                try:
                    return step, _keys_of(files[step])
                except (ViewError, OSError):
                    return step, None

            with ThreadPoolExecutor(self.WORKERS) as pool:
                for step, got in pool.map(read, todo):
                    if got is None:
                        self.files.pop(step, None)
                    else:
                        self.files[step] = (stamps[step], *got)
            for step in set(self.files) - set(stamps):
                del self.files[step]
            self.skipped = sorted(set(stamps) - set(self.files))
            steps = sorted(self.files)
            self.table = pa.table({
                "step": pa.array([s for s in steps for _ in range(len(self.files[s][1]))], pa.int64()),
                "prompt_key": pa.chunked_array([self.files[s][1] for s in steps], pa.string()),
                "group": pa.chunked_array([self.files[s][2] for s in steps], pa.int32())})

    def find(self, key: str) -> list[tuple[int, int]]:
        """The (step, group) pairs that sampled `key`, ascending by step (the first group of a step when the key
        was drawn twice in it)."""
        import pyarrow.compute as pc

        with self.lock:
            hits = self.table.filter(pc.equal(self.table["prompt_key"], key))
        out: dict[int, int] = {}
        for step, group in zip(hits["step"].to_pylist(), hits["group"].to_pylist()):
            out.setdefault(step, group)
        return sorted(out.items())


_INDEXES: dict[Path, PromptIndex] = {}
_INDEXES_LOCK = threading.Lock()


def prompt_index(run: Run) -> PromptIndex:
    """The run's `PromptIndex`, refreshed against its rollouts files."""
    with _INDEXES_LOCK:
        index = _INDEXES.setdefault(run.path.resolve(), PromptIndex())
    index.refresh(step_files(run))
    return index


def prompt_steps(run: Run, key: str, *, offset: int = 0, limit: int = 20) -> dict[str, Any]:
    """`/api/runs/{run}/prompts/{key}`: prompt `key`'s groups at the steps that sampled it, `limit` steps from
    `offset` (ascending): {"key", "prompt", "steps_total", "all_steps", "steps": [{"step", "group", "rollouts"}],
    "skipped" (steps whose file could not be read)}. The key index (`PromptIndex`) reads only the prompt_key and
    group columns of each file, once per file.

    Raises:
        ViewError: 404 the run or prompt is unknown, 400 a bad offset or limit.
    """
    run.check()
    if offset < 0 or not 1 <= limit <= 200:
        raise ViewError(f"offset must be >= 0 and limit in 1..200 (got offset={offset}, limit={limit})", 400)
    index = prompt_index(run)
    hits = index.find(key)
    if not hits:
        raise ViewError(f"run {run.name}: no logged step sampled prompt {key!r}", 404)
    steps, prompt = [], None
    for step, group in hits[offset:offset + limit]:
        g = group_rollouts(run, step, group)
        prompt = prompt or g["prompt"]
        steps.append({"step": step, "group": group, "rollouts": g["rollouts"]})
    return {"key": key, "prompt": prompt, "steps_total": len(hits), "all_steps": [h[0] for h in hits],
            "offset": offset, "limit": limit, "steps": steps, "skipped": index.skipped}


# ---------------------------------------------------------------------------------------------------- reports
def _table(title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    """A report table as the API returns it."""
    return {"title": title, "columns": columns, "rows": rows}


def _scalars(section: Any, prefix: str = "") -> list[list[Any]]:
    """[key, value] rows of a report section's scalar leaves (lists and long strings left out)."""
    rows = []
    for key, value in _flatten(section, prefix).items():
        if isinstance(value, (int, float, bool)) or value is None or (isinstance(value, str) and len(value) < 200):
            rows.append([key, value])
    return rows


def _search_report(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tables and accuracy-vs-N chart of a `rewardlab search` report."""
    pass_at = report.get("pass@N") or {}
    methods = report.get("methods") or {}
    ns = sorted({int(n) for n in pass_at} | {int(n) for per in methods.values() for n in per})
    rows = [[m, *((per.get(str(n)) or {}).get("accuracy") for n in ns)] for m, per in methods.items()]
    rows.append(["pass@N (pool)", *(pass_at.get(str(n)) for n in ns)])
    greedy = (report.get("greedy") or {}).get("accuracy")
    tables = [_table("accuracy against N", ["method", *(f"N={n}" for n in ns)], rows),
              _table("settings", ["key", "value"], _scalars({k: v for k, v in report.items()
                                                            if k not in ("methods", "pass@N")}))]
    traces = [{"name": m, "x": [int(n) for n in sorted(per, key=int)],
               "y": [per[n].get("accuracy") for n in sorted(per, key=int)]} for m, per in methods.items()]
    traces.append({"name": "pass@N", "x": [int(n) for n in sorted(pass_at, key=int)],
                   "y": [pass_at[n] for n in sorted(pass_at, key=int)], "dash": "dash"})
    if greedy is not None and ns:
        traces.append({"name": "greedy", "x": [ns[0], ns[-1]], "y": [greedy, greedy], "dash": "dot"})
    chart = {"title": f"accuracy against N: {report.get('task')}", "x_title": "N", "y_title": "accuracy",
             "log_x": True, "traces": traces}
    return tables, [chart]


def _rm_report(report: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tables and charts of a `rewardlab rm eval` report: each section (pairs, best_of_k, first_error) as key/value
    rows, its per-subset figures (`per_subset.subsets`: {subset: {n, mean}}) as a table and a bar chart."""
    tables, charts = [], []
    for section in ("pairs", "best_of_k", "first_error"):
        data = report.get(section)
        if not isinstance(data, dict):
            continue
        tables.append(_table(section, ["key", "value"], [r for r in _scalars(data)
                                                         if not r[0].startswith("per_subset.subsets.")]))
        per = data.get("per_subset")
        subsets = per.get("subsets") if isinstance(per, dict) else None
        if isinstance(subsets, dict) and subsets:
            cols = sorted({k for v in subsets.values() if isinstance(v, dict) for k in v})
            tables.append(_table(f"{section}: per subset", ["subset", *cols],
                                 [[name, *((v.get(c) if isinstance(v, dict) else None) for c in cols)]
                                  for name, v in subsets.items()]))
            if "mean" in cols:
                charts.append({"title": f"{section}: mean per subset", "x_title": "subset", "y_title": "mean",
                               "bar": True, "traces": [{"name": section, "x": list(subsets),
                                                        "y": [(v or {}).get("mean") for v in subsets.values()]}]})
    tables.append(_table("report", ["key", "value"], _scalars({k: v for k, v in report.items()
                                                               if k not in ("pairs", "best_of_k", "first_error")})))
    return tables, charts


def reports(run: Run) -> dict[str, Any]:
    """`/api/runs/{run}/reports`: the run's reports (report.json of rm eval and search; the summary of any run) as
    tables ({"title", "columns", "rows"}) and charts ({"title", "traces": [{"name", "x", "y"}], ...}), with the
    run's plots (plots/*.png, *.png) as file names for the file route.

    Raises:
        ViewError (404): the run is unknown or unreadable.
    """
    run.check()
    out = []
    for name in REPORTS:
        try:
            path = run.confined(name)
        except ViewError:
            continue
        if not path.is_file():
            continue
        report = _read_json(path)
        if not isinstance(report, dict):
            out.append({"file": name, "kind": "unreadable", "error": f"{name}: not a JSON object (being written?)",
                        "tables": [], "charts": []})
            continue
        kind = "search" if "methods" in report and "pass@N" in report else "rm eval"
        tables, charts = (_search_report if kind == "search" else _rm_report)(report)
        out.append({"file": name, "kind": kind, "tables": tables, "charts": charts})
    summary = read_summary(run)
    if isinstance(summary, dict):
        out.append({"file": "summary.json", "kind": "summary",
                    "tables": [_table("summary", ["key", "value"], _scalars(summary))], "charts": []})
    plots = sorted(p.relative_to(run.path).as_posix() for pattern in ("*.png", "plots/*.png")
                   for p in run.path.glob(pattern) if not p.is_symlink() and _inside(run, p))
    return finite({"run": run.index, "reports": out, "plots": plots})


def _inside(run: Run, path: Path) -> bool:
    """Whether `path` resolves inside the run directory."""
    try:
        run.confined(path.relative_to(run.path))
    except ViewError:
        return False
    return True


def run_file(run: Run, relative: str) -> tuple[Path, str]:
    """A file of the run for the file route: (its resolved path, media type).

    Raises:
        ViewError: 400 a path outside the run (`Run.confined`) or of a kind not served, 404 no such file.
    """
    run.check()
    path = run.confined(relative)
    media = SERVED_SUFFIXES.get(path.suffix.lower())
    if media is None:
        raise ViewError(f"{relative}: only {', '.join(sorted(SERVED_SUFFIXES))} files are served", 400)
    if not path.is_file():
        raise ViewError(f"run {run.name}: no file {relative}", 404)
    return path, media
