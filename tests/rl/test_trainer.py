"""The GRPO training loop on the tiny model: metrics, samples, checkpoints, resume, learning a trivial task."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards import REWARDS, reward
from rewardlab.rl.trainer import reward_tensors, step_metrics, train
from rewardlab.types import Rollout, RewardOutput

if "test_digit_frac" not in REWARDS:  # the module may be imported twice (e.g. by a plugin)

    @reward(name="test_digit_frac")
    def _digit_frac(completion):
        """Fraction of completion characters that are digits: a dense, trivially learnable signal."""
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


REQUIRED_METRICS = {
    "reward/mean", "reward/std", "accuracy", "policy/entropy", "policy/clip_frac", "rollout/len_mean",
    "rollout/len_max", "rollout/truncated_frac", "rollout/tied_group_frac", "time/step_s", "time/gen_tokens_per_s",
}


def _task_file(tmp_path):
    # 30 distinct prompts "a+b=" with a in 0..9, b in 0..2.
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    return write_jsonl(tmp_path / "task.jsonl", rows)


def _config(tmp_path, out="run", *overrides):
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{_task_file(tmp_path)}", "task.options={test_size: 5}", f"out={tmp_path / out}",
        *TINY_OVERRIDES, "rl.prompts_per_step=4", "rl.group_size=4", "rl.max_new_tokens=4", "rl.lr=1e-2",
        "rewards=[{name: test_digit_frac}]", *overrides,
    ])


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- pure helpers
def _rollout(n_tokens, group, truncated=False):
    return Rollout(prompt="p", prompt_ids=[1], completion="x" * n_tokens, completion_ids=[5] * n_tokens,
                   logprobs=[0.0] * n_tokens, group=group, truncated=truncated)


def test_reward_tensors_put_score_on_last_token():
    rollouts = [_rollout(2, 0), _rollout(1, 0), _rollout(3, 1)]
    outputs = [RewardOutput(1.0), RewardOutput(0.5), RewardOutput(0.0, error="r: boom")]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    rewards, m, group = reward_tensors(rollouts, outputs, mask, skip_errors=False)
    assert rewards.tolist() == [[0.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert torch.equal(m, mask) and group.tolist() == [0, 0, 1]
    rewards, m, group = reward_tensors(rollouts, outputs, mask, skip_errors=True)
    assert m[2].tolist() == [0.0, 0.0, 0.0] and m[0].tolist() == [1.0, 1.0, 0.0]
    assert group.tolist() == [0, 0, -3]  # the skipped rollout (index 2) gets its own group -1 - 2


def test_step_metrics_hand_computed():
    rollouts = [_rollout(2, 0), _rollout(4, 0, truncated=True), _rollout(3, 1), _rollout(3, 1)]
    outputs = [RewardOutput(1.0, {"correct": 1.0}), RewardOutput(0.0, {"correct": 0.0}),
               RewardOutput(1.0, {"correct": 1.0}), RewardOutput(1.0, {"correct": 1.0})]
    m = step_metrics(rollouts, outputs, group_size=2)
    assert m["reward/mean"] == pytest.approx(0.75)  # (1 + 0 + 1 + 1) / 4
    assert m["reward/std"] == pytest.approx(0.5)  # sample std of [1, 0, 1, 1]: sqrt(0.75 / 3)
    assert m["accuracy"] == 0.75 and m["reward/correct/mean"] == 0.75
    assert m["rollout/len_mean"] == 3.0 and m["rollout/len_max"] == 4.0  # (2 + 4 + 3 + 3) / 4
    assert m["rollout/truncated_frac"] == 0.25
    assert m["rollout/tied_group_frac"] == 0.5  # group 0 = [1, 0] differs, group 1 = [1, 1] is tied
    assert m["reward/errors"] == 0.0


# ---------------------------------------------------------------- config checks
@pytest.mark.parametrize("key, value", [("rl.estimator", "ppo_gae"), ("rl.loss", "nope"), ("rl.agg", "nope"),
                                        ("rl.kl_estimator", "k9")])
def test_unknown_algorithm_name_lists_valid_names(tmp_path, key, value):
    cfg = _config(tmp_path, "run", f"{key}={value}")
    with pytest.raises(ValueError) as info:
        train(cfg, show_progress=False)
    msg = str(info.value)
    assert msg.startswith(f"{key}: unknown name {value!r}; valid:")
    if key == "rl.estimator":
        assert "grpo" in msg and "rloo" in msg
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_resume_without_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="--resume: no checkpoint"):
        train(_config(tmp_path), resume=True, show_progress=False)


def test_unknown_reward_name(tmp_path):
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        train(_config(tmp_path, "run", "rewards=[{name: nope}]"), show_progress=False)


# ---------------------------------------------------------------- runs
@pytest.mark.slow
def test_run_directory_contents(tmp_path):
    cfg = _config(tmp_path, "run", "rl.steps=3", "save_every=1", "keep_checkpoints=2")
    summary = train(cfg, show_progress=False)
    run = tmp_path / "run"

    metrics = _metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert REQUIRED_METRICS <= set(m), REQUIRED_METRICS - set(m)
        assert 0.0 <= m["rollout/truncated_frac"] <= 1.0 and 1 <= m["rollout/len_max"] <= 4
        assert m["time/step_s"] > 0 and m["time/gen_tokens_per_s"] > 0

    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 4 * 4  # steps x prompts_per_step x group_size
    assert [s["step"] for s in samples] == [1] * 16 + [2] * 16 + [3] * 16
    for s in samples:
        assert {"step", "prompt", "completion", "components", "advantage", "reward"} <= set(s)
        assert s["components"]["test_digit_frac"] == s["reward"]
    # GRPO advantages are centred per group of 4 rollouts: each group's advantages sum to ~0.
    by_group = {}
    for s in samples:
        by_group.setdefault(s["group"], []).append(s["advantage"])
    assert len(by_group) == 12 and all(len(v) == 4 and abs(sum(v)) < 1e-4 for v in by_group.values())

    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["step-2", "step-3"]  # keep_checkpoints=2 pruned step-1
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-3")
    assert model.config.hidden_size == 32
    assert summary["final_checkpoint"] == str(run / "checkpoints" / "step-3")
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    assert (run / "config.yaml").is_file() and (run / "plots" / "train.png").is_file()


@pytest.mark.slow
def test_resume_logs_same_metrics_as_uninterrupted_run(tmp_path):
    extra = ["save_every=1", "rl.epochs=2", "rl.minibatch_size=8"]  # minibatch shuffling uses the torch RNG
    train(_config(tmp_path, "a", "rl.steps=3", *extra), show_progress=False)
    train(_config(tmp_path, "b", "rl.steps=2", *extra), show_progress=False)
    summary = train(_config(tmp_path, "b", "rl.steps=3", *extra), resume=True, show_progress=False)
    assert summary["resumed_from"] == 2

    a, b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [m["step"] for m in b] == [1, 2, 3]
    a3, b3 = a[2], b[2]
    keys = {k for k in a3 if not k.startswith("time/")}
    assert keys == {k for k in b3 if not k.startswith("time/")}
    for k in sorted(keys):
        assert b3[k] == pytest.approx(a3[k], abs=1e-6), k
    samples_a = [json.loads(x) for x in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()]
    samples_b = [json.loads(x) for x in (tmp_path / "b" / "samples.jsonl").read_text().splitlines()]
    assert [s["completion"] for s in samples_a if s["step"] == 3] == [s["completion"] for s in samples_b
                                                                      if s["step"] == 3]


@pytest.mark.slow
def test_mean_reward_rises_on_trivial_task(tmp_path):
    # reward = fraction of digit characters; a fresh model emits digits ~10/101 of the time.
    cfg = _config(tmp_path, "run", "rl.steps=15", "rl.group_size=8", "save_every=100")
    train(cfg, show_progress=False)
    rewards = [m["reward/mean"] for m in _metrics(tmp_path / "run")]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards


def test_time_budget_stops_after_the_step_that_ends_past_it(tmp_path):
    # A zero budget is spent by the end of step 1, whatever the machine's speed: one step, then the final checkpoint.
    summary = train(_config(tmp_path, "run", "rl.steps=50", "save_every=100"), show_progress=False, time_budget_s=0.0)
    metrics = _metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["time/elapsed_s"] >= metrics[0]["time/step_s"] > 0
    assert summary["steps_done"] == 1 and summary["steps"] == 50
    assert summary["final_checkpoint"] == str(tmp_path / "run" / "checkpoints" / "step-1")
