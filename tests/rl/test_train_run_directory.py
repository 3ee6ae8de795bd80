"""`rewardlab train` and its run directory: a used directory is refused, --overwrite replaces it, --resume repairs a
torn log line and skips a damaged checkpoint, a second writer is locked out."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main


def _args(tmp_path, out, *extra):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return ["train", "--no-progress", "--out", str(out), "--task", f"jsonl:{task}", "task.options={test_size: 5}",
            *TINY_OVERRIDES, "rl.prompts_per_step=2", "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=1e-2",
            "rewards=[{name: chrf}]", *extra]  # chrF: partial credit, so the rewards vary and the model moves


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_same_metrics(got, expected):
    """The same steps with the same metrics, but for time/* (wall clock), to float32 round-off: a model reloaded
    from a checkpoint computes log-probabilities ~1e-15 apart from the one kept in memory."""
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for g, e in zip(got, expected):
        keys = {k for k in e if not k.startswith("time/")}
        assert keys == {k for k in g if not k.startswith("time/")}
        for k in sorted(keys):
            assert g[k] == pytest.approx(e[k], rel=1e-6, abs=1e-9), (g["step"], k)


def _err_lines(capsys):
    return capsys.readouterr().err.strip().splitlines()


def test_reusing_a_run_directory_is_refused_and_overwrite_replaces_it(tmp_path, capsys):
    out = tmp_path / "D"
    assert main(_args(tmp_path, out, "rl.steps=12", "save_every=9")) == 0  # run A: checkpoints step-9, step-12
    before = _snapshot(out)
    capsys.readouterr()
    assert main(_args(tmp_path, out, "rl.steps=2")) == 2  # run B without a flag
    assert _err_lines(capsys) == [f"rewardlab train: error: out: {out} already holds a run; pass --resume to continue "
                                  "it or --overwrite to replace it"]
    assert _snapshot(out) == before  # untouched
    # bad inputs with --overwrite delete nothing: the task is checked first
    assert main([*_args(tmp_path, out, "rl.steps=2"), "--overwrite", "--task", "jsonl:/nonexistent.jsonl"]) == 2
    assert _snapshot(out) == before

    assert main([*_args(tmp_path, out, "rl.steps=2"), "--overwrite"]) == 0
    assert f"--overwrite: deleted the previous run in {out}" in capsys.readouterr().err
    assert [m["step"] for m in _lines(out / "metrics.jsonl")] == [1, 2]  # only run B's steps
    assert sorted({s["step"] for s in _lines(out / "samples.jsonl")}) == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_checkpoint"] == str(out / "checkpoints" / "step-2") and summary["steps_done"] == 2
    assert "steps: 2\n" in (out / "config.yaml").read_text()
    assert [e["event"] for e in _lines(out / "events.jsonl")] == ["overwrite"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A 4-step run checkpointed at steps 2 and 4, and a copy of its directory to damage."""
    tmp = tmp_path_factory.mktemp("train")
    assert main(_args(tmp, tmp / "A", "rl.steps=4", "save_every=2", "rl.epochs=2", "rl.minibatch_size=2")) == 0
    return tmp


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_resume_cuts_a_torn_metrics_line_and_logs_every_step_once(uninterrupted, tmp_path, capsys):
    a = uninterrupted / "A"
    d = _copy(a, tmp_path / "D")
    # The state a SIGKILL during step 3's metrics write leaves: step-2 is the last checkpoint, step 3's line is torn.
    import shutil

    shutil.rmtree(d / "checkpoints" / "step-4")
    (d / "summary.json").unlink()
    lines = (a / "metrics.jsonl").read_text().splitlines(keepends=True)
    (d / "metrics.jsonl").write_text(lines[0] + lines[1] + lines[2][:25])
    capsys.readouterr()
    assert main([*_args(uninterrupted, d, "rl.steps=4", "save_every=2", "rl.epochs=2", "rl.minibatch_size=2"),
                 "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"{d / 'metrics.jsonl'}: cut a torn last line (25 bytes)" in err
    raw = (d / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in raw]  # every line is valid JSON
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # no step lost, none twice
    _assert_same_metrics(records, _lines(a / "metrics.jsonl"))  # what the uninterrupted run logged
    assert [(s["step"], s["completion"]) for s in _lines(d / "samples.jsonl")] == [
        (s["step"], s["completion"]) for s in _lines(a / "samples.jsonl")]
    assert json.loads((d / "summary.json").read_text())["resumed_from"] == 2


def test_resume_skips_a_damaged_checkpoint_and_refuses_when_none_is_valid(uninterrupted, tmp_path, capsys):
    a = uninterrupted / "A"
    d = _copy(a, tmp_path / "D")
    (d / "checkpoints" / "step-4" / "model.safetensors").write_bytes(b"")  # an empty weights file
    args = _args(uninterrupted, d, "rl.steps=4", "save_every=2", "rl.epochs=2", "rl.minibatch_size=2")
    capsys.readouterr()
    assert main([*args, "--resume", "rl.lr=1e-3"]) == 2  # train on, but with another learning rate: refused
    assert _err_lines(capsys) == [f"rewardlab train: error: --resume: {d} was started with other settings: rl.lr (run: "
                                  f"0.01, now: 0.001); resume with its settings ({d / 'config.yaml'}) or pass "
                                  "--overwrite"]
    assert main([*args, "--resume"]) == 0
    warnings = [line for line in _err_lines(capsys) if "step-4" in line]
    assert len(warnings) == 1 and warnings[0].startswith("rewardlab: warning: checkpoint ")
    assert "step-4 is invalid (model.safetensors: 0 bytes, manifest says" in warnings[0]
    assert warnings[0].endswith("; skipping it")
    summary = json.loads((d / "summary.json").read_text())
    assert summary["resumed_from"] == 2 and summary["final_checkpoint"] == str(d / "checkpoints" / "step-4")
    _assert_same_metrics(_lines(d / "metrics.jsonl"), _lines(a / "metrics.jsonl"))
    assert (d / "checkpoints" / "step-4" / "model.safetensors").stat().st_size == (
        a / "checkpoints" / "step-4" / "model.safetensors").stat().st_size  # written again

    for step in (2, 4):
        (d / "checkpoints" / f"step-{step}" / "trainer_state.pt").write_bytes(b"garbage")
    assert main([*args, "--resume"]) == 2
    err = _err_lines(capsys)
    assert err[-1] == f"rewardlab train: error: --resume: cannot resume {d}: none of its 2 checkpoint(s) is valid"
    assert len(err) == 3 and all(line.startswith("rewardlab: warning: checkpoint") for line in err[:2])


def test_a_second_writer_is_refused(tmp_path, capsys):
    out = tmp_path / "D"
    cmd = [sys.executable, "-m", "rewardlab.cli", *_args(tmp_path, out, "rl.steps=100000", "save_every=1")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        # any checkpoint: with keep_checkpoints=2 a fast machine prunes step-1 before a 50 ms poll sees it
        while not any((out / "checkpoints").glob("step-*")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        capsys.readouterr()
        for flag in ("--resume", "--overwrite"):
            assert main([*_args(tmp_path, out, "rl.steps=2"), flag]) == 2
            assert _err_lines(capsys) == [f"rewardlab train: error: out: {out} is in use by another process (pid "
                                          f"{proc.pid}; lock {out / '.lock'})"]
        # --overwrite deleted nothing (the child goes on writing its run) and neither attempt logged an event
        assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1
        assert [e["event"] for e in _lines(out / "events.jsonl")] == ["start"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert main([*_args(tmp_path, out, "rl.steps=2"), "--overwrite"]) == 0  # the lock died with its holder


class _Hostile:
    """Unpickling it calls os.mkdir(marker): a trainer_state.pt someone shared that runs code on --resume."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_resume_refuses_a_trainer_state_that_would_run_code(uninterrupted, tmp_path, capsys):
    import hashlib
    import shutil

    import torch

    d = _copy(uninterrupted / "A", tmp_path / "D")
    shutil.rmtree(d / "checkpoints" / "step-4")
    (d / "summary.json").unlink()
    step2, marker = d / "checkpoints" / "step-2", tmp_path / "pwned"
    torch.save({"step": 2, "rng": _Hostile(marker)}, step2 / "trainer_state.pt")
    manifest = json.loads((step2 / "manifest.json").read_text())  # a consistent manifest: it is not a signature
    data = (step2 / "trainer_state.pt").read_bytes()
    manifest["files"]["trainer_state.pt"] = {**manifest["files"]["trainer_state.pt"], "size": len(data),
                                             "sha256": hashlib.sha256(data).hexdigest()}
    (step2 / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    args = _args(uninterrupted, d, "rl.steps=4", "save_every=2", "rl.epochs=2", "rl.minibatch_size=2")
    assert main([*args, "--resume"]) == 2
    assert not marker.exists()
    err = _err_lines(capsys)
    assert err[-1].startswith(f"rewardlab train: error: {step2 / 'trainer_state.pt'}: ") and "mkdir" in err[-1]
