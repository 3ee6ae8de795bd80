"""What writing the rollouts file costs a GRPO step at the quickstart's batch (128 prompts x 8 rollouts).

    python benchmarks/rollout_log_cost.py [--sft-checkpoint CKPT] [--steps 20] [--warmup 3] [--repeats 2]

Runs the quickstart's GRPO stage (its task, model and `rl` section, `QuickstartConfig()`'s defaults) for `--steps`
steps in three arms, interleaved `--repeats` times so the machine's load falls on each alike:

- off: rl.logging.log_completions false (samples.jsonl and metrics.jsonl only, as before the rollouts file);
- scalars: the rollouts and completions files without tokens (rl.logging.log_tokens 0);
- on: the default, the rollouts and completions files with the first 8 episodes' tokens (rl.logging.log_tokens 8);
- all: every episode's tokens (log_tokens all), the upper end.

For each arm it reports the median over steps (after `--warmup`) of time/step_s (the step without its logging) and
time/log_s (the seconds writing the step's rollouts: samples.jsonl, and the Parquet files when on), and log_s as a
share of step_s. The cost of the rollouts file is on's log_s minus off's; of logging 8 episodes' tokens, on's minus
scalars'. The model is the quickstart's SFT
checkpoint when given (the run the README measures), else the tiny model from scratch (same shapes, same batch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rewardlab.config import QuickstartConfig, TrainConfig
from rewardlab.rl.trainer import train

ARMS = {"off": {"log_completions": False}, "scalars": {"log_completions": True, "log_tokens": 0},
        "on": {"log_completions": True, "log_tokens": 8}, "all": {"log_completions": True, "log_tokens": "all"}}


def run_arm(arm: str, out: Path, args: argparse.Namespace) -> dict[str, float]:
    """One run of `arm`; the medians of its steps after the warm-up."""
    qs = QuickstartConfig()
    model = qs.model.model_copy(update={"path": args.sft_checkpoint}) if args.sft_checkpoint else qs.model
    logging = qs.rl.logging.model_copy(update=ARMS[arm])
    rl = qs.rl.model_copy(update={"steps": args.steps, "logging": logging,
                                  "eval": qs.rl.eval.model_copy(update={"every": 0})})
    cfg = TrainConfig(model=model, task=qs.task, rl=rl, out=str(out), seed=0, save_every=10_000,
                      threads=args.threads)
    train(cfg, show_progress=False)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][args.warmup:]
    step_s = statistics.median(m["time/step_s"] for m in lines)
    log_s = statistics.median(m["time/log_s"] for m in lines)
    return {"step_s": step_s, "log_s": log_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft-checkpoint", default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for arm in ARMS:
                results[arm].append(run_arm(arm, Path(tmp) / f"{arm}-{r}", args))
    off_log = statistics.median(x["log_s"] for x in results["off"])
    print(f"{'arm':<8} {'step_s':>8} {'log_s':>8} {'log/step':>9} {'added log_s':>12} {'added/step':>11}")
    for arm, runs in results.items():
        step_s = statistics.median(x["step_s"] for x in runs)
        log_s = statistics.median(x["log_s"] for x in runs)
        added = log_s - off_log
        print(f"{arm:<8} {step_s:8.3f} {log_s:8.4f} {log_s / step_s:9.2%} {added:12.4f} {added / step_s:11.2%}")


if __name__ == "__main__":
    main()
