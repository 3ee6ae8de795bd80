"""Policy evaluation on held-out rows: greedy exact-match accuracy and unbiased pass@k."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewardlab.envs.sampling import (EpisodeSettings, count_metrics, episode_counts, episode_ends, episode_rows,
                                     sample_rollouts)
from rewardlab.policy import Policy
from rewardlab.rewards.base import Reward
from rewardlab.train_state import restore_rng_state, rng_state_record
from rewardlab.types import ProgressBar


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").

    pass@k = 1 - C(n - c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i) for stability.

    Args:
        n: samples drawn for the problem; c: how many were correct; k: budget.
    Returns:
        probability (0..1) that at least one of k samples drawn without replacement from the n is correct.
    Raises:
        ValueError: unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def evaluate_policy(
    policy: Policy,
    rows: Sequence[dict[str, Any]],
    reward: Reward,
    *,
    n: int = 8,
    ks: Sequence[int] = (1, 8),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 8,
    batch_size: int = 256,
    bar: ProgressBar | None = None,
    done: Sequence[Mapping[str, Any]] = (),
    on_batch: Callable[[dict[str, Any]], None] | None = None,
    episodes: EpisodeSettings | None = None,
    seed: int = 0,
    max_prompt_length: int | None = None,
) -> dict[str, Any]:
    """Greedy accuracy and pass@k of `policy` on `rows`, in batches of `batch_size` questions.

    Completions come from `rewardlab.envs.sample_rollouts`: single completions (`policy.generate`) when `episodes`
    is None, else whole episodes in `episodes.env` under its budgets (`max_new_tokens` per model turn), a greedy
    one per question and `n` sampled ones. The reward is called once per episode, on its last row
    (`episode_ends`: the final model turn is the completion it scores). Sampled episodes draw from the streams
    (seed, batch index, 0) (`sample_rollouts`): they do not depend on torch's generator (single completions draw
    from it). With `max_prompt_length` (single completions only), each prompt is cut to its last
    that many tokens (`Policy.generate`, TRL's left truncation).

    Each finished batch is handed to `on_batch` as a record {"batch", "start", "size", "correct" (greedy, per
    question), "scores" (greedy reward), "errors", "pass_counts" (correct samples per question), "examples",
    "predictions" (one per question, see Returns), "rng" (torch's RNG state after the batch, `rng_state_record`)}. Given the records of the first batches of an
    interrupted run (`done`), those batches are not generated again: their figures are taken from the records and
    the RNG state of the last one is restored, so the result equals an uninterrupted run's. With `n=0` (and no `ks`)
    only the greedy completions are generated: no sampling, so no random numbers are drawn (held-out evaluation
    during training, `rewardlab.evaluation.heldout`).

    Returns:
        {"accuracy": greedy exact-match fraction, "score_mean": mean greedy reward, "pass@k": ... for each k,
         "n_questions": len(rows), "samples_per_question": n, "errors": greedy reward errors,
         "examples": the first 20 greedy (prompt, completion, answer, correct), "predictions": one dict per row,
         in order: {"question", "answer", "prediction" (the greedy completion), "correct", "score", "error",
         "samples": the n sampled completions, each {"completion", "score", "correct", "error"}}}.
        With `episodes`, each prediction also holds the greedy episode's "messages" (its transcript), "termination",
        "turns" (model turns) and "tool_calls" (per model turn, the parsed calls with their status), and the result
        gains the greedy episodes' figures (`episode_figures`): "turns_mean", "termination" ({reason: fraction}),
        "tool_call_rate", "tool_calls_mean" and "tool_errors_mean".
    Raises:
        ValueError: a k outside 1..n, or no rows; a record in `done` that is not the batch at its position (the
            rows or batch size changed); what `sample_rollouts` raises (a prompt that fills the model's context
            window, `max_prompt_length` with `episodes`).
    """
    if not rows:
        raise ValueError("evaluate: no rows to evaluate")
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"eval.k: each k must be in 1..eval.n={n}, got {bad}")
    prompts = [r["prompt"] for r in rows]
    correct, scores, errors, examples, predictions, episode_stats = [], [], 0, [], [], []
    per_q = [0] * len(rows)
    for b, start in enumerate(range(0, len(rows), batch_size)):
        chunk_rows = rows[start : start + batch_size]
        chunk = prompts[start : start + batch_size]
        if b < len(done):  # finished before an interruption: take its record
            rec = done[b]
            if (rec.get("batch"), rec.get("start"), rec.get("size")) != (b, start, len(chunk)):
                raise ValueError(f"evaluate: the record of batch {b} (start {rec.get('start')}, size "
                                 f"{rec.get('size')}) does not match the run's batch {b} (start {start}, size "
                                 f"{len(chunk)})")
            if b == len(done) - 1:
                restore_rng_state(rec["rng"])
        else:
            rec = {"batch": b, "start": start, "size": len(chunk), "correct": [], "scores": [], "errors": 0,
                   "pass_counts": [0] * len(chunk), "examples": [], "predictions": []}
            stream = (seed, b, 0) if episodes is not None else None
            greedy_rows = sample_rollouts(policy, chunk_rows, episodes=episodes, greedy=True,
                                          max_new_tokens=max_new_tokens, stream=stream,
                                          max_prompt_length=max_prompt_length)
            greedy = episode_ends(greedy_rows)
            outs = reward(greedy)
            by_episode = episode_rows(greedy_rows) if episodes is not None else {}
            for r, o in zip(greedy, outs):
                ok = o.correct
                rec["correct"].append(ok)
                rec["scores"].append(o.score)
                rec["errors"] += o.error is not None
                if len(examples) + len(rec["examples"]) < 20:
                    rec["examples"].append({"prompt": r.row.get("prompt"), "completion": r.completion,
                                            "answer": r.row.get("answer"), "correct": ok})
                rec["predictions"].append({"question": r.row.get("prompt"), "answer": r.row.get("answer"),
                                           "prediction": r.completion, "correct": ok, "score": o.score,
                                           "error": o.error, "samples": []})
                if episodes is not None:
                    rec["predictions"][-1].update(messages=r.messages, **episode_summary(by_episode[id(r)]))
                    rec.setdefault("episodes", []).append(episode_counts(by_episode[id(r)]))
            if n > 0:
                sampled = episode_ends(sample_rollouts(
                    policy, chunk_rows, episodes=episodes, n=n, temperature=temperature, top_p=top_p,
                    max_new_tokens=max_new_tokens, stream=stream, max_prompt_length=max_prompt_length))
                for r, o in zip(sampled, reward(sampled)):
                    rec["pass_counts"][r.group] += o.correct
                    rec["predictions"][r.group]["samples"].append({"completion": r.completion, "score": o.score,
                                                                   "correct": o.correct, "error": o.error})
            if on_batch is not None:
                on_batch({**rec, "rng": rng_state_record()})
        correct += rec["correct"]
        scores += [float(x) for x in rec["scores"]]
        errors += rec["errors"]
        examples += rec["examples"]
        predictions += rec.get("predictions", [])
        episode_stats += rec.get("episodes", [])
        per_q[start : start + len(chunk)] = rec["pass_counts"]
        if bar is not None:
            bar.advance(len(chunk), acc=sum(correct) / len(correct))
    result: dict[str, Any] = {
        "accuracy": sum(correct) / len(correct),
        "score_mean": sum(scores) / len(scores),
        "n_questions": len(rows),
        "samples_per_question": n,
        "errors": errors,
    }
    for k in ks:
        result[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in per_q) / len(per_q)
    if episodes is not None:
        result.update(episode_figures(episode_stats))
    result["examples"] = examples
    result["predictions"] = predictions
    return result


def episode_summary(rows: Sequence[Any]) -> dict[str, Any]:
    """What a prediction records of one episode, given its rows (`episode_rows`; the last holds `termination`):
    {"termination", "turns" (model turns, all rows), "tool_calls" (per model turn, the parsed calls: name,
    arguments, status, seconds)}."""
    last = rows[-1]
    calls = [list(turn) for r in rows for turn in (r.tool_calls or [])]
    return {"termination": last.termination, "turns": last.first_turn + len(last.turns or []), "tool_calls": calls}


def episode_figures(counts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The episode figures of an evaluation, over E episodes (their `rewardlab.envs.episode_counts`; the
    definitions are `rewardlab.envs.count_metrics`'s, the ones training logs):
        turns_mean        mean model turns per episode
        termination       {reason: fraction of episodes that ended so} (reasons that occurred; they sum to 1)
        tool_call_rate    (model turns with a tool call) / (model turns), over all episodes; 0.0 with no turns
        tool_calls_mean   mean tool calls per episode
        tool_errors_mean  mean tool calls per episode whose status is an error (not ok or skipped_last_turn)
    Returns {} for no episodes."""
    m = count_metrics(list(counts))
    if not m:
        return {}
    prefix = "episode/termination/"
    return {"turns_mean": m["episode/turns_mean"],
            "termination": {k[len(prefix):]: v for k, v in sorted(m.items()) if k.startswith(prefix) and v},
            "tool_call_rate": m["tool/call_rate"], "tool_calls_mean": m["tool/calls_mean"],
            "tool_errors_mean": m["tool/errors_mean"]}


def describe_rows(n: int, total: int, split: str, spec: str) -> str:
    """"3 rows of jsonl:d.jsonl (split all: every row)": how many rows of which split a stage scored."""
    what = {"all": "every row", "train": "the training split", "test": "the held-out split"}.get(split, split)
    count = f"{n} row{'s' if n != 1 else ''}" if n == total else f"the first {n} of {total} rows"
    return f"{count} of {spec} (split {split}: {what})"
