"""SIGKILL `rewardlab train` on engine ray (the driver: the learner and the owner of the worker actors) at a seeded
random moment, resume it with --resume, and get the undisturbed run's steps back: none lost, none twice, the same
metrics (timings and ray/* aside) and the same samples. The child joins the session's local Ray cluster by address;
its actors die with it, and the resumed driver builds new ones."""

import json
import random

import pytest

from cli_kill import check_every_log, count_lines, kill_after_line, read_strict
from conftest import TINY_OVERRIDES
from rewardlab.cli import main

STEPS, SAVE_EVERY = 6, 2

REWARD = ("def digits(completion):\n"
          "    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n")


def _args(tmp_path, out, address):
    return ["train", f"--out={out}", *TINY_OVERRIDES, "task.spec=reasoning_gym:chain_sum",
            "task.options={size: 40, test_size: 4, min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, "
            "template: compact}", f"rewards=[{{name: '{tmp_path / 'r.py'}:digits'}}]", f"rl.steps={STEPS}",
            "rl.prompts_per_step=4", "rl.group_size=2", "rl.sampling.rollout_chunk=4", "rl.sampling.max_new_tokens=4",
            "rl.lr=5e-2", "threads=1", "seed=7", f"save_every={SAVE_EVERY}", "keep_checkpoints=2", "rl.engine=ray",
            "rl.ray.rollout_workers=2", "rl.ray.reward_workers=2", f"rl.ray.address={address}"]


def _semantic(metrics):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/"))} for m in metrics]


@pytest.mark.slow
@pytest.mark.ray_long
def test_train_on_engine_ray_killed_and_resumed_logs_what_the_undisturbed_run_logs(tmp_path, ray_cluster):
    (tmp_path / "r.py").write_text(REWARD)  # imported by path in every reward worker
    address = ray_cluster.get_runtime_context().gcs_address
    rng = random.Random(22)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_args(tmp_path, a, address), "--no-progress"]) == 0  # this process: the session's connection

    # kill the child after metrics line k (step SAVE_EVERY's checkpoint exists) plus a fraction of a step
    kill_after_line(_args(tmp_path, b, address), b / "metrics.jsonl", rng.randint(SAVE_EVERY + 1, STEPS - 2), rng,
                    timeout=300)
    assert not (b / "summary.json").exists() and count_lines(b / "metrics.jsonl") < STEPS
    checkpoint = max(int(p.name.split("-")[1]) for p in (b / "checkpoints").glob("step-*"))
    assert main([*_args(tmp_path, b, address), "--resume", "--no-progress"]) == 0

    check_every_log(b)
    got, expected = read_strict(b / "metrics.jsonl"), read_strict(a / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))  # none lost, none twice
    assert expected[0]["policy/grad_norm"] > 0  # the published weights change from step to step
    assert {m["ray/worker_restarts"] for m in expected} == {0}  # no worker of the undisturbed run died
    assert _semantic(got) == _semantic(expected)
    assert read_strict(b / "samples.jsonl") == read_strict(a / "samples.jsonl")
    assert [e["step"] for e in read_strict(b / "events.jsonl") if e["event"] == "resume_from"] == [checkpoint]
    summary = json.loads((b / "summary.json").read_text())
    assert summary["resumed_from"] == checkpoint and summary["steps_done"] == STEPS
