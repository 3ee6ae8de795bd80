"""Run directories: append-only metrics, last-line-wins reads, atomic checkpoints, pruning, summary."""

import errno
import json
import os
import signal
import subprocess
import sys

import pytest

from rewardlab.runs import RunDir, RunDirError, atomic_write_text, verify_checkpoint


def _write_file(text):
    def write(tmp):
        (tmp / "weights.txt").write_text(text)

    return write


def test_log_metrics_appends_lines(tmp_path):
    run = RunDir(tmp_path / "run")
    run.log_metrics(1, {"reward/mean": 0.5})
    first = (run.path / "metrics.jsonl").read_text()
    run.log_metrics(2, {"reward/mean": 0.75})
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert lines[0] + "\n" == first  # the earlier line is unchanged
    assert json.loads(lines[1]) == {"step": 2, "reward/mean": 0.75}


def test_log_metrics_writes_non_finite_values_as_json(tmp_path):
    run = RunDir(tmp_path)
    run.log_metrics(1, {"a": float("nan"), "b": float("inf"), "c": float("-inf")})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line) == {"step": 1, "a": None, "b": "inf", "c": "-inf"}  # strict JSON, no NaN literal
    assert "NaN" not in line


def test_read_metrics_last_line_per_step_wins(tmp_path):
    run = RunDir(tmp_path)
    run.log_metrics(1, {"x": 1})
    run.log_metrics(2, {"x": 2})
    run.log_metrics(1, {"x": 10})  # a resumed run logs step 1 again
    assert run.read_metrics() == [{"step": 1, "x": 10}, {"step": 2, "x": 2}]


def test_read_metrics_ignores_torn_last_line(tmp_path):
    run = RunDir(tmp_path)
    run.log_metrics(1, {"x": 1})
    run.log_metrics(2, {"x": 2})
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 3, "x"')  # crash mid-write
    assert run.read_metrics() == [{"step": 1, "x": 1}, {"step": 2, "x": 2}]


def test_read_metrics_without_file(tmp_path):
    assert RunDir(tmp_path).read_metrics() == []


def test_log_samples_appends_one_line_per_record(tmp_path):
    run = RunDir(tmp_path)
    run.log_samples([{"step": 1, "completion": "7"}, {"step": 1, "completion": "8"}])
    run.log_samples([])
    run.log_samples([{"step": 2, "completion": "é"}])
    lines = (tmp_path / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["completion"] for x in lines] == ["7", "8", "é"]


def test_save_checkpoint_renames_into_place(tmp_path):
    run = RunDir(tmp_path)
    path = run.save_checkpoint(3, _write_file("w3"))
    assert path == tmp_path / "checkpoints" / "step-3"
    assert (path / "weights.txt").read_text() == "w3"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-3"]  # no temp dir left
    assert run.latest_checkpoint() == (3, path)


def test_save_checkpoint_failure_leaves_no_step_dir(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(4, _write_file("w4"))

    def crash(tmp):
        (tmp / "half.bin").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=r"checkpoint step-5 .* could not be written \(No space left on device\); "
                                      r"the previous checkpoint step-4 is intact"):
        run.save_checkpoint(5, crash)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-4"]  # temp dir removed too
    assert run.latest_valid_checkpoint() == (4, tmp_path / "checkpoints" / "step-4")


def test_save_checkpoint_keep_prunes_older(tmp_path):
    run = RunDir(tmp_path)
    for step in (1, 2, 3, 10):
        run.save_checkpoint(step, _write_file(f"w{step}"), keep=2)
    # sorted by step number (10 after 3, not as text), the two most recent stay.
    assert [s for s, _ in run.list_checkpoints()] == [3, 10]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-10", "step-3"]


def test_save_checkpoint_same_step_replaces(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(2, _write_file("old"))
    (tmp_path / "checkpoints" / "step-2" / "stale.txt").write_text("x")
    run.save_checkpoint(2, _write_file("new"))
    step2 = tmp_path / "checkpoints" / "step-2"
    assert (step2 / "weights.txt").read_text() == "new"
    assert not (step2 / "stale.txt").exists()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-2"]  # the old copy is gone


def test_list_checkpoints_ignores_other_entries(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(4, _write_file("w"))
    ck = tmp_path / "checkpoints"
    (ck / ".step-9.tmp").mkdir()
    (ck / "step-x").mkdir()
    (ck / "step-7").write_text("a file, not a dir")
    assert [s for s, _ in run.list_checkpoints()] == [4]


def test_write_summary_is_valid_json(tmp_path):
    run = RunDir(tmp_path)
    run.write_summary({"accuracy": 0.5, "path": tmp_path, "k": [1, 8]})
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data == {"accuracy": 0.5, "path": str(tmp_path), "k": [1, 8]}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # temp file renamed away


def test_atomic_write_replaces_content(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and [p.name for p in path.parent.iterdir()] == ["f.txt"]


def test_write_config(tmp_path):
    run = RunDir(tmp_path)
    run.write_config("seed: 1\n")
    assert (tmp_path / "config.yaml").read_text() == "seed: 1\n"


def test_plot_writes_png_or_none(tmp_path):
    run = RunDir(tmp_path)
    assert run.plot(["reward/mean"]) is None  # no metrics yet
    run.log_metrics(1, {"reward/mean": 0.1})
    run.log_metrics(2, {"reward/mean": 0.3})
    assert run.plot(["missing"]) is None
    out = run.plot(["reward/mean", "missing"], "r.png")
    assert out == tmp_path / "plots" / "r.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ starting a run in a directory


def test_start_refuses_a_directory_holding_a_run(tmp_path):
    first = RunDir.start(tmp_path / "d")
    first.log_metrics(1, {"x": 1})
    first.close()
    with pytest.raises(RunDirError) as err:
        RunDir.start(tmp_path / "d")
    msg = str(err.value)
    assert "\n" not in msg and "already holds a run" in msg and "--resume" in msg and "--overwrite" in msg
    assert (tmp_path / "d" / "metrics.jsonl").read_text() == '{"step": 1, "x": 1}\n'  # untouched


def test_start_accepts_missing_and_empty_directories(tmp_path):
    RunDir.start(tmp_path / "new").close()
    (tmp_path / "empty").mkdir()
    run = RunDir.start(tmp_path / "empty")
    assert [e["event"] for e in run.read_jsonl("events.jsonl")] == ["start"]
    run.close()


def test_start_refuses_other_files_even_with_overwrite(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="already holds files \\(notes.txt\\)"):
        RunDir.start(tmp_path)
    with pytest.raises(RunDirError, match="holds files but no rewardlab run"):
        RunDir.start(tmp_path, mode="overwrite")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_overwrite_deletes_the_previous_run(tmp_path, capsys):
    run = RunDir.start(tmp_path)
    run.log_metrics(1, {"x": 1})
    run.save_checkpoint(1, _write_file("w"))
    run.close()
    run = RunDir.start(tmp_path, mode="overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "events.jsonl"]
    assert [e["event"] for e in run.read_jsonl("events.jsonl")] == ["overwrite"]
    assert "deleted the previous run" in capsys.readouterr().err
    run.close()


def test_resume_needs_a_run_and_mode_is_checked(tmp_path):
    with pytest.raises(RunDirError, match="holds no run to resume"):
        RunDir.start(tmp_path / "none", mode="resume")
    with pytest.raises(ValueError, match="mode must be one of 'new', 'resume', 'overwrite', not 'append'"):
        RunDir.start(tmp_path, mode="append")


def test_a_run_directory_is_locked_while_written(tmp_path):
    run = RunDir.start(tmp_path)
    run.log_metrics(1, {"x": 1})
    with pytest.raises(RunDirError, match="already being written by this process"):
        RunDir.start(tmp_path, mode="resume")
    code = ("import sys; from rewardlab.runs import RunDir, RunDirError\n"
            "try:\n    RunDir.start(sys.argv[1], mode='resume')\n"
            "except RunDirError as e:\n    print(e); sys.exit(3)\n")
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 3, other.stderr
    assert f"in use by another process (pid {os.getpid()}" in other.stdout
    run.close()
    RunDir.start(tmp_path, mode="resume").close()  # released


def test_a_killed_writer_leaves_no_stale_lock(tmp_path):
    code = ("import sys, time; from rewardlab.runs import RunDir\n"
            "r = RunDir.start(sys.argv[1]); r.log_metrics(1, {}); print('locked', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match="in use by another process"):
            RunDir.start(tmp_path, mode="resume")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    RunDir.start(tmp_path, mode="resume").close()


# ------------------------------------------------------------------ torn tails, verified checkpoints, rollback


def test_first_append_cuts_a_torn_tail(tmp_path, capsys):
    run = RunDir(tmp_path)
    run.log_metrics(1, {"x": 1})
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 2, "x"')  # what a SIGKILL during a write leaves
    resumed = RunDir(tmp_path)
    resumed.log_metrics(2, {"x": 2})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"step": 1, "x": 1}, {"step": 2, "x": 2}]  # every line valid
    events = resumed.read_jsonl("events.jsonl")
    assert [(e["event"], e["log"], e["bytes_removed"]) for e in events] == [("torn_tail", "metrics.jsonl", 15)]
    assert "cut a torn last line (15 bytes)" in capsys.readouterr().err


def test_resume_repairs_every_log(tmp_path):
    run = RunDir.start(tmp_path)
    run.log_samples([{"a": 1}])
    run.close()
    with (tmp_path / "samples.jsonl").open("a") as fh:
        fh.write('{"a": ')
    RunDir.start(tmp_path, mode="resume").close()
    assert (tmp_path / "samples.jsonl").read_text() == '{"a": 1}\n'


def test_checkpoint_manifest_detects_damage(tmp_path):
    run = RunDir(tmp_path)
    path = run.save_checkpoint(3, _write_file("weights"))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["files"]["weights.txt"]["size"] == 7 and manifest["step"] == 3
    assert verify_checkpoint(path) is None
    (path / "weights.txt").write_text("")
    assert verify_checkpoint(path) == "weights.txt: 0 bytes, manifest says 7"
    (path / "weights.txt").write_text("WEIGHTS")
    assert verify_checkpoint(path) == "weights.txt: checksum differs from the manifest"
    (path / "manifest.json").unlink()
    assert verify_checkpoint(path) == "no manifest.json"


def test_resume_skips_an_invalid_latest_checkpoint_and_rolls_logs_back(tmp_path, capsys):
    run = RunDir(tmp_path)
    for step in (1, 2, 3, 4):
        run.log_metrics(step, {"x": step})
        run.log_samples([{"step": step}])
        if step in (2, 4):
            run.save_checkpoint(step, _write_file(f"w{step}"))
    run.log_metrics(5, {"x": 5})  # logged after the last checkpoint, then the process died
    (tmp_path / "checkpoints" / "step-4" / "weights.txt").write_text("")
    step, path = RunDir(tmp_path).resume_checkpoint()
    assert (step, path.name) == (2, "step-2")
    assert "step-4 is invalid (weights.txt: 0 bytes, manifest says 2); skipping it" in capsys.readouterr().err
    assert [r["step"] for r in run.read_jsonl("metrics.jsonl")] == [1, 2]
    assert [r["step"] for r in run.read_jsonl("samples.jsonl")] == [1, 2]
    assert [r["step"] for r in RunDir(tmp_path / "rolled_back").read_jsonl("metrics.jsonl")] == [3, 4, 5]
    events = [e["event"] for e in run.read_jsonl("events.jsonl")]
    assert events == ["checkpoint_invalid", "rolled_back", "rolled_back", "resume_from"]


def test_resume_without_a_valid_checkpoint_is_one_line(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(1, _write_file("w"))
    (tmp_path / "checkpoints" / "step-1" / "manifest.json").unlink()
    with pytest.raises(RunDirError, match=r"^--resume: cannot resume .*: none of its 1 checkpoint\(s\) is valid$"):
        run.resume_checkpoint()


def test_resume_deletes_the_temp_dirs_of_checkpoint_writes_cut_short(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(2, _write_file("w2"))
    partial = tmp_path / "checkpoints" / ".step-4.x1y2"  # what a SIGKILL inside save_checkpoint leaves
    partial.mkdir()
    (partial / "weights.txt").write_text("half")
    assert RunDir(tmp_path).resume_checkpoint()[0] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-2"]
    events = [(e["event"], e.get("path")) for e in run.read_jsonl("events.jsonl")]
    assert events[0] == ("partial_checkpoint_removed", "checkpoints/.step-4.x1y2")


@pytest.mark.parametrize("text", ["- a list\n", "a: " + "[" * 20000 + "\n", "a: [1\n"])
def test_resume_reads_a_malformed_run_config_as_one_line(tmp_path, text):
    """A run's config.yaml that is not a mapping, too deeply nested or not YAML is a one-line error naming it on
    --resume, never a traceback (RecursionError, AttributeError on a list)."""
    from rewardlab.runs import check_resume_config

    run = RunDir.start(tmp_path)
    (tmp_path / "config.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(RunDirError) as err:
        check_resume_config(run, "a: 1\n")
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "config.yaml") in msg and "--overwrite" in msg
    run.close()
