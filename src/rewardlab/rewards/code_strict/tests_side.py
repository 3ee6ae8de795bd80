"""The tests' side of the strict harness: runs as the sandbox's main program (after codec.py's text and the `_RL`
literal: program, runner, trusted, prelude, tests, entry, key, timeout) and writes the results, one authenticated
line per test, to fd 1 (the same lines as the lenient harness: rewardlab.rewards.code._parse reads both).

The program under test never runs here. This process makes itself non-dumpable (so no other process of its uid can
read its memory, open its descriptors or ptrace it), drops the working directory from its import path, and starts
the candidate's side (candidate_side.py) as a fresh interpreter - exec, not fork, so the child holds no copy of the
tests or the key - with /dev/null as its standard streams and two pipes as its only other descriptors. Each test runs
here, in a namespace built from the task's own code: the test prelude, the prompt's complete definitions (`trusted`:
helpers such as HumanEval's poly), the trusted builtins, and, for every other name the program defines, a proxy that
forwards calls and attribute reads to the candidate's process. Arguments and results cross as plain values
(codec.py) and are rebuilt here as fresh built-in objects, so what a test compares, hashes or tests for truth is
never an object the candidate wrote. A non-plain result arrives as a handle: it can be called and its attributes
read (an instance of a class under test, a module), but comparing, hashing, truth-testing or iterating it raises
StrictModeError, which fails the test.

A test whose call runs past the time limit, or whose candidate process died or broke the protocol, fails; the
candidate is then restarted (the program loaded afresh) for the next test.
"""

import builtins as _rl_builtins
import marshal as _rl_marshal
import os as _rl_os
import signal as _rl_signal
import sys as _rl_sys
from _blake2 import blake2b as _rl_blake2b


class _RLTimeout(BaseException):
    pass


class StrictModeError(TypeError):
    """A non-plain value the candidate returned was compared, hashed, truth-tested or iterated, or a test passed a
    non-plain argument."""


class CandidateError(Exception):
    """The candidate raised an exception that is not one of Python's built-in ones (or a BaseException such as
    SystemExit); its type name and message."""


class _RLCrash(Exception):
    pass


class _RLSink:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def _rl_alarm(signum, frame):
    raise _RLTimeout()


def _rl_high(fd):
    """`fd` moved to a number above the child's 0-4, close-on-exec."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16)
    _rl_os.close(fd)
    return high


def _rl_pass_read_search(ctypes):
    """A root caller's program runs as an unprivileged uid that keeps CAP_DAC_READ_SEARCH, so that an interpreter
    under /root stays readable; execve would drop it, so raise it as an ambient capability for the candidate's
    interpreter (the same capability the program has under the lenient harness). No-op without it."""
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc, bit = ctypes.CDLL(None, use_errno=True), 1 << 2  # CAP_DAC_READ_SEARCH = 2
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0 or not data[0].permitted & bit:
        return
    data[0].inheritable |= bit
    if libc.capset(ctypes.byref(header), data) == 0:
        libc.prctl(47, 2, 2, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH


# The candidate interpreter's first code: read the runner (b"m" + marshalled code or b"s" + source) from fd 3, run it.
_RL_BOOT = (
    "import marshal, os\n"
    "def _rl_read(n):\n"
    "    data = b''\n"
    "    while len(data) < n:\n"
    "        chunk = os.read(3, n - len(data))\n"
    "        if not chunk:\n"
    "            raise SystemExit(1)\n"
    "        data += chunk\n"
    "    return data\n"
    "_rl_runner = _rl_read(int.from_bytes(_rl_read(4), 'big'))\n"
    "del _rl_read\n"
    "exec(marshal.loads(_rl_runner[1:]) if _rl_runner[:1] == b'm' else _rl_runner[1:].decode('utf-8'))\n"
)


class _RLCandidate:
    """The candidate's process: started with `start`, addressed through `request`."""

    def __init__(self, rl, work):
        self.runner, self.program, self.work = rl["runner"], rl["program"], work
        self.pid, self.generation, self.seq, self.busy, self.names = None, 0, 0, False, []

    def start(self, load_seconds):
        """Start the candidate's interpreter and load the program. Returns None, or (kind, why) when the program
        did not load."""
        self.kill()
        r_in, w_in = (_rl_high(fd) for fd in _rl_os.pipe())
        r_out, w_out = (_rl_high(fd) for fd in _rl_os.pipe())
        actions = [
            (_rl_os.POSIX_SPAWN_OPEN, 0, _rl_os.devnull, _rl_os.O_RDONLY, 0),
            (_rl_os.POSIX_SPAWN_OPEN, 1, _rl_os.devnull, _rl_os.O_WRONLY, 0),
            (_rl_os.POSIX_SPAWN_DUP2, 1, 2),
            (_rl_os.POSIX_SPAWN_DUP2, r_in, 3),
            (_rl_os.POSIX_SPAWN_DUP2, w_out, 4),
        ]
        argv = [_rl_sys.executable, "-I", "-S", "-B", "-c", _RL_BOOT]
        try:
            self.pid = _rl_os.posix_spawn(_rl_sys.executable, argv, dict(_rl_os.environ), file_actions=actions,
                                          setpgroup=0)
        finally:
            _rl_os.close(r_in)
            _rl_os.close(w_out)
        self.out, self.inp = w_in, r_out
        self.generation += 1
        self.busy = True
        try:
            _rl_signal.setitimer(_rl_signal.ITIMER_REAL, 30.0)  # the interpreter's start, not charged to the test
            send(self.out, self.runner)
            if loads(recv(self.inp)) != ["ready"]:
                raise ValueError("no ready message")
            _rl_signal.setitimer(_rl_signal.ITIMER_REAL, load_seconds)
            send(self.out, _rl_marshal.dumps(["load", self.program, self.work, list(_rl_sys.path)]))
            reply = loads(recv(self.inp))
        except _RLTimeout:
            self.kill()
            return ("timeout", "the program ran past %g s while it was defined" % load_seconds)
        except (EOFError, OSError):
            return ("crash", "the program's process ended while it was defined (%s)" % self.kill())
        except ValueError as exc:
            self.kill()
            return ("error", "the program's process broke the protocol: %s" % exc)
        finally:
            _rl_signal.setitimer(_rl_signal.ITIMER_REAL, 0)
        self.busy = False
        if type(reply) is list and len(reply) == 2 and reply[0] == "loaded" and type(reply[1]) is list:
            self.names = [n for n in reply[1] if type(n) is str and n.isidentifier()]
            return None
        self.kill()
        if type(reply) is list and len(reply) == 3 and reply[0] == "load_failed":
            return ("error", " ".join(str(reply[2]).split())[:200])
        return ("error", "the program's process broke the protocol")

    def kill(self):
        """Kill the candidate's process group and reap it; returns how it ended (one line)."""
        if self.pid is None:
            return "not running"
        how = "killed"
        try:
            _rl_os.killpg(self.pid, _rl_signal.SIGKILL)
        except OSError:
            pass
        try:
            _, status = _rl_os.waitpid(self.pid, 0)
            if _rl_os.WIFEXITED(status):
                how = "exit status %d" % _rl_os.WEXITSTATUS(status)
            elif _rl_os.WIFSIGNALED(status):
                how = "signal %d" % _rl_os.WTERMSIG(status)
        except OSError:
            pass
        for fd in (self.out, self.inp):
            try:
                _rl_os.close(fd)
            except OSError:
                pass
        self.pid, self.busy = None, False
        return how

    def request(self, message):
        """Send one request and return the candidate's reply value. Raises _RLCrash when its process is gone,
        StrictModeError when it broke the protocol, or the exception it reported."""
        if self.pid is None:
            raise _RLCrash("the program's process is not running (it ended in an earlier test)")
        self.seq += 1
        message[1] = self.seq
        self.busy = True
        try:
            send(self.out, _rl_marshal.dumps(message))
            reply = loads(recv(self.inp))
        except (EOFError, OSError):
            raise _RLCrash("the program's process ended (%s)" % self.kill()) from None
        except ValueError as exc:
            self.kill()
            raise StrictModeError("the program's process broke the protocol: %s" % exc) from None
        self.busy = False
        if type(reply) is not list or len(reply) != 4 or reply[1] != self.seq or reply[0] not in ("ok", "raise"):
            self.kill()
            raise StrictModeError("the program's process broke the protocol")
        if reply[0] == "raise":
            kind, text = str(reply[2]), str(reply[3])
            cls = getattr(_rl_builtins, kind, None)
            if type(cls) is type and issubclass(cls, Exception) and kind.isidentifier():
                try:
                    exc = cls(text)
                except Exception:
                    exc = CandidateError(kind + ": " + text)
            else:
                exc = CandidateError(kind + ": " + text)
            raise exc
        generation = self.generation

        def resolve(tag, fields):
            if tag == "handle" and len(fields) == 2 and type(fields[0]) is int:
                return _RLRemote(self, ["ref", fields[0]], generation, str(fields[1])[:100])
            raise ValueError("malformed value")

        try:
            return decode(reply[2], resolve), [(i, decode(v, resolve)) for i, v in reply[3]]
        except (ValueError, TypeError) as exc:
            raise StrictModeError("the program's process answered a malformed value: %s" % exc) from None

    def encode_argument(self, value):
        def handle(obj):
            if type(obj) is _RLRemote:
                return obj._rl_wire()
            raise StrictModeError("a test passed a non-plain argument of type %s" % type(obj).__name__)

        try:
            return encode(value, handle)
        except ValueError as exc:
            raise StrictModeError("a test passed an argument that is not a plain value: %s" % exc) from None


_MUTABLE = (list, dict, set, bytearray)


class _RLRemote:
    """A name the program defines, or a non-plain value it returned, in the candidate's process."""

    __slots__ = ("_rl_candidate", "_rl_target", "_rl_generation", "_rl_type")

    def __init__(self, candidate, target, generation, type_name):
        object.__setattr__(self, "_rl_candidate", candidate)
        object.__setattr__(self, "_rl_target", target)
        object.__setattr__(self, "_rl_generation", generation)
        object.__setattr__(self, "_rl_type", type_name)

    def _rl_wire(self):
        if self._rl_target[0] == "ref" and self._rl_generation != self._rl_candidate.generation:
            raise StrictModeError("a value from an earlier run of the program (it was restarted) was used")
        return list(self._rl_target)

    def __call__(self, *args, **kwargs):
        candidate = self._rl_candidate
        wire_args = candidate.encode_argument(list(args))
        wire_kwargs = candidate.encode_argument(dict(kwargs))
        value, mutated = candidate.request(["call", 0, self._rl_wire(), wire_args, wire_kwargs])
        for position, new in mutated:
            if type(position) is int and 0 <= position < len(args):
                old = args[position]
                if type(old) is type(new) and type(old) in _MUTABLE:
                    if type(old) is list or type(old) is bytearray:
                        old[:] = new
                    else:
                        old.clear()
                        old.update(new)
        return value

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value, _ = self._rl_candidate.request(["getattr", 0, self._rl_wire(), name])
        return value

    def __setattr__(self, name, value):
        raise StrictModeError("setting an attribute of the program's objects is not supported in strict mode")

    def _rl_refuse(self, *args):
        raise StrictModeError("%r is not a plain value: it cannot be compared, hashed, tested for truth or iterated"
                              % self)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __len__ = __iter__ = _rl_refuse
    __contains__ = __getitem__ = __index__ = __int__ = __float__ = __str__ = __format__ = _rl_refuse

    def __repr__(self):
        if self._rl_target[0] == "global":
            return "<the program's %s>" % self._rl_target[1]
        return "<a non-plain %s from the program>" % self._rl_type


def _rl_main(rl):
    # The program under test never runs in this process, so the builtins need no binding against it.
    write, setitimer, real, mac = _rl_os.write, _rl_signal.setitimer, _rl_signal.ITIMER_REAL, _rl_blake2b
    Timeout = _RLTimeout
    key = bytes.fromhex(rl.pop("key"))
    timeout = rl["timeout"]

    def emit(*fields):
        payload = " ".join([str(f) for f in fields]).encode("utf-8", "replace")
        write(1, mac(payload, key=key, digest_size=16).hexdigest().encode() + b" " + payload + b"\n")

    def why(exc):
        try:
            text = type(exc).__name__ + ": " + str(exc)
        except BaseException:
            text = type(exc).__name__
        return " ".join(text.split())[:200]

    def run(source, name, namespace):
        setitimer(real, timeout)
        try:
            exec(compile(source, name, "exec"), namespace)
            return None
        except Timeout:
            if candidate.busy:
                candidate.kill()
            return ("timeout", "ran past %g s" % timeout)
        except _RLCrash as exc:
            return ("crash", why(exc))
        except AssertionError as exc:
            return ("assertion", why(exc))
        except BaseException as exc:
            return ("error", why(exc))
        finally:
            setitimer(real, 0)

    try:
        _rl_os.unlink(__file__)
    except (NameError, OSError):
        pass
    work = _rl_os.getcwd()
    _rl_sys.path[:] = [p for p in _rl_sys.path if p not in ("", ".", work)]
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        emit("load", "error", "strict mode could not make the tests' process non-dumpable")
        return
    _rl_pass_read_search(ctypes)
    try:
        soft = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[0]
    except (ImportError, OSError):
        soft = 1024
    for fd in range(3, min(soft, 4096)):
        try:
            _rl_os.set_inheritable(fd, False)
        except OSError:
            pass
    _rl_signal.signal(_rl_signal.SIGALRM, _rl_alarm)
    _rl_sys.stdout = _rl_sys.stderr = _RLSink()
    candidate = _RLCandidate(rl, work)
    failed = candidate.start(timeout)
    namespace = {"__name__": "__main__", "__builtins__": _rl_builtins}
    if failed is None and rl["trusted"]:
        run(rl["trusted"], "task.py", namespace)  # the task's own helpers; a failure leaves the names unbound
    if failed is None:
        failed = run(rl["prelude"], "tests.py", namespace)
    if failed is None:
        for name in candidate.names:
            if name not in namespace and not hasattr(_rl_builtins, name):
                namespace[name] = _RLRemote(candidate, ["global", name], 0, "")
        if rl["entry"] is not None:
            if rl["entry"] in candidate.names:
                namespace["candidate"] = namespace[rl["entry"]] = _RLRemote(candidate, ["global", rl["entry"]], 0,
                                                                            "")
            else:
                failed = ("error", "the program defines no %r" % rl["entry"])
    if failed is not None:
        candidate.kill()
        emit("load", failed[0], failed[1])
        return
    for index, is_test, source in rl["tests"]:
        if candidate.pid is None:
            restart = candidate.start(timeout)
            if restart is not None:
                outcome = ("crash", "the program did not load again after its process ended: " + restart[1])
                if is_test:
                    emit("test", index, "fail", *outcome)
                continue
        outcome = run(source, "test_%d.py" % index, namespace)
        if is_test:
            emit("test", index, "pass") if outcome is None else emit("test", index, "fail", *outcome)
    candidate.kill()
    emit("done")


_rl_main(globals().pop("_RL"))
