"""Run directories: append-only metrics, last-line-wins reads, atomic checkpoints, pruning, summary."""

import json

import pytest

from rewardlab.runs import RunDir, atomic_write_text


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

    def crash(tmp):
        (tmp / "half.bin").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run.save_checkpoint(5, crash)
    names = [p.name for p in (tmp_path / "checkpoints").iterdir()]
    assert "step-5" not in names
    assert names and all(n.startswith(".") for n in names)  # only the hidden temp dir
    assert run.list_checkpoints() == [] and run.latest_checkpoint() is None


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
