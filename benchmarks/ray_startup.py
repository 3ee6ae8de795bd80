"""Where engine ray's start-up time goes (README, next to Ray's per-step overhead; docs/scale-out.md).

    python benchmarks/ray_startup.py --repeats 3      # the figures in the docs (about 6 min on 2 cores)

It benchmarks the rewardlab of this checkout (src/ next to benchmarks/) unless PYTHONPATH is set, offline, with the
tiny model and the quickstart's task and RL settings (`rewardlab quickstart`'s GRPO stage: chain_sum, 128 prompts x
8 rollouts of 4 tokens), 1 torch thread.

- end to end: `rewardlab train ... rl.steps=STEPS` as a fresh process, engine local and engine ray (its default 2
  rollout + 2 reward workers, a local cluster), alternating over `--repeats`; the process's wall time (median).
- breakdown of engine ray's start-up (one more fresh process): `ray.init` of the local cluster, the 4 worker actors'
  processes up (Ray starts a Python process per actor), and inside each worker its `start` (what `RayEngine`
  waits for): its imports, the task it loads (single-turn tasks: none, the driver sends the task's reward spec),
  its model (rollout workers) and its reward (reward workers); then `ray.shutdown`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def quickstart_overrides() -> list[str]:
    """The quickstart's GRPO stage as `rewardlab train` overrides (its model, task and rl section; no held-out eval)."""
    from rewardlab.config import QuickstartConfig

    q = QuickstartConfig()
    return [f"model.path={q.model.path}", f"task.spec={q.task.spec}", f"task.options={json.dumps(q.task.options)}",
            f"rl.prompts_per_step={q.rl.prompts_per_step}", f"rl.group_size={q.rl.group_size}",
            f"rl.sampling.max_new_tokens={q.rl.sampling.max_new_tokens}", "rl.eval.every=0", "threads=1"]


def env() -> dict[str, str]:
    out = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out.setdefault("PYTHONPATH", str(HERE.parent / "src"))
    return out


def end_to_end(engine: str, steps: int, work: Path) -> float:
    """Seconds of wall clock of `rewardlab train` (a fresh process) with `engine`, `steps` steps."""
    out = work / f"{engine}-{time.monotonic_ns()}"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rewardlab.cli", "train", *quickstart_overrides(), f"rl.steps={steps}",
                    f"rl.engine={engine}", f"--out={out}", "--no-progress"], check=True, env=env(),
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def _worker_phases(worker: Any) -> dict[str, float]:
    """Inside a fresh worker actor: its `start`, timed by part (the same calls, in the same order)."""
    t = time.perf_counter()
    from rewardlab.envs.sampling import load_episodes
    from rewardlab.policy import load_policy
    from rewardlab.rewards import build_reward
    from rewardlab.rl.engines.ray_engine import set_transformers_logging
    from rewardlab.tasks import load as load_task
    from rewardlab.threads import apply_threads

    out = {"imports": time.perf_counter() - t}
    cfg = worker.cfg
    set_transformers_logging(worker.hf_logging)
    apply_threads(worker.threads)
    t = time.perf_counter()
    task = worker.task if getattr(worker, "task", None) is not None else load_task(cfg.task.spec, **cfg.task.options)
    out["task"] = time.perf_counter() - t
    t = time.perf_counter()
    if hasattr(worker, "settings"):
        policy = load_policy(cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())
        load_episodes(task, cfg.env, policy)
        out["model"] = time.perf_counter() - t
    else:
        build_reward(cfg.rewards if cfg.rewards is not None else task.reward, on_error=cfg.on_error)
        out["reward"] = time.perf_counter() - t
    return out


def breakdown() -> dict[str, Any]:
    """Engine ray's start-up by part, in this process (the driver's own set-up aside)."""
    import ray

    from rewardlab.config import TrainConfig, load_config
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RewardWorker, RolloutWorker, transformers_logging, worker_task
    from rewardlab.tasks import load as load_task

    cfg = load_config(TrainConfig, None, [*quickstart_overrides(), "rl.engine=ray", "out=unused"])
    rl, logs = cfg.rl, transformers_logging()
    task = worker_task(load_task(cfg.task.spec, **cfg.task.options))
    out: dict[str, Any] = {}
    t = time.perf_counter()
    ray.init(logging_level=logging.WARNING)
    out["ray.init"] = time.perf_counter() - t
    # the actors RayEngine starts, with its arguments, then timed part by part instead of `start`
    rollout = ray.remote(RolloutWorker).options(num_cpus=rl.ray.rollout_worker_cpus,
                                                num_gpus=rl.ray.rollout_worker_gpus)
    reward = ray.remote(RewardWorker).options(num_cpus=rl.ray.reward_worker_cpus, num_gpus=rl.ray.reward_worker_gpus)
    settings = SamplingSettings(max_new_tokens=rl.sampling.max_new_tokens)
    t = time.perf_counter()
    workers = ([rollout.remote(cfg, settings, 1, logs, task) for _ in range(rl.ray.rollout_workers)]
               + [reward.remote(cfg, 1, logs, task) for _ in range(rl.ray.reward_workers)])
    ray.get([w.__ray_call__.remote(lambda worker: None) for w in workers])
    out["actors up"] = time.perf_counter() - t
    t = time.perf_counter()
    out["workers"] = ray.get([w.__ray_call__.remote(_worker_phases) for w in workers])
    out["workers start (in parallel)"] = time.perf_counter() - t
    t = time.perf_counter()
    ray.shutdown()
    out["ray.shutdown"] = time.perf_counter() - t
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="end-to-end,breakdown", help="comma-separated: end-to-end, breakdown")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(breakdown()))
        return
    parts = args.parts.split(",")
    if "end-to-end" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            times: dict[str, list[float]] = {"local": [], "ray": []}
            for r in range(args.repeats):
                for engine in times:
                    times[engine].append(end_to_end(engine, args.steps, Path(tmp)))
                    print(f"  {engine} run {r + 1}: {times[engine][-1]:.1f} s", flush=True)
        local, ray = statistics.median(times["local"]), statistics.median(times["ray"])
        print(f"end to end, {args.steps} steps, median of {args.repeats}: local {local:.1f} s, ray {ray:.1f} s "
              f"(+{ray - local:.1f} s)", flush=True)
    if "breakdown" not in parts:
        return
    child = subprocess.run([sys.executable, __file__, "--child"], check=True, env=env(), capture_output=True,
                           text=True)
    parts = json.loads(child.stdout.strip().splitlines()[-1])
    for key in ("ray.init", "actors up", "workers start (in parallel)", "ray.shutdown"):
        print(f"  {key}: {parts[key]:.1f} s")
    for i, w in enumerate(parts["workers"]):
        print(f"    worker {i}: " + ", ".join(f"{k} {v:.1f} s" for k, v in w.items()))


if __name__ == "__main__":
    main()
