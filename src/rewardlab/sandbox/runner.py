"""Run untrusted Python programs in a sandbox: fresh temp dir, scrubbed environment, rlimits, wall timeout, no network.

    sandbox = Sandbox(SandboxLimits(timeout=5.0))
    result = sandbox.run("print(sum(range(10)))")          # SandboxResult(exit_code=0, stdout="45\\n", ...)
    results = sandbox.run_many(sources)                     # `workers` at a time, in input order

User documentation: docs/sandbox.md.

What is contained (Linux; "namespaces" isolation, chosen automatically where the kernel allows unprivileged user
namespaces and mount_setattr, i.e. Linux >= 5.12):
    processes   the program is pid 1 of a new PID namespace; when it exits, or is killed at the wall timeout, the
                kernel kills every process left in the namespace - children that double-fork, call setsid() or
                ignore signals included. It sees no process outside the namespace, so it can signal none
                (kill(-1, ...) and kill(0, ...) reach only sandboxed processes). As pid 1 it ignores signals from
                itself and its children that it has no handler for, a failed write past RLIMIT_FSIZE is EFBIG
                rather than SIGXFSZ, and os.getppid() is 0.
    count       RLIMIT_NPROC = max_processes (threads count), counted per sandbox: the limit is set after entering
                the new user namespace, whose process count starts at zero. The kernel never enforces
                RLIMIT_NPROC for uid 0, so a root caller's programs run as an unprivileged uid (65534, "nobody")
                that keeps only CAP_DAC_READ_SEARCH, so an interpreter under /root stays importable.
    files       every mount is read-only (and nosuid) in the sandbox's mount namespace - a nested user namespace
                cannot undo that; the working directory is a private tmpfs of `disk_bytes` mounted over /tmp, which
                vanishes with it. Nothing touches the host's disk: the source, stdout and stderr are memfds passed
                over the launcher's socket; RLIMIT_FSIZE bounds the outputs, the caller keeps the last
                `output_bytes` of each.
    network     socket(2) is refused (EACCES, a seccomp filter) and so is io_uring (ENOSYS), which can open sockets
                without it; socketpair(2) works. A network namespace alone would not do: a Unix socket of the host
                (a session bus, an agent) stays reachable through the read-only mounts, and so does vsock. Behind
                the filter, a new network namespace with only a loopback device that is down.
    environment the program gets HOME=TMPDIR=its work dir, PATH, LANG, and 1 for OMP/MKL/OPENBLAS/NUMEXPR_NUM_THREADS
                (one thread per program); nothing from the caller's environment.
                It runs as `__main__` from main.py, the only file in its fresh work dir.
                /proc is the namespace's own, so other processes' environ files are not there to read.
    resources   RLIMIT_CPU (seconds), RLIMIT_AS (bytes), RLIMIT_FSIZE (bytes), RLIMIT_NOFILE, RLIMIT_NPROC, no core
                files; stdin is /dev/null; no new privileges (PR_SET_NO_NEW_PRIVS); no capabilities beyond
                CAP_DAC_READ_SEARCH (root callers) or none (other callers).

What is not contained:
    - reading: the program can read every file the caller can read (it is not in a chroot). With no network and
      no writable disk outside its tmpfs, what it reads can reach only its own stdout/stderr, which the caller keeps.
    - memory across processes: RLIMIT_AS is per process, so a sandbox can use up to max_processes x memory_bytes
      plus its tmpfs (disk_bytes) and its outputs (2 x file_size_bytes, in memory); there is no cgroup. CPU time
      likewise is per process; the wall timeout bounds all of it.
    - kernel bugs: user namespaces widen the kernel surface a program can reach; the seccomp filter narrows it
      only by socket(2) and io_uring.
    - honesty: code run in one process with its tests can tamper with them (see rewardlab.rewards.code).

"process" isolation (the kernel refuses user namespaces; or isolation="process"): a fresh temp dir on disk as the
working directory, the same scrubbed environment and rlimits, socket(2) and io_uring refused by the same seccomp
filter (or, where seccomp is unavailable, by replacing Python's socket classes - which ctypes can bypass), the
program in its own session, and at exit or timeout every descendant is killed (the sandbox's setup process is a
child subreaper, so orphans come back to it). Root callers' programs run as uid 65534. Where the kernel has Landlock
(Linux >= 5.13) the program and its children may write only in the work dir (and /dev/null), and with Landlock ABI 6
(Linux >= 6.12) may signal only each other: not the supervisor, the launcher, the caller, other sandboxes or other
processes of their uid. Without Landlock, files the uid may write stay writable (world-writable /tmp included) and
the program can signal other processes of its uid. Weaker than namespaces either way: RLIMIT_NPROC counts all
processes of that uid on the machine (the limit is set to those running now plus max_processes),
and it sees the host's /proc. isolation="namespaces" refuses to run instead of falling back.

Implementation: a launcher process (`launcher.py` in this package, stdlib only, single-threaded) is started once per
interpreter and clones one sandbox per program. The caller only exchanges datagrams with it: it never forks itself
(forking a multi-threaded trainer that holds a model is slow and unsafe), and any number of caller threads can run
batches at once. The launcher runs up to `workers` programs of a batch at once and starts the next queued one the
moment one exits. It kills its sandboxes and exits when the caller process ends, however it ends: it sees end of file
on its socket (a process forked from the caller, e.g. a pool worker, closes its inherited copy of the caller's end at
once) and it watches the caller's pidfd, which covers a copy held anyway.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import Future, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from pathlib import Path

from rewardlab.threads import THREAD_ENV, thread_budget

__all__ = ["ISOLATION", "Sandbox", "SandboxError", "SandboxLimits", "SandboxResult", "default_workers"]

ISOLATION = ("auto", "namespaces", "process")
LAUNCHER = Path(__file__).with_name("launcher.py")
#: Seconds the caller waits beyond the program's timeout before it declares the launcher stuck.
_CALLER_GRACE = 10.0


def default_workers() -> int:
    """The run's thread budget (`rewardlab.threads.thread_budget`): the `threads` setting a verb applied, else the
    number of CPUs this process may run on (its affinity mask where the OS has one), at least 1.

    The default size of both process pools: the sandbox's and the reward executor's (which imports it from here).
    """
    return thread_budget()


class SandboxError(RuntimeError):
    """The sandbox itself failed (launcher died, namespaces required but refused, bad run directory) - not the
    program. The message says why."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed program.

    Attributes:
        timeout: wall-clock seconds from start until the whole process tree is killed (default 10).
        cpu_seconds: RLIMIT_CPU per process, in seconds; None = ceil(timeout) + 1.
        memory_bytes: RLIMIT_AS per process (virtual address space), bytes (default 1 GiB).
        file_size_bytes: RLIMIT_FSIZE, the largest file the program may write, stdout/stderr included (16 MiB).
        disk_bytes: size of the working directory's tmpfs, bytes (64 MiB; "namespaces" isolation only).
        open_files: RLIMIT_NOFILE (64).
        max_processes: processes and threads the program may have at once, itself included (RLIMIT_NPROC; 32).
        output_bytes: bytes kept from the end of stdout and of stderr (64 KiB).
    Raises:
        ValueError: a limit that is not positive (the message names it).
    """

    timeout: float = 10.0
    cpu_seconds: int | None = None
    memory_bytes: int = 1 << 30
    file_size_bytes: int = 16 << 20
    disk_bytes: int = 64 << 20
    open_files: int = 64
    max_processes: int = 32
    output_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name in ("timeout", "memory_bytes", "file_size_bytes", "disk_bytes", "open_files", "max_processes",
                     "output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"sandbox.{name}: must be a positive number, got {value!r}")
        if not math.isfinite(self.timeout):
            raise ValueError(f"sandbox.timeout: must be finite, got {self.timeout!r}")
        if self.cpu_seconds is not None and (isinstance(self.cpu_seconds, bool) or not self.cpu_seconds > 0):
            raise ValueError(f"sandbox.cpu_seconds: must be a positive number or None, got {self.cpu_seconds!r}")

    @property
    def cpu(self) -> int:
        """RLIMIT_CPU in whole seconds."""
        return int(math.ceil(self.cpu_seconds if self.cpu_seconds is not None else self.timeout + 1))


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one program.

    Attributes:
        exit_code: the program's exit status (0-255), or None when a signal ended it or it timed out.
        signal: the number of the signal that ended it (e.g. 9 SIGKILL, 24 SIGXCPU, 25 SIGXFSZ), else None.
        timed_out: True when the wall timeout killed it.
        stdout, stderr: the last `output_bytes` of each, decoded as UTF-8 (undecodable bytes replaced).
        wall_seconds: seconds from the sandbox's start to its end, set-up included.
        cpu_seconds: CPU seconds (user + system) the program and its waited-for children used.
        isolation: "namespaces" or "process" - what contained this run.
        reason: one line: "ok", "exit code 1: ZeroDivisionError: division by zero", "killed by SIGXCPU (CPU time
            limit)", "timed out after 2 s", ...
    """

    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_seconds: float
    cpu_seconds: float
    isolation: str
    reason: str

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 before the timeout."""
        return self.exit_code == 0 and not self.timed_out


_SIGNAL_CAUSES = {
    signal.SIGXCPU: "CPU time limit",
    signal.SIGXFSZ: "file size limit",
    signal.SIGSEGV: "segmentation fault",
}


def _base_env() -> dict[str, str]:
    """The whole environment of the launcher and (with HOME and TMPDIR set to the work dir) of every program."""
    # One thread per program for the numeric libraries (OpenMP, MKL, OpenBLAS, numexpr): `workers` programs run at
    # once, and each spinning a thread per core would oversubscribe the cores that many times over.
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
            **{name: "1" for name in THREAD_ENV}}


class _Launcher:
    """One `launcher.py` process and the thread that reads its replies."""

    def __init__(self, python: str) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        _NOT_INHERITED.update((ours, theirs))
        self._log = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [python, "-I", "-B", str(LAUNCHER), str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                env=_base_env(), cwd="/", start_new_session=True,
            )
        except OSError as exc:
            _NOT_INHERITED.discard(ours)
            ours.close()
            raise SandboxError(f"sandbox: cannot start the launcher with {python}: {exc}") from None
        finally:
            _NOT_INHERITED.discard(theirs)
            theirs.close()
        self.sock = ours
        self.owner_pid = os.getpid()
        self.lock = threading.Lock()
        self.pending: dict[int, Future] = {}
        self.ids = itertools.count()
        self.dead: str | None = None
        hello = self._recv()[0]
        if hello is None:
            _NOT_INHERITED.discard(ours)
            ours.close()
            raise SandboxError(f"sandbox: the launcher exited at start: {self._log_tail()}")
        self.namespaces: bool = hello["namespaces"]
        self.refusal: str = hello["reason"]
        self.reader = threading.Thread(target=self._read, name="rewardlab-sandbox-reader", daemon=True)
        self.reader.start()

    def _recv(self) -> tuple[dict | None, list[int]]:
        """The next message and the descriptors attached to it; (None, []) at EOF."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 2)
        except OSError:
            return None, []
        if not data:
            return None, []
        return json.loads(data), fds

    def _log_tail(self) -> str:
        try:
            self._log.seek(0)
            lines = self._log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return "no log"
        return lines[-1] if lines else "no output"

    def _exit_cause(self) -> str:
        """How the launcher ended ("killed by SIGKILL", "exit code 1: <its last log line>"), for error messages."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return self._log_tail()
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
            return f"killed by {name}"
        tail = self._log_tail()
        return f"exit code {code}" + (f": {tail}" if tail not in ("no output", "no log") else "")

    def _read(self) -> None:
        while True:
            reply, fds = self._recv()
            if reply is None:
                break
            reply["fds"] = fds
            with self.lock:
                future = self.pending.pop(reply["id"], None)
            if future is not None:
                future.set_result(reply)
            else:
                for fd in fds:
                    os.close(fd)
        with self.lock:
            self.dead = f"sandbox: the launcher exited ({self._exit_cause()})"
            pending, self.pending = self.pending, {}
        for future in pending.values():
            future.set_exception(SandboxError(self.dead))

    def submit(self, request: dict, source_fd: int) -> Future:
        """Send one request with its source memfd; the future gets the reply (with its "fds": stdout, stderr)."""
        future: Future = Future()
        with self.lock:
            if self.dead:
                raise SandboxError(self.dead)
            request["id"] = next(self.ids)
            self.pending[request["id"]] = future
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [source_fd])
            except OSError as exc:
                self.pending.pop(request["id"], None)
                raise SandboxError(f"sandbox: cannot reach the launcher: {exc}") from None
        return future

    def alive(self) -> bool:
        return self.dead is None and self.owner_pid == os.getpid() and self.proc.poll() is None

    def close(self) -> None:
        _NOT_INHERITED.discard(self.sock)
        try:
            self.sock.close()  # the launcher sees EOF, kills its sandboxes and exits
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


_LAUNCHERS: dict[str, _Launcher] = {}
_BATCHES = itertools.count()
_LAUNCHERS_LOCK = threading.Lock()
#: This process's ends of its launchers' sockets. A forked child (a pool worker) closes its copies at once: a copy
#: left open would keep a launcher from seeing end of file when this process dies.
_NOT_INHERITED: set[socket.socket] = set()


def _forget_launchers_after_fork() -> None:
    """In a forked child: close the inherited launcher sockets and forget the parent's launchers (a child that runs
    a sandbox starts its own); the lock may have been held by another thread of the parent at the fork."""
    global _LAUNCHERS_LOCK
    for sock in list(_NOT_INHERITED):
        sock.close()
    _NOT_INHERITED.clear()
    _LAUNCHERS.clear()
    _LAUNCHERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_launchers_after_fork)


def _launcher(python: str) -> _Launcher:
    with _LAUNCHERS_LOCK:
        launcher = _LAUNCHERS.get(python)
        if launcher is None or not launcher.alive():
            launcher = _LAUNCHERS[python] = _Launcher(python)
        return launcher


def _shutdown_launchers() -> None:
    for launcher in list(_LAUNCHERS.values()):
        if launcher.owner_pid == os.getpid():
            launcher.close()


atexit.register(_shutdown_launchers)


def _tail(fd: int, limit: int) -> str:
    """The last `limit` bytes of the memfd `fd`, decoded as UTF-8 (undecodable bytes replaced)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, limit, max(0, size - limit))
    return data.decode("utf-8", errors="replace")


def _remove(path: str) -> None:
    def retry(func, target, _exc):  # a program may leave directories without write permission
        try:
            os.chmod(os.path.dirname(target), 0o700)
            func(target)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


def _process_work_dir(work_dirs: list[str]) -> str:
    """A new work dir for one program under process isolation: `<parent>/work`, mode 0700, in a fresh 0700 temp
    dir `parent` of the caller's, which is appended to `work_dirs` (the caller removes it). A root caller's program
    runs as uid 65534, which then owns the work dir."""
    parent = tempfile.mkdtemp(prefix="rewardlab-sandbox-")  # 0700, the caller's
    work_dirs.append(parent)
    work_dir = os.path.join(parent, "work")
    os.mkdir(work_dir, 0o700)
    if os.geteuid() == 0:
        os.chown(work_dir, 65534, 65534)  # process isolation runs a root caller's program as 65534
    return work_dir


def _submit(launcher: _Launcher, request: dict, source: str) -> Future:
    """Hand one program to the launcher: `source` (UTF-8, lone surrogates kept) in a close-on-exec memfd, which is
    closed here once the launcher has its copy. Returns the future of the launcher's reply.

    Raises:
        SandboxError: the launcher could not take the program.
    """
    source_fd = os.memfd_create("main.py", os.MFD_CLOEXEC)
    try:
        data = memoryview(source.encode("utf-8", errors="surrogatepass"))
        while data:
            data = data[os.write(source_fd, data):]
        return launcher.submit(request, source_fd)
    finally:
        os.close(source_fd)


class Sandbox:
    """Runs Python programs, each in its own sandbox (see the module docstring for what is contained).

    Args:
        limits: resource limits applied to every program (default `SandboxLimits()`).
        isolation: "auto" (namespaces where the kernel allows, else process isolation), "namespaces" (refuse to
            run otherwise) or "process".
        workers: programs of one `run_many` call run at once (the launcher queues the rest); default: the run's
            `threads` setting, else the CPU count (`default_workers`), so each program gets about a core and its
            wall timeout means what it says.
        python: interpreter that runs the programs (default: this one, `sys.executable`).
    Raises:
        ValueError: an unknown isolation or a workers count below 1.
    """

    def __init__(self, limits: SandboxLimits | None = None, *, isolation: str = "auto", workers: int | None = None,
                 python: str | None = None) -> None:
        if isolation not in ISOLATION:
            raise ValueError(f"sandbox.isolation: expected one of {ISOLATION}, got {isolation!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"sandbox.workers: must be an integer >= 1, got {workers!r}")
        self.limits = limits or SandboxLimits()
        self.isolation = isolation
        self.workers = workers or default_workers()
        self.python = python or sys.executable

    def available_isolation(self) -> tuple[str, str]:
        """("namespaces", "") when the kernel allows the namespace set-up, else ("process", why it refused)."""
        launcher = _launcher(self.python)
        return ("namespaces", "") if launcher.namespaces else ("process", launcher.refusal)

    def run(self, source: str) -> SandboxResult:
        """Run `source` as a Python program (`__main__`, file main.py, working directory = its own temp dir).

        Returns the SandboxResult; a program that fails, crashes or times out is a result, not an exception.
        Raises:
            TypeError: `source` is not a str.
            SandboxError: the sandbox could not run it (launcher died; isolation="namespaces" but refused).
        """
        (result,) = self.run_many([source])
        if isinstance(result, SandboxError):
            raise result
        return result

    def run_many(self, sources: Sequence[str]) -> list[SandboxResult | SandboxError]:
        """Run every source, at most `workers` at once; results in input order.

        All programs are handed to the launcher at once; it starts the next as soon as one exits. A program the
        sandbox could not run gets its SandboxError in place of a result (the others still run).
        Raises:
            TypeError: a source is not a str.
            SandboxError: no program can run (the launcher cannot start; isolation="namespaces" but refused).
        """
        for source in sources:
            if not isinstance(source, str):
                raise TypeError(f"sandbox: source must be a str, got {type(source).__name__}")
        if not sources:
            return []
        launcher = self._checked_launcher()
        by_process = self.isolation == "process" or (self.isolation == "auto" and not launcher.namespaces)
        batch = next(_BATCHES)
        results: list[SandboxResult | SandboxError | None] = [None] * len(sources)
        waiting: dict[Future, tuple[int, str | None]] = {}
        work_dirs: list[str] = []
        try:
            for i, source in enumerate(sources):
                # namespaces isolation needs nothing on disk: its work dir is a private tmpfs
                work_dir = _process_work_dir(work_dirs) if by_process else None
                request = self._request(batch, work_dir)
                try:
                    waiting[_submit(launcher, request, source)] = (i, work_dirs[-1] if work_dir else None)
                except SandboxError as exc:
                    results[i] = exc
            self._gather(launcher, waiting, results)
        finally:
            for work_dir in work_dirs:
                if os.path.exists(work_dir):
                    _remove(work_dir)
        return results  # type: ignore[return-value]

    def _checked_launcher(self) -> _Launcher:
        """This interpreter's launcher (started on first use).

        Raises:
            SandboxError: isolation="namespaces" but the kernel refused the namespace set-up; the launcher cannot
                start.
        """
        launcher = _launcher(self.python)
        if self.isolation == "namespaces" and not launcher.namespaces:
            raise SandboxError(f"sandbox: isolation='namespaces' but the kernel refused: {launcher.refusal}")
        return launcher

    def _request(self, batch: int, work_dir: str | None) -> dict:
        """The launcher's request for one program of `batch`: at most `workers` of the batch at once, the limits
        (seconds, bytes, counts), the isolation, the scrubbed environment and the work dir (None: a private tmpfs)."""
        limits = self.limits
        return {
            "batch": batch, "limit": self.workers, "timeout": float(limits.timeout),
            "cpu_seconds": limits.cpu, "memory_bytes": int(limits.memory_bytes),
            "file_size_bytes": int(limits.file_size_bytes), "disk_bytes": int(limits.disk_bytes),
            "open_files": int(limits.open_files), "max_processes": int(limits.max_processes),
            "isolation": self.isolation, "env": _base_env(), "work_dir": work_dir,
        }

    def _gather(self, launcher: _Launcher, waiting: dict[Future, tuple[int, str | None]],
                results: list[SandboxResult | SandboxError | None]) -> None:
        """Put each program's result (or its SandboxError) in its place in `results` as the launcher answers, and
        remove its work dir then. Programs run `workers` at a time, each for at most timeout: a launcher that
        answers later is stuck; it is closed (with everything it runs) and each program still without a result
        gets a SandboxError."""
        rounds = math.ceil(len(results) / self.workers)
        deadline = rounds * (self.limits.timeout + 1.0) + _CALLER_GRACE
        try:
            for future in as_completed(waiting, timeout=deadline):
                i, work_dir = waiting[future]
                results[i] = self._outcome(future)
                if work_dir is not None:
                    _remove(work_dir)
        except FuturesTimeout:
            launcher.close()  # stuck: kill it and everything it runs; the next call starts a fresh one
            for i, result in enumerate(results):
                if result is None:
                    results[i] = SandboxError("sandbox: the launcher did not answer; restarted it")

    def _outcome(self, future: Future) -> SandboxResult | SandboxError:
        """The result of an answered program, or the SandboxError the launcher's reply gave."""
        try:
            return self._collect(future.result())
        except SandboxError as exc:
            return exc

    def _collect(self, reply: dict) -> SandboxResult:
        fds = reply.get("fds", [])
        try:
            if reply["error"]:
                raise SandboxError(reply["error"])
            if len(fds) != 2:
                raise SandboxError("sandbox: the launcher's reply lacks the program's output")
            stdout, stderr = (_tail(fd, self.limits.output_bytes) for fd in fds)
        finally:
            for fd in fds:
                os.close(fd)
        return _result(reply, stdout, stderr, self.limits)


def _result(reply: dict, stdout: str, stderr: str, limits: SandboxLimits) -> SandboxResult:
    status = reply["status"]
    cpu = float(reply.get("cpu_seconds") or 0.0)
    exit_code = sig = None
    if reply["timed_out"]:
        reason = f"timed out after {limits.timeout:g} s"
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        cause = _SIGNAL_CAUSES.get(sig)
        # RLIMIT_CPU's hard limit is a SIGKILL. The CPU time wait4 reports can read well below what the limit
        # counted (0.77-0.9 s at a 1 s limit on a loaded 2-core virtual machine), so half the limit is the mark.
        if sig == signal.SIGKILL and cpu >= 0.5 * limits.cpu:
            cause = "CPU time limit"
        reason = f"killed by {name}" + (f" ({cause})" if cause else "")
    else:
        exit_code = os.WEXITSTATUS(status)
        reason = "ok" if exit_code == 0 else f"exit code {exit_code}"
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
        if exit_code != 0 and last:
            reason += f": {last[:200]}"
    return SandboxResult(exit_code=exit_code, signal=sig, timed_out=bool(reply["timed_out"]), stdout=stdout,
                         stderr=stderr, wall_seconds=float(reply["wall_seconds"]), cpu_seconds=cpu,
                         isolation=reply["isolation"], reason=reason)
