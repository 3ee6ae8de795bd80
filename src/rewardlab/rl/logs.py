"""What a step writes: its metrics line (metrics.jsonl) and its rollouts (samples.jsonl), `log_step`."""

from __future__ import annotations

from typing import Any

from rewardlab.envs.replay import episode_record
from rewardlab.rl.credit import Credit


def step_line(run: Any, progress: Any, batch: Any, credit: Credit | None, stats: dict[str, float], *,
              timing: dict[str, float], evals: dict[str, float] | None = None) -> dict[str, float]:
    """Step `progress.step`'s metrics: the batch's, the credit's and the update's, `rollout/generated` (episodes
    generated and scored this step, every group-filter round: its samples.jsonl rows; a sampled estimator input such
    as ReMax's greedy baseline is not counted) added to `progress.generated_total` (`rollout/generated_total`), the
    learning rate, the step's times (`timing`: step_s, elapsed_s; generation from the batch and the credit), and
    `evals` (the held-out evaluation's metrics) when given."""
    metrics = {**batch.metrics, **credit.metrics} if credit is not None else dict(batch.metrics)
    metrics.update({k: v for k, v in stats.items() if k != "policy/updates"})
    progress.generated_total += len(batch.episodes)
    metrics.update({"rollout/generated": float(len(batch.episodes)),
                    "rollout/generated_total": float(progress.generated_total), **(evals or {})})
    gen_s = batch.gen_s + (credit.gen_s if credit is not None else 0.0)
    gen_tokens = batch.gen_tokens + (credit.gen_tokens if credit is not None else 0)
    metrics.update({"lr": run.scheduler.get_last_lr()[0], "time/step_s": timing["step_s"], "time/gen_s": gen_s,
                    "time/gen_tokens_per_s": gen_tokens / max(gen_s, 1e-9),
                    "policy/updates": stats["policy/updates"], "time/elapsed_s": timing["elapsed_s"]})
    return metrics


def sample_records(run: Any, step: int, batch: Any, credit: Credit | None) -> list[dict[str, Any]]:
    """The samples.jsonl lines of step `step`: every episode generated, or the first rl.logging.log_samples.

    A single completion's line holds its prompt, completion, answer, reward, components, error, advantage (on its
    first token), whether the loss saw it (kept), truncated and the policy version that sampled it. An environment
    task writes one line per episode, `rewardlab.envs.episode_record` (each row's ids, loss mask and behaviour
    log-probs, the turns, messages, tool calls, termination, reward, turn rewards and the advantage of each turn on
    its first sampled token, which `rewardlab.envs.replay` rebuilds) plus step, kept and policy_version.
    """
    first_row = {}  # index in batch.episodes of a kept episode -> index of its first row in credit.rows
    if credit is not None:
        at = 0
        for i in batch.kept:
            first_row[i] = at
            at += len(batch.episodes[i].rows)
    records = []
    for i, e in enumerate(batch.episodes[:run.cfg.rl.logging.log_samples]):
        r, o = e.last, e.output
        if run.episodes is None:
            records.append({
                "step": step, "group": r.group, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
                "answer": r.row.get("answer"), "reward": o.score, "components": o.components, "error": o.error,
                "advantage": credit.advantages[first_row[i], 0].item() if i in first_row else None,
                "kept": i in first_row, "truncated": r.truncated, "policy_version": r.policy_version,
                **({"step_scores": o.step_scores} if o.step_scores is not None else {})})
            continue
        turn_adv = None
        if i in first_row:  # each turn's advantage on its first sampled token
            turn_adv = [credit.advantages[first_row[i] + k, next((t for t in range(a, b) if row.loss_mask[t]), a)]
                        .item() for k, row in enumerate(e.rows) for a, b in row.turns]
        records.append({"step": step, **episode_record(list(e.rows), o, turn_adv), "kept": i in first_row,
                        "policy_version": r.policy_version})
    return records


def log_step(run: Any, progress: Any, batch: Any, credit: Credit | None, stats: dict[str, float], *,
             timing: dict[str, float], evals: dict[str, float] | None = None) -> dict[str, float]:
    """Append step `progress.step`'s metrics to metrics.jsonl (`step_line`) and its rollouts to samples.jsonl
    (`sample_records`); returns the metrics."""
    metrics = step_line(run, progress, batch, credit, stats, timing=timing, evals=evals)
    run.rundir.log_metrics(progress.step, metrics)
    run.rundir.log_samples(sample_records(run, progress.step, batch, credit))
    return metrics
