"""Worker processes die with the process that started them, however it ends (SIGKILL, SIGTERM, a crash).

A pool worker (the reward executor's and `ToolEnv`'s pebble workers) calls `die_with_parent(pid)` first thing: on
Linux it asks the kernel to SIGKILL it when its parent goes (prctl PR_SET_PDEATHSIG), then checks that its parent is
still `pid` - the parent may have died between the fork and the prctl, and then the worker exits at once. So a
worker busy on an item (a math-verify call that never returns, a tool in an endless loop) does not outlive a killed
trainer, which was the one enforcing the item's timeout. SIGKILL, because a worker stuck in C code (a huge integer
power) runs no Python signal handler.

Linux sends the parent-death signal when the *thread* that forked the worker ends, not the whole process. So pools
start their workers through `in_lasting_thread`: in the main thread as is, else on one daemon thread kept for the
process's life - never on a caller's short-lived thread (a reward's ThreadPoolExecutor, the prefetch thread), whose
end would kill workers that are still in use. pebble forks replacement workers from the pool's manager thread, which
lives as long as the pool.

Elsewhere (macOS, Windows) there is no parent-death signal and `die_with_parent` does nothing: when the trainer is
killed, an idle pebble worker still exits (its task channel reaches end of file), but a worker busy on an item runs
until the item returns.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["PDEATHSIG_SUPPORTED", "die_with_parent", "in_lasting_thread"]

_T = TypeVar("_T")

#: True where the kernel has a parent-death signal (Linux).
PDEATHSIG_SUPPORTED = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None) -> bool:
    """Have the kernel SIGKILL this process when its parent (the thread that forked it) ends; Linux only.

    Args:
        parent_pid: the pid the parent had when it started this process; when the parent is no longer it (it died
            before the prctl took effect, and this process was re-parented), this process exits at once with status
            1. None: no such check (a forkserver's child, whose parent is the fork server).
    Returns:
        True when the signal is armed; False where the platform has none (nothing is done).
    Raises:
        OSError: the prctl call failed.
    """
    if not PDEATHSIG_SUPPORTED:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL), zero, zero, zero) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)  # the parent is already gone: the signal will never come
    return True


class _LastingThread:
    """One daemon thread that runs the callables given to it, for the life of the process that started it."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="rewardlab-spawner", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            fn, future = self.jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)


_LASTING: _LastingThread | None = None
_LASTING_LOCK = threading.Lock()


def in_lasting_thread(fn: Callable[[], _T]) -> _T:
    """`fn()`, run on a thread that lasts as long as this process: the calling thread when it is the main thread,
    else a daemon thread kept for that purpose. Pools start their workers this way (see the module docstring).

    Returns fn's value; raises what it raises.
    """
    global _LASTING
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _LASTING_LOCK:
        if _LASTING is None:
            _LASTING = _LastingThread()
        lasting = _LASTING
    future: Future = Future()
    lasting.jobs.put((fn, future))
    return future.result()


def _forget_lasting_thread() -> None:  # a forked child has neither the thread nor, safely, the lock
    global _LASTING, _LASTING_LOCK
    _LASTING, _LASTING_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lasting_thread)
