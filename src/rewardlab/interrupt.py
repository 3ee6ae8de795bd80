"""Ctrl-C and SIGTERM in a training loop (`train`, `sft`): stop cleanly after the current step, or at once on a second
signal.

    with StopRequest() as stop:
        for step in ...:
            ...                          # one whole step
            if stop.requested:
                save a checkpoint, write the summary, raise Interrupted(..., signum=stop.signum)

The first SIGINT or SIGTERM only sets `stop.requested` (and says so on stderr); the loop finishes the step it is in,
writes a checkpoint and its summary, and raises `Interrupted`, which the CLI turns into one line naming the
`--resume` command and exit status 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM: the shell's
convention). A second SIGINT or SIGTERM raises KeyboardInterrupt at once, as Python does for Ctrl-C by default. The
previous handlers are restored when the block ends.

SIGTERM is how schedulers stop a job (Slurm, Kubernetes, `timeout`, `docker stop`) and they follow it with SIGKILL
after a while, so it comes with a deadline: the process ends `sigterm_grace_s()` seconds (default
`SIGTERM_GRACE_S`, 20; environment variable `REWARDLAB_SIGTERM_GRACE_S`) after the first SIGTERM at the latest. A
step and its checkpoint that do not finish in time are abandoned: the process exits at once with status 143, the run
resumes from its last checkpoint, as after a SIGKILL (its logs and checkpoints are written to survive one), and no
worker process it started outlives it (`rewardlab.lifetime`).
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
#: Seconds from the first SIGTERM to the end of the process at the latest, unless REWARDLAB_SIGTERM_GRACE_S says.
#: Below the 30 s that Slurm (KillWait) and Kubernetes (terminationGracePeriodSeconds) wait before their SIGKILL.
SIGTERM_GRACE_S = 20.0
GRACE_ENV = "REWARDLAB_SIGTERM_GRACE_S"


def sigterm_grace_s() -> float:
    """The grace period after a first SIGTERM, seconds: $REWARDLAB_SIGTERM_GRACE_S if set, else SIGTERM_GRACE_S.

    Raises:
        ValueError: the variable is set to something other than a finite number >= 0 (one line naming it).
    """
    text = os.environ.get(GRACE_ENV, "").strip()
    if not text:
        return SIGTERM_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= 0 and value != float("inf")):
        raise ValueError(f"{GRACE_ENV}: expected a number of seconds >= 0, got {text!r}")
    return value


class Interrupted(KeyboardInterrupt):
    """A training loop stopped at the user's request (SIGINT) or a scheduler's (SIGTERM) after finishing step
    `step`, with checkpoint `checkpoint` and the run's summary written, so `--resume` continues from there.

    A KeyboardInterrupt, so that code which handles Ctrl-C handles this one too.

    Attributes:
        verb: the CLI verb that continues the run ("train", "sft"). out: the run directory.
        step: the last step done. checkpoint: the checkpoint directory written for it.
        signum: the signal that asked for the stop (SIGINT or SIGTERM).
        exit_status: what the CLI exits with: 128 + signum (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, verb: str, out: str | Path, step: int, checkpoint: str | Path,
                 signum: int = signal.SIGINT) -> None:
        super().__init__(verb, str(out), step, str(checkpoint))
        self.verb, self.out, self.step, self.checkpoint = verb, str(out), step, str(checkpoint)
        self.signum = int(signum)
        self.exit_status = 128 + self.signum

    def message(self, command: str | None = None) -> str:
        """One line: the step, the checkpoint and `command` (default: `rewardlab VERB --out OUT --resume`)."""
        command = command or shlex.join(["rewardlab", *self.verb.split(), "--out", self.out, "--resume"])
        how = "interrupted" if self.signum == signal.SIGINT else f"stopped by {signal.Signals(self.signum).name}"
        return f"{how} at step {self.step}; checkpoint {Path(self.checkpoint).name} written; continue with: {command}"

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
    """Turns the first SIGINT or SIGTERM into a request to stop after the current step (see the module docstring).

    Active only inside its `with` block and only in the main thread (the only one Python delivers signals to); in
    another thread it installs nothing and `requested` stays False. A process forked inside the block (a reward
    worker pool) inherits the handlers: it ignores SIGINT (the training process decides when its workers stop) and
    dies of SIGTERM as by default.

    A first SIGTERM also starts the grace period: `grace_s` seconds later the process exits with status 143
    (`os._exit`, from a daemon thread, wherever the main thread is), after one line on stderr, unless it ended
    before. The deadline outlives the block (a SIGTERM asks the process to end); `cancel_deadline()` takes it back.

    Args:
        grace_s: seconds from the first SIGTERM to the end of the process; default `sigterm_grace_s()`.
    Attributes:
        requested: True once a SIGINT or SIGTERM arrived in the block.
        signum: the first one's number (signal.SIGINT or signal.SIGTERM), None before.
    Raises:
        ValueError: from `sigterm_grace_s()` (a bad REWARDLAB_SIGTERM_GRACE_S).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, grace_s: float | None = None) -> None:
        self.requested = False
        self.signum: int | None = None
        self.grace_s = sigterm_grace_s() if grace_s is None else float(grace_s)
        self._previous: dict[int, Any] = {}
        self._installed = False
        self._pid = os.getpid()
        self._deadline: threading.Timer | None = None

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked worker: its parent handles Ctrl-C; SIGTERM ends it as by default
            if signum == signal.SIGTERM:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum
        if signum == signal.SIGTERM:
            self._deadline = threading.Timer(self.grace_s, self._expire)
            self._deadline.daemon = True
            self._deadline.start()
            print(f"rewardlab: SIGTERM: finishing the current step, then writing a checkpoint, within {self.grace_s:g} "
                  "s (else stopping then, losing the step; SIGTERM or Ctrl-C again to stop at once)",
                  file=sys.stderr, flush=True)
            return
        print("rewardlab: interrupt: finishing the current step, then writing a checkpoint (Ctrl-C again to stop "
              "at once, losing the step)", file=sys.stderr, flush=True)

    def _expire(self) -> None:
        """The grace period is over: leave now. The logs and checkpoints survive this as they survive a SIGKILL;
        every worker process dies with this one."""
        try:
            print(f"rewardlab: SIGTERM: the {self.grace_s:g} s grace period is over; stopping now (the step in "
                  "progress is lost; --resume continues from the last checkpoint)", file=sys.stderr, flush=True)
        finally:
            os._exit(128 + signal.SIGTERM)

    def cancel_deadline(self) -> None:
        """Take back the exit at the end of a SIGTERM's grace period (for a caller whose process goes on after the
        `Interrupted`, e.g. a test). Idempotent."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def __enter__(self) -> StopRequest:
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            for signum in self.SIGNALS:
                # None: the previous handler was not installed from Python; the default is what it did.
                previous = self._previous.get(signum)
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            self._installed = False
