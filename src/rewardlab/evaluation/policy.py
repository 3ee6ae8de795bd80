"""Policy evaluation on held-out rows: greedy exact-match accuracy and unbiased pass@k."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rewardlab.envs.sampling import (EpisodeSettings, count_metrics, episode_counts, episode_ends, episode_rows,
                                     sample_rollouts)
from rewardlab.policy import Policy, SamplingSettings
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


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation computes.

    Attributes:
        n: sampled completions (episodes) per question for pass@k; 0: greedy only, no random numbers drawn.
        ks: the budgets k of pass@k, each in 1..n.
        batch_size: questions per batch (one greedy and one sampled `sample_rollouts` call each).
        seed: the first entry of the sampled episodes' random streams (seed, batch index, 0).
    """

    n: int = 8
    ks: Sequence[int] = (1, 8)
    batch_size: int = 256
    seed: int = 0


@dataclass(frozen=True)
class EvalProgress:
    """Where an evaluation stands and whom it tells: the resume bookkeeping, apart from the computation.

    Attributes:
        done: the batch records of the first batches of an interrupted run (what `on_batch` was given): those
            batches are not generated again, and torch's RNG state of the last one is restored.
        on_batch: called with each newly finished batch's record (e.g. appended to batches.jsonl).
        bar: advanced by each batch's questions (with the running accuracy); None: no bar.
    """

    done: Sequence[Mapping[str, Any]] = ()
    on_batch: Callable[[dict[str, Any]], None] | None = None
    bar: ProgressBar | None = None


def evaluate_policy(policy: Policy, rows: Sequence[dict[str, Any]], reward: Reward, sampling: SamplingSettings, *,
                    settings: EvalSettings = EvalSettings(), episodes: EpisodeSettings | None = None,
                    progress: EvalProgress = EvalProgress()) -> dict[str, Any]:
    """Greedy accuracy and pass@k of `policy` on `rows`, in batches of `settings.batch_size` questions.

    Completions come from `rewardlab.envs.sample_rollouts`: single completions when `episodes` is None, else whole
    episodes, a greedy one per question and `settings.n` sampled ones. The reward is called once per episode, on
    its last row (`episode_ends`). Sampled episodes draw from the streams (seed, batch index, 0), not from torch's
    generator (single completions draw from it).

    Each finished batch's record (`evaluate_batch`, with "rng": torch's RNG state after it) goes to
    `progress.on_batch`; the batches of an interrupted run's records (`progress.done`) are not generated again
    (`resumed_record`), so the result equals an uninterrupted run's. With `settings.n=0` (and no `ks`) only the
    greedy completions are generated: no random numbers are drawn (held-out evaluation during training).

    Args:
        policy, rows, reward: the `Policy` (or an object with its `generate` / `sample_ids`), the questions (task
            rows) and the verifier, whose `correct` decides accuracy and pass@k.
        sampling: `rewardlab.policy.SamplingSettings`: max_new_tokens (per completion, or per model turn of an
            episode), temperature and top_p (of the sampled completions; the greedy ones use argmax),
            max_prompt_length (single completions only: each prompt cut to its last that many tokens,
            `Policy.generate`'s left truncation); greedy and chunk are not read.
        settings: `EvalSettings`: n, ks, batch_size, seed.
        episodes: the environment and its budgets (`rewardlab.envs.EpisodeSettings`); None: single completions.
        progress: `EvalProgress`: done (records to resume from), on_batch (told each new record), bar.
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
        ValueError: a k outside 1..n, or no rows; a record in `progress.done` that is not the batch at its position
            (the rows or batch size changed); what `sample_rollouts` raises (a prompt that fills the model's context
            window, `max_prompt_length` with `episodes`).
    """
    if not rows:
        raise ValueError("evaluate: no rows to evaluate")
    n, size = settings.n, settings.batch_size
    bad = [k for k in settings.ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"eval.k: each k must be in 1..eval.n={n}, got {bad}")
    totals = _Totals(len(rows))
    for b, start in enumerate(range(0, len(rows), size)):
        chunk_rows = rows[start : start + size]
        if b < len(progress.done):  # finished before an interruption: take its record
            rec = resumed_record(progress.done, b, start, len(chunk_rows))
        else:
            rec = evaluate_batch(policy, chunk_rows, reward, sampling, settings=settings, episodes=episodes,
                                 where=(b, start), examples=20 - len(totals.examples))
            if progress.on_batch is not None:
                progress.on_batch({**rec, "rng": rng_state_record()})
        totals.add(rec)
        if progress.bar is not None:
            progress.bar.advance(len(chunk_rows), acc=sum(totals.correct) / len(totals.correct))
    return totals.result(n, settings.ks, episodes is not None)


def resumed_record(done: Sequence[Mapping[str, Any]], b: int, start: int, size: int) -> Mapping[str, Any]:
    """The record of batch `b` (questions start..start+size) of an interrupted evaluation, from `done` (the
    records it wrote); for its last record, torch's RNG state after it is restored, so the next batch draws what
    it would have drawn.

    Raises:
        ValueError: a record whose batch, start or size differ (the rows or batch size changed).
    """
    rec = done[b]
    if (rec.get("batch"), rec.get("start"), rec.get("size")) != (b, start, size):
        raise ValueError(f"evaluate: the record of batch {b} (start {rec.get('start')}, size {rec.get('size')}) "
                         f"does not match the run's batch {b} (start {start}, size {size})")
    if b == len(done) - 1:
        restore_rng_state(rec["rng"])
    return rec


def evaluate_batch(policy: Policy, rows: Sequence[dict[str, Any]], reward: Reward, sampling: SamplingSettings, *,
                   settings: EvalSettings, episodes: EpisodeSettings | None, where: tuple[int, int],
                   examples: int) -> dict[str, Any]:
    """One batch of `evaluate_policy`: its record, the greedy completion of each row scored, then, with
    settings.n > 0, the n sampled ones counted per row for pass@k. The record: {"batch", "start", "size",
    "correct" (greedy, per question), "scores" (greedy reward), "errors", "pass_counts" (correct samples per
    question), "examples", "predictions" (one per question, see `evaluate_policy`'s Returns)}, and with episodes
    "episodes" (each greedy episode's `episode_counts`).

    Args:
        policy, rows, reward, sampling, settings, episodes: as in `evaluate_policy` (rows: the batch's).
        where: (batch index, index of rows[0] among all rows).
        examples: how many greedy examples the record may still keep (the result keeps the first 20).
    Raises:
        ValueError: what `sample_rollouts` raises.
    """
    b, start = where
    rec: dict[str, Any] = {"batch": b, "start": start, "size": len(rows), "correct": [], "scores": [], "errors": 0,
                           "pass_counts": [0] * len(rows), "examples": [], "predictions": []}
    stream = (settings.seed, b, 0) if episodes is not None else None
    greedy_sampling = SamplingSettings(max_new_tokens=sampling.max_new_tokens, greedy=True,
                                       max_prompt_length=sampling.max_prompt_length)
    greedy_rows = sample_rollouts(policy, rows, greedy_sampling, episodes=episodes, stream=stream)
    greedy = episode_ends(greedy_rows)
    by_episode = episode_rows(greedy_rows) if episodes is not None else {}
    for r, o in zip(greedy, reward(greedy)):
        ok = o.correct
        rec["correct"].append(ok)
        rec["scores"].append(o.score)
        rec["errors"] += o.error is not None
        if len(rec["examples"]) < examples:
            rec["examples"].append({"prompt": r.row.get("prompt"), "completion": r.completion,
                                    "answer": r.row.get("answer"), "correct": ok})
        rec["predictions"].append({"question": r.row.get("prompt"), "answer": r.row.get("answer"),
                                   "prediction": r.completion, "correct": ok, "score": o.score, "error": o.error,
                                   "samples": []})
        if episodes is not None:
            rec["predictions"][-1].update(messages=r.messages, **episode_summary(by_episode[id(r)]))
            rec.setdefault("episodes", []).append(episode_counts(by_episode[id(r)]))
    if settings.n > 0:
        sampled = episode_ends(sample_rollouts(policy, rows, replace(sampling, greedy=False), episodes=episodes,
                                               n=settings.n, stream=stream))
        for r, o in zip(sampled, reward(sampled)):
            rec["pass_counts"][r.group] += o.correct
            rec["predictions"][r.group]["samples"].append({"completion": r.completion, "score": o.score,
                                                           "correct": o.correct, "error": o.error})
    return rec


class _Totals:
    """The batch records of an evaluation summed up, in batch order."""

    def __init__(self, questions: int) -> None:
        self.correct: list[bool] = []
        self.scores: list[float] = []
        self.errors = 0
        self.examples: list[dict[str, Any]] = []
        self.predictions: list[dict[str, Any]] = []
        self.episodes: list[Mapping[str, Any]] = []
        self.pass_counts = [0] * questions

    def add(self, rec: Mapping[str, Any]) -> None:
        self.correct += rec["correct"]
        self.scores += [float(x) for x in rec["scores"]]
        self.errors += rec["errors"]
        self.examples += rec["examples"]
        self.predictions += rec.get("predictions", [])
        self.episodes += rec.get("episodes", [])
        self.pass_counts[rec["start"] : rec["start"] + rec["size"]] = rec["pass_counts"]

    def result(self, n: int, ks: Sequence[int], episodes: bool) -> dict[str, Any]:
        """`evaluate_policy`'s result (see its Returns)."""
        per_q = self.pass_counts
        result: dict[str, Any] = {"accuracy": sum(self.correct) / len(self.correct),
                                  "score_mean": sum(self.scores) / len(self.scores), "n_questions": len(per_q),
                                  "samples_per_question": n, "errors": self.errors}
        for k in ks:
            result[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in per_q) / len(per_q)
        if episodes:
            result.update(episode_figures(self.episodes))
        result["examples"] = self.examples
        result["predictions"] = self.predictions
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
