"""Rich progress bars with live metrics for the long stages (SFT, RL, evaluation)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class StageBar:
    """Handle of one stage's bar: `advance(n, **fields)` moves it and shows the fields (e.g. reward, acc)."""

    def __init__(self, progress: Progress | None, task_id: int | None) -> None:
        self._progress = progress
        self._task = task_id

    def advance(self, n: int = 1, **fields: float) -> None:
        if self._progress is None or self._task is None:
            return
        text = "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        self._progress.update(self._task, advance=n, info=text)


@contextmanager
def stage(name: str, total: int, enabled: bool = True) -> Iterator[StageBar]:
    """A progress bar for a stage of `total` units (steps, prompts) on stderr; disabled when `enabled` is False."""
    if not enabled:
        yield StageBar(None, None)
        return
    progress = Progress(
        TextColumn("[bold]{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    )
    with progress:
        task_id = progress.add_task(name, total=total, info="")
        yield StageBar(progress, task_id)
