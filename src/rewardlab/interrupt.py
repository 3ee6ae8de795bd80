"""Ctrl-C in a training loop (`train`, `sft`): stop cleanly after the current step, or at once on a second Ctrl-C.

    with StopRequest() as stop:
        for step in ...:
            ...                          # one whole step
            if stop.requested:
                save a checkpoint, write the summary, raise Interrupted(...)

The first SIGINT only sets `stop.requested` (and says so on stderr); the loop finishes the step it is in, writes a
checkpoint and its summary, and raises `Interrupted`, which the CLI turns into one line naming the `--resume` command
and exit status 130 (128 + SIGINT, the shell's convention). A second SIGINT raises KeyboardInterrupt at once, as
Python does by default. The previous SIGINT handler is restored when the block ends.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The CLI's exit status after an `Interrupted` run: 128 + SIGINT, what a shell reports for a job stopped by Ctrl-C.
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Interrupted(KeyboardInterrupt):
    """A training loop stopped at the user's request (SIGINT) after finishing step `step`, with checkpoint
    `checkpoint` and the run's summary written, so `--resume` continues from there.

    A KeyboardInterrupt, so that code which handles Ctrl-C handles this one too.

    Attributes:
        verb: the CLI verb that continues the run ("train", "sft"). out: the run directory.
        step: the last step done. checkpoint: the checkpoint directory written for it.
    """

    def __init__(self, verb: str, out: str | Path, step: int, checkpoint: str | Path) -> None:
        super().__init__(verb, str(out), step, str(checkpoint))
        self.verb, self.out, self.step, self.checkpoint = verb, str(out), step, str(checkpoint)

    def message(self, command: str | None = None) -> str:
        """One line: the step, the checkpoint and `command` (default: `rewardlab VERB --out OUT --resume`)."""
        command = command or shlex.join(["rewardlab", *self.verb.split(), "--out", self.out, "--resume"])
        return (f"interrupted at step {self.step}; checkpoint {Path(self.checkpoint).name} written; "
                f"continue with: {command}")

    def __str__(self) -> str:
        return self.message()


def resume_command(argv: Sequence[str]) -> str:
    """The command line that continues the run `rewardlab ARGV` started: ARGV without --overwrite, with --resume
    (the same config file and overrides, so a resume accepts them), shell-quoted."""
    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["rewardlab", *args])


class StopRequest:
    """Turns the first SIGINT into a request to stop after the current step (see the module docstring).

    Active only inside its `with` block and only in the main thread (the only one Python delivers signals to); in
    another thread it installs nothing and `requested` stays False. A process forked inside the block (a reward
    worker pool) inherits the handler and ignores SIGINT: the training process decides when its workers stop.

    Attributes:
        requested: True once a SIGINT arrived in the block.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False
        self._pid = os.getpid()

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked worker: its parent handles Ctrl-C
            return
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("rewardlab: interrupt: finishing the current step, then writing a checkpoint (Ctrl-C again to stop "
              "at once, losing the step)", file=sys.stderr, flush=True)

    def __enter__(self) -> StopRequest:
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            # None: the previous handler was not installed from Python; the default is what it did.
            signal.signal(signal.SIGINT, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False
