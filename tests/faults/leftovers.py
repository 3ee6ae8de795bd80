"""Shared by the leftover-process fault tests: run a command under a child subreaper, so that every process it starts
stays findable after it is killed, and count those left.

A process whose parent dies is re-parented to its nearest ancestor that is a child subreaper (prctl
PR_SET_CHILD_SUBREAPER), else to init. The reaper below is one: it starts the command, and every orphan of the
command's tree becomes its child, so "the processes the command started that are still alive" is "the reaper's
descendants". It reaps them as they exit and prints `exit PID STATUS` for each; it exits once it has no child left.
Linux only (the subreaper and /proc/PID/task/TID/children).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_REAPER = r"""
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
print("child", child.pid, flush=True)
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:  # no child, so no descendant left either
        break
    print("exit", pid, status, flush=True)
"""


def _children(pid: int) -> list[int]:
    kids = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(x) for x in fh.read().split())
        except OSError:
            continue
    return kids


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first), or None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (0.0 when it is gone)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class Tree:
    """`argv` started under a subreaper; `stderr` (a file path) gets the command's stderr.

    Attributes:
        root: the command's pid.
    """

    def __init__(self, argv: list[str], stderr: Path, env: dict[str, str] | None = None) -> None:
        self.stderr = stderr
        with open(stderr, "wb") as err:
            self.reaper = subprocess.Popen([sys.executable, "-c", _REAPER, *argv], stdout=subprocess.PIPE,
                                           stderr=err, env=env, text=True)
        line = self.reaper.stdout.readline().split()
        assert line[:1] == ["child"], f"the reaper did not start the command: {line} {stderr.read_text()[-2000:]}"
        self.root = int(line[1])

    def alive(self) -> dict[int, str]:
        """Every live (not zombie) process the command started, the command included: pid -> command line."""
        found, todo = {}, _children(self.reaper.pid)
        while todo:
            pid = todo.pop()
            fields = _stat(pid)
            if fields is not None and fields[0] not in ("Z", "X"):
                found[pid] = cmdline(pid)
            todo.extend(_children(pid))
        return found

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float) -> None:
        """Poll `condition` until true; fails naming `what` (and the command's stderr) at the deadline or when the
        command has exited."""
        deadline = time.monotonic() + timeout
        while not condition():
            fields = _stat(self.root)
            assert fields is not None and fields[0] != "Z", f"the command exited before {what}: {self.tail()}"
            assert time.monotonic() < deadline, f"no {what} after {timeout:g} s: {self.tail()}"
            time.sleep(0.1)

    def left_after(self, timeout: float) -> dict[int, str]:
        """Wait up to `timeout` seconds for every process of the tree to end; those still alive then."""
        deadline = time.monotonic() + timeout
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def status(self, timeout: float = 10.0) -> int | None:
        """The command's wait status (once the reaper has exited: call after `left_after` found nothing)."""
        out, _ = self.reaper.communicate(timeout=timeout)
        for line in out.splitlines():
            word, pid, status = line.split()
            if word == "exit" and int(pid) == self.root:
                return int(status)
        return None

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-lines:])

    def kill_all(self) -> None:
        """SIGKILL every process left in the tree (a failed test's), then the reaper."""
        for _ in range(50):
            left = self.alive()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        if self.reaper.poll() is None:
            self.reaper.kill()
        self.reaper.wait(timeout=30)
        self.reaper.stdout.close()


def workers_of(tree: Tree, min_cpu_s: float) -> list[int]:
    """Pids of the tree's forked pool workers (the root's command line, not the root) that have used at least
    `min_cpu_s` CPU seconds: busy on an item."""
    root = cmdline(tree.root)
    return [pid for pid, line in tree.alive().items()
            if pid != tree.root and line == root and cpu_seconds(pid) >= min_cpu_s]


def launchers_of(tree: Tree) -> list[int]:
    """Pids of the tree's sandbox launchers."""
    return [pid for pid, line in tree.alive().items() if "sandbox/launcher.py" in line]
