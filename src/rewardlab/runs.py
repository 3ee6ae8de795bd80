"""Run directories: resolved config, append-only logs, verified atomic checkpoints, resume, summary and plots.

Layout:
    config.yaml         the resolved config
    metrics.jsonl       one JSON object per step, appended and flushed every step
    samples.jsonl       every rollout (step, prompt, completion, reward components, advantage)
    rollouts/, completions/
                        train: one Parquet file per step each (rewardlab.rollout_log), written atomically
    events.jsonl        what happened to the directory: start, resume, overwrite, torn-tail repairs, rolled-back
                        log lines, skipped invalid checkpoints, settings a resume changed (config_changed), a stop
                        for reward errors (reward_errors)
    checkpoints/step-K/ HF-format model + tokenizer + trainer_state.pt + manifest.json, written to a temp dir
                        then renamed; manifest.json (sizes and SHA-256 of every file, and the size of each log at
                        that step) is written last, and a checkpoint is verified against it before a resume
    rolled_back/        log lines and per-step files written after the checkpoint a run resumed from (kept)
    summary.json        final figures, written atomically
    plots/*.png         metric curves
    .lock               held (flock) by the process writing the run

Guarantees (docs/reliability.md): a directory that already holds something is never silently reused
(`RunDir.start` refuses it unless asked to resume or overwrite); two processes never write one run at once; a
torn last line of an append-only log is cut back to the last newline before anything is appended; a resume starts
from the newest checkpoint that verifies and first rolls every log back to what it held at that checkpoint, so
each step is logged exactly once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from rewardlab.rollout_log import STEP_FILES

CHECKPOINT_PREFIX = "step-"
MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
LOCK = ".lock"
ROLLED_BACK = "rolled_back"


def _step_of(path: Path) -> int | None:
    """The step of a per-step file (`STEP_FILES`), or None when `path` is not one."""
    pattern = STEP_FILES.get(path.parent.name)
    match = pattern.fullmatch(path.name) if pattern is not None else None
    return int(match.group(1)) if match else None


#: Entries that mark a directory as a rewardlab run (any one of them).
RUN_MARKERS = ("config.yaml", "summary.json", "metrics.jsonl", EVENTS, "checkpoints")


#: How a verb opens its run directory (`RunDir.start`): "new" (the directory must be missing or empty), "resume"
#: (continue the run there) or "overwrite" (delete the run there first). The CLI's --resume and --overwrite.
RunMode = Literal["new", "resume", "overwrite"]
RUN_MODES: tuple[RunMode, ...] = get_args(RunMode)


class RunDirError(ValueError):
    """A run directory cannot be used as asked (holds a run, in use, nothing to resume); one line."""


def check_mode(mode: Any) -> RunMode:
    """`mode` if it is a `RunMode`; else a one-line ValueError naming the three."""
    if mode not in RUN_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, RUN_MODES))}, not {mode!r}")
    return mode


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file in the same directory and an atomic rename.

    Raises:
        OSError: the write failed (e.g. no space left); `path` then still holds its previous content.
    """
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` writes the file's content to a hidden temp path beside `path`, which is then flushed to disk
    and renamed onto `path` (and the directory synced): a reader sees the old file or the whole new one.

    Raises:
        OSError: the write failed (e.g. no space left); `path` then still holds its previous content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, f"could not write {path} ({exc.strerror or exc}); its previous content is "
                      "intact") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def as_os_error(exc: BaseException) -> OSError | None:
    """The operating-system error behind `exc`, or None when it is not an I/O failure.

    Libraries report a failed write (no space left, file too large) in their own types: an OSError anywhere in the
    exception chain (torch.save to a Python file object), or Rust's "... (os error 28)" in the message (safetensors,
    used by `save_pretrained`).
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        stack += [e.__cause__, e.__context__]
    m = re.search(r"\(os error (\d+)\)", str(exc))
    return OSError(int(m.group(1)), os.strerror(int(m.group(1)))) if m else None


def repair_torn_tail(path: Path) -> int:
    """Cut a file back to its last newline (what a crash in the middle of appending a line leaves).

    Returns:
        the number of bytes removed (0 when the file is missing, empty or ends with a newline).
    """
    if not path.is_file():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        # Scan back in blocks for the last newline.
        pos, keep = size, 0
        while pos > 0:
            start = max(0, pos - 65536)
            fh.seek(start)
            block = fh.read(pos - start)
            idx = block.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return size - keep


def file_digest(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_checkpoint(path: Path) -> str | None:
    """Check a checkpoint directory against its manifest.json.

    Returns:
        None when every file the manifest lists exists with the recorded size and SHA-256; otherwise a short reason
        ("no manifest.json", "model.safetensors: 0 bytes, manifest says 3456", "x.pt: checksum differs", ...).
    """
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return f"no {MANIFEST}"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for rel, info in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel}: missing"
        size = f.stat().st_size
        if size != info["size"]:
            return f"{rel}: {size} bytes, manifest says {info['size']}"
        if file_digest(f) != info["sha256"]:
            return f"{rel}: checksum differs from the manifest"
    return None


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest.json of a checkpoint directory (call `verify_checkpoint` first)."""
    return json.loads((path / MANIFEST).read_text(encoding="utf-8"))


def _config_diffs(old: Any, new: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in list(old) + [k for k in new if k not in old]:
            out += _config_diffs(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [(prefix.rstrip("."), old, new)]


#: Settings every resume may change: how fast a run goes (threads) and where its logs are also sent (report_to),
#: never what it computes.
ALWAYS_MAY_CHANGE = ("threads", "report_to")


def _read_run_config(path: Path, renamed: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A run's config.yaml as a mapping, read as data (`config.read_config_file`), the keys an earlier release wrote
    by their old names moved to their new places (`renamed`, {old dotted key: new}: `config.renamed_keys` of the
    verb's config class; `config.move_renamed`, without warnings).

    Raises:
        RunDirError: one line naming the file: not UTF-8, invalid or too deeply nested YAML, not a mapping, a key
            given both by its old and its new name.
    """
    from rewardlab.config import ConfigError, move_renamed, read_config_file

    try:
        return move_renamed(read_config_file(path), renamed or {}, quiet=True)
    except ConfigError as exc:
        raise RunDirError(f"--resume: {exc}; resume a run whose config.yaml this project wrote, or pass "
                          "--overwrite") from None


def check_resume_config(run: RunDir, config_text: str, may_change: Iterable[str] = (),
                        renamed: Mapping[str, str] | None = None) -> list[tuple[str, Any, Any]]:
    """For a resume that continues the same job: the run's config.yaml must hold the same settings as `config_text`
    (the YAML of the resolved config), but for `out` (which may be spelt differently), the dotted keys in
    `may_change` (train: rl.steps, to train on) and ALWAYS_MAY_CHANGE. A config.yaml an earlier release wrote is
    read with its keys `renamed` ({old dotted key: new}, `config.renamed_keys`) first. A run killed before it wrote
    config.yaml gets `config_text` written. Nothing is written otherwise (see `RunDir.apply_config_changes`).

    Returns:
        the allowed changes, (dotted key, the run's value, the new value) each, in config order.
    Raises:
        RunDirError: one line naming every differing key that may not change, with the run's and the new values.
    """
    import yaml

    path = run.path / "config.yaml"
    if not path.is_file():
        run.write_config(config_text)
        return []
    old, new = _read_run_config(path, renamed), yaml.safe_load(config_text) or {}
    allowed = set(may_change) | set(ALWAYS_MAY_CHANGE)
    diffs = [d for d in _config_diffs(old, new) if d[0] != "out"]
    refused = [d for d in diffs if d[0] not in allowed]
    if refused:
        shown = ", ".join(f"{k} (run: {a!r}, now: {b!r})" for k, a, b in refused)
        raise RunDirError(f"--resume: {run.path} was started with other settings: {shown}; resume with its "
                          f"settings ({path}) or pass --overwrite")
    return diffs


def warn(message: str) -> None:
    """A one-line warning on stderr."""
    print(f"rewardlab: warning: {message}", file=sys.stderr, flush=True)


# Locks held by this process, by resolved run path: a second RunDir.start on the same path in one process is refused
# like one from another process (flock on a second descriptor of the same file would not be).
_HELD_LOCKS: dict[str, int] = {}


class RunDir:
    """A run directory. Logs are only ever appended; checkpoints are verified and renamed into place.

    `RunDir(path)` only names the directory (readers, tests, a stage writing into a run it was handed); a verb that
    writes a run opens it with `RunDir.start`, which refuses a directory that already holds a run unless asked to
    resume or overwrite, and locks it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._checked_tails: set[str] = set()
        self._lock_fd: int | None = None
        self._trackers: Any = None

    # --------------------------------------------------------------- opening
    @classmethod
    def start(cls, path: str | Path, *, mode: RunMode = "new", key: str = "out") -> RunDir:
        """Open `path` for writing a run as `mode` says: new, resumed or replacing the run there.

        - new: `path` must be missing or empty (as with HF Trainer's output_dir).
        - resume: `path` must hold a run; every append-only log's torn tail is repaired.
        - overwrite: the run in `path` is deleted first (only a directory holding a rewardlab run, never arbitrary
          files).
        The directory is locked (flock on `.lock`, released when the process exits, so a killed run leaves no
        stale lock) and an event is appended to events.jsonl.

        Raises:
            RunDirError: `path` holds a run and `mode` is "new"; "resume" with no run; "overwrite" of a directory
                holding other files; another process (or this one) is writing the run.
            ValueError: `mode` is not a `RunMode` (`check_mode`).
        """
        check_mode(mode)
        run = cls(path)
        if run.path.exists() and not run.path.is_dir():
            raise RunDirError(f"{key}: {run.path} is a file, not a directory")
        held = run.holds_run()
        if run.path.is_dir():
            run._lock(key)
        try:
            if mode == "resume":
                if not held:
                    raise RunDirError(f"--resume: {run.path} holds no run to resume")
                run.repair_logs()
                run.log_event("resume")
            else:
                contents = run._contents()
                if contents and mode != "overwrite":
                    what = "a run" if held else f"files ({', '.join(sorted(p.name for p in contents)[:3])})"
                    raise RunDirError(f"{key}: {run.path} already holds {what}; pass --resume to continue it or "
                                      f"--overwrite to replace it")
                if contents:
                    if not held:
                        raise RunDirError(f"--overwrite: {run.path} holds files but no rewardlab run; choose "
                                          f"another directory")
                    for entry in contents:
                        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    warn(f"--overwrite: deleted the previous run in {run.path}")
                run.path.mkdir(parents=True, exist_ok=True)
                run._lock(key)
                run.log_event("overwrite" if contents else "start")
        except BaseException:
            run.close()
            raise
        return run

    def _contents(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return [p for p in self.path.iterdir() if p.name != LOCK]

    def holds_run(self) -> bool:
        """Whether the directory holds a rewardlab run (any of config.yaml, summary.json, logs, checkpoints)."""
        return any((self.path / m).exists() for m in RUN_MARKERS)

    def _lock(self, key: str) -> None:
        if self._lock_fd is not None:
            return
        real = str(self.path.resolve())
        if real in _HELD_LOCKS:
            raise RunDirError(f"{key}: {self.path} is already being written by this process")
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirError(f"{key}: {self.path} is in use by another process (pid {holder}; lock "
                              f"{self.path / LOCK})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        _HELD_LOCKS[real] = fd

    def close(self) -> None:
        """Close the attached trackers (`attach_trackers`) and release the directory's lock (also released when the
        process exits). The lock is released even when closing a tracker raises."""
        trackers, self._trackers = self._trackers, None
        try:
            if trackers is not None:
                trackers.close()
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is None:
            return
        for real, fd in list(_HELD_LOCKS.items()):
            if fd == self._lock_fd:
                del _HELD_LOCKS[real]
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- logs
    def write_config(self, text: str) -> None:
        atomic_write_text(self.path / "config.yaml", text)

    def record_config(self, text: str, *, resume: bool, may_change: Iterable[str] = (),
                      renamed: Mapping[str, str] | None = None) -> None:
        """A new run writes its resolved config (`text`, YAML) to config.yaml; a resumed one checks that config.yaml
        holds the same settings but for `out` and the dotted keys in `may_change` (`check_resume_config`, the keys
        an earlier release wrote by their old names read through `renamed`), then writes and logs the changes
        allowed (`apply_config_changes`). A training verb that resumes from a checkpoint uses `resume_training`
        instead (it also checks the step count against the checkpoint first).

        Raises:
            RunDirError: on a resume whose settings differ (one line naming the keys).
        """
        if resume:
            self.apply_config_changes(check_resume_config(self, text, may_change, renamed), renamed)
        else:
            self.write_config(text)

    def apply_config_changes(self, changes: Iterable[tuple[str, Any, Any]],
                             renamed: Mapping[str, str] | None = None) -> None:
        """Write the allowed changes of a resume (`check_resume_config`'s) into config.yaml, so that it states what
        the run now does, and say so: a `config_changed` event each ({key, old, new}) and one warning line
        ("--resume: rl.steps 20 -> 22; written to config.yaml"). A config.yaml that holds keys by their old names
        (`renamed`, {old dotted key: new}) is rewritten with the new ones. Nothing happens otherwise.
        """
        import yaml

        changes = list(changes)
        path = self.path / "config.yaml"
        if not changes and not (renamed and _read_run_config(path) != _read_run_config(path, renamed)):
            return
        config = _read_run_config(path, renamed)
        for key, _, value in changes:
            *parents, last = key.split(".")
            node = config
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        self.write_config(yaml.safe_dump(config, sort_keys=False))
        if not changes:
            return
        for key, old, value in changes:
            self.log_event("config_changed", key=key, old=old, new=value)
        shown = ", ".join(f"{key} {old!r} -> {value!r}" for key, old, value in changes)
        warn(f"--resume: {shown}; written to {path}")

    def log_event(self, event: str, **fields: Any) -> None:
        """Append `{"time": unix seconds, "event": event, "pid": pid, **fields}` to events.jsonl."""
        self._append(EVENTS, [{"time": round(time.time(), 3), "event": event, "pid": os.getpid(), **fields}])

    def repair_logs(self) -> None:
        """Cut a torn last line off every *.jsonl log of the run (logged as a `torn_tail` event and a warning)."""
        if not self.path.is_dir():
            return
        for log in sorted(self.path.glob("*.jsonl")):
            self._repair_tail(log.name)

    def _repair_tail(self, name: str) -> None:
        self._checked_tails.add(name)
        cut = repair_torn_tail(self.path / name)
        if cut:
            warn(f"{self.path / name}: cut a torn last line ({cut} bytes) left by an interrupted write")
            self.log_event("torn_tail", log=name, bytes_removed=cut)

    def _append(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(
            json.dumps({k: _jsonable(v) for k, v in r.items()}, default=str, ensure_ascii=False) + "\n"
            for r in records
        )
        if not lines:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if name not in self._checked_tails:  # first append of this process: never glue onto a torn line
            self._repair_tail(name)
        try:
            with (self.path / name).open("a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise OSError(exc.errno, f"could not append to {self.path / name} ({exc.strerror or exc}); a torn last "
                          "line is cut on --resume") from exc

    def append_jsonl(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records to the run's log `name` (e.g. "labels.jsonl"), one JSON line each, flushed to disk.

        A torn last line left by a crash is cut before the first append. Non-finite floats become null/"inf".
        """
        self._append(name, records)

    def attach_trackers(self, trackers: Any) -> None:
        """Send what the run logs from now on to `trackers` too (`rewardlab.trackers.Trackers`, or any object with
        `log_metrics(step, metrics)`, `log_completions(step, records)` and `close()`): every `log_metrics` line,
        and the records of each `log_samples` call grouped by their "step" as that step's completions. `close`
        closes them. A previously attached one is closed first."""
        if self._trackers is not None and self._trackers is not trackers:
            self._trackers.close()
        self._trackers = trackers

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line `{"step": step, **metrics}` to metrics.jsonl and flush it to disk; then send it to the
        attached trackers (`attach_trackers`)."""
        self._append("metrics.jsonl", [{"step": step, **metrics}])
        if self._trackers is not None:
            self._trackers.log_metrics(step, metrics)

    def log_samples(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append rollout records to samples.jsonl and flush them to disk; then send each step's records (their
        "step" field; records without one are not sent) to the attached trackers as its completions."""
        records = list(records)
        self._append("samples.jsonl", records)
        if self._trackers is not None:
            by_step: dict[int, list[Mapping[str, Any]]] = {}
            for rec in records:
                if isinstance(rec.get("step"), int):
                    by_step.setdefault(rec["step"], []).append(rec)
            for step, group in by_step.items():
                self._trackers.log_completions(step, group)

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        """The records of log `name` in order (a torn last line is ignored); [] when the log is missing."""
        path = self.path / name
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def read_metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl as a list ordered by step; when a step was logged twice, the last line wins.

        A torn last line (a crash mid-write) is ignored.
        """
        by_step: dict[int, dict[str, Any]] = {}
        for rec in self.read_jsonl("metrics.jsonl"):
            by_step[int(rec["step"])] = rec
        return [by_step[s] for s in sorted(by_step)]

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")

    def _log_sizes(self) -> dict[str, int]:
        if not self.path.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in sorted(self.path.glob("*.jsonl")) if p.name != EVENTS}

    def rollback_logs(self, sizes: Mapping[str, int]) -> None:
        """Cut each log back to the size it had at a checkpoint (`sizes`, from its manifest).

        The cut lines are appended to rolled_back/<log> (nothing is deleted) and a `rolled_back` event is logged,
        so that after a resume every step appears once in metrics.jsonl and samples.jsonl. A log that did not exist
        at the checkpoint is moved there whole.
        """
        for path in sorted(self.path.glob("*.jsonl")):
            if path.name == EVENTS:
                continue
            keep = int(sizes.get(path.name, 0))
            size = path.stat().st_size
            if size <= keep:
                continue
            with path.open("rb+") as fh:
                fh.seek(keep)
                tail = fh.read()
                dest = self.path / ROLLED_BACK / path.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                with dest.open("ab") as out:
                    out.write(tail)
                    out.flush()
                    os.fsync(out.fileno())
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())
            self.log_event("rolled_back", log=path.name, bytes=size - keep, lines=tail.count(b"\n"),
                           kept_in=f"{ROLLED_BACK}/{path.name}")

    def write_step_file(self, relative: str, write: Callable[[Path], None]) -> Path:
        """Write the per-step file `relative` (e.g. "rollouts/step-000012.parquet", a name `STEP_FILES` matches)
        atomically (`atomic_write`; `write(tmp)` writes the content). Returns its path."""
        path = self.path / relative
        if _step_of(path) is None:
            raise ValueError(f"{relative}: not a per-step file name (runs.STEP_FILES)")
        atomic_write(path, write)
        return path

    def rollback_step_files(self, step: int) -> None:
        """Move every per-step file (`STEP_FILES`) of a step after `step` into rolled_back/<dir>/ (nothing is
        deleted; one `rolled_back` event per file) and delete the hidden temp files a crash left mid-write, so a
        run resumed from step `step` writes each later step's file once."""
        for folder in STEP_FILES:
            where = self.path / folder
            if not where.is_dir():
                continue
            for path in sorted(where.iterdir()):
                if path.name.startswith("."):
                    path.unlink(missing_ok=True)
                    continue
                at = _step_of(path)
                if at is None or at <= step:
                    continue
                dest = self.path / ROLLED_BACK / folder / path.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, dest)
                self.log_event("rolled_back", log=f"{folder}/{path.name}",
                               kept_in=f"{ROLLED_BACK}/{folder}/{path.name}")

    # --------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int, write: Callable[[Path], None], keep: int | None = None) -> Path:
        """Write a checkpoint with `write(tmp_dir)` and rename it to `checkpoints/step-<step>`.

        After `write`, manifest.json (every file's size and SHA-256, and each log's size now) is written last into
        the temp dir, then the dir is renamed into place: a crash leaves only a hidden temp dir, never a partial
        `step-K`, and a `step-K` whose files were damaged later fails `verify_checkpoint`. With `keep`, older
        checkpoints beyond the `keep` most recent are deleted after the new one is in place.

        Raises:
            OSError: writing failed (e.g. no space left on device); the message names the checkpoint, the temp dir
                is removed, and the previous checkpoints are untouched.
        """
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        final = self.checkpoints / f"{CHECKPOINT_PREFIX}{step}"
        tmp = Path(tempfile.mkdtemp(dir=self.checkpoints, prefix=f".{final.name}."))
        try:
            write(tmp)
            files = {}
            for f in sorted(tmp.rglob("*")):
                if f.is_file():
                    files[str(f.relative_to(tmp))] = {"size": f.stat().st_size, "sha256": file_digest(f)}
            manifest = {"step": step, "time": round(time.time(), 3), "files": files, "logs": self._log_sizes()}
            atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            io_error = as_os_error(exc)
            if io_error is None:
                raise
            previous = self.latest_checkpoint()
            kept = f"the previous checkpoint {previous[1].name} is intact" if previous else "no earlier checkpoint"
            raise OSError(io_error.errno, f"checkpoint {final.name} in {self.checkpoints} could not be written "
                          f"({io_error.strerror or io_error}); {kept}") from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final.exists():  # re-saving a step after a resume: move the old one aside first
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(self.checkpoints)
        if keep is not None:
            for _, path in self.list_checkpoints()[:-keep]:
                shutil.rmtree(path, ignore_errors=True)
        return final

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), oldest first (not verified: see `latest_valid_checkpoint`)."""
        if not self.checkpoints.is_dir():
            return []
        found = []
        for p in self.checkpoints.iterdir():
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX) :].isdigit():
                found.append((int(p.name[len(CHECKPOINT_PREFIX) :]), p))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.list_checkpoints()
        return found[-1] if found else None

    def latest_valid_checkpoint(self) -> tuple[int, Path] | None:
        """The newest checkpoint that passes `verify_checkpoint`, or None when there is none.

        Each newer, invalid one is skipped with a one-line warning naming it and why, and a `checkpoint_invalid`
        event.
        """
        for step, path in reversed(self.list_checkpoints()):
            reason = verify_checkpoint(path)
            if reason is None:
                return step, path
            warn(f"checkpoint {path} is invalid ({reason}); skipping it")
            self.log_event("checkpoint_invalid", checkpoint=path.name, reason=reason)
        return None

    def resume_checkpoint(self, *, steps: int | None = None, steps_key: str = "steps") -> tuple[int, Path]:
        """For a resume: the newest valid checkpoint, with every log rolled back to what it held at that step.

        The hidden temp dirs of checkpoint writes that a crash cut short (`.step-K.*`, never a checkpoint) are
        deleted first, each logged as a `partial_checkpoint_removed` event. With `steps` (the run's step count, the
        setting `steps_key`), a checkpoint past it is refused before any log is touched.

        Raises:
            RunDirError: no checkpoint verifies, or the newest valid one is past `steps` (one line naming the
                directory or the setting).
        """
        if self.checkpoints.is_dir():
            for tmp in sorted(self.checkpoints.glob(f".{CHECKPOINT_PREFIX}*")):
                shutil.rmtree(tmp, ignore_errors=True)
                self.log_event("partial_checkpoint_removed", path=f"checkpoints/{tmp.name}")
        found = self.latest_valid_checkpoint()
        if found is None:
            n = len(self.list_checkpoints())
            detail = f"none of its {n} checkpoint(s) is valid" if n else "it has no checkpoint"
            raise RunDirError(f"--resume: cannot resume {self.path}: {detail}")
        if steps is not None and steps < found[0]:
            raise RunDirError(f"--resume: {steps_key}={steps} is below step {found[0]}, where {found[1]} already is; "
                              f"resume with {steps_key} >= {found[0]} (a run cannot be shortened past a checkpoint)")
        self.rollback_logs(read_manifest(found[1]).get("logs", {}))
        self.rollback_step_files(found[0])
        self.log_event("resume_from", checkpoint=found[1].name, step=found[0])
        return found

    def resume_training(self, text: str, *, may_change: Iterable[str], steps: int, steps_key: str,
                        renamed: Mapping[str, str] | None = None) -> tuple[int, Path]:
        """A training verb's resume, in the order that leaves the directory untouched when it is refused: check the
        config against config.yaml (`check_resume_config`, its keys by old names read through `renamed`), find the
        checkpoint and refuse a step count below it, roll the logs back (`resume_checkpoint`), then write and log
        the allowed changes (`apply_config_changes`).

        Returns:
            (step, path) of the checkpoint to continue from.
        Raises:
            RunDirError: other settings than `may_change`, no valid checkpoint, or `steps` below its step (one line).
        """
        changes = check_resume_config(self, text, may_change, renamed)
        found = self.resume_checkpoint(steps=steps, steps_key=steps_key)
        self.apply_config_changes(changes, renamed)
        return found

    # --------------------------------------------------------------- plots
    def plot(self, keys: Iterable[str], name: str = "metrics.png") -> Path | None:
        """Plot metric curves against step into plots/<name>; returns the path, or None with no metrics."""
        records = self.read_metrics()
        keys = [k for k in keys if any(k in r for r in records)]
        if not records or not keys:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.2 * len(keys)), sharex=True, squeeze=False)
        for ax, key in zip(axes[:, 0], keys):
            pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts])
            ax.set_ylabel(key, fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        fig.tight_layout()
        out = self.path / "plots" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out
