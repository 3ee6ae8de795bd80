"""`rewardlab evaluate` and its run directory: finished batches are logged with the RNG state, --resume skips them
and gives the uninterrupted run's summary; a used directory and a resume with other settings are refused."""

import json
import shutil

import pytest
import torch

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import EvaluateConfig, load_config
from rewardlab.commands.evaluate import run as run_evaluate
from rewardlab.train_state import restore_rng_state, rng_state_record
from rewardlab.runs import RunDirError


def _config(tmp_path, out, *overrides):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(4)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return load_config(EvaluateConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 10}", "split=test", f"out={out}", "model.path=tiny",
        *TINY_OVERRIDES, "eval.n=4", "eval.k=[1, 4]", "eval.max_new_tokens=2", "eval.batch_size=3", *overrides])


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    run_evaluate(_config(tmp, tmp / "A"), show_progress=False)
    return tmp


def test_rng_state_record_round_trips():
    torch.manual_seed(3)
    rec = rng_state_record()
    first = torch.rand(5)
    torch.rand(7)
    restore_rng_state(json.loads(json.dumps(rec)))  # through JSON, as in the log
    assert torch.equal(torch.rand(5), first)


def test_batches_are_logged_with_the_rng_state(uninterrupted):
    batches = _lines(uninterrupted / "A" / "batches.jsonl")
    # 10 questions in batches of 3: starts 0, 3, 6, 9
    assert [(b["batch"], b["start"], b["size"]) for b in batches] == [(0, 0, 3), (1, 3, 3), (2, 6, 3), (3, 9, 1)]
    summary = json.loads((uninterrupted / "A" / "summary.json").read_text())
    correct = [c for b in batches for c in b["correct"]]
    assert summary["accuracy"] == sum(correct) / 10
    assert all(0 <= c <= 4 for b in batches for c in b["pass_counts"])
    assert len({b["rng"]["torch"] for b in batches}) == 4  # sampling moved the RNG after every batch


def test_resume_skips_finished_batches_and_matches_the_uninterrupted_run(uninterrupted, tmp_path):
    a = uninterrupted / "A"
    d = shutil.copytree(a, tmp_path / "D")
    lines = (a / "batches.jsonl").read_text().splitlines(keepends=True)
    (d / "summary.json").unlink()
    (d / "batches.jsonl").write_text(lines[0] + lines[1] + lines[2][:40])  # killed while logging batch 2
    summary = run_evaluate(_config(uninterrupted, d), mode="resume", show_progress=False)
    expected = json.loads((a / "summary.json").read_text())
    assert {k: v for k, v in summary.items() if k != "wall_s"} == {k: v for k, v in expected.items() if k != "wall_s"}
    assert _lines(d / "batches.jsonl") == _lines(a / "batches.jsonl")  # same figures and RNG states, each batch once
    assert _lines(d / "predictions.jsonl") == _lines(a / "predictions.jsonl")  # resumed batches' predictions too

    # The logged batches are taken as they are, not evaluated again: mark batch 0's three questions right.
    rec = json.loads(lines[0])
    rec["correct"], rec["pass_counts"] = [True] * 3, [4] * 3
    (d / "batches.jsonl").write_text(json.dumps(rec) + "\n" + lines[1])
    (d / "summary.json").unlink()
    summary = run_evaluate(_config(uninterrupted, d), mode="resume", show_progress=False)
    later = [c for b in _lines(a / "batches.jsonl")[1:] for c in b["correct"]]
    assert summary["accuracy"] == (3 + sum(later)) / 10


def test_a_used_directory_and_a_resume_with_other_settings_are_refused(uninterrupted, tmp_path):
    d = shutil.copytree(uninterrupted / "A", tmp_path / "D")
    with pytest.raises(RunDirError, match=r"^out: .*D already holds a run; pass --resume to continue it or "
                                          r"--overwrite to replace it$"):
        run_evaluate(_config(uninterrupted, d), show_progress=False)
    with pytest.raises(RunDirError) as info:
        run_evaluate(_config(uninterrupted, d, "eval.n=2", "eval.k=[1]"), mode="resume", show_progress=False)
    assert str(info.value) == (f"--resume: {d} was started with other settings: eval.n (run: 4, now: 2), eval.k "
                               f"(run: [1, 4], now: [1]); resume with its settings ({d / 'config.yaml'}) or pass "
                               "--overwrite")
    summary = run_evaluate(_config(uninterrupted, d, "eval.n=2", "eval.k=[1]"), mode="overwrite", show_progress=False)
    assert summary["samples_per_question"] == 2 and len(_lines(d / "batches.jsonl")) == 4
