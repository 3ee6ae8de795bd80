"""report_to: each tracker receives the metrics under their metrics.jsonl names and the completions as its table,
read back with the tracker's own reader (TensorBoard's EventAccumulator, W&B's record protobufs, trackio's store,
MLflow's client). Nothing reaches the network: W&B offline, trackio and MLflow on local stores."""

import glob
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from rewardlab.config import ConfigError, TrainConfig, load_config
from rewardlab.runs import RunDir
from rewardlab.trackers import (REPORT_TO, STATE_FILE, TRACKERS, check_report_to, completion_table, markdown_table,
                                mlflow_key, open_trackers)

SRC = Path(__file__).resolve().parents[1] / "src"
#: Two steps of metrics as a training loop logs them (names with slashes, a string and a None that trackers skip).
METRICS = {1: {"reward/mean": 0.25, "reward/timed_out/mean": 0.0, "time/gen_s": 1.5, "lr": 1e-3, "note": "x",
               "eval/accuracy": None},
           2: {"reward/mean": 0.75, "reward/timed_out/mean": 0.5, "time/gen_s": 2.25, "lr": 5e-4, "note": "y",
               "eval/accuracy": None}}
NUMERIC = ("reward/mean", "reward/timed_out/mean", "time/gen_s", "lr")


def _samples(step):
    return [{"step": step, "group": 0, "prompt": f"{step}+1=", "completion": f"{step + 1}", "reward": 1.0,
             "components": {"exact": 1.0, "format": 0.5}, "advantage": 0.5, "kept": True},
            {"step": step, "group": 0, "prompt": f"{step}+1=", "completion": "x|y\nz", "reward": 0.0,
             "components": {"exact": 0.0, "format": 0.0}, "advantage": -0.5, "kept": True}]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No tracker talks to a server: W&B offline and silent, MLflow's telemetry off, every store local."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    for name in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_PROJECT"):
        monkeypatch.delenv(name, raising=False)


def _log_two_steps(run_dir: Path, names, resume_step=None) -> None:
    """Open `names` on the run in `run_dir` and log METRICS and two steps of samples through the RunDir."""
    with RunDir.start(run_dir, mode="resume" if resume_step is not None else "new") as run:
        run.attach_trackers(open_trackers(names, run_dir, run_name="runs/t", config={"rl": {"steps": 2}, "seed": 0},
                                          resume_step=resume_step))
        for step, metrics in METRICS.items():
            run.log_metrics(step, metrics)
            run.log_samples(_samples(step))


# ------------------------------------------------------------------------------------------------ settings
def test_report_to_forms_and_one_line_errors(monkeypatch):
    assert check_report_to(None) == check_report_to("none") == check_report_to(["none"]) == check_report_to([]) == []
    assert check_report_to("tensorboard") == ["tensorboard"]
    installed = check_report_to("all")
    assert set(installed) <= set(REPORT_TO) and list(TRACKERS) == list(REPORT_TO)
    with pytest.raises(ValueError, match=r"^report_to: unknown tracker 'comet'; valid: tensorboard, wandb, trackio, "
                                         r"mlflow, none, all$"):
        check_report_to(["comet"])
    with pytest.raises(ValueError, match="named twice"):
        check_report_to(["tensorboard", "tensorboard"])
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, ["report_to=[comet]"])
    assert "\n" not in str(err.value) and str(err.value).startswith("config error: report_to: ")
    assert TrainConfig().report_to == [] and TrainConfig(report_to="none").report_to == []


@pytest.mark.parametrize("name", REPORT_TO)
def test_a_missing_extra_is_one_line_naming_it(monkeypatch, tmp_path, name):
    monkeypatch.setitem(sys.modules, TRACKERS.meta(name)["module"], None)  # as if not installed
    expected = f"report_to: {name} needs pip install 'rewardlab[{name}]'"
    with pytest.raises(ValueError) as err:
        open_trackers([name], tmp_path, run_name="r", config={})
    assert str(err.value) == expected
    with pytest.raises(ConfigError, match=r"report_to: Value error, " + name + r" needs pip install 'rewardlab\[" +
                       name + r"\]'"):
        load_config(TrainConfig, None, [f"report_to=[{name}]"])
    assert name not in check_report_to("all")
    assert not (tmp_path / STATE_FILE).exists()


# ------------------------------------------------------------------------------------------------ tables and keys
def test_completion_table_has_trls_columns_components_and_json_cells():
    env_record = {"step": 3, "completion": "done", "rows": [{"prompt": "P0", "prompt_ids": [1, 2]}],
                  "messages": [{"role": "user", "content": "hi"}], "reward": 1.0, "components": {"tool": 1.0}}
    columns, rows = completion_table([*_samples(3), env_record])
    assert columns[:6] == ["step", "prompt", "completion", "exact", "format", "tool"]
    assert columns[6] == "advantage" and "rows" not in columns and "components" not in columns
    assert rows[0][:7] == [3, "3+1=", "4", 1.0, 0.5, None, 0.5]
    env_row = dict(zip(columns, rows[2]))
    assert env_row["prompt"] == "P0" and env_row["tool"] == 1.0 and env_row["advantage"] is None
    assert json.loads(env_row["messages"]) == [{"role": "user", "content": "hi"}]
    text = markdown_table(["a", "b"], [["x|y", "1\n2"], [None, 3]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| x\\|y | 1<br>2 |", "|  | 3 |"]


def test_mlflow_keys_keep_our_names_and_replace_what_mlflow_refuses():
    for name in ("reward/timed_out/mean", "time/gen_s", "lr", "policy/clip_frac", "rollout/len_mean"):
        assert mlflow_key(name) == name
    assert mlflow_key("eval/pass@1") == "eval/pass_1"
    assert mlflow_key("reward/judge(helpful)") == "reward/judge_helpful_"
    assert mlflow_key("a//b/../c") == "a/_/b/_/c"


# ------------------------------------------------------------------------------------------------ the RunDir hook
class _Recorder:
    def __init__(self):
        self.calls = []

    def log_metrics(self, step, metrics):
        self.calls.append(("metrics", step, dict(metrics)))

    def log_completions(self, step, records):
        self.calls.append(("completions", step, [r["completion"] for r in records]))

    def close(self):
        self.calls.append(("close",))
        raise RuntimeError("tracker failed to close")


def test_rundir_forwards_metrics_and_each_steps_samples_and_closes_the_trackers(tmp_path):
    recorder = _Recorder()
    run = RunDir.start(tmp_path / "run")
    run.attach_trackers(recorder)
    run.log_metrics(1, {"reward/mean": 0.5})
    run.log_samples([*_samples(1), *_samples(2), {"completion": "no step"}])
    with pytest.raises(RuntimeError, match="failed to close"):
        run.close()
    assert recorder.calls == [("metrics", 1, {"reward/mean": 0.5}), ("completions", 1, ["2", "x|y\nz"]),
                              ("completions", 2, ["3", "x|y\nz"]), ("close",)]
    RunDir.start(tmp_path / "run", mode="resume").close()  # the lock was released although the tracker failed
    assert len(run.read_jsonl("samples.jsonl")) == 5


# ------------------------------------------------------------------------------------------------ TensorBoard
def _tensorboard(run_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    texts = {tag: {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)}
             for tag in acc.Tags()["tensors"]}
    return scalars, texts


def test_tensorboard_event_files_hold_the_metrics_and_completions(tmp_path):
    pytest.importorskip("tensorboard")
    _log_two_steps(tmp_path / "run", ["tensorboard"])
    scalars, texts = _tensorboard(tmp_path / "run")
    assert set(scalars) == set(NUMERIC)
    for step, metrics in METRICS.items():
        for key in NUMERIC:
            assert scalars[key][step] == pytest.approx(metrics[key], rel=1e-6)
    table = texts["completions/text_summary"]
    assert sorted(table) == [1, 2]
    assert table[2].splitlines()[0] == "| step | prompt | completion | exact | format | advantage | group | reward | kept |"
    assert "| 2 | 2+1= | x\\|y<br>z | 0.0 | 0.0 | -0.5 | 0 | 0.0 | True |" in table[2]
    assert '"steps": 2' in texts["config/text_summary"][0]


# ------------------------------------------------------------------------------------------------ W&B
def _wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline run's .wandb file: W&B's record protobufs in LevelDB log framing (32 KiB
    blocks of records with a 7-byte header: checksum, length, type full/first/middle/last), after W&B's 7-byte
    file header."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunks, part = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += block - pos % block
            continue
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, last
            chunks.append(part)
            part = b""
    rows = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def test_wandb_offline_run_holds_the_metrics_and_the_completions_table(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    _log_two_steps(run_dir, ["wandb"])
    run_id = json.loads((run_dir / STATE_FILE).read_text())["wandb"]["id"]
    [path] = glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))
    history = {row["_step"]: row for row in _wandb_history(Path(path))}
    for step, metrics in METRICS.items():
        assert {k: history[step][k] for k in NUMERIC} == pytest.approx({k: metrics[k] for k in NUMERIC})
        assert "note" not in history[step] and "eval/accuracy" not in history[step]
        table_file = Path(path).parent / "files" / history[step]["completions/path"]
        table = json.loads(table_file.read_text())
        assert table["columns"] == ["step", "prompt", "completion", "exact", "format", "advantage", "group",
                                    "reward", "kept"]
        assert table["data"] == completion_table(_samples(step))[1]
    # a resume continues the same W&B run (its id from trackers.json)
    with RunDir.start(run_dir, mode="resume") as run:
        run.attach_trackers(open_trackers(["wandb"], run_dir, run_name="runs/t", config={}, resume_step=1))
        run.log_metrics(3, {"reward/mean": 1.0})
    assert len(glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}"))) == 2
    assert json.loads((run_dir / STATE_FILE).read_text())["wandb"]["id"] == run_id


# ------------------------------------------------------------------------------------------------ trackio
TRACKIO_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, {test_dir!r})
from test_trackers import _log_two_steps
_log_two_steps(Path({run_dir!r}), ["trackio"])
from trackio.sqlite_storage import SQLiteStorage
state = json.loads((Path({run_dir!r}) / "trackers.json").read_text())["trackio"]
print(json.dumps({{"state": state, "runs": SQLiteStorage.get_runs(state["project"]),
                   "logs": SQLiteStorage.get_logs(state["project"], state["name"])}}))
"""


def test_trackio_local_store_holds_the_metrics_and_the_completions_table(tmp_path):
    pytest.importorskip("trackio")
    # trackio reads TRACKIO_DIR when it is imported: a fresh process with its store in tmp_path
    script = TRACKIO_SCRIPT.format(test_dir=str(Path(__file__).parent), run_dir=str(tmp_path / "run"))
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "store"), "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith('{"state"')]  # trackio prints too
    result = json.loads(line)
    assert result["state"] == {"project": "rewardlab", "name": "runs/t"} and result["runs"] == ["runs/t"]
    assert list(Path(tmp_path / "store").glob("rewardlab.db"))
    by_step: dict[int, dict] = {}
    for row in result["logs"]:
        by_step.setdefault(row["step"], {}).update(row)
    for step, metrics in METRICS.items():
        assert {k: by_step[step][k] for k in NUMERIC} == pytest.approx({k: metrics[k] for k in NUMERIC})
        table = by_step[step]["completions"]
        assert table["_type"] == "trackio.table"
        columns, rows = completion_table(_samples(step))
        assert table["_value"] == [dict(zip(columns, row)) for row in rows]


# ------------------------------------------------------------------------------------------------ MLflow
def test_mlflow_local_store_holds_the_metrics_and_the_completions_table(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    _log_two_steps(run_dir, ["mlflow"])
    state = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{run_dir.resolve() / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=state["tracking_uri"])
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "runs/t"
    assert run.data.params["rl.steps"] == "2" and set(run.data.metrics) == set(NUMERIC)
    for key in NUMERIC:
        history = {m.step: m.value for m in client.get_metric_history(state["run_id"], key)}
        assert history == pytest.approx({step: metrics[key] for step, metrics in METRICS.items()})
    for step in METRICS:
        [table] = glob.glob(str(run_dir / "mlflow" / "artifacts" / state["run_id"] / "artifacts" / "completions" /
                                f"step_{step:06d}.json"))
        saved = json.loads(Path(table).read_text())
        columns, rows = completion_table(_samples(step))
        assert saved["columns"] == columns and saved["data"] == rows
    # a resume logs into the same MLflow run
    with RunDir.start(run_dir, mode="resume") as resumed:
        resumed.attach_trackers(open_trackers(["mlflow"], run_dir, run_name="runs/t", config={}, resume_step=1))
        resumed.log_metrics(3, {"reward/mean": 1.0})
    assert [m.step for m in client.get_metric_history(state["run_id"], "reward/mean")] == [1, 2, 3]
    assert client.get_run(state["run_id"]).info.status == "FINISHED"


def test_tensorboard_on_resume_drops_the_points_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    _log_two_steps(tmp_path / "run", ["tensorboard"])
    with RunDir.start(tmp_path / "run", mode="resume") as run:  # resumed from step 1: step 2 is logged again
        run.attach_trackers(open_trackers(["tensorboard"], run.path, run_name="runs/t", config={}, resume_step=1))
        run.log_metrics(2, {"reward/mean": 0.125})
    scalars, _ = _tensorboard(tmp_path / "run")
    assert scalars["reward/mean"] == {1: 0.25, 2: 0.125}
    assert scalars["time/gen_s"] == {1: 1.5}


# ------------------------------------------------------------------------------------------------ end to end
def _assert_tensorboard_holds_the_metrics(run: RunDir) -> dict:
    """Every number of every metrics.jsonl line is TensorBoard's scalar of that name at that step; returns the
    texts."""
    scalars, texts = _tensorboard(run.path)
    lines = run.read_metrics()
    assert lines
    for line in lines:
        for key, value in line.items():
            if key == "step" or isinstance(value, str):
                continue
            got = scalars[key][line["step"]]
            if value is None:  # a non-finite value: null in metrics.jsonl, as it is in TensorBoard
                assert not math.isfinite(got), key
            else:
                assert got == pytest.approx(float(value), rel=1e-6, abs=1e-12), key
    return texts


def test_sft_and_rm_train_report_their_metrics_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from conftest import TINY_OVERRIDES, write_jsonl
    from rewardlab.cli import main

    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(8)])
    assert main(["sft", "--no-progress", "--model", "tiny", "--task", f"jsonl:{task}", "--out", str(tmp_path / "sft"),
                 "sft.steps=3", "sft.batch_size=4", "report_to=tensorboard", *TINY_OVERRIDES]) == 0
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": f"{a}+1=", "chosen": str(a + 1), "rejected": "x"}
                                                   for a in range(8)])
    assert main(["rm", "train", "--no-progress", "--model", "tiny", "--data", str(pairs), "--out",
                 str(tmp_path / "rm"), "train.epochs=1", "train.batch_size=4", "report_to=[tensorboard]",
                 *TINY_OVERRIDES]) == 0
    for name in ("sft", "rm"):
        texts = _assert_tensorboard_holds_the_metrics(RunDir(tmp_path / name))
        assert "completions/text_summary" not in texts and "config/text_summary" in texts


def test_train_reports_every_metric_and_the_completions_to_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from conftest import TINY_OVERRIDES, write_jsonl
    from rewardlab.rl.trainer import train

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    cfg = load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / 'run'}", *TINY_OVERRIDES,
        "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=3", "rl.steps=2",
        "report_to=tensorboard"])
    train(cfg, show_progress=False)
    run = RunDir(tmp_path / "run")
    texts = _assert_tensorboard_holds_the_metrics(run)
    assert [line["step"] for line in run.read_metrics()] == [1, 2]
    samples = run.read_jsonl("samples.jsonl")
    for step in (1, 2):
        table = texts["completions/text_summary"][step]
        assert all(f"| {step} | {s['prompt']} |" in table for s in samples if s["step"] == step)
    assert json.loads((run.path / STATE_FILE).read_text()) == {"tensorboard": {}}


def test_quickstart_passes_report_to_to_its_training_stages(tmp_path, monkeypatch):
    from rewardlab.commands import quickstart

    seen = []

    class Stop(Exception):
        pass

    def stage(kind, result):
        def run(cfg, **_):
            seen.append((kind, getattr(cfg, "report_to", None)))
            if result is None:
                raise Stop
            return result
        return run

    monkeypatch.setattr(quickstart.sft_command, "run", stage("sft", {"final_checkpoint": "ckpt"}))
    monkeypatch.setattr(quickstart.evaluate_command, "run", stage("evaluate", {"accuracy": 0.0}))
    monkeypatch.setattr(quickstart.train_command, "run", stage("train", None))
    cfg = load_config(quickstart.QuickstartConfig, None, [f"out={tmp_path / 'q'}", "report_to=[tensorboard]"])
    with pytest.raises(Stop):
        quickstart.run(cfg, show_progress=False)
    assert seen == [("sft", ["tensorboard"]), ("evaluate", None), ("train", ["tensorboard"])]
