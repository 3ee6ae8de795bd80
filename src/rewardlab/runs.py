"""Run directories: resolved config, append-only logs, atomic checkpoints, resume, summary and plots.

Layout:
    config.yaml         the resolved config
    metrics.jsonl       one JSON object per step, appended and flushed every step
    samples.jsonl       every rollout (step, prompt, completion, reward components, advantage)
    checkpoints/step-K/ HF-format model + tokenizer + trainer_state.pt, written to a temp dir then renamed
    summary.json        final figures, written atomically
    plots/*.png         metric curves
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

CHECKPOINT_PREFIX = "step-"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file in the same directory and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunDir:
    """A run directory (created if missing). Logs are only ever appended; checkpoints are renamed into place."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints = self.path / "checkpoints"

    # --------------------------------------------------------------- logs
    def write_config(self, text: str) -> None:
        atomic_write_text(self.path / "config.yaml", text)

    def _append(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
        lines = "".join(
            json.dumps({k: _jsonable(v) for k, v in r.items()}, default=str, ensure_ascii=False) + "\n"
            for r in records
        )
        if not lines:
            return
        with (self.path / name).open("a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one line `{"step": step, **metrics}` to metrics.jsonl and flush it to disk."""
        self._append("metrics.jsonl", [{"step": step, **metrics}])

    def log_samples(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append rollout records to samples.jsonl and flush them to disk."""
        self._append("samples.jsonl", records)

    def read_metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl as a list ordered by step; when a resumed run logged a step again, the last line wins.

        A torn last line (a crash mid-write) is ignored.
        """
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        by_step: dict[int, dict[str, Any]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            by_step[int(rec["step"])] = rec
        return [by_step[s] for s in sorted(by_step)]

    def write_summary(self, summary: Mapping[str, Any]) -> None:
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")

    # --------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int, write: Callable[[Path], None], keep: int | None = None) -> Path:
        """Write a checkpoint with `write(tmp_dir)` and rename it to `checkpoints/step-<step>`.

        A crash while writing leaves only a hidden temp dir, never a partial `step-K`. With `keep`, older
        checkpoints beyond the `keep` most recent are deleted after the new one is in place.
        """
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        final = self.checkpoints / f"{CHECKPOINT_PREFIX}{step}"
        tmp = Path(tempfile.mkdtemp(dir=self.checkpoints, prefix=f".{final.name}."))
        write(tmp)
        if final.exists():  # re-saving a step after a resume: move the old one aside first
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        if keep is not None:
            for _, path in self.list_checkpoints()[:-keep]:
                shutil.rmtree(path, ignore_errors=True)
        return final

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        found = []
        for p in self.checkpoints.iterdir():
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[len(CHECKPOINT_PREFIX) :].isdigit():
                found.append((int(p.name[len(CHECKPOINT_PREFIX) :]), p))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.list_checkpoints()
        return found[-1] if found else None

    # --------------------------------------------------------------- plots
    def plot(self, keys: Iterable[str], name: str = "metrics.png") -> Path | None:
        """Plot metric curves against step into plots/<name>; returns the path, or None with no metrics."""
        records = self.read_metrics()
        keys = [k for k in keys if any(k in r for r in records)]
        if not records or not keys:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.2 * len(keys)), sharex=True, squeeze=False)
        for ax, key in zip(axes[:, 0], keys):
            pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            ax.plot([p[0] for p in pts], [p[1] for p in pts])
            ax.set_ylabel(key, fontsize=8)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        fig.tight_layout()
        out = self.path / "plots" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
        plt.close(fig)
        return out
