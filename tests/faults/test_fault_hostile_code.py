"""Fault injection: hostile programs through the `code` reward, end to end (rollout in, RewardOutput out).

Each hostile program is a completion for ROW (three asserts on `add(a, b)`) that does one hostile thing instead of
solving the task. Under each isolation the kernel allows, every test checks that
- the reward scores it 0 with no error (a hostile program is a failing program, not a reward failure), with the
  failure cause a person can predict from the program (e.g. all 3 tests failed by an assertion: the harness kept
  running after the attack);
- the attack was contained: no file outside the sandbox, no connection or datagram reaching a listener the test
  holds, no process left behind, the test process, its other child and the sandbox launcher alive;
- the same reward object scores a correct program 1.0 afterwards.
Where the check looks for an escape (a listener, a process name), the same probe is first shown able to see one.

Time limits are small (wall 2 s, 1 s per test) so that the whole file stays fast; sandbox set-up costs milliseconds.
The unit tests of the sandbox itself are tests/test_sandbox.py; this file attacks the reward that uses it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from rewardlab.sandbox import runner as sandbox_module
from rewardlab.sandbox.launcher import landlock_abi
from rewardlab.rewards.code import CodeReward
from rewardlab.sandbox import Sandbox, SandboxError
from rewardlab.types import Rollout

TIMEOUT, TEST_TIMEOUT = 2.0, 1.0
ROW = {"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0",
                                               "assert add(2, 2) == 4"]}
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return None\n"  # fails all three asserts


def _namespaces_refusal() -> str:
    try:
        return Sandbox().available_isolation()[1]
    except SandboxError as exc:
        return str(exc)


LANDLOCK = landlock_abi()
NS = pytest.param("namespaces", marks=pytest.mark.skipif(
    bool(_namespaces_refusal()), reason=f"the kernel refuses unprivileged user namespaces: {_namespaces_refusal()}"))


def process(min_landlock: int = 0):
    """The "process" isolation parameter; it contains writes (Landlock ABI 1) and signals to processes of the same
    uid (ABI 6) only where the kernel has Landlock."""
    return pytest.param("process", marks=pytest.mark.skipif(
        LANDLOCK < min_landlock, reason=f"process isolation needs Landlock ABI >= {min_landlock} for this; the "
                                        f"kernel has {LANDLOCK or 'none'}"))


ISOLATIONS = [NS, process()]


def reward_for(isolation: str, **options) -> CodeReward:
    return CodeReward(**{"timeout": TIMEOUT, "test_timeout": TEST_TIMEOUT, "max_processes": 8,
                         "memory_bytes": 256 << 20, "isolation": isolation, "workers": 2, **options})


def rollout(completion: str) -> Rollout:
    return Rollout(prompt="p", prompt_ids=[1], completion=completion, completion_ids=[2], logprobs=[0.0], row=ROW)


def failed(out) -> dict[str, float]:
    """The non-zero failure counts of one output, e.g. {"assertion": 3.0}."""
    return {k.split("/", 1)[1]: v for k, v in out.components.items() if k.startswith("failed/") and v}


def launcher_pid(reward: CodeReward) -> int:
    return sandbox_module._launcher(reward.sandbox.python).proc.pid


def assert_unharmed(reward: CodeReward, launcher: int) -> None:
    """The launcher is the same live process, and the same reward object scores a correct program 1.0."""
    assert launcher_pid(reward) == launcher
    (out,) = reward([rollout(CORRECT)])
    assert (out.score, out.error) == (1.0, None)
    assert subprocess.run(["true"]).returncode == 0  # this process can still start processes


def score_hostile(reward: CodeReward, source: str):
    launcher = launcher_pid(reward)
    (out,) = reward([rollout(source)])
    assert out.error is None, out.error  # a hostile program is a failing program, not a reward failure
    assert out.score == 0.0 and out.components["total"] == 3.0
    return out, launcher


def name_self(marker: str) -> str:
    """Program lines that rename the running process (its comm, inherited by children) to `marker`."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"


def new_marker() -> str:
    return "rl" + uuid.uuid4().hex[:13]


def live_processes_with(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose name (comm) or command line contains `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            comm = Path(f"/proc/{name}/comm").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (marker in comm or marker in cmdline):
            found.append(int(name))
    return found


def wait_gone(marker: str, seconds: float = 2.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := live_processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


# ------------------------------------------------------------------------------------------------ resources
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_fork_bomb(isolation):
    marker = new_marker()
    bomb = name_self(marker) + (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    out, launcher = score_hostile(reward_for(isolation), bomb)
    # The program's own definition is cut at 1 s (a load failure for every test) or, on a starved machine, by the
    # 2 s wall limit (a timeout for every test): either way no test passes.
    assert failed(out) in ({"load": 3.0}, {"timeout": 3.0})
    assert wait_gone(marker) == []  # every forked copy is gone
    assert_unharmed(reward_for(isolation), launcher)


MEMORY_BOMBS = {
    "grows until refused": "blocks = []\nwhile True:\n    blocks.append(bytearray(32 << 20))\n",
    "one huge block": "x = bytearray(1 << 40)\n",
    "inside the function": "def add(a, b):\n    return len(bytearray(1 << 40))\n",
}


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("bomb", list(MEMORY_BOMBS))
def test_memory_bomb(isolation, bomb):
    reward = reward_for(isolation)
    out, launcher = score_hostile(reward, MEMORY_BOMBS[bomb])
    # RLIMIT_AS (256 MiB here) refuses the allocation: MemoryError, at definition time (all 3 tests fail to load)
    # or in each call.
    assert failed(out) == ({"error": 3.0} if bomb == "inside the function" else {"load": 3.0})
    assert_unharmed(reward, launcher)


LOOPS = {
    # SIGALRM (the per-test limit) ignored, so only the wall limit can stop it: every test times out.
    "CPU loop ignoring the per-test alarm": "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                            "while True:\n    pass\n",
    # Each call loops: the first test is cut at the per-test limit, the wall limit ends the process in the second.
    "CPU loop in every call": "def add(a, b):\n    while True:\n        pass\n",
    "sleep with SIGALRM blocked": "import signal, time\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
                                  "time.sleep(3600)\n",
}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("loop", list(LOOPS))
def test_programs_that_never_finish(isolation, loop, strict):
    reward = reward_for(isolation, timeout=1.0, test_timeout=0.6, strict=strict)  # no time to start: short limits
    out, launcher = score_hostile(reward, LOOPS[loop])
    # Strict mode times the program's definition from the tests' process, which the program cannot block or
    # ignore: a loop at import is cut at test_timeout (a load failure for every test). Lenient: the wall limit.
    at_import = loop != "CPU loop in every call"
    assert failed(out) == ({"load": 3.0} if strict and at_import else {"timeout": 3.0})
    assert_unharmed(reward, launcher)


# ---------------------------------------------------------------------------------------------------- files
@pytest.fixture
def shared_dir():
    """A directory outside /tmp (a namespaced sandbox has a /tmp of its own) that every uid may traverse."""
    parent = next((d for d in ("/var/tmp", "/dev/shm") if os.access(d, os.W_OK)), None)
    path = Path(tempfile.mkdtemp(prefix="rewardlab-fault-", dir=parent))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("isolation", [NS, process(min_landlock=1)])
def test_writes_outside_the_sandbox(isolation, tmp_path, shared_dir):
    token = uuid.uuid4().hex
    shared_dir.chmod(0o777)  # writable by anyone, the program's uid included: only the sandbox stops the write
    targets = [tmp_path / f"escape-{token}", Path.home() / f".rewardlab-escape-{token}",
               Path(f"/tmp/rewardlab-escape-{token}"), Path(f"/var/tmp/rewardlab-escape-{token}"),
               Path(f"/dev/shm/rewardlab-escape-{token}"), shared_dir / "escape"]
    source = (
        f"import os\nfor path in {[str(t) for t in targets]!r}:\n"
        "    for attempt in (lambda: open(path, 'w').write('x'), lambda: os.mkdir(path),\n"
        "                    lambda: os.symlink('/', path)):\n"
        "        try:\n            attempt()\n        except OSError:\n            pass\n"
    ) + WRONG
    try:
        out, launcher = score_hostile(reward_for(isolation), source)
        assert failed(out) == {"assertion": 3.0}  # the harness ran every test after the attempts
        assert [t for t in targets if t.exists() or t.is_symlink()] == []
        assert list(tmp_path.iterdir()) == [] and list(shared_dir.iterdir()) == []
        assert_unharmed(reward_for(isolation), launcher)
    finally:
        for target in targets:
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                target.rmdir()


# -------------------------------------------------------------------------------------------------- network
@pytest.fixture
def listeners(shared_dir):
    """A TCP listener and a UDP socket (a stand-in DNS server) on 127.0.0.1, and a Unix socket any uid may connect
    to, all owned by the test. Yields (a program that tries all three, then a name lookup, then defines a wrong add;
    the same without the lookup, which can be slow uncontained; a function that says which listeners received)."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = str(shared_dir / "listener.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    unix.listen(8)
    for s in (tcp, udp, unix):
        s.setblocking(False)
    # A DNS query (id 0x1234, one question: rewardlab.example A IN), then a name lookup through the system resolver.
    query = bytes.fromhex("123401000001000000000000") + b"\x09rewardlab\x07example\x00\x00\x01\x00\x01"
    source = (
        "import socket\n"
        f"def tcp():\n    socket.create_connection(('127.0.0.1', {tcp.getsockname()[1]}), timeout=1).sendall(b'hi')\n"
        f"def dns():\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto({query!r}, "
        f"('127.0.0.1', {udp.getsockname()[1]}))\n"
        f"def unix():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({unix_path!r})\n    s.sendall(b'hi')\n"
        "def resolve():\n    socket.getaddrinfo('rewardlab.example', 80)\n"
        "for attempt in ATTEMPTS:\n    try:\n        attempt()\n    except OSError:\n        pass\n"
    ) + WRONG

    def received() -> list[str]:
        got = []
        for name, sock, take in (("tcp", tcp, tcp.accept), ("unix", unix, unix.accept), ("udp", udp, udp.recv)):
            try:
                result = take(*(() if sock is not udp else (512,)))
            except BlockingIOError:
                continue
            got.append(name)
            if sock is not udp:
                result[0].close()
        return got

    yield (source.replace("ATTEMPTS", "(tcp, dns, unix, resolve)"), source.replace("ATTEMPTS", "(tcp, dns, unix)"),
           received)
    for s in (tcp, udp, unix):
        s.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_network(isolation, listeners):
    source, without_lookup, received = listeners
    # The probe sees an escape: the same program, uncontained, reaches all three listeners.
    subprocess.run([sys.executable, "-c", without_lookup], check=True, timeout=30)
    time.sleep(0.05)
    assert sorted(received()) == ["tcp", "udp", "unix"]
    out, launcher = score_hostile(reward_for(isolation), source)
    assert failed(out) == {"assertion": 3.0}
    time.sleep(0.05)
    assert received() == []  # no connection, no datagram: not over TCP, UDP (DNS) or a Unix socket of the host
    assert_unharmed(reward_for(isolation), launcher)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_io_uring_is_refused(isolation):
    """io_uring can open and connect sockets without socket(2). The program defines a correct add only if it gets
    an io_uring, so it would score 1.0 where that route is open."""
    source = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = ctypes.create_string_buffer(120)\n"
        "if libc.syscall(425, 4, params) >= 0:  # io_uring_setup(4 entries, params)\n"
        "    def add(a, b):\n        return a + b\n"
    )
    out, launcher = score_hostile(reward_for(isolation), source)
    assert failed(out) == {"error": 3.0}  # NameError: add was never defined
    assert_unharmed(reward_for(isolation), launcher)


# ------------------------------------------------------------------------------------------- killing others
def killers(targets: list[int]) -> dict[str, str]:
    """Programs that keep trying to kill processes outside their sandbox for ~0.6 s, then define a wrong add.
    `targets`: pids of the test process, its other child and the launcher (the last attack names them)."""
    loop = "import os, signal, subprocess, time\nfor _ in range({n}):\n    try:\n        {attack}\n" \
           "    except OSError:\n        pass\n    time.sleep({pause})\n"
    attacks = {
        "kill(getppid(), SIGKILL)": ("os.kill(os.getppid(), signal.SIGKILL)", 60, 0.01),
        "killpg(the parent's group)": ("os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)", 60, 0.01),
        "kill(-1, SIGKILL)": ("os.kill(-1, signal.SIGKILL)", 60, 0.01),
        "kill -9 -1 (shell)": ("subprocess.run(['sh', '-c', 'kill -9 -1'])", 6, 0.1),
    }
    out = {name: loop.format(n=n, attack=attack, pause=pause) + WRONG for name, (attack, n, pause) in attacks.items()}
    out["SIGKILL to every pid in /proc and to the test's"] = (
        "import os, signal, time\n"
        "def _try(pid):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        f"for _ in range(6):\n    for pid in {targets!r} + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "        if pid != os.getpid():\n            _try(pid)\n    time.sleep(0.1)\n"
    ) + WRONG
    return out


KILLERS = list(killers([]))
#: Runs beside each killer, in the same batch: it must not be hit. It sleeps first, so it is alive during the attack.
BYSTANDER = "import time\ntime.sleep(0.3)\n" + CORRECT


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("isolation", [NS, process(min_landlock=6)])
@pytest.mark.parametrize("attack", KILLERS)
def test_killing_the_parent_and_others(isolation, attack, strict):
    reward = reward_for(isolation, strict=strict)
    launcher = launcher_pid(reward)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        source = killers([os.getpid(), sleeper.pid, launcher])[attack]
        killer, bystander = reward([rollout(source), rollout(BYSTANDER)])
        assert (killer.score, killer.error) == (0.0, None)
        if strict:
            # The program's parent is the tests' process: the attacks that reach it end the run (a crash or a
            # load failure for every test), the others leave the program to define its wrong add. No test passes.
            assert sum(failed(killer).values()) == 3.0
        elif attack == "kill -9 -1 (shell)" and isolation == "process":
            # The shell's kill(-1) reaches every process the shell may signal, which is its own sandbox, the program
            # included: it killed the program before any test reported.
            assert failed(killer) == {"crash": 3.0}
        else:  # the program survived its own attack (under namespaces it is its PID namespace's init) and ran the tests
            assert failed(killer) == {"assertion": 3.0}
        assert (bystander.score, bystander.error) == (1.0, None)  # the other sandbox of the batch was not hit
        assert sleeper.poll() is None  # this process's other child is alive, and so is this process
        assert_unharmed(reward, launcher)
    finally:
        sleeper.kill()
        sleeper.wait()


# ----------------------------------------------------------------------------------------------- leftovers
def orphans(marker: str) -> dict[str, str]:
    """Programs that start a process meant to outlive them, then define a wrong add and let the tests run."""
    return {
        "double fork + setsid, signals ignored": name_self(marker) + (
            "import os, signal, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
            "            signal.signal(sig, signal.SIG_IGN)\n        while True:\n            time.sleep(1)\n"
            "    os._exit(0)\n"
            "time.sleep(0.4)\n"
        ) + WRONG,
        "detached shell in its own session": (
            "import subprocess, time\n"
            f"subprocess.Popen(['sh', '-c', \"trap '' HUP TERM INT; while :; do sleep 1; done; : {marker}\"], "
            "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "time.sleep(0.4)\n"
        ) + WRONG,
    }


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("kind", list(orphans("")))
def test_background_processes_do_not_outlive_the_program(isolation, kind):
    marker = new_marker()
    seen: list[int] = []
    stop = threading.Event()

    def watch():  # the probe sees the orphan while the program runs
        while not stop.is_set() and not seen:
            seen.extend(live_processes_with(marker))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out, launcher = score_hostile(reward_for(isolation), orphans(marker)[kind])
    finally:
        stop.set()
        watcher.join()
    assert failed(out) == {"assertion": 3.0}
    assert seen  # it did start
    assert wait_gone(marker) == []  # and is gone once the program ended
    assert_unharmed(reward_for(isolation), launcher)


# --------------------------------------------------------------------------------------------------- honesty
EARLY_EXITS = {
    # (program, failures): an exit before or during the tests never counts as a pass.
    "sys.exit(0) before the tests": ("import sys\nsys.exit(0)\n" + CORRECT, {"load": 3.0}),
    "exit(0) before the tests": ("exit(0)\n" + CORRECT, {"load": 3.0}),
    "os._exit(0) before the tests": ("import os\nos._exit(0)\n" + CORRECT, {"crash": 3.0}),
    "sys.exit(0) in the function": ("import sys\ndef add(a, b):\n    sys.exit(0)\n", {"error": 3.0}),
    "os._exit(0) in the function": ("import os\ndef add(a, b):\n    os._exit(0)\n", {"crash": 3.0}),
}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", list(EARLY_EXITS))
def test_early_exit_does_not_pass(isolation, case, strict):
    source, failures = EARLY_EXITS[case]
    reward = reward_for(isolation, strict=strict)
    out, launcher = score_hostile(reward, source)
    # The failures listed are the lenient harness's (the program and the tests in one process). Strict mode runs
    # the tests in another process, where nothing the program writes or exits can reach them: every test fails.
    assert failed(out) == failures if not strict else sum(failed(out).values()) == 3.0
    assert_unharmed(reward, launcher)


_FORGE = '''
import os, re, sys
def forge(tags):
    """Write, for every tag, pass lines in the harness's format (tag first) for tests 0-2, and keyed-hash lines."""
    lines = []
    for tag in tags:
        for i in range(3):
            payload = "test %d pass" % i
            lines.append(tag + " " + payload)
            if re.fullmatch("[0-9a-f]{16,}", tag) and len(tag) % 2 == 0:
                import hashlib
                mac = hashlib.blake2b(payload.encode(), key=bytes.fromhex(tag)[:64], digest_size=16).hexdigest()
                lines.append(mac + " " + payload)
    os.write(1, ("\\n".join(lines) + "\\n").encode())
'''
EXIT = "os._exit(0)\n"  # leave before the harness reports anything: only the forged lines are on stdout
FAKES = {
    # (program, failures). A program that forges lines and exits: every test unreported, a crash.
    "plain success words": ("import os, sys\nfor text in ('OK', 'passed', '3 passed', 'PASS', 'test 0 pass', 'ok'):\n"
                            "    print(text)\n    sys.__stdout__.write(text + '\\n')\n    sys.__stdout__.flush()\n"
                            "    os.write(1, (text + '\\n').encode())\n    os.write(2, (text + '\\n').encode())\n"
                            + EXIT, {"crash": 3.0}),
    "pass lines with guessed tags": (_FORGE + "forge(['0' * 24, 'x' * 24, '', '0' * 64])\n" + EXIT, {"crash": 3.0}),
    "the secret read from main.py": (_FORGE + (
        "try:\n    forge(re.findall(r\"'(?:nonce|key)': '([0-9a-f]+)'\", open(os.path.join(os.getcwd(), 'main.py'))"
        ".read()))\nexcept OSError:\n    pass\n") + EXIT, {"crash": 3.0}),
    "the secret read from __main__": (_FORGE + (
        "import __main__\nrl = getattr(__main__, '_RL', {})\n"
        "forge([str(rl.get('nonce', '')), str(rl.get('key', ''))])\n"
    ) + EXIT, {"crash": 3.0}),
    # In every call: read what the harness wrote so far, rewrite it with every failure turned into a pass, and add
    # a pass line for every test under each tag seen (the last line for a test wins, so the rewrite matters). The
    # rewritten lines of tests 0 and 1 no longer authenticate, so those tests count as unreported (a crash); test
    # 2's honest line comes after the last call.
    "copying the harness's own lines": (_FORGE + (
        "def add(a, b):\n"
        "    text = os.pread(1, 1 << 16, 0).decode()\n"
        "    tags = sorted({line.split(' ', 1)[0] for line in text.splitlines() if ' ' in line})\n"
        "    rewritten = re.sub(r'test (\\d+) fail .*', r'test \\1 pass', text)\n"
        "    os.ftruncate(1, 0)\n    os.lseek(1, 0, os.SEEK_SET)\n    os.write(1, rewritten.encode())\n"
        "    forge(tags)\n    return None\n"), {"crash": 2.0, "assertion": 1.0}),
    # With exec a no-op every test "passes" without running; with map/str patched a failure line reads as a pass.
    # The harness bound its own: the tests run, and every assert fails.
    "builtins.exec and compile patched": (WRONG + "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
                                                  "builtins.compile = lambda *a, **k: None\n", {"assertion": 3.0}),
    "builtins.map and str patched": (WRONG + (
        "import builtins\n_map, _str = builtins.map, builtins.str\n"
        "builtins.map = lambda f, items: _map(f, [x for x in items if x not in ('fail', 'assertion')][:2] + "
        "['pass'] if 'fail' in list(items) else items)\n"
        "class _Str(_str):\n    def __new__(cls, x=''):\n        x = _str(x)\n"
        "        return _str.__new__(cls, 'pass' if x == 'fail' else x)\nbuiltins.str = _Str\n"), {"assertion": 3.0}),
}


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("fake", list(FAKES))
def test_faked_pass_lines_do_not_pass(isolation, fake, strict):
    source, failures = FAKES[fake]
    reward = reward_for(isolation, strict=strict)
    out, launcher = score_hostile(reward, source)
    # The failures listed are the lenient harness's (the program and the tests in one process). Strict mode runs
    # the tests in another process, where nothing the program writes or exits can reach them: every test fails.
    assert failed(out) == failures if not strict else sum(failed(out).values()) == 3.0
    assert_unharmed(reward, launcher)
