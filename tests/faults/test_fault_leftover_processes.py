"""Nothing a run starts outlives it: after SIGKILL or SIGTERM of the process, none of the processes it started is
alive a few seconds later (a SIGTERM's grace period later for `train`), for each pool:

- the reward executor (pebble workers), with a worker busy on a math item that never finishes by itself (the
  reference 10^{10^{10}}, which math-verify tries to evaluate), through `rewardlab train`, `evaluate`, `search` and
  `prm label`;
- the sandbox launcher, started by the code reward before the math pool forked its workers (which then held a copy
  of the launcher's socket), and a launcher whose socket another process holds;
- `ToolEnv`'s pebble workers, with a tool in an endless loop, in a Python driver (custom tools are the Python API's).

The command runs under a child subreaper (`leftovers.Tree`), so its orphans stay countable. A SIGTERM to `train`
is a first Ctrl-C with a grace period: it finishes the step and checkpoints it (exit 143) when the step can finish,
and exits at the end of the grace period when it cannot (the hung item).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import textwrap
import time

import pytest

from cli_kill import child_env, cli, count_lines
from conftest import TINY_OVERRIDES, write_jsonl
from leftovers import Tree, launchers_of, workers_of
from rewardlab.runs import verify_checkpoint

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: subreaper, /proc, pdeathsig")

#: Seconds after a SIGKILL (or the end of a SIGTERM's grace) by which every process of the tree must be gone.
GONE_S = 5.0
#: The SIGTERM grace period the tests give `train` (REWARDLAB_SIGTERM_GRACE_S).
GRACE_S = 2.0
#: A math reference that math-verify does not finish comparing with (it evaluates the power).
HANG = "10^{10^{10}}"


def _hang_rows(tmp_path):
    return write_jsonl(tmp_path / "hang.jsonl",
                       [{"prompt": f"{i}+1=", "answer": HANG, "tests": ["assert 1 == 1"]} for i in range(30)])


def _env(**extra):
    return {**child_env(), "REWARDLAB_SIGTERM_GRACE_S": str(GRACE_S), **extra}


def _kill_and_count(tree, signum, within):
    os.kill(tree.root, signum)
    left = tree.left_after(within)
    assert not left, f"alive {within:g} s after {signum.name}: {left}\n{tree.tail()}"


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_train_killed_while_a_math_item_hangs_leaves_no_process(tmp_path, signum):
    task = _hang_rows(tmp_path)
    args = ["train", "--model", "tiny", "--task", f"jsonl:{task}", "--out", str(tmp_path / "run"), *TINY_OVERRIDES,
            "rewards=[{name: code, timeout: 5}, {name: math, timeout: 120}]", "rl.steps=3", "rl.prompts_per_step=2",
            "rl.group_size=2", "rl.sampling.max_new_tokens=32", "threads=1"]
    tree = Tree(cli(args), tmp_path / "stderr.txt", _env())
    try:
        # The code reward started the launcher; then the math pool forked its worker, which is now stuck.
        tree.wait_for("sandbox launcher", lambda: launchers_of(tree), timeout=120)
        tree.wait_for("math worker busy for 1 s", lambda: workers_of(tree, min_cpu_s=1.0), timeout=120)
        _kill_and_count(tree, signum, GONE_S + (GRACE_S if signum == signal.SIGTERM else 0.0))
        status = tree.status()
        if signum == signal.SIGKILL:
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        else:  # the step could not finish: abandoned at the end of the grace period
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, tree.tail()
            err = tree.tail()
            assert "rewardlab: SIGTERM: finishing the current step" in err
            assert f"rewardlab: SIGTERM: the {GRACE_S:g} s grace period is over; stopping now" in err
    finally:
        tree.kill_all()


def test_train_sigterm_finishes_the_step_checkpoints_exits_143_and_leaves_no_process(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "tests": ["assert 1 == 1"]}
            for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--task", f"jsonl:{task}", "--out", str(out), *TINY_OVERRIDES,
            "rewards=[{name: code, timeout: 5}, {name: math, timeout: 20}]", "rl.steps=50", "rl.prompts_per_step=2",
            "rl.group_size=2", "rl.sampling.max_new_tokens=8", "threads=1", "save_every=100"]
    tree = Tree(cli(args, pause=0.15), tmp_path / "stderr.txt", _env(REWARDLAB_SIGTERM_GRACE_S="60"))
    try:
        tree.wait_for("metrics line 2", lambda: count_lines(out / "metrics.jsonl") >= 2, timeout=120)
        assert launchers_of(tree) and workers_of(tree, min_cpu_s=0.0), tree.alive()  # both pools are up
        _kill_and_count(tree, signal.SIGTERM, 60.0)  # the step finishes and is checkpointed, then the process ends
        status = tree.status()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 143, tree.tail()
    finally:
        tree.kill_all()
    k = count_lines(out / "metrics.jsonl")
    assert 2 <= k < 50
    command = shlex.join(["rewardlab", *args, "--no-progress", "--resume"])
    err = tree.tail().splitlines()
    assert err[-1] == (f"rewardlab: stopped by SIGTERM at step {k}; checkpoint step-{k} written; "
                       f"continue with: {command}")
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step-{k}"]
    assert verify_checkpoint(out / "checkpoints" / f"step-{k}") is None
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True


#: Verbs other than train, each scoring with the math reward (default timeout 5 s: a hung item's worker is replaced
#: and the next item hangs in turn). They have no grace period: SIGTERM ends them at once, as SIGKILL does.
VERBS = {
    "evaluate": ["evaluate", "eval.batch_size=2", "eval.n=2", "eval.k=[1, 2]", "eval.max_new_tokens=32",
                 "eval.temperature=1.5"],
    "search": ["search", "--scorer", "math", "search.n=[1, 2]", "search.methods=[best_of_n]",
               "search.max_new_tokens=32"],
    "prm label": ["prm", "label", "label.method=mc", "label.limit=4", "label.question_batch=2",
                  "label.solutions_per_question=2", "label.max_new_tokens=32", "label.k=2"],
}


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("verb", list(VERBS))
def test_verb_killed_while_a_math_item_hangs_leaves_no_process(tmp_path, verb, signum):
    task = _hang_rows(tmp_path)
    args = [*VERBS[verb], "--model", "tiny", "--task", f"jsonl:{task}", "--out", str(tmp_path / "run"),
            *TINY_OVERRIDES, "task.options={reward: math}", "threads=1"]
    tree = Tree(cli(args), tmp_path / "stderr.txt", _env())
    try:
        tree.wait_for("math worker busy for 1 s", lambda: workers_of(tree, min_cpu_s=1.0), timeout=120)
        _kill_and_count(tree, signum, GONE_S)
    finally:
        tree.kill_all()


TOOL = textwrap.dedent('''
    def spin(n: int) -> str:
        """Loop for ever.

        Args:
            n: ignored
        """
        while True:
            n += 1
''')

DRIVER = textwrap.dedent('''
    import sys
    sys.path.insert(0, sys.argv[1])
    from busy_tool import spin
    from rewardlab.envs import ToolEnv

    env = ToolEnv([spin], timeout_s=600, workers=2)
    state = env.reset({"prompt": "q"})
    env.step(state, '<tool_call>{"name": "spin", "arguments": {"n": 1}}</tool_call>')
''')


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_tool_env_driver_killed_mid_call_leaves_no_worker(tmp_path, signum):
    (tmp_path / "busy_tool.py").write_text(TOOL)
    tree = Tree([sys.executable, "-c", DRIVER, str(tmp_path)], tmp_path / "stderr.txt", child_env())
    try:
        tree.wait_for("tool worker busy for 1 s", lambda: workers_of(tree, min_cpu_s=1.0), timeout=120)
        assert len(tree.alive()) >= 2, tree.alive()  # the driver and its workers
        _kill_and_count(tree, signum, GONE_S)
    finally:
        tree.kill_all()


HOLDER = textwrap.dedent('''
    import subprocess, sys, time
    from rewardlab.sandbox import Sandbox, runner

    assert Sandbox(workers=1).run("print(1)").ok
    (launcher,) = runner._LAUNCHERS.values()
    fd = launcher.sock.fileno()
    # A process that holds the caller's end of the launcher's socket (as a forked worker did) and outlives it.
    subprocess.Popen(["sleep", "120"], pass_fds=[fd])
    print("ready", file=sys.stderr, flush=True)
    time.sleep(120)
''')


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_launcher_exits_with_its_caller_while_another_process_holds_its_socket(tmp_path, signum):
    tree = Tree([sys.executable, "-c", HOLDER], tmp_path / "stderr.txt", child_env())
    try:
        tree.wait_for("ready", lambda: "ready" in tree.tail(), timeout=120)
        assert len(launchers_of(tree)) == 1, tree.alive()
        os.kill(tree.root, signum)
        deadline = time.monotonic() + GONE_S
        while (left := {p: c for p, c in tree.alive().items() if c != "sleep 120"}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"alive {GONE_S:g} s after {signum.name}: {left}"  # the holder is the test's to kill
    finally:
        tree.kill_all()


def test_a_forked_child_holds_no_copy_of_the_launchers_socket():
    from rewardlab.sandbox import Sandbox, runner

    assert Sandbox(workers=1).run("print(1)").ok
    launcher = runner._launcher(sys.executable)
    fd, inode = launcher.sock.fileno(), os.fstat(launcher.sock.fileno()).st_ino
    pid = os.fork()
    if pid == 0:  # the child: exit 0 when fd is closed (or is something else), 1 when it is the launcher's socket
        try:
            code = int(os.fstat(fd).st_ino == inode)
        except OSError:
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child inherited the launcher's socket"
    assert launcher.alive() and Sandbox(workers=1).run("print(2)").stdout == "2\n"  # the parent's is untouched
