"""Where a GRPO step's time goes, in rewardlab and in TRL's GRPOTrainer (the settings of grpo_vs_trl.py).

    python benchmarks/profile_grpo_step.py --sft-checkpoint CKPT [--steps 20] [--threads 2] [--ops]

Each trainer runs `--steps` steps in its own child process with wall-clock timers wrapped around the functions that
make up a step (the wrappers add one perf_counter pair per call, nothing else):

- generation: `Policy.generate` (sampling, behaviour log-probs, Rollout records) | TRL's `_generate_single_turn`
  (transformers `generate`, EOS masking).
- reward: the task verifier (`Reward.__call__`) | `_calculate_rewards`.
- log-prob forward: `Policy.token_logprobs` | `_get_per_token_logps_and_entropies`.
- backward: `Tensor.backward` | the same (called by accelerate).
- optimizer: `clip_grad_norm_` + `AdamW.step` | the same functions (TRL's default fused AdamW).
- logging: `RunDir.log_metrics` + `log_samples` (fsync'd JSONL, written under --out) | none (TRL keeps its metrics in
  memory; no logging step falls inside the run).
- other: the loop time minus the above (packing, advantages, loss, metrics, Python; for TRL also Trainer and
  accelerate bookkeeping).

The first `--warmup` steps are left out of the per-step means. benchmarks/real_shape.py runs every arm through this
script's child (`--child`), so each of its runs carries these phase times. "step CPU time" is the process's CPU time per step
(user + system, all threads): on a shared machine it moves much less with the load than wall time does. With
`--ops`, torch.profiler's top operators by self CPU time are printed for each trainer too.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402

PHASES = ("generation", "reward", "log-prob forward", "backward", "optimizer", "logging")


class Timers:
    """Per-step seconds of each phase: `mark_step()` closes a step; nested calls of one phase count once."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.depth: dict[str, int] = defaultdict(int)

    def wrap(self, phase: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.depth[phase] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth[phase] -= 1
                if self.depth[phase] == 0:
                    self.current[phase] += time.perf_counter() - t0

        return timed

    def mark_step(self) -> None:
        self.current["cpu"] = time.process_time()
        self.steps.append(dict(self.current))
        self.current = defaultdict(float)


def patch(obj: Any, name: str, phase: str, timers: Timers) -> None:
    setattr(obj, name, timers.wrap(phase, getattr(obj, name)))


def install_common(timers: Timers) -> None:
    import torch

    patch(torch.Tensor, "backward", "backward", timers)
    patch(torch.nn.utils, "clip_grad_norm_", "optimizer", timers)
    patch(torch.optim.AdamW, "step", "optimizer", timers)


def profile_rewardlab(cfg: dict[str, Any], timers: Timers) -> dict[str, Any]:
    import rewardlab.rl.trainer as trainer_mod
    from rewardlab.policy.hf import Policy
    from rewardlab.runs import RunDir

    patch(Policy, "generate", "generation", timers)
    patch(Policy, "token_logprobs", "log-prob forward", timers)
    patch(RunDir, "log_samples", "logging", timers)
    build_reward = trainer_mod.build_reward
    trainer_mod.build_reward = lambda *a, **k: timers.wrap("reward", build_reward(*a, **k))
    log_metrics = RunDir.log_metrics

    def log_and_mark(self, step, metrics):  # the last call of a step: close it
        t0 = time.perf_counter()
        log_metrics(self, step, metrics)
        timers.current["logging"] += time.perf_counter() - t0
        timers.current["loop"] = metrics["time/elapsed_s"]
        timers.mark_step()

    RunDir.log_metrics = log_and_mark
    return bench.child_rewardlab(cfg)


def profile_trl(cfg: dict[str, Any], timers: Timers) -> dict[str, Any]:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    patch(GRPOTrainer, "_generate_single_turn", "generation", timers)
    patch(GRPOTrainer, "_calculate_rewards", "reward", timers)
    patch(GRPOTrainer, "_get_per_token_logps_and_entropies", "log-prob forward", timers)
    clock: dict[str, float] = {}

    class Mark(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.setdefault("t0", time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            timers.current["loop"] = time.perf_counter() - clock["t0"]
            timers.mark_step()

    original = GRPOTrainer.__init__

    def init_with_mark(self, *args, callbacks=None, **kwargs):
        original(self, *args, callbacks=[*(callbacks or []), Mark()], **kwargs)

    GRPOTrainer.__init__ = init_with_mark
    return bench.child_trl(cfg)


def child_main(role: str, cfg_path: str, out_path: str) -> None:
    bench._offline_env()
    cfg = json.loads(Path(cfg_path).read_text())
    bench._set_threads(cfg["threads"])
    timers = Timers()
    install_common(timers)
    run = profile_rewardlab if role == "rewardlab" else profile_trl
    ops = None
    if cfg.get("ops"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            rec = run(cfg, timers)
        ops = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50)
    else:
        rec = run(cfg, timers)
    # the training child's own record (benchmarks/grpo_vs_trl.py) plus the phase timers' per-step times
    Path(out_path).write_text(json.dumps({**rec, "steps": timers.steps, "ops": ops, "load_avg_end": bench._load_avg()}))


def per_step_ms(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Mean ms per step of each phase over the steps after `warmup`; `step` is the loop time per step."""
    kept = steps[warmup:]
    loop_s = kept[-1]["loop"] - steps[warmup - 1]["loop"] if warmup else kept[-1]["loop"]
    out = {p: 1000 * sum(s.get(p, 0.0) for s in kept) / len(kept) for p in PHASES}
    out["step"] = 1000 * loop_s / len(kept)
    out["other"] = out["step"] - sum(out[p] for p in PHASES)
    w = max(warmup, 1)
    out["step CPU time"] = 1000 * (kept[-1]["cpu"] - steps[w - 1]["cpu"]) / (len(steps) - w)
    return out


def phase_table(results: dict[str, dict[str, float]]) -> str:
    """A markdown table of `per_step_ms` results, one column per trainer."""
    names = list(results)
    lines = ["| ms per step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in ("step", *PHASES, "other", "step CPU time"):
        lines.append(f"| {key} | " + " | ".join(f"{results[n][key]:.1f}" for n in names) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sft-checkpoint", help="start checkpoint, e.g. OUT/sft/checkpoints/step-650 of grpo_vs_trl.py")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--out", default="runs/profile_grpo_step")
    ap.add_argument("--ops", action="store_true", help="also print torch.profiler's top operators")
    ap.add_argument("--only", choices=bench.TRAINERS, default=None)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child_main(*a.child)
        return
    if not a.sft_checkpoint:
        ap.error("--sft-checkpoint is required")
    bench._offline_env()
    results = {}
    for name in [a.only] if a.only else bench.TRAINERS:
        cfg = {"checkpoint": a.sft_checkpoint, "run_dir": str(Path(a.out) / name), "steps": a.steps,
               "budget_s": None, "threads": a.threads, "lr": a.lr, "temperature": 0.7, "prompts": 16,
               "group_size": 8, "max_new_tokens": 8, "seed": 0, "ops": a.ops}
        load_start = bench._load_avg()
        rec = bench.run_child(name, cfg, script=__file__)
        results[name] = per_step_ms(rec["steps"], a.warmup)
        print(f"{name}: {len(rec['steps'])} steps, load average {load_start} -> {rec['load_avg_end']}")
        if rec["ops"]:
            print(rec["ops"])
    print("\n" + phase_table(results))
    Path(a.out, "profile_summary.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
