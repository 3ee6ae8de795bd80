"""Experiment trackers (`report_to`, TRL's setting): TensorBoard, Weights & Biases, trackio and MLflow.

A training verb opens the trackers its config names (`open_trackers`) once its run directory is open, and the run
directory forwards to them what it writes (`rewardlab.runs.RunDir.attach_trackers`): every metrics.jsonl line under
the same names (`Trackers.log_metrics`), and a step's samples.jsonl records as that step's completions table
(`Trackers.log_completions`, columns as TRL's: step, prompt, completion, one per reward component, advantage, then
the record's other keys).

    trackers = open_trackers(["tensorboard"], Path("runs/train"), run_name="runs/train", config=cfg.model_dump())
    trackers.log_metrics(1, {"reward/mean": 0.5})
    trackers.log_completions(1, [{"step": 1, "prompt": "2+3=", "completion": "5", "components": {"exact": 1.0}}])
    trackers.close()

Where each backend writes (docs/viewer.md#trackers-report_to):
    tensorboard  RUN_DIR/tensorboard/ event files; scalars by metric name, the completions as the text "completions"
                 (a markdown table per step), the config as the text "config"
    wandb        a W&B run (project $WANDB_PROJECT, default "rewardlab"; its files under $WANDB_DIR, default RUN_DIR,
                 in RUN_DIR/wandb/); the completions as the table "completions"; $WANDB_MODE as W&B reads it
    trackio      a trackio run (project $TRACKIO_PROJECT, default "rewardlab") in trackio's local store ($TRACKIO_DIR,
                 which trackio reads when it is imported; default ~/.cache/huggingface/trackio); the completions as the
                 table "completions"
    mlflow       an MLflow run (experiment $MLFLOW_EXPERIMENT_NAME, default "rewardlab") at $MLFLOW_TRACKING_URI,
                 default sqlite:///RUN_DIR/mlflow/mlflow.db with artifacts in RUN_DIR/mlflow/artifacts; the completions
                 as the table artifact completions/step_NNNNNN.json; a metric name with a character MLflow refuses
                 is logged under `mlflow_key(name)`
The ids that let a resumed run continue the same tracker run are kept in RUN_DIR/trackers.json.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from rewardlab.registry import Registry

__all__ = ["REPORT_TO", "TRACKERS", "TrackerName", "Trackers", "check_report_to", "completion_table",
           "markdown_table", "mlflow_key", "open_trackers"]

#: The trackers `report_to` may name.
TrackerName = Literal["tensorboard", "wandb", "trackio", "mlflow"]
REPORT_TO: tuple[TrackerName, ...] = get_args(TrackerName)
#: The file of the run directory that holds each tracker's run id, so that a resume continues the same run.
STATE_FILE = "trackers.json"
#: The project (W&B, trackio) or experiment (MLflow) a run goes to when the backend's variable does not name one.
DEFAULT_PROJECT = "rewardlab"
#: The fixed leading columns of the completions table, in TRL's order (the reward components go before advantage).
LEADING_COLUMNS = ("step", "prompt", "completion")
#: Record keys that are not columns of the completions table: an environment episode's per-row token ids, masks and
#: log-probs (rows; samples.jsonl keeps them for `rewardlab.envs.replay`), and the reward components, which are a
#: column each.
TABLE_SKIPS = ("rows", "components")

#: Tracker backends by name: classes taking (run_dir, run_name=, config=, resume_step=, state=); meta `extra` (the
#: pip extra of rewardlab that installs it) and `module` (the package it needs).
TRACKERS: Registry[Any] = Registry("tracker")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _missing(name: str) -> str:
    return f"report_to: {name} needs pip install 'rewardlab[{TRACKERS.meta(name)['extra']}]'"


def check_report_to(value: Any) -> list[str]:
    """The tracker names of a `report_to` setting, each installed: a list of names, one name, "none" (no tracker,
    also None and []) or "all" (every tracker whose package is installed), as TRL reads it.

    Raises:
        ValueError: one line naming `report_to`: a name not registered (listing the valid ones), a name given
            twice, or a tracker whose package is not installed (naming the pip extra).
    """
    if value is None or value == "none" or value == ["none"]:
        return []
    if value == "all" or value == ["all"]:
        return [n for n in TRACKERS if _installed(TRACKERS.meta(n)["module"])]
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)):
        raise ValueError(f"report_to: expected a list of tracker names, got {value!r}")
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"report_to: unknown tracker {name!r}; valid: {', '.join(TRACKERS)}, none, all")
        if not _installed(TRACKERS.meta(name)["module"]):
            raise ValueError(_missing(name))
    if len(set(names)) < len(names):
        raise ValueError(f"report_to: a tracker is named twice in {list(names)}")
    return list(names)


# ------------------------------------------------------------------------------------------------ tables
def _cell(value: Any) -> Any:
    """A table cell: numbers, strings, bools and None as they are, anything else as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def completion_table(records: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The completions table of samples.jsonl records (one row each), as TRL's completions table lays it out.

    Columns: step, prompt, completion, one per reward component (the records' `components` keys, in order of first
    appearance), advantage, then every other key of the records but `TABLE_SKIPS` (in order of first appearance).
    An environment episode's prompt is its first row's (`rows[0].prompt`). A key a record lacks is None; a nested
    value (a list, a mapping) is its JSON text.

    Returns:
        (columns, rows): rows[i][j] is record i's value of columns[j].
    """
    components: dict[str, None] = {}
    rest: dict[str, None] = {}
    for rec in records:
        components.update(dict.fromkeys(rec.get("components") or {}))
        rest.update(dict.fromkeys(k for k in rec if k not in (*LEADING_COLUMNS, "advantage", *TABLE_SKIPS)))
    columns = [*LEADING_COLUMNS, *components, "advantage", *(k for k in rest if k not in components)]
    rows = []
    for rec in records:
        prompt = rec.get("prompt")
        if prompt is None and rec.get("rows"):
            prompt = rec["rows"][0].get("prompt")
        values = {**rec, "prompt": prompt, **(rec.get("components") or {})}
        rows.append([_cell(values.get(c)) for c in columns])
    return columns, rows


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (TensorBoard's text plugin renders it): `|` escaped, line breaks as <br>, None empty."""

    def text(value: Any) -> str:
        s = "" if value is None else str(value)
        return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")

    lines = ["| " + " | ".join(map(text, columns)) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(map(text, row)) + " |" for row in rows]
    return "\n".join(lines)


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric values of a metrics line (bools as 0/1); strings and None are not sent to a tracker."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def mlflow_key(name: str) -> str:
    """`name` as an MLflow metric or parameter key: characters other than letters, digits, `_ - . : /` and space
    become `_`; an empty, `.` or `..` path segment becomes `_`; at most 250 characters (MLflow's limits)."""
    key = re.sub(r"[^\w.\- :/]", "_", name)
    key = "/".join(p if p not in ("", ".", "..") else "_" for p in key.split("/"))
    return key[:250]


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------------------------------------------ backends
@TRACKERS.register("tensorboard", extra="tensorboard", module="tensorboard")
class TensorBoardTracker:
    """Event files in RUN_DIR/tensorboard (torch.utils.tensorboard). A resume from step k writes TensorBoard's
    purge marker at step k + 1, so TensorBoard drops the earlier run's points after the checkpoint."""

    def __init__(self, run_dir: Path, *, run_name: str, config: Mapping[str, Any], resume_step: int | None,
                 state: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = resume_step + 1 if resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        if resume_step is None:
            self.writer.add_text("config", "```\n" + json.dumps(dict(config), indent=2, default=str) + "\n```", 0)
        self.writer.flush()

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("completions", markdown_table(*completion_table(records)), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb", extra="wandb", module="wandb")
class WandbTracker:
    """A W&B run (`wandb.init`, resume "allow" with the id kept in trackers.json). W&B drops a point whose step is
    not above the run's last one, so a resumed run's steps after the checkpoint keep their first values there."""

    def __init__(self, run_dir: Path, *, run_name: str, config: Mapping[str, Any], resume_step: int | None,
                 state: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        run_id = state.get("id") if resume_step is not None else None  # None: W&B draws a new one
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, name=run_name,
                              id=run_id, resume="allow", dir=os.environ.get("WANDB_DIR") or str(run_dir),
                              config=dict(config))
        state["id"] = self.run.id

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = completion_table(records)
        self.run.log({"completions": self.wandb.Table(columns=columns, data=rows, allow_mixed_types=True)}, step=step)

    def close(self) -> None:
        self.run.finish()


@TRACKERS.register("trackio", extra="trackio", module="trackio")
class TrackioTracker:
    """A trackio run named `run_name` in trackio's local store ($TRACKIO_DIR); a resume continues the run of that
    name (trackio's resume "allow"). trackio's messages go to stderr."""

    def __init__(self, run_dir: Path, *, run_name: str, config: Mapping[str, Any], resume_step: int | None,
                 state: dict[str, Any]) -> None:
        import trackio

        self.trackio = trackio
        if resume_step is None or "project" not in state:
            state.update(project=os.environ.get("TRACKIO_PROJECT") or DEFAULT_PROJECT, name=run_name)
        with contextlib.redirect_stdout(sys.stderr):
            self.run = trackio.init(project=state["project"], name=state["name"], config=dict(config),
                                    resume="allow" if resume_step is not None else "never")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = completion_table(records)
        self.run.log({"completions": self.trackio.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self.run.finish()


@TRACKERS.register("mlflow", extra="mlflow", module="mlflow")
class MlflowTracker:
    """An MLflow run (`MlflowClient`), its id kept in trackers.json so that a resume logs into it again; the config
    as the run's parameters (flattened, dotted keys) on a new run. MLflow keeps every point, so the steps after a
    resumed checkpoint hold two values there (the rolled-back one first)."""

    def __init__(self, run_dir: Path, *, run_name: str, config: Mapping[str, Any], resume_step: int | None,
                 state: dict[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        store = run_dir.resolve() / "mlflow"
        if not uri:  # MLflow's own default store, sqlite, needs sqlalchemy and alembic (the extra installs them)
            if not (_installed("sqlalchemy") and _installed("alembic")):
                raise ImportError("MLflow's sqlite store needs sqlalchemy and alembic")
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        if resume_step is not None and state.get("run_id") and state.get("tracking_uri") == uri:
            self.run_id = state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(
            name, artifact_location=None if os.environ.get("MLFLOW_TRACKING_URI") else (store / "artifacts").as_uri())
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        state.update(run_id=self.run_id, tracking_uri=uri)
        params = [Param(mlflow_key(k), str(v)[:6000]) for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        points = [Metric(mlflow_key(k), v, ms, step) for k, v in metrics.items()]
        for i in range(0, len(points), 1000):  # MLflow takes at most 1000 points a call
            self.client.log_batch(self.run_id, metrics=points[i:i + 1000])

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        columns, rows = completion_table(records)
        data = {c: [row[j] for row in rows] for j, c in enumerate(columns)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"completions/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# ------------------------------------------------------------------------------------------------ the fan-out
class Trackers:
    """The open trackers of a run (`open_trackers`); each call goes to every one of them, in `report_to` order.
    With no tracker every call does nothing."""

    def __init__(self, backends: Mapping[str, Any] | None = None) -> None:
        self.backends = dict(backends or {})

    @property
    def names(self) -> list[str]:
        return list(self.backends)

    def __bool__(self) -> bool:
        return bool(self.backends)

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Send a metrics.jsonl line's numeric values (bools as 0/1, not-a-number kept) under their names."""
        numbers = _numbers(metrics)
        if numbers:
            for backend in self.backends.values():
                backend.log_metrics(step, numbers)

    def log_completions(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        """Send step `step`'s samples.jsonl records as its completions table (`completion_table`)."""
        if records:
            for backend in self.backends.values():
                backend.log_completions(step, records)

    def close(self) -> None:
        """Finish every tracker's run (each is closed even when another fails; the first error is raised)."""
        first: BaseException | None = None
        for backend in self.backends.values():
            try:
                backend.close()
            except Exception as exc:  # close the others first
                first = first or exc
        self.backends = {}
        if first is not None:
            raise first


def _read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(run_dir: Path, state: Mapping[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{STATE_FILE}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(dict(state), indent=1) + "\n")
    os.replace(tmp, run_dir / STATE_FILE)


def open_trackers(names: Iterable[str], run_dir: str | Path, *, run_name: str, config: Mapping[str, Any],
                  resume_step: int | None = None) -> Trackers:
    """Open the trackers `names` (a `report_to` setting, `check_report_to`) for the run in `run_dir`.

    Args:
        names: tracker names; [] opens none (every call of the result does nothing).
        run_dir: the run directory (TensorBoard's event files, the default W&B and MLflow stores, trackers.json).
        run_name: the tracker run's display name (the verbs pass their `out`).
        config: the resolved config (JSON-able values), recorded with the run.
        resume_step: the checkpoint step a resumed run continues from; None for a new run. The trackers then
            continue the runs whose ids trackers.json holds.
    Returns:
        the open trackers; close them (`Trackers.close`, which `RunDir.close` calls) when the run ends.
    Raises:
        ValueError: one line naming `report_to` (`check_report_to`): an unknown tracker or one not installed.
    """
    names = check_report_to(list(names))
    run_dir = Path(run_dir)
    state = _read_state(run_dir) if resume_step is not None else {}
    backends: dict[str, Any] = {}
    try:
        for name in names:
            own = state.setdefault(name, {})
            try:
                backends[name] = TRACKERS.get(name)(run_dir, run_name=run_name, config=config,
                                                    resume_step=resume_step, state=own)
            except ImportError as exc:
                raise ValueError(_missing(name)) from exc
    except BaseException:
        Trackers(backends).close()
        raise
    if names:
        _write_state(run_dir, state)
    return Trackers(backends)
