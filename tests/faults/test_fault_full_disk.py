"""A disk that fills up during `rewardlab train`: the checkpoint being written fails, the run stops with a one-line
error (exit 2) naming it and the intact previous checkpoint, and --resume continues from that one.

The full disk is simulated with a file-size limit (RLIMIT_FSIZE) that the test lowers on the running child once its
first checkpoint is in place (Python ignores SIGXFSZ, so a write past the limit fails with EFBIG, "File too large",
as one past a full disk fails with ENOSPC). No mount or privilege is needed.
"""

import json
import subprocess
import time

import pytest

from cli_kill import check_every_log, child_env, cli, read_strict
from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.runs import verify_checkpoint

resource = pytest.importorskip("resource")
if not hasattr(resource, "prlimit"):
    pytest.skip("resource.prlimit (Linux) is needed to limit the child's file size", allow_module_level=True)

STEPS = 6


def _args(tmp_path, out):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return ["train", "--out", str(out), "--task", f"jsonl:{task}", "task.options={test_size: 5}", *TINY_OVERRIDES,
            "rewards=[{name: chrf}]", f"rl.steps={STEPS}", "rl.prompts_per_step=2", "rl.group_size=4",
            "rl.sampling.max_new_tokens=3", "rl.lr=1e-2", "save_every=2"]


def test_a_full_disk_fails_the_checkpoint_cleanly_and_the_run_resumes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_args(tmp_path, a), "--no-progress"]) == 0

    # pause: 0.1 s before each log line, so the limit is in place well before step 4's checkpoint
    proc = subprocess.Popen(cli(_args(tmp_path, b), pause=0.1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=child_env())
    try:
        deadline = time.monotonic() + 180
        while not (b / "checkpoints" / "step-2").is_dir():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.002)
        # Below the size of the weights file, above what the logs will reach.
        limit = (b / "checkpoints" / "step-2" / "model.safetensors").stat().st_size // 2
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == (f"rewardlab train: error: checkpoint step-4 in {b / 'checkpoints'} could "
                                            "not be written (File too large); the previous checkpoint step-2 is intact")
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == ["step-2"]  # no partial step-4, no temp dir
    assert verify_checkpoint(b / "checkpoints" / "step-2") is None
    assert not (b / "summary.json").exists()
    assert all(p.stat().st_size < limit for p in b.glob("*.jsonl"))  # it was the checkpoint that hit the limit

    # With space again, --resume continues from step 2 and logs what the uninterrupted run logged.
    assert main([*_args(tmp_path, b), "--resume", "--no-progress"]) == 0
    check_every_log(b)
    got, expected = read_strict(b / "metrics.jsonl"), read_strict(a / "metrics.jsonl")
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    for g, e in zip(got, expected):
        for key in e:
            if not key.startswith("time/"):
                assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    summary = json.loads((b / "summary.json").read_text())
    assert summary["resumed_from"] == 2 and summary["final_checkpoint"] == str(b / "checkpoints" / f"step-{STEPS}")
