"""The reward executor: run a picklable function over items in a process pool with a hard per-item wall timeout.

Rewards whose checker can hang or cannot time itself out safely (math-verify uses `signal.alarm`, which works only in
a main thread) hand their items to an `Executor`. Each item runs in a worker process (pebble's `ProcessPool`); an
item that runs past its timeout is killed together with its worker, and pebble starts a fresh worker in its place.
Every item comes back, in input order, either as the function's return value or as a `TaskError` that names the
cause - never as a silent 0.

A worker that dies (the OOM killer, a segfault, a kill) fails only the item it was running ("crashed"). pebble gives
up the whole pool when a worker dies while no item runs, and its workers wait forever when one dies holding the
pool's channel lock (as while reading a task or writing a result); `map` restarts such a pool - it is also
restarted when no result arrives for the item timeout plus `_STALL_GRACE` seconds - and runs the items it had not
finished once more on a fresh one. The workers of a broken pool are stopped, not left behind.

No worker outlives the process that started the pool: each dies with it (`rewardlab.lifetime.die_with_parent`, a
parent-death SIGKILL on Linux), also when that process is SIGKILLed while the worker runs an item; the first workers
are forked from a thread that lasts as long as the process (`rewardlab.lifetime.in_lasting_thread`).

    with Executor(workers=2) as ex:
        results = ex.map(check, items, timeout=5.0)      # [value | TaskError, ...] in input order

`shared_executor()` gives one process-wide pool per (workers, start_method), created lazily on the first `map`,
reused across calls and rewards, and shut down at interpreter exit.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from pebble import ProcessExpired, ProcessPool

from rewardlab.lifetime import die_with_parent, in_lasting_thread
from rewardlab.sandbox import default_workers  # one definition for both pools
from rewardlab.threads import single_thread_worker

__all__ = ["Executor", "TaskError", "default_workers", "shared_executor"]

#: TaskError kinds.
TIMEOUT, EXCEPTION, CRASHED = "timeout", "exception", "crashed"
#: Seconds beyond a task's own timeout after which a pool that returned no result is taken as stuck. A healthy pool
#: finishes some started task within its timeout plus pebble's 3 s kill grace and a worker's restart.
_STALL_GRACE = 10.0


@dataclass(frozen=True)
class TaskError:
    """Why one item has no result.

    Attributes:
        kind: "timeout" (ran past the per-item wall timeout; its worker was killed and replaced), "exception" (the
            function raised) or "crashed" (the worker process died, e.g. killed by the OOM killer or a segfault, or
            the pool failed twice while the item waited).
        message: one line naming the cause, e.g. "timed out after 5 s (worker killed and replaced)",
            "worker process died (killed by SIGKILL)" or "ZeroDivisionError: division by zero".
    """

    kind: str
    message: str

    def __str__(self) -> str:
        return self.message


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.splitlines()[0] if text.strip() else type(exc).__name__


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[tuple[bool, Any]]:
    """Worker side of a chunk: (True, value) or (False, one-line exception) per item, so one failing item does not
    discard the others' results."""
    out: list[tuple[bool, Any]] = []
    for item in chunk:
        try:
            out.append((True, fn(item)))
        except Exception as exc:  # noqa: BLE001 - returned as an explicit error value
            out.append((False, _one_line(exc)))
    return out


def _init_worker(parent_pid: int | None) -> None:
    """Initializer of every pool worker: die with the pool's process (see the module docstring), one thread."""
    die_with_parent(parent_pid)
    single_thread_worker()


def _stop_pool(pool: ProcessPool) -> None:
    pool.stop()  # terminates the workers; map() has already collected every result it waits for
    pool.join(timeout=10)


class Executor:
    """A lazily created, reusable pebble process pool with a hard per-item wall timeout.

    Args:
        workers: worker processes, one thread each (`rewardlab.threads.single_thread_worker`); default: the run's
            `threads` setting, else the CPUs this process may use (`default_workers()`).
        start_method: multiprocessing start method ("fork", "forkserver", "spawn"); default: the platform default
            ("fork" on Linux up to Python 3.13). With "spawn"/"forkserver" the function must be importable by name.

    The pool starts on the first `map` (workers import what the function needs on their first item), is reused by
    later calls, and is shut down by `close()`, by leaving a `with` block, when the executor is garbage collected,
    or at interpreter exit, whichever comes first. `map` may be called again after `close()`: it starts a new pool.

    Raises:
        ValueError: workers < 1.
    """

    def __init__(self, workers: int | None = None, *, start_method: str | None = None) -> None:
        self.workers = default_workers() if workers is None else int(workers)
        if self.workers < 1:
            raise ValueError(f"workers: expected >= 1, got {workers}")
        self.start_method = start_method
        self._pool: ProcessPool | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def _get_pool(self) -> ProcessPool:
        with self._lock:
            if self._pool is None or not self._pool.active:
                if self._finalizer is not None:  # a pool pebble gave up: stop the workers it left running
                    self._finalizer()
                context = multiprocessing.get_context(self.start_method)
                # A forkserver's children are the fork server's: their parent is not this process.
                parent = None if context.get_start_method() == "forkserver" else os.getpid()
                self._pool = ProcessPool(max_workers=self.workers, context=context, initializer=_init_worker,
                                         initargs=(parent,))
                pool = self._pool
                in_lasting_thread(lambda: pool.active)  # pebble forks the first workers when the pool first starts
                # Runs at close(), at garbage collection or at interpreter exit (atexit), whichever is first; it
                # holds the pool, not the executor, so it does not keep the executor alive.
                self._finalizer = weakref.finalize(self, _stop_pool, self._pool)
            return self._pool

    @property
    def started(self) -> bool:
        """True while a pool is running (after the first `map`, before `close`)."""
        return self._pool is not None and self._pool.active

    def close(self) -> None:
        """Stop the workers and release the pool. Idempotent."""
        with self._lock:
            if self._finalizer is not None:
                self._finalizer()  # calls _stop_pool once
            self._pool, self._finalizer = None, None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ work
    def map(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        timeout: float | None = 10.0,
        chunk_size: int = 1,
    ) -> list[Any]:
        """Run `fn(item)` for every item in the pool; results in input order.

        Args:
            fn: a picklable one-argument function (module level); the items must be picklable too.
            items: the inputs.
            timeout: hard wall-clock limit per item, seconds, counted from when a worker starts it; None: no limit.
                An item past its limit is killed with its worker (SIGTERM, then SIGKILL after 3 s) and a new worker
                takes its place.
            chunk_size: items sent to a worker as one task (fewer round trips for cheap items). A chunk gets
                `timeout * len(chunk)`; if it times out or its worker dies, each of its items is run again on its
                own with `timeout`, so only the guilty item gets the error (worst case for a hung item:
                `timeout * (chunk_size + 1)` seconds).
        Returns:
            One entry per item: `fn(item)`'s value, or a `TaskError` (timeout, exception or crashed worker).
        Raises:
            ValueError: timeout <= 0 or chunk_size < 1.
        """
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout: expected a positive number of seconds or None, got {timeout}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
        items = list(items)
        if not items:
            return []
        results: list[Any] = [None] * len(items)
        chunks = [(s, min(s + chunk_size, len(items))) for s in range(0, len(items), chunk_size)]
        rerun: list[int] = []  # items of a multi-item chunk that timed out or crashed: run each alone
        why = ""
        for _attempt in range(2):  # a chunk the pool failed on (not the chunk's fault) gets one more try
            chunks, why = self._run(fn, items, chunks, timeout, results, rerun)
            if not chunks:
                break
        for start, end in chunks:  # the pool failed on them twice
            results[start:end] = [TaskError(CRASHED, why)] * (end - start)
        if rerun:
            for i, value in zip(rerun, self.map(fn, [items[i] for i in rerun], timeout=timeout, chunk_size=1)):
                results[i] = value
        return results

    def _run(self, fn: Callable[[Any], Any], items: list[Any], chunks: list[tuple[int, int]], timeout: float | None,
             results: list[Any], rerun: list[int]) -> tuple[list[tuple[int, int]], str]:
        """Run `chunks` ([start, end) ranges of `items`) on the pool, filling `results` and `rerun`. Returns the
        chunks left unfinished because the pool itself failed (pebble gave it up, or it stopped answering; it is
        then stopped), and why; ([], "") when every chunk came back."""
        pool = self._get_pool()
        futures = {}
        try:
            for start, end in chunks:
                task_timeout = None if timeout is None else timeout * (end - start)
                futures[pool.schedule(_run_chunk, args=(fn, items[start:end]), timeout=task_timeout)] = (start, end)
        except RuntimeError as exc:  # pebble gave the pool up while we scheduled (a worker died just now)
            self.close()
            return chunks, f"the worker pool failed ({_one_line(exc)})"
        longest = max(end - start for start, end in chunks)
        stall = None if timeout is None else timeout * longest + _STALL_GRACE
        lost: list[tuple[int, int]] = []
        why = ""
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=stall, return_when=FIRST_COMPLETED)
            if not done:  # no result for `stall` seconds: the pool is stuck (e.g. a worker died holding its lock)
                lost.extend(futures[f] for f in pending)
                why = f"the worker pool stopped answering (no result for {stall:g} s)"
                break
            for future in done:
                start, end = futures[future]
                try:
                    values = future.result()
                except (BrokenProcessPool, RuntimeError) as exc:  # the pool failed, not this chunk
                    lost.append((start, end))
                    why = f"the worker pool failed ({_one_line(exc)})"
                    continue
                except Exception as exc:  # noqa: BLE001 - every failure becomes an explicit error value
                    error = self._error(exc, timeout)
                    if end - start > 1 and error.kind in (TIMEOUT, CRASHED):
                        rerun.extend(range(start, end))  # find the guilty item by running each alone
                    else:
                        results[start:end] = [error] * (end - start)
                    continue
                for k, (ok, value) in enumerate(values):
                    results[start + k] = value if ok else TaskError(EXCEPTION, value)
        if lost:
            self.close()  # stop what is left of the pool; the next _get_pool starts a fresh one
        return sorted(lost), why

    @staticmethod
    def _error(exc: BaseException, timeout: float | None) -> TaskError:
        if isinstance(exc, FutureTimeoutError):
            return TaskError(TIMEOUT, f"timed out after {timeout:g} s (worker killed and replaced)")
        if isinstance(exc, ProcessExpired):
            code = exc.exitcode
            if code is not None and code < 0 and -code in signal.Signals._value2member_map_:
                return TaskError(CRASHED, f"worker process died (killed by {signal.Signals(-code).name})")
            return TaskError(CRASHED, f"worker process died (exit code {code})")
        return TaskError(EXCEPTION, _one_line(exc))


_SHARED: dict[tuple[int, str | None], Executor] = {}
_SHARED_LOCK = threading.Lock()


def shared_executor(workers: int | None = None, start_method: str | None = None) -> Executor:
    """The process-wide executor for (workers, start_method), so rewards share one pool instead of one each.

    Created on first use; its pool starts on the first `map` and stops at interpreter exit.
    """
    key = (default_workers() if workers is None else int(workers), start_method)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = Executor(key[0], start_method=start_method)
        return _SHARED[key]
