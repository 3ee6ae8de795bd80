"""`sft` during the run: greedy held-out evaluation every sft.eval_every steps (eval/accuracy) that leaves training
unchanged, and a first Ctrl-C that ends the run after the step with a checkpoint, the summary and `Interrupted`, from
which --resume continues to the uninterrupted run's weights, bit for bit."""

import json
import signal

import pytest

import rewardlab.sft as sft
from conftest import TINY_OVERRIDES, write_jsonl, read_jsonl, sha256_of, without_keys
from rewardlab.commands.sft import run as run_sft
from rewardlab.config import SFTConfig, load_config
from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
from rewardlab.policy.settings import SamplingSettings
from rewardlab.interrupt import Interrupted
from rewardlab.policy import load_policy
from rewardlab.rewards import build_reward
from rewardlab.runs import verify_checkpoint
from rewardlab.tasks import load as load_task

#: Every training answer is "7": a few steps teach the tiny model to write "7" and stop, whatever the question.
ROWS = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(4)]
#: Held-out answers that "7" matches exactly (1 of 3), partly (chrF of "7" against "77") and not at all.
TEST_ROWS = [{"prompt": "3+4=", "answer": "7"}, {"prompt": "70+7=", "answer": "77"}, {"prompt": "1+0=", "answer": "1"}]


def _config(tmp_path, out, *overrides):
    task, test = write_jsonl(tmp_path / "task.jsonl", ROWS), write_jsonl(tmp_path / "test.jsonl", TEST_ROWS)
    # chrF as the task's verifier: a greedy "1x" gets partial credit, so eval/score_mean is a number to check.
    return load_config(SFTConfig, None, [
        f"task.spec=jsonl:{task}", f"task.options={{test_path: {test}, reward: chrf}}", f"out={tmp_path / out}",
        *TINY_OVERRIDES, "sft.batch_size=8", "sft.lr=1e-2", *overrides,
    ])


_lines, _sha, _without = read_jsonl, sha256_of, without_keys


def test_sft_eval_every_logs_heldout_greedy_accuracy_and_leaves_training_unchanged(tmp_path):
    run_sft(_config(tmp_path, "A", "sft.steps=12"), show_progress=False)
    run_sft(_config(tmp_path, "B", "sft.steps=12", "sft.eval_every=5", "sft.eval_n=3"), show_progress=False)
    a, b = _lines(tmp_path / "A" / "metrics.jsonl"), _lines(tmp_path / "B" / "metrics.jsonl")
    assert [r["step"] for r in b if "eval/accuracy" in r] == [5, 10, 12]
    assert _without(b, "eval/", "time/") == _without(a, "eval/", "time/")  # the same losses and lr, bit for bit
    weights = "checkpoints/step-12/model.safetensors"
    assert _sha(tmp_path / "B" / weights) == _sha(tmp_path / "A" / weights)
    # After 12 steps the model answers "7" to all three held-out questions: one of them is right.
    task = load_task(f"jsonl:{tmp_path / 'task.jsonl'}", test_path=str(tmp_path / "test.jsonl"), reward="chrf")
    policy = load_policy(str(tmp_path / "B" / "checkpoints" / "step-12"))
    # completions up to the longest training target: "7" + EOS, 2 tokens
    want = evaluate_policy(policy, task.test, build_reward("chrf"), SamplingSettings(max_new_tokens=2),
                           settings=EvalSettings(n=0, ks=()))
    assert [e["completion"] for e in want["examples"]] == ["7", "7", "7"]
    assert b[-1]["eval/accuracy"] == want["accuracy"] == pytest.approx(1 / 3)
    assert b[-1]["eval/score_mean"] == want["score_mean"] > 1 / 3  # chrF gives "7" against "77" partial credit


def test_sft_eval_every_without_heldout_rows_is_refused(tmp_path):
    cfg = _config(tmp_path, "R", "sft.steps=1", "sft.eval_every=1", "task.options={test_size: 0}")
    with pytest.raises(ValueError, match=r"^sft.eval_every: task jsonl:.* has no held-out test rows to evaluate on"):
        run_sft(cfg, show_progress=False)
    assert not (tmp_path / "R").exists()  # refused before the run directory is created


def test_ctrl_c_in_sft_checkpoints_the_step_and_resume_reaches_the_same_weights(tmp_path, monkeypatch):
    common = ["sft.steps=6", "save_every=4"]
    full = run_sft(_config(tmp_path, "A", *common), show_progress=False)

    loss, calls = sft.sft_loss, []

    def loss_with_sigint_in_step_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            signal.raise_signal(signal.SIGINT)
        return loss(*args, **kwargs)

    handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(sft, "sft_loss", loss_with_sigint_in_step_3)
    b = tmp_path / "B"
    with pytest.raises(Interrupted, match=rf"^interrupted at step 3; checkpoint step-3 written; continue with: "
                                          rf"rewardlab sft --out {b} --resume$"):
        run_sft(_config(tmp_path, "B", *common), show_progress=False)
    assert signal.getsignal(signal.SIGINT) is handler
    assert [m["step"] for m in _lines(b / "metrics.jsonl")] == [1, 2, 3]
    assert verify_checkpoint(b / "checkpoints" / "step-3") is None
    summary = json.loads((b / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps_done"] == 3

    monkeypatch.undo()
    resumed = run_sft(_config(tmp_path, "B", *common), mode="resume", show_progress=False)
    assert resumed["resumed_from"] == 3 and resumed["interrupted"] is False
    assert resumed["final_loss"] == full["final_loss"]
    weights = "checkpoints/step-6/model.safetensors"
    assert _sha(b / weights) == _sha(tmp_path / "A" / weights)
