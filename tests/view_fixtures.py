"""Fixture runs for the viewer's tests: a run directory written as the trainer writes one (config.yaml,
metrics.jsonl, events.jsonl, summary.json, rollouts files through `rewardlab.rollout_log.write_step`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from rewardlab.rollout_log import write_step
from rewardlab.runs import RunDir

XSS = "<script>window.__xss = 1</script><img src=x onerror=alert(1)>"


def rollout(step: int, i: int, rng: random.Random, *, tokens: bool) -> dict:
    """One rollout record of step `step`: groups of 4, rollout 3 holds a <script> completion, 5 a reward error,
    6 is truncated, 1 an episode with a tool call; `tokens`: with per-token columns."""
    rec = {"episode": i, "row": 0, "group": i // 4, "prompt_key": f"p{(i // 4 + step) % 5}", "prompt": f"{i} + 1 =",
           "completion": XSS if i == 3 else f"answer {i}", "reward": round(rng.random(), 3),
           "components": {"correct": float(i % 2), "format": 1.0}, "advantage": rng.uniform(-1, 1),
           "error": "reward timed out" if i == 5 else None, "truncated": i == 6, "kept": i % 3 != 0,
           "termination": "length" if i == 6 else "stop", "policy_version": step - 1, "staleness": 0, "num_tokens": 4}
    if i == 1:
        rec["turns"] = [{"span": [0, 2], "reward": 0.5, "advantage": 0.25, "result": "<b>2</b>",
                         "tool_calls": [{"name": "calc", "arguments": {"x": "1+1"}, "status": "ok", "seconds": 0.01}]}]
    if tokens:
        rec.update(tokens=["<s", "cript>", " 4", "."], token_ids=[1, 2, 3, 4], loss_mask=[1, 1, 0, 1],
                   advantages=[0.5, -0.25, 0.0, 1.0], logprob=[-0.1, -2.0, -0.5, -1.0],
                   logprob_old=[-0.1, -2.0, -0.5, -1.0], ratio=[1.0, 1.1, 0.9, 1.0], entropy=[0.1, 0.5, 0.2, 0.3],
                   clip=[0, 1, 0, 2], step_spans=[0, 2, 2, 4], step_scores=[0.9, 0.1])
    return rec


def make_run(path: Path, *, steps: int = 3, per_step: int = 16, logged: int = 4, lr: float = 0.001,
             summary: bool = True) -> Path:
    """A finished train run at `path` with `steps` logged steps of `per_step` rollouts (the first `logged` with
    per-token values)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(f"model:\n  path: tiny\ntask:\n  spec: reasoning_gym:chain_sum\n"
                                      f"rl:\n  steps: {steps}\n  lr: {lr}\n", encoding="utf-8")
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / steps, "loss": 1 / s})
                                                + "\n" for s in range(1, steps + 1)), encoding="utf-8")
    (path / "events.jsonl").write_text(json.dumps({"time": 0, "event": "start", "pid": 1}) + "\n", encoding="utf-8")
    rng = random.Random(0)
    run = RunDir(path)
    for step in range(1, steps + 1):
        write_step(run, step, [rollout(step, i, rng, tokens=i < logged) for i in range(per_step)])
    if summary:
        (path / "summary.json").write_text(json.dumps({"steps": steps, "interrupted": False}), encoding="utf-8")
    return path
