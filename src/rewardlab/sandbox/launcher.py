"""The sandbox launcher: a small long-lived process that forks one contained process tree per program.

Run by `rewardlab.sandbox.runner` as `python -I -B launcher.py FD CALLER` (by path, as -I ignores PYTHONPATH), where
FD is one end of a SOCK_SEQPACKET socket pair and CALLER the caller's pid; stdlib only, so it never imports rewardlab
(or torch). It is single-threaded, so forking it is safe (forking a multi-threaded parent is not), and it imports
everything once, so each sandbox costs a fork and a few system calls instead of an interpreter start.

Protocol (one JSON object per datagram):
    hello    {"namespaces": bool, "reason": why not, "pid"}  - sent once at start, after probing the namespace set-up
    request  {"id", "batch", "limit", "timeout", "cpu_seconds", "memory_bytes", "file_size_bytes", "disk_bytes",
              "open_files", "max_processes", "env": {...}, "isolation": "auto" | "namespaces" | "process",
              "work_dir" (process isolation only: the program's working directory)}
             with one descriptor attached (SCM_RIGHTS): a memfd holding the program's source.
             At most `limit` requests of one batch run at once; the launcher starts the next queued one as soon as
             one exits.
    reply    {"id", "isolation", "status" (raw wait status of the program, or null), "timed_out", "wall_seconds",
              "error" (null, or why the sandbox could not run the program), "cpu_seconds", "max_rss_bytes"}
             with the program's stdout and stderr attached as two memfds (none when it could not start).
The launcher kills its sandboxes and exits when the caller closes its end of the socket, and when the caller process
ends (it watches a pidfd of CALLER), even while another process still holds a copy of the caller's end.
Under "namespaces" isolation nothing is written to the host's disk: the source and outputs are memfds and the
working directory is a tmpfs mounted over /tmp in the sandbox's own mount namespace.

Process tree of one sandbox, "namespaces" isolation:
    launcher ─ P  cloned (clone3) straight into new user, mount, network, PID, IPC and UTS namespaces, as pid 1 of
                  its PID namespace. The launcher writes its uid/gid maps; P mounts a tmpfs on its work dir, makes
                  every other mount read-only, mounts its own /proc, drops privileges, sets rlimits and runs the
                  program. When P exits - or the launcher kills it at the wall timeout - the kernel kills every
                  other process in the PID namespace. P dies with the launcher (PR_SET_PDEATHSIG).
    Because the program is its namespace's init: signals it sends itself (or gets from its own children) that it
    has no handler for are ignored, SIGKILL and SIGSTOP included (Python's SIGINT handler still works);
    descendants orphaned by a double fork are reaped only when it exits; os.getppid() is 0.

"process" isolation (the kernel refused namespaces):
    launcher ─ S  child subreaper: enforces the wall timeout, then kills every process it has adopted
                 └─ P  own session; Landlock domain (writes only in its work dir, signals only inside); dies with S
Both: P installs a seccomp filter refusing socket(2) and io_uring before the program runs.
"""

from __future__ import annotations

import builtins
import collections
import ctypes
import errno
import fcntl
import gc
import json
import os
import platform
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback
import types
from collections.abc import Sequence

LIBC = ctypes.CDLL(None, use_errno=True)
#: The same C library, called without releasing the GIL (for clone3, which must not race Python's fork hooks).
PYLIBC = ctypes.PyDLL(None, use_errno=True)
LIBC.syscall.restype = PYLIBC.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_CLONE3, SYS_MOUNT_SETATTR = 435, 442  # the same numbers on every architecture (added after the unification)
SYS_IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register: likewise
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # likewise
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_KEEPCAPS, PR_SET_SECCOMP = 1, 4, 8, 22
PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 24, 36, 38
CAP_DAC_READ_SEARCH = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
#: The unprivileged account a root caller's programs run as (kernel uid/gid; "nobody"/"nogroup" on most systems).
NOBODY = 65534
#: Inside a root caller's user namespace: uid/gid 0 maps to root (the setup processes), 1 to NOBODY (the program).
INNER_ID = 1
GRACE_SECONDS = 0.5
#: Read end of a pipe whose write end only the launcher holds: at EOF the launcher is gone. Set by main().
LAUNCHER_ALIVE = -1
#: Descriptors of a sandbox's set-up processes after _keep_only: the program's source, stdout and stderr (memfds),
#: the report pipe, LAUNCHER_ALIVE.
SOURCE_FD, OUT_FD, ERR_FD, REPORT_FD, ALIVE_FD = 3, 4, 5, 6, 7
#: The working directory under "namespaces" isolation: a private tmpfs mounted over /tmp in the sandbox only.
NAMESPACED_WORK = "/tmp"


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> None:
    zero = ctypes.c_ulong(0)  # prctl and syscall are variadic: pass every argument at its full width
    _check(LIBC.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero), what)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None, what: str) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(LIBC.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), what)


def _mount_setattr(path: str, flags: int, attr_set: int = 0, attr_clr: int = 0) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    _check(LIBC.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_long(AT_FDCWD), path.encode(),
                        ctypes.c_ulong(flags), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
           f"mount_setattr {path}")


def _drop_bounding_set(keep: int) -> None:
    """Remove every capability not in `keep` (a bit mask) from the bounding set (needs CAP_SETPCAP)."""
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if not keep & (1 << cap):
            _prctl(PR_CAPBSET_DROP, cap, f"drop capability {cap} from the bounding set")


def _set_capabilities(keep: int) -> None:
    """Permitted and effective sets = `keep` (a bit mask); inheritable empty (so ambient is empty too)."""
    data = (_CapData * 2)()
    data[0].effective = data[0].permitted = keep & 0xFFFFFFFF
    data[1].effective = data[1].permitted = keep >> 32
    _check(LIBC.capset(ctypes.byref(_CapHeader(LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


# ----------------------------------------------------------------------------------------------------- seccomp
AUDIT_ARCH = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}  # (AUDIT_ARCH_*, __NR_socket)


def _refuse_sockets() -> str:
    """Install a seccomp filter that makes socket(2) fail with EACCES and io_uring_setup/enter/register with ENOSYS;
    fall back to patching the socket module.

    Both isolations need it. A network namespace does not stop a Unix socket: connect() to a socket file of the
    host (a session bus, an agent) works through a read-only mount, with the caller's uid. Nor does it stop vsock,
    which reaches a virtual machine's host. io_uring can create and connect sockets without socket(2), so it is
    refused too (socketpair(2) stays: multiprocessing's pipes use it).
    Returns how sockets were refused ("seccomp" or "python socket module patched").
    """
    arch = AUDIT_ARCH.get(platform.machine())
    if arch is not None:
        audit_arch, nr_socket = arch
        ld_w_abs, jeq_k, ret_k = 0x20, 0x15, 0x06
        kill, allow, eacces = 0x80000000, 0x7FFF0000, 0x00050000 | errno.EACCES
        enosys = 0x00050000 | errno.ENOSYS
        setup, enter, register = SYS_IO_URING
        prog = [
            (ld_w_abs, 0, 0, 4),  # A = seccomp_data.arch
            (jeq_k, 1, 0, audit_arch),  # native architecture: skip the kill
            (ret_k, 0, 0, kill),
            (ld_w_abs, 0, 0, 0),  # A = seccomp_data.nr
            (jeq_k, 0, 1, nr_socket),
            (ret_k, 0, 0, eacces),
            (jeq_k, 2, 0, setup),  # any io_uring call: to the ENOSYS return
            (jeq_k, 1, 0, enter),
            (jeq_k, 0, 1, register),
            (ret_k, 0, 0, enosys),
            (ret_k, 0, 0, allow),
        ]
        if platform.machine() == "x86_64":  # refuse the x32 ABI (syscall numbers with bit 30 set) outright
            prog[4:4] = [(0x35, 0, 1, 0x40000000), (ret_k, 0, 0, kill)]  # jge 0x40000000 -> kill
        raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
        buf = ctypes.create_string_buffer(raw)

        class _Fprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = _Fprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
        zero = ctypes.c_ulong(0)
        if LIBC.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero) == 0:
            return "seccomp"
    import _socket

    def refused(*_args, **_kwargs):
        raise PermissionError(errno.EACCES, "network access is disabled in the sandbox")

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refused()

    socket.socket = _socket.socket = NoSocket  # type: ignore[misc]
    socket.socketpair = socket.create_connection = socket.create_server = refused  # type: ignore[assignment]
    return "python socket module patched"


# ---------------------------------------------------------------------------------------------------- landlock
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
#: Landlock file-system rights that write (bit, first ABI that knows it): write a file, remove a dir/file, make a
#: char device/dir/regular file/socket/fifo/block device/symlink, link or rename across dirs (REFER), truncate.
LANDLOCK_WRITES = [(1 << 1, 1), (1 << 4, 1), (1 << 5, 1), (1 << 6, 1), (1 << 7, 1), (1 << 8, 1), (1 << 9, 1),
                   (1 << 10, 1), (1 << 11, 1), (1 << 12, 1), (1 << 13, 2), (1 << 14, 3)]
LANDLOCK_FILE_RIGHTS = (1 << 1) | (1 << 14)  # of those, the ones a rule on a single file (not a dir) may grant
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1, 2  # ABI 6 (Linux 6.12)
#: Files outside the work dir a program may still open for writing.
WRITABLE_FILES = ("/dev/null",)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled)."""
    abi = LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(abi))


def _landlock(work_dir: str) -> int:
    """Process isolation: with Landlock, let this process and its descendants write only under `work_dir` (and to
    WRITABLE_FILES), and (ABI >= 6) signal, or connect to abstract Unix sockets of, only processes of their own
    domain - so not the supervisor, the launcher, the caller, other sandboxes or other processes of their uid.
    Reading is not restricted. Returns the ABI used; 0 (nothing restricted) where the kernel has no Landlock.
    Needs PR_SET_NO_NEW_PRIVS. Raises OSError when the kernel has Landlock but refuses the rules.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    writes = 0
    for bit, since in LANDLOCK_WRITES:
        if abi >= since:
            writes |= bit
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr grew by one u64 per feature: handled_access_fs, _net (ABI 4), scoped (ABI 6)
    attr = (ctypes.c_uint64 * 3)(writes, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                      ctypes.c_uint32(0))
    if fd < 0:
        _check(-1, "landlock_create_ruleset")
    try:
        for path, rights in ((work_dir, writes), *((f, writes & LANDLOCK_FILE_RIGHTS) for f in WRITABLE_FILES)):
            try:
                target = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = struct.pack("=Qi", rights, target)  # struct landlock_path_beneath_attr (packed)
                _check(LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(fd),
                                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.c_char_p(rule),
                                    ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            finally:
                os.close(target)
        _check(LIBC.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(fd)
    return abi


# ------------------------------------------------------------------------------------------------- the program
def _run_program(req: dict, isolation: str) -> None:
    """Become the program: drop privileges, set limits, run the source as `__main__`. Never returns.

    RLIMIT_NPROC: in a new user namespace the count of this uid starts at zero (the kernel counts per user
    namespace once the limit is set inside it), so max_processes bounds this sandbox alone.

    Expects the descriptors _keep_only leaves. A set-up failure is reported on REPORT_FD (the caller gets a
    SandboxError) and the program does not run.
    """
    try:
        source, path, main = _set_up_program(req, isolation)
    except BaseException:  # noqa: BLE001 - a setup failure must not run the program
        _report(REPORT_FD, error="sandbox: program set-up failed: " + traceback.format_exc().splitlines()[-1])
        os._exit(126)
    os.close(REPORT_FD)
    _exec_main(source, path, main)


def _set_up_program(req: dict, isolation: str) -> tuple[bytes, str, types.ModuleType]:
    """Every step of the program's set-up, in this order: standard streams, signals, privileges, death with the
    parent, no new privileges, Landlock (process isolation), the socket filter, working directory, environment
    and main.py, rlimits, `__main__`. Returns (source, path of main.py, the `__main__` module). Raises on any
    failure (the program must then not run)."""
    _redirect_streams()
    _reset_signals()
    _drop_privileges(req, isolation)
    _die_with_parent(req, isolation)
    os.close(ALIVE_FD)
    extra_processes = 0
    if isolation == "process":
        # RLIMIT_NPROC counts every process of this real uid on the machine: allow the others running now.
        extra_processes = _count_tasks(os.getuid()) - 1
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
    if isolation == "process":
        _landlock(req["work_dir"])
    _refuse_sockets()
    work = NAMESPACED_WORK if isolation == "namespaces" else req["work_dir"]
    source, path = _write_main(req, work)
    _set_limits(req, extra_processes)
    sys.argv[:] = [path]
    sys.path[0] = work
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    return source, path, main


def _redirect_streams() -> None:
    """stdout and stderr to the program's output memfds, stdin from /dev/null; the memfds' own descriptors closed."""
    os.dup2(OUT_FD, 1)
    os.dup2(ERR_FD, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.close(OUT_FD)
    os.close(ERR_FD)


def _reset_signals() -> None:
    """Signal dispositions as at interpreter start (the launcher's and the supervisor's changed some)."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGALRM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at interpreter start
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _drop_privileges(req: dict, isolation: str) -> None:
    """Drop the capabilities a user namespace gave, or, for a root caller, switch to an unprivileged uid."""
    if isolation == "namespaces" and not req["root_caller"]:
        # inner uid = the caller's uid; drop every capability the user namespace gave
        _drop_bounding_set(0)
        _set_capabilities(0)
    elif os.geteuid() == 0:
        # Become an unprivileged uid (inner uid 1 = NOBODY in the namespace, NOBODY itself without one), so
        # RLIMIT_NPROC applies (the kernel never enforces it for uid 0) and file permissions protect root's
        # files. Keep CAP_DAC_READ_SEARCH so an interpreter installed under a private home (/root) stays
        # readable. Order: bounding set (needs CAP_SETPCAP), then ids (need CAP_SETUID/SETGID), then capset.
        new_id = INNER_ID if isolation == "namespaces" else NOBODY
        _drop_bounding_set(1 << CAP_DAC_READ_SEARCH)
        _prctl(PR_SET_KEEPCAPS, 1, "PR_SET_KEEPCAPS")
        os.setgroups([])
        os.setresgid(new_id, new_id, new_id)
        os.setresuid(new_id, new_id, new_id)
        _set_capabilities(1 << CAP_DAC_READ_SEARCH)
        _prctl(PR_SET_DUMPABLE, 1, "PR_SET_DUMPABLE")  # a uid change made /proc/self/* root-only


def _die_with_parent(req: dict, isolation: str) -> None:
    """Set the parent-death signal (a uid change clears it) and exit at once when the parent is already gone."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")
    if isolation == "namespaces" and select.select([ALIVE_FD], [], [], 0)[0]:  # EOF: the launcher is gone
        os._exit(1)
    if isolation == "process" and os.getppid() != req["supervisor_pid"]:
        os._exit(1)


def _write_main(req: dict, work: str) -> tuple[bytes, str]:
    """Enter `work`, set the program's environment and write its source to `work`/main.py; returns (source, path)."""
    os.chdir(work)
    os.environ.clear()
    os.environ.update(req["env"], HOME=work, TMPDIR=work)
    source = _read_all(SOURCE_FD)
    os.close(SOURCE_FD)
    path = os.path.join(work, "main.py")
    with open(path, "wb") as fh:  # a real file, as for `python main.py` (before RLIMIT_FSIZE applies)
        fh.write(source)
    return source, path


def _set_limits(req: dict, extra_processes: int) -> None:
    """The request's rlimits: CPU seconds, address space, file size, open files, processes (+ `extra_processes`
    of the same uid already running), no core dumps."""
    cpu = int(req["cpu_seconds"])
    limits = [
        (resource.RLIMIT_CPU, cpu, cpu),  # SIGKILL at the limit (an init ignores SIGXCPU)
        (resource.RLIMIT_AS, req["memory_bytes"], req["memory_bytes"]),
        (resource.RLIMIT_FSIZE, req["file_size_bytes"], req["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, req["open_files"], req["open_files"]),
        (resource.RLIMIT_NPROC, req["max_processes"] + extra_processes, req["max_processes"] + extra_processes),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for which, soft, hard in limits:
        resource.setrlimit(which, (soft, hard))


def _exec_main(source: bytes, path: str, main: types.ModuleType) -> None:
    """Run `source` as `main`, then exit with the code `python main.py` exits with. Never returns."""
    code = 1
    try:
        exec(compile(source, path, "exec"), main.__dict__)
        code = 0
    except SystemExit as exc:  # the interpreter's own rules for sys.exit(arg)
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:  # noqa: BLE001 - print the traceback like `python main.py` would
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next  # drop this launcher's own frames
        traceback.print_exception(type(exc), exc, tb)
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code & 0xFF)


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _count_tasks(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) whose real uid is `uid`."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return total


# ----------------------------------------------------------------------------------------- namespaces set-up
class _CloneArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack", "stack_size", "tls", "set_tid",
        "set_tid_size", "cgroup")]


def _clone_into_namespaces() -> int:
    """fork(), but the child starts in new user, mount, network, PID, IPC and UTS namespaces, as pid 1 of its PID
    namespace (clone3 with a zero stack behaves like fork). Returns the child's pid in the parent, 0 in the child.

    Python's own fork bookkeeping runs around the raw system call (PyOS_BeforeFork / PyOS_AfterFork_*), as in
    os.fork. The child's glibc thread descriptor keeps the parent's tid; the child only mounts, forks (glibc's
    fork sets the grandchild's tid right) and waits, none of which reads it.
    Raises:
        OSError: the kernel refused (e.g. EPERM where unprivileged user namespaces are disabled).
    """
    args = _CloneArgs(flags=NAMESPACES, exit_signal=signal.SIGCHLD)
    ctypes.pythonapi.PyOS_BeforeFork()
    pid = PYLIBC.syscall(ctypes.c_long(SYS_CLONE3), ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
    if pid == 0:
        ctypes.pythonapi.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    ctypes.pythonapi.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone3 into new namespaces: {os.strerror(err)}")
    return pid


def _write_id_maps(pid: int) -> None:
    """Map ids of the new user namespace of `pid` (written from the parent namespace).

    Root caller: inner 0 -> root (the set-up process), inner 1 -> NOBODY (the program); the program switches to 1,
    so RLIMIT_NPROC applies to it. Other callers: their own uid and gid map to themselves (the only mapping an
    unprivileged process may write; setgroups must be denied first).
    """
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0:
        maps = (("uid_map", f"0 0 1\n{INNER_ID} {NOBODY} 1\n"), ("gid_map", f"0 0 1\n{INNER_ID} {NOBODY} 1\n"))
    else:
        maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n"))
    for name, text in maps:
        with open(f"/proc/{pid}/{name}", "w") as fh:
            fh.write(text)


def _isolate_files(disk_bytes: int, owner: tuple[int, int]) -> None:
    """In the new mount namespace: mount a private tmpfs of `disk_bytes` on NAMESPACED_WORK (owned by `owner`,
    inner uid and gid), then make every mount read-only and nosuid except that tmpfs. Raises OSError on refusal.
    Nothing is created on the host's disk."""
    work = NAMESPACED_WORK
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None, "make mounts private")
    _mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={disk_bytes},nr_inodes=4096,mode=0700,uid={owner[0]},gid={owner[1]}", "mount tmpfs on work dir")
    _mount_setattr("/", AT_RECURSIVE, attr_set=MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
    _mount_setattr(work, 0, attr_clr=MOUNT_ATTR_RDONLY)


def _start_namespaced(req: dict, report_w: int, fds: tuple[int, int, int]) -> int:
    """Start the program P as pid 1 of new namespaces; returns its pid. Raises OSError when the kernel refuses.

    `fds`: the program's source, stdout and stderr (memfds, so nothing touches the host's disk).
    """
    go_r, go_w = os.pipe()
    pid = _clone_into_namespaces()
    if pid == 0:
        os.close(go_w)
        _namespaced_program(req, report_w, go_r, fds)
    os.close(go_r)
    try:
        _write_id_maps(pid)
        os.write(go_w, b"g")
    except OSError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(go_w)
    return pid


def _namespaced_program(req: dict, report_fd: int, go_fd: int, fds: tuple[int, int, int]) -> None:
    """Process P under "namespaces" isolation: finish the set-up, then run the program. Never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")  # dies with the launcher
        if os.read(go_fd, 1) != b"g":  # EOF: the launcher died or could not map ids
            os._exit(1)
        _keep_only(*fds, report_fd)
        report_fd = REPORT_FD
        req["root_caller"] = root = req["launcher_uid"] == 0
        owner = (INNER_ID, INNER_ID) if root else (req["launcher_uid"], req["launcher_gid"])
        _isolate_files(req["disk_bytes"], owner)
        os.setsid()  # its process group then holds only sandboxed processes (kill(0, ...) stays inside)
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount /proc")
        except OSError:
            pass  # the host's /proc stays (read-only); its processes are still unreachable from this PID namespace
        if req.get("probe"):
            _report(report_fd, isolation="namespaces")
            os._exit(0)
    except BaseException:  # noqa: BLE001 - the program must not run half-contained
        _report(report_fd, error="sandbox: set-up failed: " + traceback.format_exc().splitlines()[-1])
        os._exit(126)
    _run_program(req, "namespaces")


def _keep_only(source_fd: int, out_fd: int, err_fd: int, report_fd: int) -> None:
    """Move the program's source, stdout and stderr, the report pipe and LAUNCHER_ALIVE to SOURCE_FD ... ALIVE_FD
    (close-on-exec) and close every other descriptor (the launcher's socket, other sandboxes' pipes)."""
    fds = (source_fd, out_fd, err_fd, report_fd, LAUNCHER_ALIVE)
    above = max(*fds, ALIVE_FD) + 1
    copies = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in fds]
    for target, fd in zip((SOURCE_FD, OUT_FD, ERR_FD, REPORT_FD, ALIVE_FD), copies):
        os.dup2(fd, target, inheritable=False)
    os.closerange(ALIVE_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


# --------------------------------------------------------------------------------------------- process isolation
def _start_process(req: dict, report_w: int, fds: tuple[int, int, int], launcher_pid: int) -> int:
    """Start process S, which runs the program with process isolation in req["work_dir"]; returns its pid."""
    pid = os.fork()
    if pid == 0:
        _supervise(req, report_w, fds, launcher_pid)
    return pid


def _supervise(req: dict, report_fd: int, fds: tuple[int, int, int], launcher_pid: int) -> None:
    """Process S (process isolation): start the program, enforce the wall timeout, kill every descendant after.
    Never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")
        if os.getppid() != launcher_pid:
            os._exit(1)
        _keep_only(*fds, report_fd)
        report_fd = REPORT_FD
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        req["root_caller"] = req["launcher_uid"] == 0
        req["supervisor_pid"] = os.getpid()
        _report(report_fd, isolation="process")
        deadline = time.monotonic() + float(req["timeout"])
        _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")  # orphans come back here, to be killed
        prog = os.fork()
        if prog == 0:
            os.setsid()
            _run_program(req, "process")
        if not _wait(prog, deadline, status_fd=report_fd):
            _report(report_fd, timed_out=True)
        _kill_descendants()
    except BaseException:  # noqa: BLE001 - report the cause; the program did not (or may not) run
        _report(report_fd, error="sandbox: " + traceback.format_exc().splitlines()[-1])
    os._exit(0)


def _wait(pid: int, deadline: float, status_fd: int | None = None) -> bool:
    """Wait for child `pid` until `deadline` (monotonic seconds); True if it exited (reaped, status reported to
    `status_fd` when given), False at the deadline."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        if _reaped(pid, pidfd, deadline, status_fd):
            exited = True
            break
        if time.monotonic() >= deadline:
            exited = False
            break
    if pidfd is not None:
        os.close(pidfd)
    return exited


def _reaped(pid: int, pidfd: int | None, deadline: float, status_fd: int | None) -> bool:
    """Wait until child `pid` may have exited (its `pidfd` readable; without one, 5 ms) or `deadline`, then reap it
    if it has; True when reaped (its status reported to `status_fd` when given)."""
    left = deadline - time.monotonic()
    if pidfd is not None:
        ready = select.select([pidfd], [], [], max(0.0, left))[0]
    else:
        time.sleep(min(0.005, max(0.0, left)))
        ready = True
    if not ready:
        return False
    done, status = os.waitpid(pid, os.WNOHANG)
    if done != pid:
        return False
    if status_fd is not None:
        _report(status_fd, status=status)
    return True


def _kill_descendants() -> None:
    """SIGKILL and reap every descendant of this (subreaper) process until none is left."""
    for _ in range(10000):
        victims = _descendants(os.getpid())
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_exited()
        time.sleep(0.001)


def _reap_exited() -> None:
    """Reap every child that has exited, without waiting for the others."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _descendants(pid: int) -> list[int]:
    """Every descendant of process `pid` (from /proc), children before their own children."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found.extend(kids)
        todo.extend(kids)
    return found


def _children(pid: int) -> list[int]:
    """The children of every thread of process `pid` (from /proc; none when it is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
        except OSError:
            continue
    return kids


def _report(fd: int, **fields) -> None:
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    except OSError:
        pass


# ------------------------------------------------------------------------------------------------ event loop
def _memfd(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC)


def probe_namespaces() -> str:
    """Try the namespace set-up once (no program); "" when it works, else the reason it does not."""
    req = {"probe": True, "disk_bytes": 1 << 20, "launcher_uid": os.geteuid(), "launcher_gid": os.getegid()}
    report_r, report_w = os.pipe()
    fds = (_memfd("main.py"), _memfd("stdout"), _memfd("stderr"))
    try:
        try:
            pid = _start_namespaced(req, report_w, fds)
        except OSError as exc:
            return str(exc)
        finally:
            for fd in (report_w, *fds):
                os.close(fd)
        os.waitpid(pid, 0)
        reply = _read_reports(report_r)
    finally:
        os.close(report_r)
    if reply.get("error"):
        return reply["error"]
    return "" if reply.get("isolation") == "namespaces" else "the probe process died"


def main(sock_fd: int, caller_pid: int | None = None) -> None:
    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller's Ctrl-C is the caller's business
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    launcher_pid = os.getpid()
    caller = -1
    if caller_pid is not None:
        try:
            caller = os.pidfd_open(caller_pid)
        except OSError:  # already gone
            return
        if os.getppid() != caller_pid:  # it died and another process took its pid before the pidfd was opened
            return
    global LAUNCHER_ALIVE
    LAUNCHER_ALIVE, alive_w = os.pipe()  # alive_w stays open, unused, for the launcher's whole life
    refused = probe_namespaces()
    gc.collect()
    gc.freeze()  # children's garbage collections then skip (and so do not copy-on-write) the launcher's objects
    sock.send(json.dumps({"namespaces": not refused, "reason": refused, "pid": launcher_pid}).encode())
    _Launcher(sock, caller, launcher_pid, not refused).serve()


class _Launcher:
    """The launcher's loop: requests queued per batch and started while fewer than the batch's limit run, replies
    sent as programs exit, programs killed at their deadline, every sandbox killed when the caller is gone.

    `caller`: a pidfd of the caller process (readable once it has ended), or -1 when not watched.
    """

    def __init__(self, sock: socket.socket, caller: int, launcher_pid: int, namespaces_ok: bool) -> None:
        self.sock, self.caller = sock, caller
        self.launcher_pid, self.namespaces_ok = launcher_pid, namespaces_ok
        self.jobs: dict[int, dict] = {}  # pidfd -> running job
        self.queues: dict[object, collections.deque] = {}  # batch -> (request, source fd) not started yet
        self.running: dict[object, int] = collections.Counter()  # batch -> jobs running
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        if caller >= 0:
            self.poller.register(caller, select.POLLIN)  # readable once the caller process has ended

    def serve(self) -> None:
        """Handle events until the caller is gone (then every sandbox is killed)."""
        while True:
            wait_ms = None
            if self.jobs:
                wait_ms = max(0, int(1000 * (min(j["deadline"] for j in self.jobs.values()) - time.monotonic())) + 1)
            for fd, _ in self.poller.poll(wait_ms):
                if not self.handle(fd):  # the caller is gone, however it ended: take every sandbox down with us
                    self.kill_all()
                    return
            self.kill_overdue()

    def handle(self, fd: int) -> bool:
        """One ready descriptor: the caller's pidfd (it has ended), the socket (a request, or the caller's EOF) or a
        job's pidfd (it has exited). False when the caller is gone."""
        if fd == self.caller:
            return False
        if fd == self.sock.fileno():
            return self.receive()
        if fd in self.jobs:
            self.finish(fd)
        return True

    def receive(self) -> bool:
        """Queue the request waiting on the socket and start what its batch allows; False at the caller's EOF."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 20, 1)
        except ConnectionResetError:
            data, fds = b"", []
        if not data:
            return False
        req = json.loads(data)
        if len(fds) != 1:
            for extra in fds:
                os.close(extra)
            self.reply({"id": req["id"], "isolation": None, "status": None, "timed_out": False,
                        "wall_seconds": 0.0, "error": "sandbox: a request must carry its source descriptor"})
            return True
        batch = req.get("batch", ("single", req["id"]))
        self.queues.setdefault(batch, collections.deque()).append((req, fds[0]))
        self.pump(batch)
        return True

    def pump(self, batch: object) -> None:
        """Start queued requests of `batch` while fewer than its limit run."""
        queue = self.queues.get(batch)
        while queue and self.running[batch] < queue[0][0]["limit"]:
            job = _start(*queue.popleft(), self.launcher_pid, self.namespaces_ok)
            if "reply" in job:
                self.reply(job["reply"])
                continue
            job["batch"] = batch
            self.running[batch] += 1
            self.jobs[job["pidfd"]] = job
            self.poller.register(job["pidfd"], select.POLLIN)
        if queue is not None and not queue:
            del self.queues[batch]

    def finish(self, pidfd: int) -> None:
        """The job of `pidfd` has exited: start its batch's next program, then send its reply."""
        job = self.jobs.pop(pidfd)
        self.poller.unregister(pidfd)
        self.running[job["batch"]] -= 1
        self.pump(job["batch"])  # the next program starts before this reply is even sent
        self.reply(_finish(job), job["outputs"])
        if not self.running[job["batch"]]:
            del self.running[job["batch"]]

    def kill_overdue(self) -> None:
        """SIGKILL each job past its deadline (namespaces: the wall timeout; process isolation: a backstop for a
        stuck S). P's death kills its PID namespace."""
        now = time.monotonic()
        for job in self.jobs.values():
            if now >= job["deadline"] and not job["killed"]:
                os.kill(job["pid"], signal.SIGKILL)
                job["killed"] = True

    def kill_all(self) -> None:
        for job in self.jobs.values():
            os.kill(job["pid"], signal.SIGKILL)

    def reply(self, message: dict, fds: Sequence[int] = ()) -> None:
        socket.send_fds(self.sock, [json.dumps(message).encode()], list(fds))
        for fd in fds:
            os.close(fd)


def _start(req: dict, source_fd: int, launcher_pid: int, namespaces_ok: bool) -> dict:
    """Start one sandbox; returns its job, or {"reply": ...} when it could not start. Closes `source_fd`."""
    req["launcher_uid"], req["launcher_gid"] = os.geteuid(), os.getegid()
    isolation = req["isolation"]
    if isolation == "auto":
        isolation = "namespaces" if namespaces_ok else "process"
    started = time.monotonic()
    report_r = report_w = -1
    outputs: tuple[int, ...] = ()
    try:
        outputs = (_memfd("stdout"), _memfd("stderr"))
        report_r, report_w = os.pipe()
        os.set_blocking(report_r, False)
        if isolation == "namespaces":
            pid = _start_namespaced(req, report_w, (source_fd, *outputs))
            deadline = started + float(req["timeout"])
        else:
            pid = _start_process(req, report_w, (source_fd, *outputs), launcher_pid)
            deadline = started + float(req["timeout"]) + GRACE_SECONDS
    except OSError as exc:
        for fd in (report_r, *outputs):
            if fd >= 0:
                os.close(fd)
        return {"reply": {"id": req["id"], "isolation": isolation, "status": None, "timed_out": False,
                          "wall_seconds": 0.0, "error": f"sandbox: cannot start ({exc})"}}
    finally:
        for fd in (report_w, source_fd):
            if fd >= 0:
                os.close(fd)
    return {"id": req["id"], "pid": pid, "pidfd": os.pidfd_open(pid), "report": report_r, "started": started,
            "deadline": deadline, "killed": False, "namespaced": isolation == "namespaces", "outputs": outputs}


def _read_reports(fd: int) -> dict:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    merged: dict = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        try:
            merged.update(json.loads(line))
        except ValueError:
            continue
    return merged


def _finish(job: dict) -> dict:
    _, status, usage = os.wait4(job["pid"], 0)
    wall = time.monotonic() - job["started"]
    os.close(job["pidfd"])
    reply = {"id": job["id"], "isolation": None, "status": None, "timed_out": False, "error": None,
             "cpu_seconds": usage.ru_utime + usage.ru_stime, "max_rss_bytes": usage.ru_maxrss * 1024}
    reply.update(_read_reports(job["report"]))
    reply["isolation"] = "namespaces" if job["namespaced"] else "process"
    os.close(job["report"])
    if job["killed"]:
        reply["timed_out"] = True
    elif job["namespaced"] and reply["error"] is None:
        reply["status"] = status  # P is the launcher's own child
    if reply["status"] is None and not reply["timed_out"] and reply["error"] is None:
        if os.WIFSIGNALED(status):  # S (process isolation) was killed before it could report the program's status
            sig = os.WTERMSIG(status)
            how = f"was killed by {signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig}"
        else:
            how = f"exited with code {os.WEXITSTATUS(status)}"
        reply["error"] = f"sandbox: the program's status was lost (its supervisor {how})"
    reply["wall_seconds"] = wall
    return reply


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
