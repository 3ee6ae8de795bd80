"""What a step writes: its metrics line (metrics.jsonl), its rollouts (samples.jsonl) and its rollouts file with
the per-token record of the first rl.logging.log_tokens episodes (rollouts/, completions/: rewardlab.rollout_log),
`log_step`."""

from __future__ import annotations

import time
from typing import Any

from rewardlab.envs.replay import episode_record
from rewardlab.rl.credit import Credit
from rewardlab.rollout_log import prompt_key, write_step


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


def first_rows(batch: Any, credit: Credit | None) -> dict[int, int]:
    """Index in `batch.episodes` of each kept episode -> the index of its first row in `credit.rows`."""
    first_row: dict[int, int] = {}
    if credit is not None:
        at = 0
        for i in batch.kept:
            first_row[i] = at
            at += len(batch.episodes[i].rows)
    return first_row


def sample_records(run: Any, step: int, batch: Any, credit: Credit | None) -> list[dict[str, Any]]:
    """The samples.jsonl lines of step `step`: every episode generated, or the first rl.logging.log_samples.

    A single completion's line holds its prompt, completion, answer, reward, components, error, advantage (on its
    first token), whether the loss saw it (kept), truncated and the policy version that sampled it. An environment
    task writes one line per episode, `rewardlab.envs.episode_record` (each row's ids, loss mask and behaviour
    log-probs, the turns, messages, tool calls, termination, reward, turn rewards and the advantage of each turn on
    its first sampled token, which `rewardlab.envs.replay` rebuilds) plus step, kept and policy_version.
    """
    first_row = first_rows(batch, credit)
    first_token = credit.advantages[:, 0].tolist() if credit is not None else []
    records = []
    for i, e in enumerate(batch.episodes[:run.cfg.rl.logging.log_samples]):
        r, o = e.last, e.output
        if run.episodes is None:
            records.append({
                "step": step, "group": r.group, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
                "answer": r.row.get("answer"), "reward": o.score, "components": o.components, "error": o.error,
                "advantage": first_token[first_row[i]] if i in first_row else None,
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


def _tokens_logged(run: Any, n_episodes: int) -> int:
    """How many of a step's episodes get per-token columns (rl.logging.log_tokens; 0 without log_completions)."""
    logging = run.cfg.rl.logging
    if not logging.log_completions:
        return 0
    return n_episodes if logging.log_tokens == "all" else min(int(logging.log_tokens), n_episodes)


def _turns(row: Any, decode: Any, advantages: list[float] | None) -> list[dict[str, Any]]:
    """The `turns` column of an episode's row: per model turn its span, the environment's reward, the advantage on
    its first sampled token (None when not trained on), its tool calls, and the text inserted after it (the tool
    results and the next observation, up to the next turn)."""
    out = []
    for k, (a, b) in enumerate(row.turns):
        end = row.turns[k + 1][0] if k + 1 < len(row.turns) else len(row.completion_ids)
        first = next((t for t in range(a, b) if row.loss_mask[t]), a)
        out.append({"span": [a, b], "reward": row.turn_rewards[k] if k < len(row.turn_rewards) else None,
                    "advantage": float(advantages[first]) if advantages is not None else None,
                    "tool_calls": list(row.tool_calls[k]) if k < len(row.tool_calls) else [],
                    "result": decode(row.completion_ids[b:end]) if end > b else ""})
    return out


def _token_columns(row: Any, output: Any, credit: Credit | None, at: int | None, decode: Any) -> dict[str, Any]:
    """The per-token columns of one row (`rewardlab.rollout_log`): what was sampled, and for a row trained on (`at`,
    its index in `credit.rows`) what the loss read and used, over the row's T completion tokens."""
    n = len(row.completion_ids)
    cols: dict[str, Any] = {"token_ids": list(row.completion_ids), "tokens": [decode([t]) for t in row.completion_ids],
                            "loss_mask": list(row.loss_mask), "logprob_old": [float(x) for x in row.logprobs]}
    if output.step_scores is not None and len(output.step_scores) == len(row.steps):
        cols["step_spans"] = [int(x) for span in row.steps for x in span]
        cols["step_scores"] = [float(x) for x in output.step_scores]
    if at is None:
        return cols
    cols["advantages"] = credit.advantages[at, :n].tolist()
    for name in ("logprob", "entropy", "ratio", "clip", "kl"):
        if name in credit.first_epoch:
            cols[name] = credit.first_epoch[name][at, :n].tolist()
    if credit.ref_logprobs is not None:
        cols["ref_logprob"] = credit.ref_logprobs[at, :n].tolist()
    return cols


def rollout_records(run: Any, step: int, batch: Any, credit: Credit | None) -> list[dict[str, Any]]:
    """The records of step `step`'s rollouts file (`rewardlab.rollout_log`): one per row of every episode the step
    generated, in `batch.episodes` order; the first rl.logging.log_tokens episodes with their per-token columns.

    The per-token advantages, log-probs, entropies, ratios, clip codes and KL terms are the tensors the update's
    loss read and computed in its first epoch (`Credit.advantages`, `Credit.first_epoch`), sliced to the row's
    completion length; a rollout not trained on (dropped by the group filter) has only what was sampled.
    """
    first_row = first_rows(batch, credit)
    tokens_for = _tokens_logged(run, len(batch.episodes))
    decode = run.policy.tokenizer.decode
    mean_adv: list[float] = []
    if credit is not None:  # each row's mean advantage over its sampled tokens, for every row at once
        mean_adv = ((credit.advantages * credit.sampled).sum(1) / credit.sampled.sum(1).clamp(min=1)).tolist()
    keys: dict[str, str] = {}
    records = []
    for i, e in enumerate(batch.episodes):
        o, last = e.output, e.last
        for k, row in enumerate(e.rows):
            at = first_row[i] + k if i in first_row else None
            version = row.policy_version
            if row.prompt not in keys:
                keys[row.prompt] = prompt_key(row.row, row.prompt)
            rec = {"episode": i, "row": k, "group": row.group, "prompt_key": keys[row.prompt],
                   "prompt": row.prompt, "completion": row.completion, "answer": row.row.get("answer"),
                   "reward": o.score, "components": o.components, "error": o.error,
                   "advantage": mean_adv[at] if at is not None else None,
                   "truncated": last.truncated, "kept": at is not None, "termination": last.termination,
                   "policy_version": version, "staleness": step - 1 - version if version is not None else None,
                   "num_tokens": len(row.completion_ids)}
            if row.episode_id is not None or row.tool_calls:
                adv = credit.advantages[at, :len(row.completion_ids)].tolist() if at is not None else None
                rec["turns"] = _turns(row, decode, adv)
            if i < tokens_for:
                rec.update(_token_columns(row, o, credit, at, decode))
            records.append(rec)
    return records


def log_step(run: Any, progress: Any, batch: Any, credit: Credit | None, stats: dict[str, float], *,
             timing: dict[str, float], evals: dict[str, float] | None = None) -> dict[str, float]:
    """Write step `progress.step`'s rollouts: samples.jsonl (`sample_records`) and, with rl.logging.log_completions,
    the rollouts and completions files (`rollout_records`, `rewardlab.rollout_log.write_step`); then append its
    metrics to metrics.jsonl (`step_line`, plus time/log_s: the seconds writing the rollouts took). Returns the
    metrics."""
    start = time.perf_counter()
    run.rundir.log_samples(sample_records(run, progress.step, batch, credit))
    if run.cfg.rl.logging.log_completions:
        write_step(run.rundir, progress.step, rollout_records(run, progress.step, batch, credit))
    metrics = step_line(run, progress, batch, credit, stats, timing=timing, evals=evals)
    metrics["time/log_s"] = time.perf_counter() - start
    run.rundir.log_metrics(progress.step, metrics)
    return metrics
