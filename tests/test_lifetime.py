"""rewardlab.lifetime: pool workers get a parent-death SIGKILL (Linux), a worker whose parent is already gone exits,
and a pool started from a short-lived thread keeps its workers after that thread ends (Linux sends the signal when
the forking thread ends). The kills themselves: tests/faults/test_fault_leftover_processes.py."""

import ctypes
import os
import signal
import sys
import threading
import time

import pytest

from rewardlab.lifetime import die_with_parent, in_lasting_thread
from rewardlab.rewards.executor import Executor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def worker_pdeathsig(_item):
    """(pid, parent-death signal) of the worker process that runs it (prctl PR_GET_PDEATHSIG)."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0)
    return os.getpid(), sig.value


def test_executor_workers_die_with_the_process_and_outlive_the_thread_that_started_the_pool():
    ex = Executor(1)
    try:
        got = []
        starter = threading.Thread(target=lambda: got.extend(ex.map(worker_pdeathsig, [0])))
        starter.start()
        starter.join()
        ((pid, sig),) = got
        assert sig == signal.SIGKILL
        time.sleep(0.5)  # a worker forked by the ended thread itself would be dead by now
        assert ex.map(worker_pdeathsig, [0]) == [(pid, signal.SIGKILL)]  # the same worker, still serving
    finally:
        ex.close()


def test_die_with_parent_exits_at_once_when_the_parent_is_not_the_one_that_started_it():
    pid = os.fork()
    if pid == 0:
        die_with_parent(os.getppid() + 1)  # as if the parent had died before the prctl and the child been re-parented
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1


def test_in_lasting_thread_runs_on_one_thread_that_outlives_its_callers():
    names = []
    for _ in range(2):
        caller = threading.Thread(target=lambda: names.append(in_lasting_thread(threading.get_ident)))
        caller.start()
        caller.join()
    assert names[0] == names[1] and names[0] != threading.get_ident()
    assert in_lasting_thread(threading.get_ident) == threading.get_ident()  # the main thread runs it itself
    errors = []

    def fail():
        try:
            in_lasting_thread(lambda: 1 / 0)
        except ZeroDivisionError as exc:
            errors.append(exc)

    caller = threading.Thread(target=fail)
    caller.start()
    caller.join()
    assert len(errors) == 1  # raised in the caller's thread
