"""The reward executor: input order, errors as values, hard timeouts that kill and replace a worker, pool lifecycle."""

import os
import time
from pathlib import Path

import pytest

from rewardlab.rewards.executor import Executor, TaskError, default_workers, shared_executor


# Pool functions live at module level so they pickle by name.
def square(x):
    return x * x


def pid(_):
    return os.getpid()


def behave(item):
    """item = (what, arg): "value" returns arg; "raise" divides by zero; "hang" writes its pid to the file `arg` and
    sleeps; "die" exits the worker with status 3."""
    what, arg = item
    if what == "raise":
        return 1 / 0
    if what == "hang":
        Path(arg).write_text(str(os.getpid()))
        time.sleep(60)
    if what == "die":
        os._exit(3)
    return arg


def _alive(process_id: int) -> bool:
    try:
        os.kill(process_id, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def executor():
    with Executor(workers=2) as ex:
        yield ex


def test_results_in_input_order(executor):
    assert executor.map(square, [3, 1, 2, 5]) == [9, 1, 4, 25]  # 3*3, 1*1, 2*2, 5*5
    assert executor.map(square, [7, 6, 5, 4, 3], chunk_size=2) == [49, 36, 25, 16, 9]
    assert executor.map(square, []) == []


def test_exception_is_an_error_value_and_the_rest_score(executor):
    out = executor.map(behave, [("value", 1), ("raise", None), ("value", 3)])
    assert out[0] == 1 and out[2] == 3
    assert out[1] == TaskError("exception", "ZeroDivisionError: division by zero")
    assert str(out[1]) == "ZeroDivisionError: division by zero"


def test_hung_item_times_out_its_worker_is_killed_and_replaced(executor, tmp_path):
    marker = tmp_path / "hung.pid"
    out = executor.map(behave, [("value", "a"), ("hang", str(marker)), ("value", "c")], timeout=0.5)
    assert out[0] == "a" and out[2] == "c"
    assert out[1] == TaskError("timeout", "timed out after 0.5 s (worker killed and replaced)")
    hung_pid = int(marker.read_text())
    assert not _alive(hung_pid)  # killed and reaped, not left sleeping
    # the pool still has its two workers: a later call runs, and not on the dead one
    pids = set(executor.map(pid, range(20)))
    assert hung_pid not in pids and 1 <= len(pids) <= 2


def test_dead_worker_is_an_error_value(executor):
    out = executor.map(behave, [("die", None), ("value", 2)])
    assert out == [TaskError("crashed", "worker process died (exit code 3)"), 2]
    assert executor.map(square, [4]) == [16]  # replaced


def test_chunk_with_a_hung_item_is_rerun_item_by_item(executor, tmp_path):
    marker = tmp_path / "hung.pid"
    items = [("value", 1), ("hang", str(marker)), ("value", 3), ("raise", None)]
    out = executor.map(behave, items, timeout=0.3, chunk_size=4)
    # the chunk (limit 4 * 0.3 s) times out; each item then runs alone, so only the hung one is a timeout
    assert out[0] == 1 and out[2] == 3
    assert out[1].kind == "timeout" and out[3].kind == "exception"


def test_pool_is_lazy_reused_and_closed():
    ex = Executor(workers=1)
    assert not ex.started  # nothing runs before the first map
    first = ex.map(pid, range(3))
    assert ex.started and len(set(first)) == 1  # one worker ran all three
    assert ex.map(pid, range(3)) == first  # the same worker process serves the next call
    ex.close()
    assert not ex.started and not _alive(first[0])
    ex.close()  # idempotent
    assert ex.map(square, [2]) == [4]  # a closed executor starts a new pool on demand
    ex.close()


def test_context_manager_closes_the_pool():
    with Executor(workers=1) as ex:
        (worker,) = ex.map(pid, [0])
    assert not ex.started and not _alive(worker)


def test_default_workers_is_the_usable_cpu_count_or_the_runs_threads(monkeypatch):
    import rewardlab.threads

    monkeypatch.setattr(rewardlab.threads, "_applied", None)  # no verb has applied a `threads` setting
    assert default_workers() == len(os.sched_getaffinity(0))
    assert Executor().workers == default_workers()
    monkeypatch.setattr(rewardlab.threads, "_applied", 3)  # a verb ran apply_threads(3)
    assert default_workers() == 3 and Executor().workers == 3


def test_shared_executor_is_one_per_setting():
    assert shared_executor(2) is shared_executor(2)
    assert shared_executor(1) is not shared_executor(2)
    assert shared_executor().workers == default_workers()


@pytest.mark.parametrize("kwargs, message", [({"timeout": 0}, "timeout"), ({"chunk_size": 0}, "chunk_size")])
def test_bad_map_arguments(executor, kwargs, message):
    with pytest.raises(ValueError, match=message):
        executor.map(square, [1], **kwargs)


def test_bad_worker_count():
    with pytest.raises(ValueError, match="workers: expected >= 1, got 0"):
        Executor(workers=0)
