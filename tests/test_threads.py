"""The `threads` setting: torch's threads, the reward pools' size, one thread per pool worker; and an sft resume
that trains longer writes its new step count down."""

import os

import pytest
import torch
import yaml

import rewardlab.threads as threads
from conftest import CHAIN_SUM, TINY_OVERRIDES
from rewardlab.config import SFTConfig, TrainConfig, load_config
from rewardlab.rewards.executor import Executor
from rewardlab.runs import RunDirError
from rewardlab.sandbox import Sandbox, default_workers
from rewardlab.commands.sft import run as run_sft


@pytest.fixture
def one_thread_after():
    """Leave torch and the pools as the suite runs them (conftest: one thread), whatever a test applied."""
    yield
    torch.set_num_threads(1)
    threads._applied = None


def test_the_default_is_omp_num_threads_else_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})  # e.g. `taskset -c 0,2,5`
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.available_cores() == 3 and threads.default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user chose
    assert threads.default_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a count: ignored
    assert threads.default_threads() == 3


def test_apply_threads_sets_torch_and_the_pools_default(monkeypatch, one_thread_after):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.apply_threads(2) == 2
    assert torch.get_num_threads() == 2 and default_workers() == 2 and Executor().workers == 2
    assert Sandbox().workers == 2
    assert threads.apply_threads(None) == 3 and torch.get_num_threads() == 3 and default_workers() == 3
    with pytest.raises(ValueError, match=r"^threads: expected an integer >= 1 .*got 0$"):
        threads.apply_threads(0)


def test_threads_is_a_setting_of_every_verb():
    from rewardlab.commands import config_classes

    VERB_CONFIGS = config_classes()

    for verb, config in VERB_CONFIGS.items():
        assert "threads" in config.model_fields, verb
    with pytest.raises(ValueError, match="threads"):
        load_config(TrainConfig, None, ["threads=0"])


def _pool_worker_threads(_):
    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def test_a_reward_pool_worker_uses_one_thread(monkeypatch, one_thread_after):
    # The parent runs torch on 2 threads; a forked worker would inherit that (and N workers x N threads
    # oversubscribe the cores), so each worker is set to one thread, for torch and for libraries it loads later.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    with Executor(workers=1) as ex:
        assert ex.map(_pool_worker_threads, [0]) == [("1", 1)]


def test_a_sandboxed_program_gets_one_thread_per_numeric_library():
    source = ("import os\nprint(*(os.environ.get(k) for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', "
              "'OPENBLAS_NUM_THREADS', 'NUMEXPR_NUM_THREADS')))")
    result = Sandbox(workers=1).run(source)
    assert result.stdout == "1 1 1 1\n", result


def test_train_and_sft_apply_the_threads_setting(tmp_path, one_thread_after):
    from rewardlab.rl.trainer import train

    common = [*TINY_OVERRIDES, "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items())
              + ", size: 40, test_size: 4}"]
    torch.set_num_threads(2)
    train(load_config(TrainConfig, None, [*common, f"out={tmp_path / 't'}", "rl.steps=1", "rl.prompts_per_step=2",
                                          "rl.group_size=2", "rl.sampling.max_new_tokens=2", "threads=1"]),
          show_progress=False)
    assert torch.get_num_threads() == 1 and default_workers() == 1
    torch.set_num_threads(2)
    run_sft(load_config(SFTConfig, None, [*common, f"out={tmp_path / 's'}", "sft.steps=1", "sft.batch_size=4",
                                          "threads=1"]), show_progress=False)
    assert torch.get_num_threads() == 1


def test_sft_resume_trains_longer_writes_the_steps_and_refuses_fewer(tmp_path, capsys):
    common = [*TINY_OVERRIDES, f"out={tmp_path / 's'}", "sft.batch_size=4", "save_every=2",
              "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items()) + ", size: 40, test_size: 4}"]
    run_sft(load_config(SFTConfig, None, [*common, "sft.steps=2"]), show_progress=False)
    capsys.readouterr()
    summary = run_sft(load_config(SFTConfig, None, [*common, "sft.steps=3"]), mode="resume", show_progress=False)
    assert (summary["steps"], summary["resumed_from"]) == (3, 2)
    config = yaml.safe_load((tmp_path / "s" / "config.yaml").read_text())
    assert config["sft"]["steps"] == 3
    assert f"rewardlab: warning: --resume: sft.steps 2 -> 3; written to {tmp_path / 's' / 'config.yaml'}" in (
        capsys.readouterr().err.splitlines())
    with pytest.raises(RunDirError, match=r"^--resume: sft.steps=1 is below step 3, where .*step-3 already is"):
        run_sft(load_config(SFTConfig, None, [*common, "sft.steps=1"]), mode="resume", show_progress=False)
    with pytest.raises(RunDirError, match=r"other settings: sft.lr \(run: 0.003, now: 0.01\)"):
        run_sft(load_config(SFTConfig, None, [*common, "sft.steps=3", "sft.lr=1e-2"]), mode="resume",
                show_progress=False)
