"""Mutation check of the trainer's switches: break each switch in a copy of the tree, and name the test that notices.

For every entry of BREAKS (a switch of `rl`, a minimal edit that disables it, and the non-slow tests that should
notice) this script copies src/, tests/, docs/, README.md and pyproject.toml into a temporary directory, applies the
edit there as an exact text replacement (the target text must occur exactly once: when the code moves, the script
stops and names the break instead of testing an unbroken tree), runs the break's tests on the copy (PYTHONPATH set to
the copy's src, `-x -m "not slow and not ray_long"`) and prints a table: switch | break | caught by (the first failing
test, or NOT CAUGHT). The working tree is never written to, so an interrupted run (Ctrl-C) leaves nothing behind but
the temporary directory, which is removed on the way out.

Not a test (pytest does not collect this file, and `make test` does not run it). From the repository root:

    python tests/mutation_check.py                 # every break (a few minutes on 2 cores)
    python tests/mutation_check.py --only kl_in    # the breaks of one switch (a substring of the switch or break)
    python tests/mutation_check.py --baseline      # first run every selected test on the unbroken copy
    python tests/mutation_check.py --list          # the breaks and their tests, without running anything

Exit status: 0 when every break was caught, 1 when one was not (or could not be measured), 2 when a break's target
text does not occur exactly once or a test file it names does not exist.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAINER = "src/rewardlab/rl/trainer.py"
ROLLOUTS = "src/rewardlab/rl/rollouts.py"
CREDIT = "src/rewardlab/rl/credit.py"
UPDATE = "src/rewardlab/rl/update.py"
COPIED = ("src", "tests", "docs", "README.md", "pyproject.toml")

SWITCH_TESTS = "tests/rl/test_trainer_switches.py"
GRADIENT = "tests/rl/test_micro_batches.py::test_micro_batches_accumulate_the_gradient_of_the_whole_minibatch"
TRAINER_TESTS = "tests/rl/test_trainer.py"
EPISODES = "tests/rl/test_trainer_episodes.py"
SPLIT = "tests/rl/test_split_invariance.py"
ASYNC = "tests/rl/test_async_staleness.py"


@dataclass(frozen=True)
class Break:
    """A minimal edit that disables `switch`: `old` replaced by `new` in `path` (relative to the repository root)."""

    switch: str
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


BREAKS = [
    Break("rl.mask_truncated", "every termination reason's loss weight forced to 1.0", CREDIT,
          "torch.tensor([weight[t] for t in ends]", "torch.tensor([1.0 for t in ends]",
          (SWITCH_TESTS, TRAINER_TESTS, EPISODES, SPLIT)),
    Break("rl.kl_in", "reward: the KL is not subtracted from the token rewards", CREDIT,
          "return ref, token_rewards - rl.beta * kl_tokens, metrics", "return ref, token_rewards, metrics",
          (SWITCH_TESTS, TRAINER_TESTS)),
    Break("rl.kl_in", "reward: the KL subtracted from the token rewards whatever rl.kl_in", CREDIT,
          'if rl.kl_in != "reward":', "if False:", (SWITCH_TESTS, TRAINER_TESTS)),
    Break("rl.kl_in", "loss: the KL term leaves the gradient", UPDATE,
          "objective = objective + rl.beta * (kl_penalty(", "objective = objective + 0 * rl.beta * (kl_penalty(",
          (SWITCH_TESTS, GRADIENT, TRAINER_TESTS)),
    Break("rl.entropy_coef", "the entropy bonus leaves the gradient", UPDATE,
          "objective = objective - rl.entropy_coef * (ent * w).sum()",
          "objective = objective - 0 * rl.entropy_coef * (ent * w).sum()",
          (SWITCH_TESTS, GRADIENT, TRAINER_TESTS)),
    Break("rl.filtering.group_filter", "the filter keeps every group", ROLLOUTS,
          "        dropped += keep.count(False) // rl.group_size",
          "        keep = [True] * len(new)\n        dropped += keep.count(False) // rl.group_size",
          (SWITCH_TESTS, TRAINER_TESTS)),
    Break("rl.filtering.curriculum", "the uniform sampler whatever the setting", TRAINER,
          "sampler = make_curriculum(cfg.rl.filtering.curriculum, task.train, seed=cfg.seed,\n"
          "                                  **cfg.rl.filtering.curriculum_options)",
          'sampler = make_curriculum("uniform", task.train, seed=cfg.seed)',
          (SWITCH_TESTS, TRAINER_TESTS, "tests/test_train_state.py")),
    Break("rl.filtering.curriculum", "the sampler never sees the pass rates", ROLLOUTS,
          "sampler.update(indices, correct.mean(dim=1).tolist())", "pass",
          (SWITCH_TESTS, TRAINER_TESTS, "tests/test_train_state.py")),
    Break("rl.ray.max_staleness", "the lag ignored (always synchronous)", ROLLOUTS,
          "self.run, self.lag = run, rl.ray.max_staleness", "self.run, self.lag = run, 0",
          (ASYNC, SWITCH_TESTS)),
    Break("rl.epochs", "one pass whatever the setting", UPDATE,
          "for _ in range(rl.epochs if n else 0):", "for _ in range(1 if n else 0):",
          (SWITCH_TESTS, TRAINER_TESTS, EPISODES)),
    Break("rl.minibatch_size", "one minibatch of the whole batch", UPDATE,
          "episode_minibatches(credit.episode, rl.minibatch_size, n=n)",
          "episode_minibatches(credit.episode, None, n=n)",
          (SWITCH_TESTS, TRAINER_TESTS, EPISODES)),
]


def check_targets(breaks: list[Break]) -> list[str]:
    """The breaks whose target text does not occur exactly once in the working tree, or that name a test file that
    does not exist, as messages."""
    problems = []
    for b in breaks:
        problems += [f"{b.switch} ({b.name}): no test file {t.split('::')[0]}" for t in b.tests
                     if not (ROOT / t.split("::")[0]).is_file()]
        count = (ROOT / b.path).read_text(encoding="utf-8").count(b.old)
        if count != 1:
            problems.append(f"{b.switch} ({b.name}): {count} occurrences of {b.old!r} in {b.path}, expected 1 "
                            "(the code moved: update BREAKS)")
    return problems


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def pytest_env(copy: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_imports_copy(copy: Path) -> None:
    """The copy's rewardlab is the one its tests import (not the working tree's or an installed one)."""
    out = subprocess.run([sys.executable, "-c", "import rewardlab; print(rewardlab.__file__)"], cwd=copy,
                         env=pytest_env(copy), capture_output=True, text=True, check=True)
    where = Path(out.stdout.strip()).resolve()
    if copy.resolve() not in where.parents:
        sys.exit(f"mutation_check: the copy imports rewardlab from {where}, not from {copy}")


def run_tests(copy: Path, tests: tuple[str, ...], *, first: bool, timeout: float) -> tuple[int, list[str], str]:
    """Run `tests` on the copy; returns (pytest's exit status, the failing test ids in order, the output's tail)."""
    cmd = [sys.executable, "-m", "pytest", *tests, "-m", "not slow and not ray_long", "-p", "no:randomly",
           "-p", "no:cacheprovider", "-q", "-rfE", "--tb=no", *(["-x"] if first else [])]
    try:
        out = subprocess.run(cmd, cwd=copy, env=pytest_env(copy), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, [], f"timed out after {timeout:.0f} s"
    text = out.stdout + out.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.M)
    return out.returncode, failed, text[-3000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run the breaks whose switch or name contains "
                        "this text (repeatable)")
    parser.add_argument("--baseline", action="store_true", help="first run the selected tests on the unbroken copy")
    parser.add_argument("--all", action="store_true", help="run every test of a break (not -x) and list every "
                        "failing one")
    parser.add_argument("--list", action="store_true", help="print the breaks and their tests and exit")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per break's pytest run (default 900)")
    args = parser.parse_args(argv)
    breaks = [b for b in BREAKS if not args.only or any(o in b.switch or o in b.name for o in args.only)]
    if args.list:
        for b in breaks:
            print(f"{b.switch} | {b.name} | {b.path}: {b.old!r} -> {b.new!r} | {' '.join(b.tests)}")
        return 0
    problems = check_targets(breaks)
    if problems:
        print("\n".join(f"mutation_check: {p}" for p in problems), file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="rewardlab-mutation-") as tmp:
        copy = Path(tmp)
        copy_tree(copy)
        check_imports_copy(copy)
        if args.baseline:
            union = tuple(dict.fromkeys(t for b in breaks for t in b.tests))
            rc, failed, tail = run_tests(copy, union, first=False, timeout=args.timeout * len(breaks))
            if rc != 0:
                print(f"mutation_check: the unbroken tests fail (exit {rc}): {failed}\n{tail}", file=sys.stderr)
                return 1
            print(f"baseline: {len(union)} test paths pass on the unbroken copy", flush=True)
        for b in breaks:
            target = copy / b.path
            original = target.read_text(encoding="utf-8")
            target.write_text(original.replace(b.old, b.new, 1), encoding="utf-8")
            t0 = time.perf_counter()
            try:
                rc, failed, tail = run_tests(copy, b.tests, first=not args.all, timeout=args.timeout)
            finally:
                target.write_text(original, encoding="utf-8")
            if rc == 0:
                caught = "NOT CAUGHT"
            elif failed and rc in (1, 2):  # 2: a collection error (ERROR lines) stopped the session
                caught = ", ".join(failed)
            else:  # a timeout, a usage error, no test selected: the break was not measured
                caught = f"NOT MEASURED (pytest exit {rc}): {tail.strip().splitlines()[-1:]}"
            rows.append((b.switch, b.name, caught, not failed or rc not in (1, 2)))
            print(f"[{time.perf_counter() - t0:5.0f} s] {b.switch} | {b.name} | {caught}", file=sys.stderr,
                  flush=True)
    print("| switch | break | caught by |\n|---|---|---|")
    for switch, name, caught, _ in rows:
        print(f"| `{switch}` | {name} | {caught} |")
    return 1 if any(missed for *_, missed in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
