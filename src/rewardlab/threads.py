"""CPU threads: how many a run's torch operations and its reward pools use (the `threads` setting of every verb).

torch's default is one intra-op thread per physical core of the machine, whatever share of it this process may use:
two runs on a 2-core machine then each spin 2 OpenMP threads on the same 2 cores, and every step waits on the other
run's threads (0.60 s a step each, against 0.18 s with one thread each). `apply_threads(cfg.threads)` at the start of
a verb sets torch's threads to the run's budget and records it as the default size of the reward pools
(`rewardlab.rewards.executor`, `rewardlab.sandbox`), whose worker processes use one thread each
(`single_thread_worker`).

    apply_threads(None)   # $OMP_NUM_THREADS when set, else the cores in this process's affinity mask
    apply_threads(1)      # one thread: the setting for several runs side by side

`freeze_heap()` after a run has loaded its model, task and reward (the RL trainer, until the run ends, and each Ray
worker): the objects alive then (torch's and transformers' modules, the task's rows: about half a million) leave the
cycle collector's view, so that its full collections, which a training loop's allocations trigger every few steps,
stop costing 0.1-0.25 s each; `gc.unfreeze()` gives them back.
"""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["THREAD_ENV", "apply_threads", "available_cores", "default_threads", "freeze_heap",
           "single_thread_worker", "thread_budget"]

#: Environment variables that size the thread pools of OpenMP, MKL, OpenBLAS and numexpr.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")

_applied: int | None = None  # the budget a verb set with apply_threads, None before


def available_cores() -> int:
    """The number of CPUs this process may run on: its affinity mask (taskset, cgroup cpusets), else the machine's
    CPU count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The default of the `threads` setting: $OMP_NUM_THREADS when it holds a positive integer (the convention of
    OpenMP and torch: a user who set it has chosen), else `available_cores()`."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return available_cores()


def apply_threads(threads: int | None) -> int:
    """Use `threads` CPU threads (None: `default_threads()`) for this process's torch operations, and make it the
    default size of the reward pools created afterwards (`thread_budget`).

    Sets torch's intra-op threads (`torch.set_num_threads`), and its inter-op threads where torch still allows it
    (only before the process's first inter-op parallel work; later calls keep the count it has).

    Returns:
        the number of threads applied.
    Raises:
        ValueError: `threads` below 1 (one line naming `threads`).
    """
    global _applied
    n = default_threads() if threads is None else threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"threads: expected an integer >= 1 (or null for the cores this process may use), got "
                         f"{threads!r}")
    import torch

    torch.set_num_threads(n)
    if torch.get_num_interop_threads() != n:
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:  # inter-op work has started (or it was set before): torch allows it once, early
            pass
    _applied = n
    return n


def thread_budget() -> int:
    """The default size of a reward pool: the threads a verb applied (`apply_threads`), else `available_cores()`
    (library use that applied none)."""
    return _applied if _applied is not None else available_cores()


def single_thread_worker() -> None:
    """Initializer of a pool's worker process: one thread for the numeric libraries it runs (the pool's size is the
    parallelism; N workers each spinning N threads would oversubscribe the cores N-fold). Sets THREAD_ENV to 1 for
    libraries the worker loads later, and torch's threads to 1 when torch is already loaded (a forked worker)."""
    for name in THREAD_ENV:
        os.environ[name] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def freeze_heap() -> int:
    """Move every object the cycle collector tracks now into its permanent generation (`gc.freeze`), after a run's
    set-up: a full collection then traverses only what the loop allocated since, instead of the ~0.5 M objects of
    torch, transformers and the task (a 0.1-0.25 s pause every few steps of the tiny model's RL loop, in the driver
    and in each Ray worker). Frozen objects are still freed when their reference count drops to zero; only garbage
    cycles among them are no longer collected. Returns the number of frozen objects (`gc.get_freeze_count`)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
