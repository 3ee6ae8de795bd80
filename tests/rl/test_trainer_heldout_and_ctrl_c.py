"""`train` during the run: greedy held-out evaluation every rl.eval.every steps (eval/accuracy) that leaves training
unchanged, rollout/generated per step and in total (every group-filter round), and a first Ctrl-C that ends the run
after the step with a checkpoint, the summary and `Interrupted`, from which --resume continues to the uninterrupted
run's end."""

import json
import signal

import pytest

import rewardlab.rl.trainer as trainer
from conftest import TINY_OVERRIDES, write_jsonl, read_jsonl, sha256_of, without_keys
from rewardlab.config import TrainConfig, load_config
from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
from rewardlab.policy.settings import SamplingSettings
from rewardlab.interrupt import Interrupted
from rewardlab.policy import load_policy
from rewardlab.rewards import build_reward
from rewardlab.runs import verify_checkpoint
from rewardlab.tasks import load as load_task

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


#: Held-out rows (task.options.test_path) whose answers share characters with what the briefly trained tiny model
#: writes ("===" here), so that chrF gives them partial credit.
TEST_ROWS = [{"prompt": p, "answer": a} for p, a in [("9+9=", "18="), ("4+4=", "=8"), ("44+44=", "=="), ("5+4=", "9"),
                                                       ("1+0=", "1")]]


def _config(tmp_path, out, *overrides):
    task = write_jsonl(tmp_path / "task.jsonl", ROWS)
    test = write_jsonl(tmp_path / "test.jsonl", TEST_ROWS)
    # chrF as the task's verifier: greedy completions get partial credit, so eval/score_mean is a number to check.
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", f"task.options={{test_path: {test}, reward: chrf}}", f"out={tmp_path / out}",
        *TINY_OVERRIDES, "rl.prompts_per_step=2", "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=1e-2",
        "rl.epochs=2", "rl.minibatch_size=4", *overrides,
    ])


_lines, _sha, _without = read_jsonl, sha256_of, without_keys


def test_eval_every_logs_heldout_greedy_accuracy_and_leaves_training_unchanged(tmp_path):
    plain = trainer.train(_config(tmp_path, "A", "rl.steps=5"), show_progress=False)
    evald = trainer.train(_config(tmp_path, "B", "rl.steps=5", "rl.eval.every=2", "rl.eval.n=4"),
                          show_progress=False)
    a, b = _lines(tmp_path / "A" / "metrics.jsonl"), _lines(tmp_path / "B" / "metrics.jsonl")
    # evaluated at every 2nd step and at the last; the run without it logs no eval/*
    assert [r["step"] for r in b if "eval/accuracy" in r] == [2, 4, 5]
    assert not any(k.startswith("eval/") for r in a for k in r)
    # the evaluation draws no random numbers and changes no state: training is the same, bit for bit (the
    # over-optimization monitor, on at the evaluation's cadence by default, likewise: tests/rl/test_monitor.py)
    assert _without(b, "eval/", "time/", "monitor/") == _without(a, "eval/", "time/")
    weights = "checkpoints/step-5/model.safetensors"
    assert _sha(tmp_path / "B" / weights) == _sha(tmp_path / "A" / weights)
    assert plain["final_metrics"]["reward/mean"] == evald["final_metrics"]["reward/mean"]
    # the figures are evaluate_policy's greedy result on the first 4 held-out rows, under the task's verifier
    task = load_task(f"jsonl:{tmp_path / 'task.jsonl'}", test_path=str(tmp_path / "test.jsonl"), reward="chrf")
    assert sorted(r["answer"] for r in task.test) == ["1", "18=", "9", "=8", "=="]  # (in the loader's order)
    policy = load_policy(str(tmp_path / "B" / "checkpoints" / "step-5"))
    want = evaluate_policy(policy, task.test[:4], build_reward("chrf"), SamplingSettings(max_new_tokens=3),
                           settings=EvalSettings(n=0, ks=()))
    assert 0 < want["score_mean"] < 1  # chrF partial credit: a figure that a wrong row set or reward would change
    assert (b[-1]["eval/accuracy"], b[-1]["eval/score_mean"]) == (want["accuracy"], want["score_mean"])
    assert (tmp_path / "B" / "plots" / "train.png").is_file()


def test_eval_every_without_heldout_rows_is_refused_before_the_run_directory(tmp_path):
    cfg = _config(tmp_path, "R", "rl.steps=1", "rl.eval.every=1", "task.options={test_size: 0}")
    assert load_task(cfg.task.spec, **cfg.task.options).test == []
    with pytest.raises(ValueError, match=r"^rl.eval.every: task jsonl:.* has no held-out test rows to evaluate on; "
                                         r"hold some out \(task.options.test_size\) or set rl.eval.every=0$"):
        trainer.train(cfg, show_progress=False)
    assert not (tmp_path / "R").exists()


def test_rollout_generated_counts_every_group_filter_round(tmp_path):
    # exact_match on the untrained model scores every rollout 0: DAPO drops every group, so each step runs all 3
    # rounds of 2 prompts x 4 rollouts = 24 rollouts, all logged in samples.jsonl.
    trainer.train(_config(tmp_path, "R", "rl.steps=3", "rewards=[{name: exact_match}]",
                          "rl.filtering.group_filter=dapo", "rl.filtering.max_rounds=3"), show_progress=False)
    metrics = _lines(tmp_path / "R" / "metrics.jsonl")
    assert [m["filter/rounds"] for m in metrics] == [3, 3, 3]
    assert [m["rollout/generated"] for m in metrics] == [24, 24, 24]
    assert [m["rollout/generated_total"] for m in metrics] == [24, 48, 72]
    samples = _lines(tmp_path / "R" / "samples.jsonl")
    assert [sum(s["step"] == k for s in samples) for k in (1, 2, 3)] == [24, 24, 24]


def _interrupt_at(monkeypatch, at_step):
    """SIGINT this process in the middle of step `at_step` (after its rollouts, before its update)."""
    update = trainer.update

    def update_then_sigint(run, credit, step):
        if step == at_step:
            signal.raise_signal(signal.SIGINT)
        return update(run, credit, step)

    monkeypatch.setattr(trainer, "update", update_then_sigint)


def test_ctrl_c_finishes_the_step_checkpoints_it_and_resume_reaches_the_uninterrupted_end(tmp_path, monkeypatch):
    common = ["rl.steps=6", "save_every=4", "rl.eval.every=2", "rl.eval.n=3"]
    full = trainer.train(_config(tmp_path, "A", *common), show_progress=False)

    handler = signal.getsignal(signal.SIGINT)
    _interrupt_at(monkeypatch, 3)
    with pytest.raises(Interrupted) as caught:
        trainer.train(_config(tmp_path, "B", *common), show_progress=False)
    b = tmp_path / "B"
    assert str(caught.value) == (f"interrupted at step 3; checkpoint step-3 written; continue with: rewardlab train "
                                 f"--out {b} --resume")
    assert signal.getsignal(signal.SIGINT) is handler  # restored for the caller
    assert [m["step"] for m in _lines(b / "metrics.jsonl")] == [1, 2, 3]  # step 3 finished and logged
    assert verify_checkpoint(b / "checkpoints" / "step-3") is None  # complete, matches its manifest
    summary = json.loads((b / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps_done"] == 3
    assert summary["final_checkpoint"] == str(b / "checkpoints" / "step-3")

    monkeypatch.undo()
    resumed = trainer.train(_config(tmp_path, "B", *common), mode="resume", show_progress=False)
    assert resumed["resumed_from"] == 3 and resumed["interrupted"] is False and resumed["steps_done"] == 6
    got, want = _lines(b / "metrics.jsonl"), _lines(tmp_path / "A" / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, 7))
    assert [m["rollout/generated_total"] for m in got] == [8, 16, 24, 32, 40, 48]  # the total survives the resume
    for g, e in zip(_without(got, "time/"), _without(want, "time/")):
        assert g.keys() == e.keys()
        for key in e:  # a model reloaded from a checkpoint computes log-probs ~1e-15 apart from the one in memory
            assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    assert full["steps_done"] == 6
