"""Settings a `train` run must not silently get wrong: a group size that makes every advantage 0, more prompts per
step than training rows, a reward that errors on most rollouts, and what a resume may change (and writes down)."""

import json

import pytest
import torch

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards import REWARDS, RewardError, reward
from rewardlab.rl.advantages import ESTIMATORS, compute_advantages
from rewardlab.rl.specs import estimator_min_group_size, estimator_needs
from rewardlab.rl.trainer import train

#: The test reward's switch: it raises from its `fail_from`-th call (one call per rollout) on (None: never).
FLAKY = {"calls": 0, "fail_from": None}

if "test_guard_flaky" not in REWARDS:

    @reward(name="test_guard_flaky")
    def _flaky(completion):
        """Digit fraction of the completion, or a ValueError once FLAKY says so (a broken reward)."""
        FLAKY["calls"] += 1
        if FLAKY["fail_from"] is not None and FLAKY["calls"] >= FLAKY["fail_from"]:
            raise ValueError("units table missing")
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


@pytest.fixture(autouse=True)
def _reset_flaky():
    FLAKY.update(calls=0, fail_from=None)
    yield
    FLAKY.update(calls=0, fail_from=None)


def _task(tmp_path):
    # 30 prompts; test_size 5 leaves 25 training rows.
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    return write_jsonl(tmp_path / "task.jsonl", rows)


def _overrides(tmp_path, out, *extra):
    return [f"task.spec=jsonl:{_task(tmp_path)}", "task.options={test_size: 5}", f"out={tmp_path / out}",
            *TINY_OVERRIDES, "rl.prompts_per_step=2", "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=1e-2",
            "rewards=[{name: test_guard_flaky}]", *extra]


def _config(tmp_path, out, *extra):
    return load_config(TrainConfig, None, _overrides(tmp_path, out, *extra))


def _cli(tmp_path, out, *extra):
    return ["train", "--no-progress", *_overrides(tmp_path, out, *extra)]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _snapshot(root):
    """Every file of a run directory but its lock and events.jsonl (where each attempt to resume is logged)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name not in (".lock", "events.jsonl")}


def _errors(capsys):
    return capsys.readouterr().err.strip().splitlines()


# ---------------------------------------------------------------- no-op settings
def _lone_rollout_advantages(name):
    """The estimator's advantages for two prompt groups of ONE rollout each, rewards 1 and 0 on 2-token completions
    (the inputs it needs beyond rewards supplied as neutral values); None when it refuses such groups."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.ones(2, 2)
    inputs = {"baseline": torch.zeros(2), "components": torch.tensor([[1.0], [0.0]]), "weights": torch.ones(1),
              "values": torch.zeros(2, 2), "step_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
              "step_mask": torch.tensor([[0.0, 1.0], [0.0, 1.0]])}
    options = {k: inputs[k] for k in estimator_needs(name)}
    try:
        return compute_advantages(name, token_rewards=rewards, mask=mask, group=torch.tensor([0, 1]), **options)
    except ValueError:
        return None


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_an_estimator_that_learns_nothing_from_a_group_of_one_declares_a_minimum_of_two(name):
    # A group-relative estimator compares a rollout with the others of its prompt: alone, it gets advantage 0 (grpo,
    # dr_grpo, opo, gdpo, reinforce_pp_baseline) or is refused (rloo, pure, process_sum). Such an estimator must
    # declare min_group_size 2, so that rl.group_size=1 is refused; the others (reinforce_pp, remax, gae) learn from
    # a lone rollout and declare 1.
    adv = _lone_rollout_advantages(name)
    learns_alone = adv is not None and bool(adv.abs().sum() > 0)
    assert estimator_min_group_size(name) == (1 if learns_alone else 2), adv


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "gdpo"])
def test_group_size_one_with_a_group_relative_estimator_is_refused_at_config_time(tmp_path, estimator):
    with pytest.raises(ValueError, match=rf"^rl.group_size: estimator '{estimator}' needs at least 2 rollouts per "
                                         r"prompt group, got 1 \(its advantages compare"):
        train(_config(tmp_path, "run", f"rl.estimator={estimator}", "rl.group_size=1"), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_more_prompts_per_step_than_training_rows_is_said_once(tmp_path, capsys):
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.prompts_per_step=40", "rl.group_size=2")
    train(cfg, show_progress=False)
    said = [line for line in _errors(capsys) if "rl.prompts_per_step" in line]
    assert said == [f"rewardlab: warning: rl.prompts_per_step=40 is more than the 25 training rows of "
                    f"jsonl:{tmp_path / 'task.jsonl'}: every step repeats prompts (each row about 1.6 times, as more "
                    "groups of the same prompt)"]
    samples = _lines(tmp_path / "run" / "samples.jsonl")
    assert sum(s["step"] == 1 for s in samples) == 80  # 40 prompts x 2 rollouts, as asked


# ---------------------------------------------------------------- reward errors
def test_a_reward_that_always_errors_stops_the_run_with_a_checkpoint(tmp_path, capsys):
    FLAKY["fail_from"] = 1  # every call fails; on_error=zero scores each rollout 0
    out = tmp_path / "run"
    assert main(_cli(tmp_path, "run", "rl.steps=4", "save_every=10")) == 2
    assert _errors(capsys) == [
        "rewardlab train: error: rl.max_reward_error_frac: 8 of 8 rollouts of step 1 (100%) have a reward error, the "
        "limit is 0.5; first: test_guard_flaky: ValueError: units table missing. Stopped after checkpoint "
        f"{out / 'checkpoints' / 'step-0'} (step 0): fix the reward and rerun with --resume"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0"]
    assert not (out / "summary.json").exists()
    (event,) = [e for e in _lines(out / "events.jsonl") if e["event"] == "reward_errors"]
    assert (event["step"], event["failed"], event["rollouts"], event["checkpoint"]) == (1, 8, 8, "step-0")

    FLAKY["fail_from"] = None  # the reward is fixed: the run goes on from step 0
    assert main([*_cli(tmp_path, "run", "rl.steps=4", "save_every=10"), "--resume"]) == 0
    assert [m["step"] for m in _lines(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert all(m["reward/errors"] == 0 for m in _lines(out / "metrics.jsonl"))


def test_a_stop_for_reward_errors_resumes_where_an_uninterrupted_run_would_be(tmp_path):
    steps = ["rl.steps=4", "save_every=10"]
    train(_config(tmp_path, "a", *steps), show_progress=False)
    FLAKY.update(calls=0, fail_from=17)  # the reward breaks at step 3 (one call per rollout, 8 a step)
    with pytest.raises(RewardError, match=r"8 of 8 rollouts of step 3 .* checkpoint .*step-2 \(step 2\)"):
        train(_config(tmp_path, "b", *steps), show_progress=False)
    b = tmp_path / "b"
    assert [m["step"] for m in _lines(b / "metrics.jsonl")] == [1, 2]  # the failed step is not logged
    FLAKY["fail_from"] = None
    train(_config(tmp_path, "b", *steps), mode="resume", show_progress=False)
    # The checkpoint holds the sampler and RNG state of the end of step 2, not of the failed draw: step 3 draws the
    # prompts and samples the completions the uninterrupted run did.
    key = [(s["step"], s["prompt"], s["completion"]) for s in _lines(b / "samples.jsonl")]
    assert key == [(s["step"], s["prompt"], s["completion"]) for s in _lines(tmp_path / "a" / "samples.jsonl")]


def test_reward_errors_below_the_limit_do_not_stop_the_run(tmp_path):
    FLAKY["fail_from"] = 9  # steps 2 and 3 fail whole (one call per rollout, 8 a step), but the limit is off
    train(_config(tmp_path, "run", "rl.steps=3", "rl.max_reward_error_frac=null"), show_progress=False)
    assert [m["reward/errors"] for m in _lines(tmp_path / "run" / "metrics.jsonl")] == [0.0, 8.0, 8.0]


# ---------------------------------------------------------------- resume: what may change
@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A finished 4-step run checkpointed at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("guards")
    assert main(_cli(tmp, "R", "rl.steps=4", "save_every=2")) == 0
    return tmp


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_resume_refuses_other_settings_naming_each_key_and_touches_nothing(four_steps, tmp_path, capsys):
    d = _copy(four_steps / "R", tmp_path / "R")
    before = _snapshot(d)
    capsys.readouterr()
    # the repro: more steps and another learning rate
    assert main([*_cli(four_steps, d, "rl.steps=6", "save_every=2", "rl.lr=5e-3"), "--resume"]) == 2
    assert _errors(capsys) == [f"rewardlab train: error: --resume: {d} was started with other settings: rl.lr (run: "
                               f"0.01, now: 0.005); resume with its settings ({d / 'config.yaml'}) or pass --overwrite"]
    # four keys that may not change: every one is named
    assert main([*_cli(four_steps, d, "rl.steps=4", "save_every=2", "rl.lr=5e-3", "rl.sampling.temperature=0.5",
                       "seed=3", "rl.group_size=2"), "--resume"]) == 2
    (line,) = _errors(capsys)
    for key in ("seed (run: 0, now: 3)", "rl.group_size (run: 4, now: 2)", "rl.lr (run: 0.01, now: 0.005)",
                "rl.sampling.temperature (run: 1.0, now: 0.5)"):
        assert key in line
    assert _snapshot(d) == before


def test_resume_with_more_steps_trains_on_and_writes_them_to_config_yaml(four_steps, tmp_path, capsys):
    import yaml

    d = _copy(four_steps / "R", tmp_path / "R")
    capsys.readouterr()
    # the repro, the allowed half: train on to step 6
    assert main([*_cli(four_steps, d, "rl.steps=6", "save_every=2"), "--resume"]) == 0
    warnings = [line for line in _errors(capsys) if line.startswith("rewardlab: warning: --resume:")]
    assert warnings == [f"rewardlab: warning: --resume: rl.steps 4 -> 6; written to {d / 'config.yaml'}"]
    config = yaml.safe_load((d / "config.yaml").read_text())
    assert config["rl"]["steps"] == 6
    assert config["rl"]["lr"] == 0.01 and config["out"] == str(four_steps / "R")  # the rest as the run had it
    changed = [(e["key"], e["old"], e["new"]) for e in _lines(d / "events.jsonl") if e["event"] == "config_changed"]
    assert changed == [("rl.steps", 4, 6)]
    assert [m["step"] for m in _lines(d / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    summary = json.loads((d / "summary.json").read_text())
    assert (summary["steps"], summary["steps_done"], summary["resumed_from"]) == (6, 6, 4)

    # checkpointing and threads may change too, said and written the same way
    assert main([*_cli(four_steps, d, "rl.steps=7", "save_every=3", "keep_checkpoints=3", "threads=1"),
                 "--resume"]) == 0
    warnings = [line for line in _errors(capsys) if line.startswith("rewardlab: warning: --resume:")]
    assert warnings == [f"rewardlab: warning: --resume: threads None -> 1, save_every 2 -> 3, keep_checkpoints 2 -> "
                        f"3, rl.steps 6 -> 7; written to {d / 'config.yaml'}"]
    config = yaml.safe_load((d / "config.yaml").read_text())
    assert (config["rl"]["steps"], config["save_every"], config["keep_checkpoints"], config["threads"]) == (7, 3, 3, 1)
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step-4", "step-6", "step-7"]
    # the run now is what config.yaml says: resuming with its settings changes nothing and says nothing
    assert main([*_cli(four_steps, d, "rl.steps=7", "save_every=3", "keep_checkpoints=3", "threads=1"),
                 "--resume"]) == 0
    assert not [line for line in _errors(capsys) if "warning: --resume" in line]


def test_resume_with_fewer_steps_than_the_checkpoint_is_refused(four_steps, tmp_path, capsys):
    d = _copy(four_steps / "R", tmp_path / "R")
    before = _snapshot(d)
    capsys.readouterr()
    assert main([*_cli(four_steps, d, "rl.steps=3", "save_every=2"), "--resume"]) == 2
    assert _errors(capsys) == [f"rewardlab train: error: --resume: rl.steps=3 is below step 4, where "
                               f"{d / 'checkpoints' / 'step-4'} already is; resume with rl.steps >= 4 (a run cannot "
                               "be shortened past a checkpoint)"]
    assert [e["event"] for e in _lines(d / "events.jsonl")][-1] == "resume"  # only the attempt is logged
    assert _snapshot(d) == before  # config.yaml, the logs and the checkpoints are untouched


def test_samples_hold_each_step_once_after_a_resume(four_steps, tmp_path):
    # The state a kill after step 3's logs leaves: checkpoint step-2, metrics and samples of steps 1-3, no step-4.
    import shutil

    d = _copy(four_steps / "R", tmp_path / "R")
    shutil.rmtree(d / "checkpoints" / "step-4")
    (d / "summary.json").unlink()
    for log in ("metrics.jsonl", "samples.jsonl"):
        (d / log).write_text("".join(json.dumps(r) + "\n" for r in _lines(d / log) if r["step"] <= 3))
    assert main([*_cli(four_steps, d, "rl.steps=4", "save_every=2"), "--resume"]) == 0
    steps = [s["step"] for s in _lines(d / "samples.jsonl")]
    assert {k: steps.count(k) for k in sorted(set(steps))} == {1: 8, 2: 8, 3: 8, 4: 8}  # prompts_per_step x group_size
    assert [m["step"] for m in _lines(d / "metrics.jsonl")] == [1, 2, 3, 4]


def test_an_asynchronous_stop_for_reward_errors_names_the_newest_checkpoint_and_saves_nothing(tmp_path):
    from types import SimpleNamespace

    from conftest import make_rollout
    from rewardlab.rl.rollouts import Prefetch, ScoredEpisode, StepBatch
    from rewardlab.rl.trainer import Progress, stop_on_reward_errors
    from rewardlab.types import RewardOutput

    events = []
    rl = SimpleNamespace(max_reward_error_frac=0.5, ray=SimpleNamespace(max_staleness=1), engine="ray")
    run = SimpleNamespace(cfg=SimpleNamespace(rl=rl), rundir=SimpleNamespace(log_event=lambda *a, **kw:
                                                                            events.append((a, kw))))
    prefetch = Prefetch(run, 3, background=False)
    progress = Progress(3, 4, (2, tmp_path / "step-2"), 0, prefetch)
    outputs = [RewardOutput(score=0.0, error="units: ValueError: bad"), RewardOutput(score=1.0)]
    batch = StepBatch([ScoredEpisode((make_rollout("x"),), o) for o in outputs], [0, 1], before=({}, {}))
    with pytest.raises(RewardError) as info:
        stop_on_reward_errors(run, progress, batch, 4)  # lag 1: nothing rolled back or saved
    assert str(info.value) == ("rl.max_reward_error_frac: 1 of 2 rollouts of step 4 (50%) have a reward error, the "
                               "limit is 0.5; first: units: ValueError: bad. Stopped; the newest checkpoint is "
                               f"{tmp_path / 'step-2'}")
    assert events == [(("reward_errors",), {"step": 4, "failed": 1, "rollouts": 2, "limit": 0.5,
                                            "first": "units: ValueError: bad", "checkpoint": "step-2"})]
    assert progress.step == 4 and progress.latest == (2, tmp_path / "step-2") and prefetch.next == 4
