"""The GRPO training loop on the tiny model: metrics, samples, checkpoints, resume, learning a trivial task."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import TINY_OVERRIDES, make_rollout, write_jsonl
from rewardlab import rollout_log
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards import REWARDS, register_reward, reward
from rewardlab.rl.credit import process_reward_tensors, reward_tensors
from rewardlab.rl.rollouts import ScoredEpisode, step_metrics, training_episodes
from rewardlab.rl.trainer import train
from rewardlab.runs import RunDir, RunDirError
from rewardlab.types import RewardOutput

if "test_digit_frac" not in REWARDS:  # the module may be imported twice (e.g. by a plugin)

    @reward(name="test_digit_frac")
    def _digit_frac(completion):
        """Fraction of completion characters that are digits: a dense, trivially learnable signal."""
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


REQUIRED_METRICS = {
    "reward/mean", "reward/std", "accuracy", "policy/entropy", "policy/clip_frac", "rollout/len_mean",
    "rollout/len_max", "rollout/truncated_frac", "rollout/tied_group_frac", "time/step_s", "time/gen_tokens_per_s",
    "time/reward_s",
}


def _task_file(tmp_path):
    # 30 distinct prompts "a+b=" with a in 0..9, b in 0..2.
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    return write_jsonl(tmp_path / "task.jsonl", rows)


def _config(tmp_path, out="run", *overrides):
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{_task_file(tmp_path)}", "task.options={test_size: 5}", f"out={tmp_path / out}",
        *TINY_OVERRIDES, "rl.prompts_per_step=4", "rl.group_size=4", "rl.sampling.max_new_tokens=4", "rl.lr=1e-2",
        "rewards=[{name: test_digit_frac}]", *overrides,
    ])


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- pure helpers
def test_reward_tensors_put_score_on_last_token():
    rollouts = [make_rollout("xx", group=0), make_rollout("x", group=0), make_rollout("xxx", group=1)]
    outputs = [RewardOutput(1.0), RewardOutput(0.5), RewardOutput(0.0, error="r: boom")]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float32)
    rewards, group = reward_tensors(rollouts, outputs, mask)
    assert rewards.tolist() == [[0.0, 1.0, 0.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert group.tolist() == [0, 0, 1]


def test_training_episodes_leave_out_skipped_episodes_and_small_groups():
    # groups: 0 = [ok, ok, err], 1 = [ok, err], 2 = [err, err], 3 = [ok]
    groups = [0, 0, 0, 1, 1, 2, 2, 3]
    errors = [None, None, "r: x", None, "r: x", "r: x", "r: x", None]
    rollouts = [make_rollout("x", group=g) for g in groups]
    outputs = [RewardOutput(0.0, error=e) for e in errors]
    # on_error=skip, min group size 2 (rloo): the 4 errored rollouts leave; group 1 keeps 1 and group 3 has 1 -> both
    # leave; group 2 has none left. Kept: group 0's two good rollouts; dropped groups 1, 2, 3.
    episodes = [ScoredEpisode((r,), o) for r, o in zip(rollouts, outputs)]
    every = list(range(len(episodes)))
    kept, skipped, dropped = training_episodes(episodes, every, skip_errors=True, min_group_size=2)
    assert kept == [0, 1] and (skipped, dropped) == (4, 3)
    # min group size 1 (reinforce_pp): group 1's survivor and group 3 stay
    kept, skipped, dropped = training_episodes(episodes, every, skip_errors=True, min_group_size=1)
    assert kept == [0, 1, 3, 7] and (skipped, dropped) == (4, 1)
    # on_error=zero: errored rollouts stay (score 0); only group 3 (one rollout) is below 2
    kept, skipped, dropped = training_episodes(episodes, every, skip_errors=False, min_group_size=2)
    assert kept == list(range(7)) and (skipped, dropped) == (0, 1)
    # only the given indices are looked at (the group filter's survivors): group 0 alone, one error skipped
    kept, skipped, dropped = training_episodes(episodes, [0, 1, 2], skip_errors=True, min_group_size=2)
    assert kept == [0, 1] and (skipped, dropped) == (1, 0)


def test_step_metrics_hand_computed():
    rollouts = [make_rollout("xx", group=0), make_rollout("xxxx", group=0, truncated=True),
                make_rollout("xxx", group=1), make_rollout("xxx", group=1)]
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


def test_process_reward_tensors_place_scores_on_step_ends():
    r0, r1 = make_rollout("xxxx", group=0), make_rollout("xxx", group=0)
    r0.steps, r0.step_text = [(0, 2), (2, 4)], ["xx", "xx"]
    r1.steps, r1.step_text = [(0, 3)], ["xxx"]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    outputs = [RewardOutput(1.0, step_scores=[0.8, 0.2]), RewardOutput(0.0, step_scores=[0.5])]
    sr, sm = process_reward_tensors([r0, r1], outputs, mask)
    assert torch.allclose(sr, torch.tensor([[0.0, 0.8, 0.0, 0.2], [0.0, 0.0, 0.5, 0.0]]))  # on tokens end - 1
    assert sm.tolist() == [[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="reward returned 1 step scores for a rollout with 2 steps"):
        process_reward_tensors([r0], [RewardOutput(1.0, step_scores=[1.0])], mask[:1])


def test_step_metrics_count_errors_per_reward():
    rollouts = [make_rollout("x", group=g) for g in (0, 0, 1, 1)]
    outputs = [RewardOutput(0.0, error="math: timeout after 5 s"),
               RewardOutput(0.0, error="math: ValueError: x; judge: HTTP 500"),
               RewardOutput(1.0), RewardOutput(0.0, error="judge: unparsable reply")]
    m = step_metrics(rollouts, outputs, group_size=2)
    assert m["reward/errors"] == 3.0  # rollouts with any error
    assert m["reward/errors/math"] == 2.0 and m["reward/errors/judge"] == 2.0


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
    with pytest.raises(RunDirError, match="^--resume: .*run holds no run to resume$"):
        train(_config(tmp_path), mode="resume", show_progress=False)
    RunDir.start(tmp_path / "run").close()  # a run that died before its first checkpoint
    with pytest.raises(RunDirError, match="^--resume: cannot resume .*run: it has no checkpoint$"):
        train(_config(tmp_path), mode="resume", show_progress=False)


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
    summary = train(_config(tmp_path, "b", "rl.steps=3", *extra), mode="resume", show_progress=False)
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
    assert rollout_log.logged_steps(tmp_path / "b") == [1, 2, 3]  # each step's rollouts file once, and the same
    step_a, step_b = rollout_log.read_step(tmp_path / "a", 3), rollout_log.read_step(tmp_path / "b", 3)
    for column in ("completion", "advantages", "logprob", "ratio"):
        assert step_a[column].to_pylist() == step_b[column].to_pylist(), column


@pytest.mark.slow
def test_mean_reward_rises_on_trivial_task(tmp_path):
    # reward = fraction of digit characters; a fresh model emits digits ~10/101 of the time.
    cfg = _config(tmp_path, "run", "rl.steps=15", "rl.group_size=8", "save_every=100")
    train(cfg, show_progress=False)
    rewards = [m["reward/mean"] for m in _metrics(tmp_path / "run")]
    assert len(rewards) == 15
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.3, rewards


# ---------------------------------------------------------------- the algorithm library through the trainer
if "test_step_digits" not in REWARDS:

    @reward(name="test_step_digits")
    def _step_digits(completion, steps):
        """Process reward: each step's digit fraction; the outcome is the whole completion's digit fraction."""
        frac = [sum(c.isdigit() for c in s) / max(1, len(s)) for s in steps]
        return RewardOutput(score=sum(c.isdigit() for c in completion) / max(1, len(completion)), step_scores=frac)

    @reward(name="test_step_only")
    def _step_only(steps):
        """Process reward only: each step's digit fraction as step scores, outcome score 0."""
        return RewardOutput(score=0.0, step_scores=[sum(c.isdigit() for c in s) / max(1, len(s)) for s in steps])

    @reward(name="test_constant")
    def _constant(completion):
        return 0.0

    @reward(name="test_prompt_tied")
    def _prompt_tied(prompt, completion):
        """Constant (a tied group) for prompts 'a+0=', the digit fraction otherwise."""
        if prompt.endswith("+0="):
            return 1.0
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


from rewardlab.rl.advantages import ESTIMATORS  # noqa: E402
from rewardlab.rl.losses import POLICY_LOSSES  # noqa: E402
from rewardlab.rl.specs import trainable_estimators  # noqa: E402

PROCESS = {"pure", "process_sum", "prime"}


def _algorithm_cases():
    cases = [(e, "ppo_clip") for e in sorted(ESTIMATORS) if e in trainable_estimators()]
    cases += [("grpo", loss) for loss in sorted(POLICY_LOSSES) if loss != "ppo_clip"]
    return cases


def test_every_registered_name_is_in_the_parametrized_run():
    assert {e for e, _ in _algorithm_cases()} == set(ESTIMATORS)
    assert {loss for _, loss in _algorithm_cases()} == set(POLICY_LOSSES)


@pytest.mark.slow
@pytest.mark.parametrize("estimator, loss", _algorithm_cases())
def test_train_runs_with_each_estimator_and_loss(tmp_path, estimator, loss):
    extra = ["rewards=[{name: test_step_digits}, {name: test_digit_frac, weight: 0.5}]", "rl.step_separator='5'"]
    cfg = _config(tmp_path, "run", "rl.steps=2", f"rl.estimator={estimator}", f"rl.loss={loss}", *extra)
    train(cfg, show_progress=False)
    metrics = _metrics(tmp_path / "run")
    assert len(metrics) == 2
    for m in metrics:
        assert all(v == v and abs(v) != float("inf") for v in m.values() if isinstance(v, float)), m
        assert m["policy/updates"] == 1.0
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert all(s["advantage"] is not None for s in samples)
    assert any(abs(s["advantage"]) > 0 for s in samples)  # the digit-fraction rewards differ within groups
    if estimator in PROCESS:
        assert all(len(s["step_scores"]) >= 1 for s in samples)


def test_gae_trains_a_critic_that_learns_the_returns(tmp_path):
    # gae's values come from a value model the trainer creates; its loss must fall as it fits the returns.
    cfg = _config(tmp_path, "run", "rl.steps=12", "rl.estimator=gae", "rl.critic_lr=3e-2", "save_every=6",
                  "rl.estimator_options={lam: 0.95}")
    train(cfg, show_progress=False)
    m = _metrics(tmp_path / "run")
    losses = [x["value/loss"] for x in m]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    assert (tmp_path / "run" / "checkpoints" / "step-12" / "critic" / "config.json").is_file()
    # resume restores the critic: step 12 after resuming from step 6 logs what the uninterrupted run logged
    train(_config(tmp_path, "b", "rl.steps=6", "rl.estimator=gae", "rl.critic_lr=3e-2", "save_every=6",
                  "rl.estimator_options={lam: 0.95}"), show_progress=False)
    train(_config(tmp_path, "b", "rl.steps=12", "rl.estimator=gae", "rl.critic_lr=3e-2", "save_every=6",
                  "rl.estimator_options={lam: 0.95}"), mode="resume", show_progress=False)
    assert _metrics(tmp_path / "b")[-1]["value/loss"] == pytest.approx(m[-1]["value/loss"], rel=1e-5)


def test_process_estimators_require_a_step_separator(tmp_path):
    with pytest.raises(ValueError, match="rl.step_separator: estimator 'pure' needs process rewards"):
        train(_config(tmp_path, "run", "rl.estimator=pure"), show_progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["pure", "process_sum"])
def test_process_reward_run_raises_the_step_reward(tmp_path, estimator):
    # Only step rewards: each step's digit fraction, steps split at "+". The outcome score is 0 so every bit of
    # credit comes from the process reward through the estimator's step returns.
    cfg = _config(tmp_path, "run", "rl.steps=15", "rl.group_size=8", "save_every=100", f"rl.estimator={estimator}",
                  "rl.step_separator=+", "rewards=[{name: test_step_only}]")
    train(cfg, show_progress=False)
    assert all(m["reward/mean"] == 0.0 for m in _metrics(tmp_path / "run"))
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    digits = [sum(sum(c.isdigit() for c in s["completion"]) / max(1, len(s["completion"])) for s in samples
                  if s["step"] == k) / 32 for k in range(1, 16)]
    first, last = sum(digits[:3]) / 3, sum(digits[-3:]) / 3
    assert last > first + 0.2, digits  # from ~0.11 (chance) to ~0.4


def test_remax_advantage_is_reward_minus_the_greedy_reward_of_the_prompt(tmp_path):
    train(_config(tmp_path, "run", "rl.steps=1", "rl.estimator=remax"), show_progress=False)
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    baselines = {}
    for s in samples:
        baselines.setdefault(s["group"], set()).add(round(s["reward"] - s["advantage"], 5))
    assert all(len(b) == 1 for b in baselines.values()), baselines  # one baseline per prompt group
    assert all(0.0 <= next(iter(b)) <= 1.0 for b in baselines.values())  # a digit fraction


def test_kl_in_reward_and_reference_refresh(tmp_path):
    common = ["rl.steps=2", "rl.beta=0.5", "rl.lr=5e-2"]
    train(_config(tmp_path, "r", *common, "rl.kl_in=reward"), show_progress=False)
    m = _metrics(tmp_path / "r")
    assert "policy/kl" not in m[0] and m[0]["policy/kl_reward"] == pytest.approx(0.0, abs=1e-6)  # policy == ref
    assert m[0]["policy/kl_clamped"] == 0.0  # no token's log-ratio near the +-20 bound, nor k3 near 10
    assert m[1]["policy/kl_reward"] > 0  # one update later the sampling policy has moved away from the reference
    train(_config(tmp_path, "l", *common), show_progress=False)
    assert _metrics(tmp_path / "l")[1]["policy/kl"] > 0
    assert _metrics(tmp_path / "l")[1]["policy/kl_clamped"] == 0.0
    # refreshing the reference every step: at each (single) update the policy equals the reference -> KL 0
    train(_config(tmp_path, "f", *common, "rl.ref_refresh_every=1"), show_progress=False)
    assert all(x["policy/kl"] == pytest.approx(0.0, abs=1e-6) for x in _metrics(tmp_path / "f"))


@pytest.mark.slow
def test_entropy_bonus_keeps_entropy_up(tmp_path):
    # The digit reward sharpens the policy (entropy falls from ~ln 101 = 4.6 nats); the bonus resists that.
    args = ["rl.steps=8", "rl.lr=3e-2", "rl.group_size=8"]
    train(_config(tmp_path, "bonus", *args, "rl.entropy_coef=0.5"), show_progress=False)
    train(_config(tmp_path, "none", *args), show_progress=False)
    bonus = [m["policy/entropy"] for m in _metrics(tmp_path / "bonus")]
    none = [m["policy/entropy"] for m in _metrics(tmp_path / "none")]
    assert none[-1] < none[0] - 0.1, none
    assert bonus[-1] > none[-1] + 0.05, (bonus, none)


def test_dynamic_sampling_drops_tied_groups_and_regenerates(tmp_path):
    # prompts "a+0=" (10 of 30) always score 1.0: their groups are tied and must be dropped
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.filtering.group_filter=dapo", "rl.filtering.max_rounds=4",
                  "rl.filtering.filter_metric=score", "rewards=[{name: test_prompt_tied}]")
    train(cfg, show_progress=False)
    metrics = _metrics(tmp_path / "run")
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sum(m["filter/dropped_groups"] for m in metrics) >= 1
    for m in metrics:
        assert m["filter/kept_groups"] <= 4 and m["filter/rounds"] >= 1
    kept = [s for s in samples if s["kept"]]
    assert not any(s["prompt"].endswith("+0=") for s in kept)
    dropped = [s for s in samples if not s["kept"]]
    assert dropped and all(s["prompt"].endswith("+0=") or s["advantage"] is None for s in dropped)
    for m in metrics:  # kept groups filled up to prompts_per_step unless rounds ran out
        assert m["filter/kept_groups"] == 4 or m["filter/rounds"] == 4


def test_curriculum_and_truncation_masking_run(tmp_path):
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.filtering.curriculum=pass_rate",
                  "rl.filtering.curriculum_options={sigma: 0.3}", "rl.mask_truncated=true",
                  "rl.sampling.max_new_tokens=2")
    train(cfg, show_progress=False)
    m = _metrics(tmp_path / "run")
    assert len(m) == 2 and m[0]["rollout/truncated_frac"] > 0


def test_unknown_curriculum_and_filter_names(tmp_path):
    with pytest.raises(ValueError, match="rl.filtering.curriculum: unknown name 'nope'; valid: pass_rate, uniform"):
        train(_config(tmp_path, "run", "rl.filtering.curriculum=nope"), show_progress=False)
    with pytest.raises(ValueError, match="rl.filtering.group_filter: unknown name 'x'; valid: accuracy, dapo"):
        train(_config(tmp_path, "run", "rl.filtering.group_filter=x"), show_progress=False)


if "test_sometimes_fails" not in REWARDS:

    @reward(name="test_sometimes_fails")
    def _sometimes_fails(completion):
        if any(c.isdigit() for c in completion[:1]):
            raise RuntimeError("first character is a digit")
        return 1.0


@pytest.mark.slow
def test_composed_and_shaped_reward_logs_every_component_and_error_counts(tmp_path):
    rewards = ("rewards=[{compose: gated, gate: {name: test_digit_frac}, threshold: 0.25, "
               "reward: {name: test_step_digits}}, "
               "{shape: overlong, reward: {name: test_digit_frac}, max_len: 4, buffer: 2, factor: 1.0, weight: 0.5}, "
               "{compose: penalty, reward: {name: test_constant}, penalties: [{name: test_digit_frac}]}, "
               "{name: test_sometimes_fails, weight: 0.1}]")
    train(_config(tmp_path, "run", "rl.steps=3", "rl.step_separator='5'", "rl.filtering.group_filter=dapo",
                  "rl.filtering.max_rounds=2", rewards), show_progress=False)
    metrics = _metrics(tmp_path / "run")
    for key in ("reward/gated/mean", "reward/test_digit_frac/mean", "reward/penalty/mean",
                "reward/test_sometimes_fails/mean", "reward/unshaped/mean"):
        assert all(key in m for m in metrics), (key, sorted(metrics[0]))
    errors = sum(m.get("reward/errors/test_sometimes_fails", 0.0) for m in metrics)
    assert errors == sum(m["reward/errors"] for m in metrics) > 0  # only that reward fails, and it does fail
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    failed = [s for s in samples if s["error"]]
    assert failed and all(s["error"].startswith("test_sometimes_fails: RuntimeError") and s["reward"] == 0.0
                          for s in failed)


def test_time_budget_stops_after_the_step_that_ends_past_it(tmp_path):
    # A zero budget is spent by the end of step 1, whatever the machine's speed: one step, then the final checkpoint.
    summary = train(_config(tmp_path, "run", "rl.steps=50", "save_every=100"), show_progress=False, time_budget_s=0.0)
    metrics = _metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["time/elapsed_s"] >= metrics[0]["time/step_s"] > 0
    assert summary["steps_done"] == 1 and summary["steps"] == 50
    assert summary["final_checkpoint"] == str(tmp_path / "run" / "checkpoints" / "step-1")


# ---------------------------------------------------------------- on_error=skip and non-finite rewards in training
def _digit_frac_output(completion, steps):
    frac = [sum(c.isdigit() for c in s) / max(1, len(s)) for s in steps]
    return RewardOutput(score=sum(c.isdigit() for c in completion) / max(1, len(completion)), step_scores=frac)


class _FailsByGroup:
    """Errors on the first rollout of each group with id % 3 == 0 and on every rollout of groups with id % 3 == 1;
    otherwise the digit fraction, with each step's digit fraction as step scores."""

    name = "test_fails_by_group"

    def __call__(self, rollouts):
        seen, outputs = set(), []
        for r in rollouts:
            first = r.group not in seen
            seen.add(r.group)
            if r.group % 3 == 1 or (r.group % 3 == 0 and first):
                outputs.append(RewardOutput(0.0, error=f"{self.name}: group {r.group}"))
            else:
                outputs.append(_digit_frac_output(r.completion, r.step_text))
        return outputs


if "test_fails_by_group" not in REWARDS:
    register_reward("test_fails_by_group")(lambda: _FailsByGroup())

if "test_nan_steps" not in REWARDS:

    @reward(name="test_nan_steps")
    def _nan_steps(completion, steps, rollout):
        """Step scores with a NaN in groups with even id (a broken process reward model), else digit fractions."""
        frac = [sum(c.isdigit() for c in s) / max(1, len(s)) for s in steps]
        if rollout.group % 2 == 0 and frac:
            frac[0] = float("nan")
        return RewardOutput(score=sum(c.isdigit() for c in completion) / max(1, len(completion)), step_scores=frac)


def _samples(path):
    return [json.loads(x) for x in (path / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("estimator", ["rloo", "pure", "process_sum"])
def test_on_error_skip_leaves_errored_rollouts_and_too_small_groups_out(tmp_path, estimator):
    # group_size 2. Groups with id % 3 == 0 lose one rollout (1 left < the 2 these estimators need), groups with
    # id % 3 == 1 lose both; groups with id % 3 == 2 train. Before: "group(s) -3 have 1" crashed the first step.
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.group_size=2", f"rl.estimator={estimator}", "on_error=skip",
                  "rl.step_separator='5'", "rewards=[{name: test_fails_by_group}]",
                  "rl.max_reward_error_frac=null")  # half the rollouts fail on purpose
    train(cfg, show_progress=False)
    metrics, samples = _metrics(tmp_path / "run"), _samples(tmp_path / "run")
    for m in metrics:
        step = [s for s in samples if s["step"] == m["step"]]
        ids = {s["group"] for s in step}
        zero, one = sum(g % 3 == 0 for g in ids), sum(g % 3 == 1 for g in ids)
        assert m["reward/errors"] == m["reward/skipped"] == zero + 2 * one
        assert m["rollout/dropped_groups"] == zero + one
        assert m["policy/updates"] == 1.0 and all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        for s in step:  # only the complete groups with id % 3 == 2 reach the estimator and the loss
            assert s["kept"] == (s["group"] % 3 == 2) and (s["advantage"] is None) == (not s["kept"]), s
    assert any(s["kept"] for s in samples)


def test_nan_step_score_is_a_reward_error_not_a_nan_advantage(tmp_path):
    # A NaN step score used to reach `pure` and NaN the advantages of its group, then the loss and the weights.
    cfg = _config(tmp_path, "run", "rl.steps=2", "rl.estimator=pure", "rl.step_separator='5'",
                  "rewards=[{name: test_nan_steps}]", "rl.max_reward_error_frac=null")  # half fail on purpose
    train(cfg, show_progress=False)
    metrics, samples = _metrics(tmp_path / "run"), _samples(tmp_path / "run")
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        step = [s for s in samples if s["step"] == m["step"]]
        assert m["reward/errors"] == m["reward/errors/test_nan_steps"] == sum(s["error"] is not None for s in step)
    failed = [s for s in samples if s["error"]]
    assert failed and all(s["error"] == "test_nan_steps: step_scores[0] is nan" and s["reward"] == 0.0
                          and s["group"] % 2 == 0 for s in failed)
    assert all(math.isfinite(s["advantage"]) for s in samples)


def test_group_size_below_the_estimators_minimum_is_refused(tmp_path):
    with pytest.raises(ValueError, match="rl.group_size: estimator 'rloo' needs at least 2 rollouts per prompt group, "
                                         "got 1"):
        train(_config(tmp_path, "run", "rl.estimator=rloo", "rl.group_size=1"), show_progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_loop_runs_with_the_set_up_frozen_out_of_the_cycle_collector_and_gives_it_back(tmp_path):
    import gc

    from rewardlab.rl.trainer import train

    frozen = []

    @reward(name="test_freeze_probe")
    def probe(completion):
        frozen.append(gc.get_freeze_count())
        return 0.0

    try:
        train(_config(tmp_path, "run", "rl.steps=1", "rewards=[{name: test_freeze_probe}]"), show_progress=False)
    finally:
        REWARDS.unregister("test_freeze_probe")
    assert frozen and min(frozen) > 1000  # torch's and the model's objects, frozen during the loop (rewardlab.threads)
    assert gc.get_freeze_count() == 0  # and given back when train returns


def test_a_run_emits_no_future_warning(tmp_path):
    """A run warns of nothing transformers will remove: the key/value cache goes in under the name this transformers
    takes (`cache` from 5.2x; `past_key_values` warned with a FutureWarning on every sampled token, removal in 5.40,
    while pyproject allows transformers < 6)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(_config(tmp_path, "run", "rl.steps=1", "rl.prompts_per_step=4", "rl.group_size=2"), show_progress=False)
    future = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, FutureWarning)]
    assert future == []
