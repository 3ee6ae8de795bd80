"""A user's own environment as a task: `env:MODULE:CLASS` and `env:PATH.py:CLASS` import the class with the code that
imports rewards by path, check its options like a built-in's, and run it in `train`, `sft` and `evaluate` from the
CLI; Ray workers get a spec that resolves in a fresh process whatever its directory; a bad spec is one line."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_OVERRIDES
from user_env_source import UNIT_GAME

from rewardlab.cli import main
from rewardlab.envs import ENVIRONMENTS, make_env
from rewardlab.tasks import load

EPISODES = ["env.max_turns=2", "env.max_episode_tokens=32"]


@pytest.fixture
def game_dir(tmp_path, monkeypatch):
    """A directory holding unit_game_user.py (a module name no other test uses), made the current directory; the
    classes imported from it are unregistered afterwards."""
    (tmp_path / "unit_game_user.py").write_text(UNIT_GAME)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("unit_game_user", None)
    for name in [n for n in ENVIRONMENTS if n.startswith((str(tmp_path), "unit_game_user:"))]:
        ENVIRONMENTS.unregister(name)


def test_a_module_and_a_file_name_the_users_class_with_its_options_checked(game_dir):
    by_file = load("env:./unit_game_user.py:UnitGame", size=6, seed=2)
    assert by_file.name == "env:./unit_game_user.py:UnitGame"
    assert by_file.env == {"name": f"{game_dir / 'unit_game_user.py'}:UnitGame", "options": {"size": 6}}
    assert by_file.reward == "exact_match"  # no `reward` attribute: the Task's own
    assert [r["prompt"] for r in by_file.train[:2]] == ["2+0=", "3+0="] and len(by_file.test) == 4
    by_module = load("env:unit_game_user:UnitGame", size=6, seed=2)
    assert by_module.env["name"] == "unit_game_user:UnitGame"
    assert [r["prompt"] for r in by_module.train] == [r["prompt"] for r in by_file.train]
    # the episode's environment is built from task.env, as every verb builds it
    env = make_env(by_file.env["name"], **by_file.env["options"])
    state = env.reset(by_file.train[0])
    assert env.step(state, "2").observation == "\nagain: "
    with pytest.raises(ValueError) as err:
        load("env:./unit_game_user.py:UnitGame", sides=6)
    assert str(err.value).startswith("task.options: unknown option 'sides' for environment "
                                     "'./unit_game_user.py:UnitGame'; valid: seed, size, test_size")
    with pytest.raises(ValueError, match=r"task.options.size: expected an integer, got 'many'"):
        load("env:unit_game_user:UnitGame", size="many")


@pytest.mark.parametrize("spec,message", [
    ("env:./nowhere.py:UnitGame", "task spec 'env:./nowhere.py:UnitGame': cannot import environment "
                                  "'./nowhere.py:UnitGame': no file "),
    ("env:no_such_module_x:UnitGame", "task spec 'env:no_such_module_x:UnitGame': cannot import environment "
                                      "'no_such_module_x:UnitGame': no module named 'no_such_module_x'"),
    ("env:./unit_game_user.py:Unit", "cannot import environment './unit_game_user.py:Unit': ./unit_game_user.py has "
                                     "no attribute 'Unit'; it defines: ListTask, NoTask, UnitGame, not_a_class"),
    ("env:./unit_game_user.py:not_a_class", "not_a_class is not a class (its type is function)"),
    ("env:./unit_game_user.py:NoTask", "class NoTask has no task method; an environment task's class defines "
                                       "task(seed) -> Task"),
    ("env:./unit_game_user.py:ListTask", "task spec 'env:./unit_game_user.py:ListTask': ListTask.task(seed) returned "
                                         "a list, expected a rewardlab.tasks.Task"),
    # (other tests of the session may register environments after "python")
    ("env:unit_game", "task spec 'env:unit_game': unknown environment 'unit_game'; valid: calculator, guess_number, "
                      "python"),
])
def test_a_bad_environment_spec_is_one_line(game_dir, spec, message):
    with pytest.raises(ValueError) as err:
        load(spec)
    text = str(err.value)
    assert message in text and "\n" not in text, text
    if spec == "env:unit_game":
        assert text.endswith(", or a class of your own as MODULE:CLASS or PATH.py:CLASS"), text


def test_train_sft_and_evaluate_run_the_users_environment_from_the_cli(game_dir, capsys):
    common = ["--no-progress", "--model", "tiny", *TINY_OVERRIDES, "threads=1", *EPISODES]
    assert main(["train", *common, "--task", "env:./unit_game_user.py:UnitGame", "--out", "rl", "rl.steps=2",
                 "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=3"]) == 0
    samples = [json.loads(x) for x in (game_dir / "rl" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and all(s["row"]["row_id"].startswith("env:./unit_game_user.py:UnitGame/train/")
                                     for s in samples)
    assert {s["n_turns"] for s in samples} == {1, 2}  # episodes of the user's dynamics: one or two turns
    assert all(s["turn_rewards"][:1] == [0.25] for s in samples if s["n_turns"] == 2)
    assert main(["sft", *common, "--task", "env:unit_game_user:UnitGame", "--out", "sft", "sft.steps=2",
                 "sft.batch_size=2"]) == 0
    assert main(["evaluate", *common, "--model", "rl/checkpoints/step-2", "--task",
                 "env:./unit_game_user.py:UnitGame", "--out", "ev", "eval.n=1", "eval.k=[1]",
                 "eval.max_new_tokens=3"]) == 0
    summary = json.loads((game_dir / "ev" / "summary.json").read_text())
    assert summary["n_questions"] == 4 and summary["task_from"] == "config"


def test_ray_workers_get_a_spec_that_resolves_in_a_fresh_process_elsewhere(game_dir, tmp_path_factory):
    """The config engine ray builds its workers from (`worker_config`), pickled as Ray ships it, builds a rollout
    worker (task, policy, environment) and a reward worker in a new process whose current directory is another one,
    and the rollout worker samples a chunk of episodes in the user's environment."""
    from rewardlab.config import TrainConfig, load_config
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import worker_config

    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, "task.spec=env:./unit_game_user.py:UnitGame",
                                          "task.options={size: 4, test_size: 1}", *EPISODES])
    shipped = worker_config(cfg)
    assert shipped.task.spec == f"env:{game_dir / 'unit_game_user.py'}:UnitGame"
    assert worker_config(cfg.model_copy(update={"task": cfg.task.model_copy(
        update={"spec": "env:unit_game_user:UnitGame"})})).task.spec == "env:unit_game_user:UnitGame"
    elsewhere = tmp_path_factory.mktemp("worker_cwd")
    payload = elsewhere / "cfg.pkl"
    payload.write_bytes(pickle.dumps((shipped, SamplingSettings(max_new_tokens=3))))
    script = f"""
import pickle
from rewardlab.rl.engines.ray_engine import RewardWorker, RolloutWorker
cfg, settings = pickle.load(open({str(payload)!r}, "rb"))
rollout, reward = RolloutWorker(cfg, settings, 1), RewardWorker(cfg, 1)
rollout.start(); reward.start()
rows = [{{"prompt": "1+2=", "answer": "3", "row_id": "r0"}}]
out = pickle.loads(rollout.generate(rows, 2, (0, 1, 0), 0))
print(type(rollout.episodes.env).__name__, len(out), sorted({{r.episode_id for r in out}}))
"""
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 0, done.stderr[-2000:]
    name, rows, episodes = done.stdout.split(maxsplit=2)
    assert name == "UnitGame" and int(rows) >= 2 and episodes.strip() == "[0, 1]"


def test_an_imported_class_is_registered_once_under_its_canonical_name(game_dir):
    load("env:./unit_game_user.py:UnitGame")
    load(f"env:{game_dir / 'unit_game_user.py'}:UnitGame")
    assert [n for n in ENVIRONMENTS if "unit_game_user" in n] == [f"{game_dir / 'unit_game_user.py'}:UnitGame"]
