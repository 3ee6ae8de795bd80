"""Fault injection: a reward's worker process killed while a batch is in flight.

The math reward checks answers in a pebble process pool (rewards/executor.py); the code reward runs programs through
the sandbox launcher, one process per program. For each way a worker can die, the tests check that
- the items it was working on report an explicit error naming the cause (RewardOutput.error), scored 0 under
  on_error="zero" and counted in the step metrics (reward/errors, reward/errors/<name>);
- every other item of the batch is scored as it would be without the fault;
- the next batch through the same reward object is scored normally (the pool or launcher recovered), and no worker
  of a broken pool is left behind.

The math workers run `hooked_verify` below (monkeypatched in for math-verify's check): it behaves like the real
check except for a few magic answers that make the worker die, wait to be killed, or die holding the pool's lock.
Workers are forked from this process after it imported this module, so they find the hook by name.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rewardlab.rewards import build_reward
from rewardlab.rewards import executor as executor_module
from rewardlab.rewards import math as math_module
from rewardlab.sandbox import runner as sandbox_module
from rewardlab.rewards.executor import shared_executor
from rewardlab.rl.rollouts import step_metrics
from rewardlab.types import Rollout

#: A pool of its own (shared_executor keys pools by worker count), so that other test files' pools are untouched.
WORKERS = 3
#: math-verify's check itself, taken before any test replaces it.
REAL_VERIFY = math_module.verify_answer
KILLED = "math: worker process died (killed by SIGKILL)"


def hooked_verify(item):
    """math-verify's check, except for these answers (the extracted prediction):
    "DIE": the worker SIGKILLs itself; "WAIT:<file>": it writes its pid to <file> and sleeps until killed;
    "LOCK-AND-DIE": it takes the pool's channel lock (as a worker reading a task or writing a result does), then
    SIGKILLs itself holding it - the worst moment for the kernel's OOM killer to pick it."""
    prediction = item[1]
    if prediction == "DIE":
        os.kill(os.getpid(), signal.SIGKILL)
    if prediction.startswith("WAIT:"):
        Path(prediction[5:]).write_text(str(os.getpid()))
        time.sleep(60)
    if prediction == "LOCK-AND-DIE":
        frame = sys._getframe()
        while frame.f_code.co_name != "process_tasks":  # pebble's worker loop holds the worker's channel
            frame = frame.f_back
        frame.f_locals["channel"].mutex.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    return REAL_VERIFY(item)


def rollout(completion: str, answer: str = "", row: dict | None = None) -> Rollout:
    return Rollout(prompt="p", prompt_ids=[1], completion=completion, completion_ids=[2], logprobs=[0.0],
                   row=row if row is not None else {"answer": answer})


#: (completion, reference) -> score without faults: 1/2 = 0.5, 4 != 3, 1,000 = 1000, 2*sqrt(2) = sqrt(8), 7 != 8.
BATCH = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{4}", "3"), (r"\boxed{1,000}", "1000"),
         (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"), (r"\boxed{7}", "8")]
SCORES = [1.0, 0.0, 1.0, 1.0, 0.0]


def batch_with(victims: dict[int, str]) -> list[Rollout]:
    """BATCH with the magic answers `victims` (position -> prediction) inserted at their positions."""
    items = [rollout(c, a) for c, a in BATCH]
    for position in sorted(victims):
        items.insert(position, rollout(rf"\boxed{{{victims[position]}}}", "1"))
    return items


@pytest.fixture
def math_reward(monkeypatch):
    """The math reward as a run builds it (on_error="zero"), checking with hooked_verify, and its executor."""
    reward = build_reward([{"name": "math", "timeout": 5.0, "workers": WORKERS}], on_error="zero")
    monkeypatch.setattr(math_module, "verify_answer", hooked_verify)
    yield reward, shared_executor(WORKERS)


def pool_workers(executor) -> list[int]:
    """Pids of the executor's current pebble workers (pebble's worker manager holds them)."""
    return sorted(executor._pool._pool_manager.worker_manager.workers)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def check_batch(reward, rollouts: list[Rollout], outputs, victims: dict[int, str]) -> None:
    """The victims' outputs are errors `victims[position]`, scored 0 and counted; the rest score as SCORES."""
    assert [o.error for i, o in enumerate(outputs) if i not in victims] == [None] * len(SCORES)
    assert [o.score for i, o in enumerate(outputs) if i not in victims] == SCORES
    for position, error in victims.items():
        assert (outputs[position].score, outputs[position].error) == (0.0, error)
    metrics = step_metrics(rollouts, outputs, group_size=len(rollouts))
    assert metrics["reward/errors"] == len(victims)
    assert metrics.get("reward/errors/math", 0.0) == len(victims)


def check_next_batch(reward) -> None:
    rollouts = batch_with({})
    outputs = reward(rollouts)
    assert [o.score for o in outputs] == SCORES and all(o.error is None for o in outputs)


# -------------------------------------------------------------------------------------------- the math pool
@pytest.mark.parametrize("how", ["the worker kills itself", "killed from outside", "two killed from outside"])
def test_math_worker_killed_while_checking_an_item(math_reward, tmp_path, how):
    reward, executor = math_reward
    check_next_batch(reward)  # the pool is up
    if how == "the worker kills itself":
        answers = {2: "DIE"}
    else:
        answers = {1: f"WAIT:{tmp_path / 'a.pid'}"}
        if how == "two killed from outside":
            answers[4] = f"WAIT:{tmp_path / 'b.pid'}"
    pid_files = [Path(a[5:]) for a in answers.values() if a.startswith("WAIT:")]

    def kill_when_waiting():
        for pid_file in pid_files:
            assert wait_until(pid_file.exists)
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_when_waiting)
    killer.start()
    rollouts = batch_with(answers)
    outputs = reward(rollouts)
    killer.join()
    check_batch(reward, rollouts, outputs, {position: KILLED for position in answers})
    check_next_batch(reward)


def test_idle_math_worker_killed_between_batches(math_reward):
    """pebble gives up a pool when a worker dies while no item is running ("All workers expired"); the executor
    replaces the pool, and stops what is left of the old one."""
    reward, executor = math_reward
    check_next_batch(reward)
    old = pool_workers(executor)
    os.kill(old[0], signal.SIGKILL)
    assert wait_until(lambda: not executor._pool.active, 5.0)  # pebble has noticed
    check_next_batch(reward)
    assert [pid for pid in old if alive(pid)] == []  # the old pool's other workers are gone, not leaked
    assert not set(old) & set(pool_workers(executor))


def test_math_worker_killed_before_any_item_started(math_reward):
    """A worker dies while the batch's items wait in the pool's queue, none started: pebble aborts every item of
    the pool ("All workers expired"). None was the dead worker's, so every one is run again on a fresh pool."""
    reward, executor = math_reward
    check_next_batch(reward)
    workers = pool_workers(executor)
    for pid in workers:  # frozen: they take no item, so no item is running when one of them dies
        os.kill(pid, signal.SIGSTOP)
    outputs: list = []
    rollouts = batch_with({})
    scorer = threading.Thread(target=lambda: outputs.extend(reward(rollouts)))
    try:
        scorer.start()
        time.sleep(0.3)  # the items are in the pool's queue
        os.kill(workers[0], signal.SIGKILL)
        assert wait_until(lambda: not executor._pool.active or not scorer.is_alive(), 5.0)
    finally:
        for pid in workers[1:]:
            os.kill(pid, signal.SIGCONT)
    scorer.join(timeout=60)
    check_batch(reward, rollouts, outputs, {})
    check_next_batch(reward)


def test_math_worker_killed_holding_the_pool_lock(math_reward, monkeypatch):
    """A worker dies holding the lock every worker takes to read a task and write a result: the other workers
    wait for it forever (pebble gives up after 60 s). The executor sees no result arrive for item timeout + grace,
    restarts the pool and runs the unfinished items again."""
    monkeypatch.setattr(executor_module, "_STALL_GRACE", 2.0, raising=False)
    _, executor = math_reward
    reward = build_reward([{"name": "math", "timeout": 1.0, "workers": WORKERS}], on_error="zero")  # stuck at 3 s
    check_next_batch(reward)
    rollouts = batch_with({0: "LOCK-AND-DIE"})
    start = time.monotonic()
    outputs = reward(rollouts)
    assert time.monotonic() - start < 30  # far below pebble's 60 s lock timeout
    check_batch(reward, rollouts, outputs, {0: KILLED})
    check_next_batch(reward)


# ----------------------------------------------------------------------------------------- the code sandbox
CODE_ROW = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"  # fails both asserts: score 0


def name_self(marker: str) -> str:
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"


def pids_named(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if Path(f"/proc/{name}/comm").read_text().strip() == marker and alive(int(name)):
                    found.append(int(name))
            except OSError:
                continue
    return found


def code_reward(isolation: str = "auto", strict: bool = True):
    return build_reward([{"name": "code", "timeout": 20.0, "test_timeout": 20.0, "workers": 4,
                          "isolation": isolation, "strict": strict}], on_error="zero")


def code_batch(quick: str, slow: str, seconds: float) -> list[Rollout]:
    """[correct, slow, wrong, slow]: the quick ones finish at once, the slow ones (correct) sleep `seconds` first."""
    slow_source = name_self(slow) + f"import time\ntime.sleep({seconds})\n" + CORRECT
    return [rollout(name_self(quick) + CORRECT, row=CODE_ROW), rollout(slow_source, row=CODE_ROW),
            rollout(name_self(quick) + WRONG, row=CODE_ROW), rollout(slow_source, row=CODE_ROW)]


def check_code_batch(rollouts, outputs, errors: dict[int, str]) -> None:
    assert [(o.score, o.error) for o in (outputs[0], outputs[2])] == [(1.0, None), (0.0, None)]
    for position, error in errors.items():
        assert (outputs[position].score, outputs[position].error) == (0.0, error)
    metrics = step_metrics(rollouts, outputs, group_size=len(rollouts))
    assert metrics["reward/errors"] == len(errors) and metrics["reward/errors/code"] == len(errors)


def run_and_kill(reward, rollouts, slow: str, quick: str, victims) -> list:
    """Score `rollouts` in a thread; once the quick programs are done and both slow ones run, SIGKILL the pids
    `victims()` returns. Returns the outputs."""
    outputs: list = []
    scorer = threading.Thread(target=lambda: outputs.extend(reward(rollouts)))
    scorer.start()
    assert wait_until(lambda: len(pids_named(slow)) == 2 and not pids_named(quick))
    time.sleep(0.3)  # the launcher has answered for the quick ones
    for pid in victims():
        os.kill(pid, signal.SIGKILL)
    scorer.join(timeout=60)
    assert not scorer.is_alive()
    return outputs


def test_sandbox_launcher_killed_mid_batch():
    reward = code_reward()
    (warm,) = reward([rollout(CORRECT, row=CODE_ROW)])
    assert warm.score == 1.0
    quick, slow = "rl" + uuid.uuid4().hex[:12], "rl" + uuid.uuid4().hex[:12]
    rollouts = code_batch(quick, slow, 60)
    launcher = sandbox_module._launcher(sys.executable).proc.pid
    outputs = run_and_kill(reward, rollouts, slow, quick, lambda: [launcher])
    error = "code: sandbox: the launcher exited (killed by SIGKILL)"
    check_code_batch(rollouts, outputs, {1: error, 3: error})
    assert wait_until(lambda: not pids_named(slow), 5.0)  # its sandboxes died with it
    (after,) = reward([rollout(CORRECT, row=CODE_ROW)])  # a fresh launcher
    assert (after.score, after.error) == (1.0, None)
    assert sandbox_module._launcher(sys.executable).proc.pid != launcher


def test_sandbox_supervisor_killed_mid_batch():
    """Process isolation runs each program under a supervisor process (the one that enforces its limits): killing
    it loses that program's status, which is the reward's error, not the program's failure. The lenient harness,
    so that the program whose parent is killed is the sandbox's own (under strict mode its parent is the tests'
    process, whose death is the program's failure, tests/faults/test_fault_hostile_code.py)."""
    reward = code_reward("process", strict=False)
    quick, slow = "rl" + uuid.uuid4().hex[:12], "rl" + uuid.uuid4().hex[:12]
    rollouts = code_batch(quick, slow, 3)

    def supervisors():
        program = pids_named(slow)[0]
        return [int(Path(f"/proc/{program}/stat").read_text().rsplit(")", 1)[1].split()[1])]  # its parent

    outputs = run_and_kill(reward, rollouts, slow, quick, supervisors)
    lost = "code: sandbox: the program's status was lost (its supervisor was killed by SIGKILL)"
    victim, other = (1, 3) if outputs[1].error else (3, 1)
    check_code_batch(rollouts, outputs, {victim: lost})
    assert (outputs[other].score, outputs[other].error) == (1.0, None)  # the other slow one finished normally
    assert pids_named(slow) == []  # the victim's program died with its supervisor
    (after,) = reward([rollout(CORRECT, row=CODE_ROW)])
    assert (after.score, after.error) == (1.0, None)
