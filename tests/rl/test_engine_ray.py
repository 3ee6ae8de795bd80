"""Engine ray on one local Ray cluster (the session's `ray_cluster`): for a seed and rl.sampling.rollout_chunk, 1 and 2
rollout and reward workers log the rollouts, rewards and metrics.jsonl values (timings and ray/* aside) of engine local,
bit for bit, on a single-turn task and on env:guess_number, and with model.lora (only the adapter published); published
weights are counted; a reward's errors come back as errors; a user's environment named by its file runs on the
workers."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_ARCH, TINY_OVERRIDES
from user_env_source import UNIT_GAME

from rewardlab.config import TrainConfig, load_config
from rewardlab.policy import load_policy
from rewardlab.rewards import RewardError
from rewardlab.rl.trainer import train

#: A reward imported by path, so each reward worker imports it too: the fraction of characters of even code (dense,
#: so groups are rarely tied); an error for a completion whose first character's code is a multiple of 3 (about a
#: third of them), to see errors travel.
REWARD = '''
def dense(completion):
    if ord(completion[:1] or "a") % 3 == 0:
        raise ValueError(f"first character {completion[:1]!r}: code a multiple of 3")
    return sum(ord(c) % 2 == 0 for c in completion) / max(1, len(completion))
'''

SINGLE_TURN = ["task.spec=reasoning_gym:chain_sum", "task.options={size: 40, test_size: 4, min_terms: 2, max_terms: 2, "
               "min_digits: 1, max_digits: 1, template: compact}", "rl.prompts_per_step=4", "rl.group_size=2",
               "rl.sampling.rollout_chunk=4", "rl.sampling.max_new_tokens=4"]
GUESS = ["task.spec=env:guess_number", "task.options={n: 8, size: 20, test_size: 2}", "env.max_turns=3",
         "env.max_episode_tokens=48"]
WORKERS = {"local": [], "ray-1": ["rl.engine=ray", "rl.ray.rollout_workers=1", "rl.ray.reward_workers=1"],
           "ray-2": ["rl.engine=ray", "rl.ray.rollout_workers=2", "rl.ray.reward_workers=2"]}


@pytest.fixture(scope="module")
def guesser(tmp_path_factory):
    """The tiny model after 120 steps of SFT on guess_number's binary-search transcripts (a few seconds): it writes
    `<g>K</g>` guesses, so its episodes have several turns (the untrained model ends every one in its first)."""
    from rewardlab.cli import main

    out = tmp_path_factory.mktemp("guesser") / "sft"
    assert main(["sft", *TINY_OVERRIDES, *GUESS, "sft.steps=120", "sft.batch_size=8", "sft.lr=1e-2", "threads=1",
                 f"--out={out}"]) == 0
    return out / "checkpoints" / "step-120"


def _run(tmp_path, name, *overrides):
    cfg = load_config(TrainConfig, None, ["rl.steps=2", "rl.lr=5e-2", "threads=1", "seed=11",
                                          f"out={tmp_path / name}", *overrides])
    train(cfg, show_progress=False)
    lines = lambda f: [json.loads(x) for x in (tmp_path / name / f).read_text().splitlines()]  # noqa: E731
    return lines("metrics.jsonl"), lines("samples.jsonl")


def _semantic(metrics):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/"))} for m in metrics]


@pytest.mark.slow  # trains three times on Ray (in `make test`, within its 90 s of Ray tests)
def test_ray_workers_log_what_local_logs_on_a_single_turn_task(tmp_path, ray_cluster):
    (tmp_path / "r.py").write_text(REWARD)
    task = [*TINY_OVERRIDES, *SINGLE_TURN, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]",
            "rl.max_reward_error_frac=null"]
    runs = {name: _run(tmp_path, name, *task, *extra) for name, extra in WORKERS.items()}
    metrics, samples = runs["local"]
    assert len(metrics) == 2 and len(samples) == 16
    assert metrics[0]["policy/grad_norm"] > 0  # step 2 samples with new weights: publishing them matters
    errors = [s["error"] for s in samples if s["error"]]
    assert errors and all("code a multiple of 3" in e for e in errors)  # failed items are errors, not silent zeros
    assert sum(m["reward/errors"] for m in metrics) == len(errors)
    params = sum(p.numel() * p.element_size() for p in load_policy("tiny", tiny_arch=TINY_ARCH).model.parameters())
    for name in ("ray-1", "ray-2"):
        ray_metrics, ray_samples = runs[name]
        assert _semantic(ray_metrics) == _semantic(metrics), name
        assert ray_samples == samples, name
        assert [m["ray/weights_bytes"] for m in ray_metrics] == [params, params]  # the state dict, tied weights once
        assert "ray/weights_bytes" not in metrics[0]


@pytest.mark.slow  # trains three times on Ray (in `make test`, within its 90 s of Ray tests)
def test_ray_workers_log_what_local_logs_on_guess_number_episodes(tmp_path, ray_cluster, guesser):
    task = [f"model.path={guesser}", *GUESS, "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.rollout_chunk=2",
            "rl.sampling.max_new_tokens=8", "rl.estimator=turn_grpo", "rl.lr=1e-3"]
    runs = {name: _run(tmp_path, name, *task, *extra) for name, extra in WORKERS.items()}
    metrics, samples = runs["local"]
    assert len(samples) == 8 and sum(s["n_turns"] > 1 for s in samples) >= 4  # episodes of several turns
    for name in ("ray-1", "ray-2"):
        ray_metrics, ray_samples = runs[name]
        assert _semantic(ray_metrics) == _semantic(metrics), name
        assert ray_samples == samples, name  # token ids, loss masks, log-probs, messages, turns, rewards


@pytest.mark.slow  # trains twice, once on Ray (in `make test`'s Ray budget)
def test_ray_workers_import_a_users_environment_by_its_relative_file_and_log_what_local_logs(tmp_path, ray_cluster,
                                                                                            monkeypatch):
    """`env:./unit_game_ray.py:UnitGame` from a directory that is not the workers' (the cluster started elsewhere):
    each worker imports the class by the spec it is given and samples the episodes engine local samples."""
    (tmp_path / "unit_game_ray.py").write_text(UNIT_GAME)
    monkeypatch.chdir(tmp_path)
    task = [*TINY_OVERRIDES, "task.spec=env:./unit_game_ray.py:UnitGame", "task.options={size: 8, test_size: 2}",
            "env.max_turns=2", "env.max_episode_tokens=32", "rl.prompts_per_step=2", "rl.group_size=2",
            "rl.sampling.max_new_tokens=3"]
    metrics, samples = _run(tmp_path, "local", *task)
    ray_metrics, ray_samples = _run(tmp_path, "ray-1", *task, *WORKERS["ray-1"])
    assert len(samples) == 8 and {s["n_turns"] for s in samples} == {1, 2}
    assert _semantic(ray_metrics) == _semantic(metrics)
    assert ray_samples == samples


@pytest.mark.slow  # trains twice, once on Ray (in `make test`'s Ray budget)
def test_ray_with_lora_publishes_the_adapter_only_and_logs_what_local_logs(tmp_path, ray_cluster, monkeypatch):
    pytest.importorskip("peft")
    from rewardlab.rl.engines import ray_engine

    published, arrays = [], ray_engine._arrays
    monkeypatch.setattr(ray_engine, "_arrays", lambda state: published.append(sorted(state)) or arrays(state))
    (tmp_path / "r.py").write_text(REWARD)
    lora = {"r": 4, "alpha": 8.0}
    task = [*TINY_OVERRIDES, *SINGLE_TURN, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]",
            "rl.max_reward_error_frac=null", "model.lora={r: 4, alpha: 8}", "rl.beta=0.1"]
    metrics, samples = _run(tmp_path, "local", *task)
    assert metrics[0]["policy/grad_norm"] > 0 and not published  # engine local publishes nothing
    ray_metrics, ray_samples = _run(tmp_path, "ray-1", *task, *WORKERS["ray-1"])
    assert _semantic(ray_metrics) == _semantic(metrics)  # the workers' base + adapter sample what the learner does
    assert ray_samples == samples
    adapter = load_policy("tiny", tiny_arch=TINY_ARCH, seed=11, lora=lora).model
    trainable = sorted(n for n, p in adapter.named_parameters() if p.requires_grad)
    assert trainable and all(".lora_" in n for n in trainable)
    assert published == [trainable] * 3  # the initial weights and after each step: the adapter's, nothing else
    nbytes = sum(p.numel() * p.element_size() for p in adapter.parameters() if p.requires_grad)
    assert [m["ray/weights_bytes"] for m in ray_metrics] == [nbytes, nbytes]


@pytest.mark.slow  # trains on Ray
def test_a_reward_exception_with_on_error_raise_reaches_the_driver_as_itself(tmp_path, ray_cluster):
    (tmp_path / "r.py").write_text(REWARD)
    with pytest.raises(RewardError, match="code a multiple of 3"):
        _run(tmp_path, "raise", *TINY_OVERRIDES, *SINGLE_TURN, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]",
             "on_error=raise", *WORKERS["ray-1"])


def test_a_worker_runs_torch_on_the_runs_threads_not_on_rays_omp_setting(ray_cluster):
    import os

    import torch

    from rewardlab.rl.engines.ray_engine import RewardWorker

    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *SINGLE_TURN])
    actor = ray_cluster.remote(RewardWorker).options(num_cpus=1).remote(cfg, 2)
    try:
        ray_cluster.get(actor.start.remote())
        seen = ray_cluster.get(actor.__ray_call__.remote(
            lambda worker: (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))))
    finally:
        ray_cluster.kill(actor)
    assert seen == (2, "1")  # Ray set OMP_NUM_THREADS to the actor's 1 CPU; the worker set the run's 2 threads


def test_a_cluster_that_cannot_be_joined_is_one_line_naming_rl_ray_address(monkeypatch, ray_cluster):
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RayEngine

    def init(**kw):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to")

    monkeypatch.setattr(ray_cluster, "is_initialized", lambda: False)  # as in a process not connected yet
    monkeypatch.setattr(ray_cluster, "init", init)
    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *SINGLE_TURN, "rl.engine=ray", "rl.ray.address=auto"])
    with pytest.raises(ValueError, match=r"^rl\.ray\.address: cannot join 'auto': Could not find any running Ray "
                                         r"instance\.$"):
        RayEngine(cfg, SamplingSettings(max_new_tokens=4), threads=1)


def test_workers_take_on_the_drivers_transformers_progress_bars_and_verbosity(ray_cluster):
    """The CLI turns transformers' progress bars off and its verbosity to errors in the driver; every worker does the
    same before it loads anything (else each printed its own "Loading weights" bar under --no-progress)."""
    from transformers.utils import logging as hf_logging

    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RayEngine

    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *SINGLE_TURN, *WORKERS["ray-1"]])
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        engine = RayEngine(cfg, SamplingSettings(max_new_tokens=4), threads=1)
    finally:
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        hf_logging.set_verbosity(verbosity)
    try:
        seen = ray_cluster.get([actor.__ray_call__.remote(lambda worker: (
            __import__("transformers").utils.logging.is_progress_bar_enabled(),
            __import__("transformers").utils.logging.get_verbosity())) for actor in engine._rollout + engine._reward])
    finally:
        engine.close()
    assert seen == [(False, hf_logging.ERROR)] * 2


def test_workers_get_a_single_turn_task_from_the_driver_without_its_rows_and_do_not_load_it(tmp_path, ray_cluster):
    """Each worker loaded the task again (the quickstart's: generating 18,509 reasoning-gym rows, seconds per worker
    at start-up); a single-turn task now comes from the driver, without its rows: a task file gone after the driver
    read it (or absent on a worker's node) no longer matters. An environment task is still loaded by each worker."""
    from conftest import write_jsonl

    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RayEngine, worker_task
    from rewardlab.tasks import load as load_task

    data = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(10)])
    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, f"task.spec=jsonl:{data}", "task.options={test_size: 2}",
                                          *WORKERS["ray-1"]])
    task = load_task(cfg.task.spec, **cfg.task.options)
    data.unlink()  # the workers cannot read it
    engine = RayEngine(cfg, SamplingSettings(max_new_tokens=4), threads=1, task=task)
    try:
        seen = ray_cluster.get([a.__ray_call__.remote(lambda w: (w.task.name, w.task.train, w.task.reward))
                                for a in engine._rollout + engine._reward])
    finally:
        engine.close()
    assert seen == [(task.name, [], task.reward)] * 2 and len(task.train) == 8  # the driver's task keeps its rows
    assert worker_task(load_task("env:guess_number", n=8, size=4, test_size=1)) is None


@pytest.mark.parametrize("given", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}", "auto"])
def test_an_address_nothing_answers_at_is_one_line_naming_it_within_seconds(monkeypatch, tmp_path, capsys, given):
    """ray.init retries such an address for minutes (861 s seen) and then names the node's own IP: the run is
    refused before it, naming the address given."""
    import socket
    import time

    from rewardlab.cli import main

    ray = pytest.importorskip("ray")
    with socket.socket() as s:  # a local port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = given.format(port=port)
    if given == "auto":
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")

    def init(**kw):
        raise AssertionError(f"ray.init reached with {kw}: it retries an unreachable address for minutes")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a process not connected yet
    monkeypatch.setattr(ray, "init", init)
    t0 = time.monotonic()
    status = main(["train", *TINY_OVERRIDES, *SINGLE_TURN, "rl.engine=ray", f"rl.ray.address={address}",
                   f"--out={tmp_path / 'run'}", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and time.monotonic() - t0 < 15
    assert len(err) == 1 and err[0].startswith(f"rewardlab train: error: rl.ray.address: cannot join {address!r}")
    assert f"nothing answers at 127.0.0.1:{port}" in err[0]
    assert not (tmp_path / "run").exists()


def test_ctrl_c_while_ray_starts_is_one_line_and_status_130(monkeypatch, tmp_path, capsys):
    """A Ctrl-C while ray.init starts the local cluster (a KeyboardInterrupt raised there, as Python raises it in the
    main thread) ends the CLI with one line and 130, as Ctrl-C does elsewhere, not a traceback and status 1."""
    from rewardlab.cli import main

    ray = pytest.importorskip("ray")
    calls = []

    def init(**kw):
        calls.append(kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    try:
        status = main(["train", *TINY_OVERRIDES, *SINGLE_TURN, "rl.engine=ray", f"--out={tmp_path / 'run'}",
                       "--no-progress"])
    except KeyboardInterrupt:
        pytest.fail("the CLI let the KeyboardInterrupt out (a traceback)")
    assert calls and status == 130
    assert capsys.readouterr().err.strip().splitlines() == ["rewardlab train: interrupted (Ctrl-C); stopped at once"]
    assert not (tmp_path / "run").exists()


def test_a_dashboard_without_its_packages_is_one_line_naming_rl_ray_dashboard(monkeypatch, ray_cluster):
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RayEngine

    def init(**kw):  # what ray.init says with include_dashboard=True on a minimal ray install
        assert kw["include_dashboard"] is True
        raise Exception("Cannot include dashboard with missing packages.")

    monkeypatch.setattr(ray_cluster, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster, "init", init)
    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *SINGLE_TURN, "rl.engine=ray", "rl.ray.dashboard=true"])
    with pytest.raises(ValueError, match=r"^rl\.ray\.dashboard: .*pip install 'ray\[default\]'.*missing packages\.$"):
        RayEngine(cfg, SamplingSettings(max_new_tokens=4), threads=1)


def test_published_weights_travel_as_arrays_and_come_back_exactly_tied_weights_once_bfloat16_included():
    import pickle

    import torch

    from rewardlab.rl.engines.ray_engine import _arrays, _tensors

    shared = torch.randn(100, 100)
    state = {"embed": shared, "lm_head": shared, "norm": torch.randn(100).to(torch.bfloat16),
             "half": torch.randn(3).half(), "steps": torch.arange(5)}
    wire = pickle.dumps(_arrays(state), protocol=5)
    back = _tensors(pickle.loads(wire))
    assert set(back) == set(state)
    for key, value in state.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key
    alone = pickle.dumps(_arrays({"embed": shared}), protocol=5)
    assert len(wire) < len(alone) + 2000  # the tied pair's 40,000 bytes of floats are sent once, not twice


def test_a_chunk_with_a_row_only_cloudpickle_can_write_still_travels():
    import pickle

    pytest.importorskip("ray")
    from rewardlab.rl.engines.ray_engine import _pack
    from rewardlab.types import Rollout

    rollout = Rollout(prompt="p", prompt_ids=[1], completion="c", completion_ids=[2], logprobs=[-0.5],
                      row={"prompt": "p", "check": lambda x: x + 1})
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        pickle.dumps([rollout], protocol=5)  # the case the fallback is for
    (back,) = pickle.loads(_pack([rollout]))
    assert back.completion == "c" and back.logprobs == [-0.5] and back.row["check"](1) == 2
