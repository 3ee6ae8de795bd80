"""Shared fixtures: a tiny architecture (fast on 2 CPU cores), a small chain_sum task, JSONL writers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny models gain nothing from intra-op threads, and on a shared 2-core machine two spinning OpenMP threads
# made the suite ~4x slower (73 s vs 19 s with one thread). OMP_NUM_THREADS=1 keeps it so for the verbs the tests run
# (their `threads` setting defaults to it, see rewardlab.threads) and for the CLI processes they start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

#: The smallest Llama the tests use: 32-wide, one block (a few thousand parameters plus the 101-token embedding).
TINY_ARCH = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
#: The same architecture as config overrides.
TINY_OVERRIDES = [f"model.tiny.{k}={v}" for k, v in TINY_ARCH.items()]
#: chain_sum with two 1-digit terms: at most 10*10*2 = 200 distinct questions, so 400 draws repeat some.
CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file, in order."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def sha256_of(path: Path) -> str:
    """The SHA-256 hex digest of a file's bytes."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def without_keys(records: list[dict], *prefixes: str) -> list[dict]:
    """The records without the keys that start with any of `prefixes` (e.g. "time/")."""
    return [{k: v for k, v in r.items() if not k.startswith(prefixes)} for r in records]


def child_last_line(code: str, **env: str) -> str:
    """The last line `python -c code` prints in a child process with `env` added to this one's environment (for
    what happens at import time in a fresh interpreter); the child must exit 0 (its stderr tail is the message)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def make_rollout(completion: str = "c", row: dict | None = None, *, prompt: str = "p", n_tokens: int | None = None,
                 **fields):
    """A Rollout of `completion` for scoring tests: prompt_ids [1], `n_tokens` completion ids (default one per
    character, at least one; ids 4, 5, ... so none is a special token), log-probs 0.0, `row` (default {}); `fields`
    (group, steps, step_text, truncated, or any of the above to override it) pass through to Rollout."""
    from rewardlab.types import Rollout

    n = max(1, len(completion)) if n_tokens is None else n_tokens
    base = dict(prompt=prompt, prompt_ids=[1], completion=completion, completion_ids=list(range(4, 4 + n)),
                logprobs=[0.0] * n, row=row or {})
    return Rollout(**{**base, **fields})


def _module_fixture_user(item) -> bool:
    """Whether `item` uses a module-scoped fixture (a run trained once and read by several tests, a built model)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d and d[-1].scope == "module" for d in defs.values())


#: The test modules that run programs in the OS sandbox (the code reward, the python tool, HumanEval pairs). The
#: sandbox's process limit for "process" isolation counts every process of its user (uid 65534) on the machine
#: (`rewardlab.sandbox.launcher`), so two of them forking at once on two xdist workers could lend each other a
#: process: they run in one xdist group, one at a time.
SANDBOX_MODULES = ("tests/sandbox/test_sandbox.py", "tests/faults/test_fault_hostile_code.py",
                   "tests/faults/test_fault_leftover_processes.py", "tests/faults/test_fault_reward_worker_killed.py",
                   "tests/rewards/test_rewards_code.py", "tests/integrations/test_trl_reward_funcs.py",
                   "tests/rm/test_rm_mutant_pairs.py", "tests/test_threads.py", "tests/envs/test_builtin_envs.py",
                   "tests/envs/test_python_env_evaluate.py", "tests/tasks/test_environment_tasks.py",
                   "tests/tasks/test_tasks_humaneval.py", "tests/tasks/test_task_vocabulary_and_chat.py",
                   "tests/test_reward_output_accessors.py", "tests/commands/test_env_key_checks.py")


def pytest_collection_modifyitems(config, items):
    """Every fault-injection test is `slow` too, so `make test-fast` (`-m "not slow"`) leaves out the SIGKILL and
    resume runs.

    xdist groups, for `pytest -n N --dist loadgroup` (`make test`), where a group's tests run on one worker: every
    test that uses `ray_cluster` is in the group "ray" (one local cluster for all of them), and the tests of a module
    that use one of its module-scoped fixtures are in a group named after the module (the fixture is built once, not
    once per worker); the modules that run sandboxed programs are the group "sandbox" (`SANDBOX_MODULES`)."""
    faults = Path(__file__).parent / "faults"
    for item in items:
        if faults in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)
        module = item.nodeid.split("::")[0]
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif module in SANDBOX_MODULES:
            item.add_marker(pytest.mark.xdist_group("sandbox"))
        elif _module_fixture_user(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture
def tiny_policy():
    from rewardlab.policy import load_policy

    return load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)


@pytest.fixture(scope="session")
def chain_sum_task():
    from rewardlab.tasks import load

    return load("reasoning_gym:chain_sum", size=400, test_size=50, seed=0, **CHAIN_SUM)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (2 CPUs, no dashboard) for every Ray test of the session, shut down at its end. ray is
    imported only when a test asks for this fixture; engine ray finds the connection (`ray.is_initialized()`) and
    keeps it."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
