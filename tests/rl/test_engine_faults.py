"""Engine ray's fault tolerance on the session's local Ray cluster (`ray_cluster`): a rollout or reward worker whose
process is SIGKILLed in the middle of a chunk, or while it waits between steps, is replaced, the new rollout worker
loads the published weights, its chunks run again, and the run logs what an undisturbed run logs (ray/* aside); a
chunk whose workers keep dying fails after MAX_RERUNS re-runs with one line naming the worker kind and the chunk."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES

from rewardlab.config import TrainConfig, load_config
from rewardlab.rl.trainer import train

#: A reward imported by path (so every reward worker imports it): dense, and an error for about a third of the items
#: (a failed item inside a live worker is an error in its output, not a death). When the file TRAP exists, the first
#: worker to rename it away writes its pid to PID and waits to be killed: the test kills it in mid-chunk. (Never in
#: the test's own process, DRIVER.)
REWARD = '''
import os, time
TRAP, PID, DRIVER = {trap!r}, {pid!r}, {driver!r}

def dense(completion):
    try:
        if os.getpid() == DRIVER:
            raise FileNotFoundError
        os.rename(TRAP, TRAP + ".sprung")  # one worker, once
    except FileNotFoundError:
        pass
    else:
        with open(PID + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(PID + ".tmp", PID)
        time.sleep(120)
    if ord(completion[:1] or "a") % 3 == 0:
        raise ValueError(f"first character {{completion[:1]!r}}: code a multiple of 3")
    return sum(ord(c) % 2 == 0 for c in completion) / max(1, len(completion))
'''

RUN = [*TINY_OVERRIDES, "task.spec=reasoning_gym:chain_sum", "task.options={size: 40, test_size: 4, min_terms: 2, "
       "max_terms: 2, min_digits: 1, max_digits: 1, template: compact}", "rl.prompts_per_step=4", "rl.group_size=2",
       "rl.sampling.rollout_chunk=4", "rl.sampling.max_new_tokens=4", "rl.steps=3", "rl.lr=5e-2", "threads=1",
       "seed=11", "rl.max_reward_error_frac=null"]
#: Two rollout workers (one chunk each a step) and one reward worker (both chunks of a step: when it dies in the first,
#: the second, queued behind it, fails too and both run again on its replacement).
RAY = ["rl.engine=ray", "rl.ray.rollout_workers=2", "rl.ray.reward_workers=1"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _semantic(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/"))} for m in metrics]


def _kill_when_written(pid_file: Path, killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the process whose pid appears in `pid_file` (a worker waiting in mid-chunk), once."""
    while not stop.is_set():
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.01)


def _trapped_rollout_worker(trap: str, pid_file: str):
    """A RolloutWorker whose generate, on step 2, renames `trap` away (one worker, once), writes its pid and waits to be
    killed in mid-chunk. A local class: Ray ships it to the actors by value."""
    from rewardlab.rl.engines.ray_engine import RolloutWorker

    class Trapped(RolloutWorker):
        def generate(self, rows, n, stream, first_row, weights=None):
            if stream[1] == 2:
                try:
                    os.rename(trap, trap + ".sprung")
                except FileNotFoundError:
                    pass
                else:
                    Path(pid_file + ".tmp").write_text(str(os.getpid()))
                    os.rename(pid_file + ".tmp", pid_file)
                    time.sleep(120)
            return super().generate(rows, n, stream, first_row, weights)

    return Trapped


@pytest.mark.slow  # trains on Ray, restarting 3 workers (in `make test`, within its 90 s of Ray tests)
def test_workers_killed_in_mid_chunk_and_between_steps_are_replaced_and_the_run_logs_what_an_undisturbed_run_logs(
        tmp_path, ray_cluster, monkeypatch):
    from rewardlab.rl.engines import ray_engine

    reward_trap, rollout_trap = tmp_path / "reward.trap", tmp_path / "rollout.trap"
    reward_pid, rollout_pid = tmp_path / "reward.pid", tmp_path / "rollout.pid"
    (tmp_path / "r.py").write_text(REWARD.format(trap=str(reward_trap), pid=str(reward_pid), driver=os.getpid()))
    run = [*RUN, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]"]
    # the undisturbed run, on engine local: engine ray logs the same (test_engine_ray.py), and local is quicker
    train(load_config(TrainConfig, None, [*run, f"out={tmp_path / 'calm'}"]), show_progress=False)

    # The disturbed run: the reward worker killed while it scores step 1's first chunk; a rollout worker killed while
    # it samples a chunk of step 2 (with version 1's weights); rollout worker 1 killed while it waits between steps 2
    # and 3, before version 2 is published.
    monkeypatch.setattr(ray_engine, "RolloutWorker", _trapped_rollout_worker(str(rollout_trap), str(rollout_pid)))
    publish, killed = ray_engine.RayEngine.publish, []

    def kill_then_publish(self, policy, version):
        if version == 2:  # the worker dies before it can load version 2 (publishing sends it to a dead actor)
            pid = ray_cluster.get(self._rollout[1].__ray_call__.remote(lambda worker: os.getpid()))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        publish(self, policy, version)

    monkeypatch.setattr(ray_engine.RayEngine, "publish", kill_then_publish)
    reward_trap.touch()
    rollout_trap.touch()
    stop = threading.Event()
    killers = [threading.Thread(target=_kill_when_written, args=(f, killed, stop), daemon=True)
               for f in (reward_pid, rollout_pid)]
    for k in killers:
        k.start()
    try:
        train(load_config(TrainConfig, None, [*run, *RAY, f"out={tmp_path / 'killed'}"]), show_progress=False)
    finally:
        stop.set()
    assert len(set(killed)) == 3  # three worker processes were SIGKILLed: one reward, two rollout

    calm, hit = _lines(tmp_path / "calm" / "metrics.jsonl"), _lines(tmp_path / "killed" / "metrics.jsonl")
    assert [m["step"] for m in hit] == [1, 2, 3]  # none lost, none twice
    assert _semantic(hit) == _semantic(calm)
    assert calm[0]["policy/grad_norm"] > 0 and calm[1]["policy/grad_norm"] > 0  # steps 2 and 3 need the new weights
    assert [m["ray/worker_restarts"] for m in hit] == [1, 1, 1]
    assert [m["ray/chunk_reruns"] for m in hit] == [2, 1, 1]  # step 1: both of the reward worker's chunks
    samples = _lines(tmp_path / "calm" / "samples.jsonl")
    assert _lines(tmp_path / "killed" / "samples.jsonl") == samples
    # a failed item inside a live worker stays an error of that item, and restarts nothing
    errors = [s["error"] for s in samples if s["error"]]
    assert errors and all("code a multiple of 3" in e for e in errors)


DIES = '''
import os, signal
def dies(completion):
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.slow  # starts 3 workers on Ray (in `make test`, within its 90 s of Ray tests)
def test_a_chunk_whose_workers_keep_dying_fails_after_max_reruns_naming_the_worker_kind_and_the_chunk(
        tmp_path, ray_cluster, monkeypatch):
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines import ray_engine
    from rewardlab.rl.engines.ray_engine import RayEngine
    from rewardlab.types import Rollout

    assert ray_engine.MAX_RERUNS == 3
    monkeypatch.setattr(ray_engine, "MAX_RERUNS", 1)  # a worker starts in seconds: 2 of them, not 4

    pids = tmp_path / "pids"
    (tmp_path / "d.py").write_text(DIES.format(pids=str(pids)))
    cfg = load_config(TrainConfig, None, [*RUN, "rl.engine=ray", "rl.ray.rollout_workers=1", "rl.ray.reward_workers=1",
                                          f"rewards=[{{name: '{tmp_path / 'd.py'}:dies'}}]"])
    engine = RayEngine(cfg, SamplingSettings(max_new_tokens=4, chunk=2), threads=1)
    rollouts = [Rollout(prompt="1+1=", prompt_ids=[1], completion=c, completion_ids=[2], logprobs=[0.0])
                for c in "ab"]  # one chunk
    try:
        with pytest.raises(RuntimeError) as caught:
            engine.score(rollouts)
    finally:
        engine.close()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("rl.engine ray: the reward worker running chunk 0 (rollouts 0-1) died 2 times; gave up "
                              "after 1 re-runs: ")
    assert len(set(pids.read_text().split())) == 2  # the first worker and its one replacement, each killed
