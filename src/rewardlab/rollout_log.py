"""The per-step rollout log of a training run: `rollouts/step-NNNNNN.parquet` and TRL's `completions/` export.

Each RL step writes one Parquet file (`write_step`) holding one record per training row of every rollout the step
generated (an episode split into several rows has one record per row, sharing `episode`). The scalar columns are
filled for every rollout; the per-token columns for the first rl.logging.log_tokens episodes only (null for the
others). Beside it, `completions/completions_NNNNN.parquet` holds TRL's completions table for the same step (one row
per rollout: step, prompt, completion, one column per reward component, advantage; what TRL's `log_completions`
writes), so a notebook written for TRL's output reads a rewardlab run.

Columns of a rollouts file (`ROLLOUT_COLUMNS`; the types are Arrow's):
    step int64                   the RL step
    index int32                  the record's position in the file (what `read_rollout` takes)
    episode int32                the episode's index among the step's rollouts (as in samples.jsonl)
    row int32                    the row's index within its episode (0 for a single-turn rollout)
    group int32                  the prompt group (rollouts of one prompt share it)
    prompt_key string            a key of the prompt the same across steps (the task row's `id` when it has one,
                                 else a hash of the prompt text), for following one prompt through training
    prompt, completion string    the prompt as fed to the model, the decoded completion (for an episode: the
                                 final model turn, as the reward read it)
    answer string                the task row's reference answer as JSON (null when it has none)
    reward float64               the episode's reward; reward/<name> float64, one column per component
    advantage float64            the mean advantage over the row's sampled tokens (the one advantage of an
                                 outcome estimator such as GRPO); null when the rollout was not trained on
    error string                 the reward's error, null when none
    truncated, kept bool         stopped at a length limit; kept by the group filter (trained on)
    termination string           why the episode ended (`Rollout.termination`)
    policy_version int32         the weights that sampled it; staleness int32 = step - 1 - policy_version
    num_tokens int32             completion tokens in the row (sampled and inserted)
    turns string                 JSON list, one entry per model turn: span [start, end) in the row's tokens, the
                                 environment's reward, the advantage on its first sampled token, its tool calls
                                 (name, arguments, status, seconds) and the tool results that followed
    Per-token (lists of the row's completion length T; null on rows not logged):
    token_ids list<int32>, tokens list<string> (each token's text piece), loss_mask list<int8> (1 on sampled
    tokens, 0 on tokens the environment, a tool or the chat template inserted), logprob_old list<float32> (the
    behaviour log-prob, natural log), logprob list<float32> (the trained policy's log-prob in the first epoch's
    forward pass, the one the loss used), ratio list<float32> (exp(logprob - logprob_old), clamped as the loss
    clamps it), advantages list<float32> (per token, as the loss read them), entropy list<float32> (nats), clip
    list<int8> (0 none, 1 low, 2 high, 3 dual: which clip of the policy loss was active for the token; null for a
    loss that reports none), kl list<float32> and ref_logprob list<float32> (the KL term and the reference's
    log-prob where rl.beta > 0, else null), step_spans list<int32> (flattened [start, end) pairs of the reasoning
    steps) and step_scores list<float32> (each step's process reward).

Files are written atomically (`rewardlab.runs.RunDir.write_step_file`) and rolled back with the other logs on
--resume, so a resumed run holds each step's file once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROLLOUTS_DIR = "rollouts"
COMPLETIONS_DIR = "completions"
#: Per-step files of a run: directory -> the file-name pattern, its one group the step. Written atomically
#: (`rewardlab.runs.RunDir.write_step_file`) and rolled back on resume (`RunDir.rollback_step_files`).
STEP_FILES: dict[str, re.Pattern[str]] = {ROLLOUTS_DIR: re.compile(r"step-(\d+)\.parquet"),
                                          COMPLETIONS_DIR: re.compile(r"completions_(\d+)\.parquet")}
#: Per-token columns: filled for logged rows only.
TOKEN_COLUMNS = ("token_ids", "tokens", "loss_mask", "logprob_old", "logprob", "ratio", "advantages", "entropy",
                 "clip", "kl", "ref_logprob", "step_spans", "step_scores")


def _schema(components: Sequence[str]):
    import pyarrow as pa

    f32, i32 = pa.list_(pa.float32()), pa.list_(pa.int32())
    fields = [("step", pa.int64()), ("index", pa.int32()), ("episode", pa.int32()), ("row", pa.int32()),
              ("group", pa.int32()), ("prompt_key", pa.string()), ("prompt", pa.string()),
              ("completion", pa.string()), ("answer", pa.string()), ("reward", pa.float64()),
              *((f"reward/{c}", pa.float64()) for c in components), ("advantage", pa.float64()),
              ("error", pa.string()), ("truncated", pa.bool_()), ("kept", pa.bool_()), ("termination", pa.string()),
              ("policy_version", pa.int32()), ("staleness", pa.int32()), ("num_tokens", pa.int32()),
              ("turns", pa.string()), ("token_ids", i32), ("tokens", pa.list_(pa.string())),
              ("loss_mask", pa.list_(pa.int8())), ("logprob_old", f32), ("logprob", f32), ("ratio", f32),
              ("advantages", f32), ("entropy", f32), ("clip", pa.list_(pa.int8())), ("kl", f32),
              ("ref_logprob", f32), ("step_spans", i32), ("step_scores", f32)]
    return pa.schema(fields)


#: The fixed columns of a rollouts file, in order (reward/<name> columns follow `reward`).
ROLLOUT_COLUMNS = tuple(f.name for f in _schema(()))


def prompt_key(row: Mapping[str, Any], prompt: str) -> str:
    """A key of a prompt that is the same at every step: the task row's `id` when it has one, else the first 16
    hex digits of the SHA-256 of the prompt text."""
    if row.get("id") is not None:
        return str(row["id"])
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def rollouts_path(run_dir: str | Path, step: int) -> Path:
    """The path of step `step`'s rollouts file (`rollouts/step-{step:06d}.parquet`); it may not exist."""
    return Path(run_dir) / ROLLOUTS_DIR / f"step-{step:06d}.parquet"


def completions_path(run_dir: str | Path, step: int) -> Path:
    """TRL's name for a step's completions file (`completions/completions_{step:05d}.parquet`)."""
    return Path(run_dir) / COMPLETIONS_DIR / f"completions_{step:05d}.parquet"


#: Scalar float columns: NaN and +-inf become null (a reward's failure is already its `error`).
_FLOAT_COLUMNS = ("reward", "advantage")
_INFINITE = (float("inf"), float("-inf"))


def rollouts_table(step: int, records: Sequence[Mapping[str, Any]]):
    """The Arrow table of step `step`'s rollouts file from its records (dicts with the `ROLLOUT_COLUMNS` keys; a
    missing key is null, `components` a dict name -> score that becomes the reward/<name> columns, `answer` and
    `turns` any JSON value). `index` and `step` are set here; NaN and +-inf scalars are stored as null.

    Raises:
        KeyError: a record has a key that is not a column (names it).
    """
    import pyarrow as pa

    scores = [r.get("components") or {} for r in records]
    components = sorted({c for comp in scores for c in comp})
    schema = _schema(components)
    unknown = set().union(*records) - set(schema.names) - {"components"} if records else set()
    if unknown:
        raise KeyError(f"rollout records: unknown column(s) {sorted(unknown)}")
    columns: dict[str, list[Any]] = {"step": [step] * len(records), "index": list(range(len(records)))}
    for name in schema.names[2:]:
        if name.startswith("reward/"):
            values = [comp.get(name[len("reward/"):]) for comp in scores]
        else:
            values = [r.get(name) for r in records]
        if name in ("answer", "turns"):
            values = [None if v is None else json.dumps(v, default=str) for v in values]
        elif name in _FLOAT_COLUMNS or name.startswith("reward/"):
            values = [None if v is None or v != v or v in _INFINITE else v for v in values]
        columns[name] = values
    return pa.Table.from_pydict(columns, schema=schema)


def completions_table(table):
    """TRL's completions table (step, prompt, completion, one column per reward component, advantage: one row per
    rollout, from each episode's last row) of a rollouts table."""
    import pyarrow as pa

    eps = table["episode"].to_pylist()  # an episode's last row: the next record is another episode's
    last = table.filter(pa.array([i == len(eps) - 1 or eps[i + 1] != eps[i] for i in range(len(eps))],
                                 type=pa.bool_()))
    names = ["step", "prompt", "completion", *(n for n in table.column_names if n.startswith("reward/")),
             "advantage"]
    out = last.select(names)
    return out.rename_columns([n.removeprefix("reward/") for n in names])


def write_parquet(table, path: Path) -> None:
    """Write `table` to `path` as Parquet (zstd)."""
    import pyarrow.parquet as pq

    pq.write_table(table, path, compression="zstd")


def write_step(rundir: Any, step: int, records: Sequence[Mapping[str, Any]]) -> None:
    """Write step `step`'s rollouts file and TRL's completions file into `rundir` (a `rewardlab.runs.RunDir`),
    each atomically (`RunDir.write_step_file`). Nothing is written for a step without records."""
    if not records:
        return
    table = rollouts_table(step, records)
    rundir.write_step_file(f"{ROLLOUTS_DIR}/{rollouts_path('', step).name}", lambda tmp: write_parquet(table, tmp))
    trl = completions_table(table)
    rundir.write_step_file(f"{COMPLETIONS_DIR}/{completions_path('', step).name}",
                           lambda tmp: write_parquet(trl, tmp))


# ----------------------------------------------------------------------------------------------- reading back
def logged_steps(run_dir: str | Path) -> list[int]:
    """The steps that have a rollouts file, ascending."""
    pattern = STEP_FILES[ROLLOUTS_DIR]
    folder = Path(run_dir) / ROLLOUTS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)))


def read_step(run_dir: str | Path, step: int, columns: Iterable[str] | None = None):
    """Step `step`'s rollouts as an Arrow table (only `columns` when given: the scalar ones read fast).

    Raises:
        FileNotFoundError: the step has no rollouts file (names it).
    """
    import pyarrow.parquet as pq

    path = rollouts_path(run_dir, step)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: step {step} has no rollouts file (logged steps: rl.logging.log_tokens)")
    return pq.read_table(path, columns=list(columns) if columns is not None else None)


def read_rollout(run_dir: str | Path, step: int, index: int) -> dict[str, Any]:
    """Record `index` of step `step`'s rollouts file as a dict (per-token columns as lists, `answer` and `turns`
    parsed from JSON, the reward/<name> columns gathered into `components`).

    Raises:
        FileNotFoundError: no rollouts file for the step. IndexError: no record `index` in it (names the count).
    """
    import pyarrow.parquet as pq

    path = rollouts_path(run_dir, step)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: step {step} has no rollouts file")
    pf = pq.ParquetFile(path)
    n = pf.metadata.num_rows
    if not 0 <= index < n:
        raise IndexError(f"step {step} has {n} rollout records; no index {index}")
    at = 0
    for g in range(pf.num_row_groups):  # read only the row group that holds it
        size = pf.metadata.row_group(g).num_rows
        if index < at + size:
            rec = pf.read_row_group(g).slice(index - at, 1).to_pylist()[0]
            break
        at += size
    components = {k.removeprefix("reward/"): rec.pop(k) for k in list(rec) if k.startswith("reward/")}
    rec["components"] = components
    for key in ("answer", "turns"):
        if rec.get(key) is not None:
            rec[key] = json.loads(rec[key])
    return rec
