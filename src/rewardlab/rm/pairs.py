"""Preference pairs generated for reward-model training (`rewardlab rm pairs`), written in the pair row format of
`rewardlab.rm.data`: from a policy's samples judged by a verifier (a correct vs an incorrect completion of the same
question), or from a code task's canonical solution vs sandbox-confirmed failing mutants of it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardlab.types import Rollout

if TYPE_CHECKING:
    from rewardlab.policy.settings import SamplingSettings


def pairs_from_samples(
    completions: Sequence[str], correct: Sequence[bool], *, k: int, rng: random.Random
) -> list[tuple[str, str]]:
    """Up to `k` (chosen, rejected) pairs from one question's samples: a correct vs an incorrect completion.

    Duplicated texts count once. Pairs are drawn without repetition, uniformly from all correct x incorrect
    combinations (seeded by `rng`). Returns [] when the question has no correct or no incorrect completion.
    """
    good = list(dict.fromkeys(c for c, ok in zip(completions, correct) if ok))
    bad = list(dict.fromkeys(c for c, ok in zip(completions, correct) if not ok and c not in good))
    combos = [(g, b) for g in good for b in bad]
    rng.shuffle(combos)
    return combos[:k]


@dataclass(frozen=True)
class PairSettings:
    """How preference pairs are made from a policy's samples (`generate_pairs`).

    Attributes:
        pairs_per_question: (chosen, rejected) pairs of one question at most.
        subset: the pair rows' `subset` (e.g. the task's name).
        batch_size: questions per `generate` call.
        max_pairs: stop once this many pairs are made; None: every question.
        seed: seeds the draw of pairs among a question's correct x incorrect completions.
    """

    pairs_per_question: int
    subset: str
    batch_size: int = 64
    max_pairs: int | None = None
    seed: int = 0


def generate_pairs(
    policy: Any,
    rows: Sequence[dict[str, Any]],
    verifier: Callable[[Sequence[Rollout]], list],
    sampling: SamplingSettings,
    *,
    n: int,
    settings: PairSettings,
    on_batch: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Preference pairs from a policy and a verifier: for each question, sample `n` completions, verify them, and pair
    a correct with an incorrect completion of the same question (up to `settings.pairs_per_question` pairs).

    Args:
        policy: anything with `generate(prompts, n=, temperature=, top_p=, max_new_tokens=, rows=)` -> Rollouts
            (prompt-major, `n` per prompt), e.g. `rewardlab.policy.Policy`.
        rows: task rows with `prompt` (and whatever the verifier reads).
        verifier: a Reward; a completion is correct when its output is `correct`.
        sampling: `rewardlab.policy.SamplingSettings`: max_new_tokens, temperature, top_p of each completion
            (greedy, chunk and max_prompt_length are not read).
        n: completions sampled per question.
        settings: `PairSettings`: pairs_per_question, subset, batch_size, max_pairs, seed.
        on_batch: called after each batch with (questions done, running stats) (e.g. a progress bar).
    Returns:
        (pair rows in RewardBench format with the task `row` attached, stats: questions, samples, sample accuracy,
        questions with both outcomes, pairs).
    Raises:
        ValueError: what `policy.generate` and the verifier raise.
    """
    temperature, top_p, max_new_tokens = sampling.temperature, sampling.top_p, sampling.max_new_tokens
    pairs_per_question = settings.pairs_per_question
    rng = random.Random(settings.seed)

    def judge(chunk: list[dict[str, Any]]) -> list[tuple[list[tuple[str, str]], dict[str, int]]]:
        rollouts = policy.generate([r["prompt"] for r in chunk], n=n, temperature=temperature, top_p=top_p,
                                   max_new_tokens=max_new_tokens, rows=chunk)
        outputs = verifier(rollouts)
        out = []
        for q in range(len(chunk)):
            outs = outputs[q * n : (q + 1) * n]
            ok = [o.correct for o in outs]
            made = pairs_from_samples([r.completion for r in rollouts[q * n : (q + 1) * n]], ok, k=pairs_per_question,
                                      rng=rng)
            out.append((made, {"samples": n, "correct_samples": sum(ok), "mixed_questions": int(bool(made)),
                               "verifier_errors": sum(o.error is not None for o in outs)}))
        return out

    pairs, stats = _pairs_in_batches(
        rows, judge, {"samples": 0, "correct_samples": 0, "mixed_questions": 0, "verifier_errors": 0},
        subset=settings.subset, batch_size=settings.batch_size, max_pairs=settings.max_pairs, on_batch=on_batch,
    )
    stats["sample_accuracy"] = stats["correct_samples"] / max(1, stats["samples"])
    return pairs, stats


def _pairs_in_batches(
    rows: Sequence[dict[str, Any]],
    judge: Callable[[list[dict[str, Any]]], list[tuple[list[tuple[str, str]], dict[str, int]]]],
    counts: dict[str, int],
    *,
    subset: str,
    batch_size: int,
    max_pairs: int | None,
    on_batch: Callable[[int, dict[str, float]], None] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The loop of `generate_pairs` and `mutant_pairs`: `judge(chunk)` gives each row of a batch of `batch_size`
    rows its (chosen, rejected) texts and its counts (keys of `counts`). Rows are taken in order until `max_pairs`
    pairs are made; each count is summed over the rows taken, from its value in `counts`. Returns (pair rows,
    {"questions", **summed counts, "pairs"})."""
    pairs: list[dict[str, Any]] = []
    stats: dict[str, Any] = {"questions": 0, **counts}
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        for row, (made, row_counts) in zip(chunk, judge(chunk)):
            stats["questions"] += 1
            for key, value in row_counts.items():
                stats[key] += value
            pairs.extend({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected, "subset": subset,
                          "row": row} for chosen, rejected in made)
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
        if on_batch is not None:
            on_batch(len(chunk), {"pairs": float(len(pairs))})
        if max_pairs is not None and len(pairs) >= max_pairs:
            pairs = pairs[:max_pairs]
            break
    stats["pairs"] = len(pairs)
    return pairs, stats


def code_row_gap(row: dict[str, Any]) -> str:
    """What a task row lacks for canonical-vs-mutant pairs: "" when it has a canonical solution (`answer` or
    `canonical_solution`, a string) and tests the `code` reward runs (`test` + `entry_point`, or `tests`)."""
    if not isinstance(row.get("canonical_solution", row.get("answer")), str):
        return "a canonical solution ('answer' or 'canonical_solution')"
    if not ("test" in row and "entry_point" in row) and "tests" not in row:
        return "tests ('test' + 'entry_point', or 'tests')"
    return ""


def check_code_rows(rows: Sequence[dict[str, Any]]) -> None:
    """Raises ValueError `row I ('ID') has no ...` (see `code_row_gap`) for the first row unfit for `mutant_pairs`."""
    for i, row in enumerate(rows):
        gap = code_row_gap(row)
        if gap:
            raise ValueError(f"row {i} ({str(row.get('task_id', row.get('prompt', '')))[:40]!r}) has no {gap}")


def _canonical_vs_mutants(chunk: list[dict[str, Any]], *, reward: Any, seed: int, pairs_per_question: int,
                          sandbox: dict[str, int]) -> list[tuple[list[tuple[str, str]], dict[str, int]]]:
    """`mutant_pairs`' judgement of one batch of rows: per row, its (canonical, failing mutant) pairs and its counts
    (questions_no_failing_mutant, questions_fewer_mutants, canonical_failures). The canonical solutions run with
    `reward`; those that pass every test get `failing_variants`; `sandbox` counts the runs ("canonical" and
    `failing_variants`' stats)."""
    from rewardlab.rm.mutants import failing_variants

    canonical = [r.get("canonical_solution", r.get("answer")) for r in chunk]
    checked = reward.evaluate(chunk, canonical)
    sandbox["canonical"] += len(chunk)
    passing = [i for i, res in enumerate(checked) if not isinstance(res, str) and res.score == 1.0]
    found = failing_variants([chunk[i] for i in passing], seed=seed, limit=pairs_per_question, stats=sandbox)
    mutants = dict(zip(passing, found))
    return [([(canonical[i], m) for m in mutants.get(i, [])],
             {"questions_no_failing_mutant": int(i in mutants and not mutants[i]),
              "questions_fewer_mutants": int(0 < len(mutants.get(i, [])) < pairs_per_question),
              "canonical_failures": int(i not in mutants)})
            for i in range(len(chunk))]


def mutant_pairs(
    rows: Sequence[dict[str, Any]],
    *,
    pairs_per_question: int,
    subset: str,
    batch_size: int = 64,
    max_pairs: int | None = None,
    seed: int = 0,
    on_batch: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Preference pairs with no policy: a row's canonical solution (chosen) vs a single-point mutant of it that the
    sandbox confirms fails the row's tests (rejected), for HumanEval-style rows (Chen et al., 2021).

    Rows are taken `batch_size` at a time. In each batch the canonical solutions are first run with the `code`
    reward (defaults: timeout 10 s, test_timeout 3 s); a row whose canonical solution does not pass every test is
    skipped (`canonical_failures`). The others get up to `pairs_per_question` failing mutants from
    `rewardlab.rm.mutants.failing_variants(..., seed=seed, limit=pairs_per_question)` (a mutant counts only
    when a test fails by an assertion, an exception or at load, never by a timeout alone), one pair each, in
    mutation order. A row's pairs depend only on the row and `seed`, not on `batch_size`.

    Args:
        rows: task rows with a canonical solution (`answer` or `canonical_solution`) and tests (`test` +
            `entry_point`, HumanEval form, or `tests`); see `code_row_gap`.
        pairs_per_question: most pairs (distinct mutants) per row.
        subset: the pairs' `subset` field.
        batch_size: rows per sandbox round.
        max_pairs: stop once this many pairs are made.
        seed: mutation order seed.
        on_batch: called after each batch with (rows done, running stats) (e.g. a progress bar).
    Returns:
        (pair rows `{prompt, chosen, rejected, subset, row}` in RewardBench format with the task `row` attached,
        stats: questions, pairs, questions_no_failing_mutant, questions_fewer_mutants (some, but fewer than
        `pairs_per_question`), canonical_failures, sandbox_runs, and mutants_tried / _failing / _passing /
        _unconfirmed / _errors as `failing_variants` counts them).
    Raises:
        ValueError: a row lacks a canonical solution or tests (naming the row).
    """
    from rewardlab.rewards.code import CodeReward

    check_code_rows(rows)
    sandbox: dict[str, int] = {"canonical": 0}
    judge = functools.partial(_canonical_vs_mutants, reward=CodeReward(), seed=seed,
                              pairs_per_question=pairs_per_question, sandbox=sandbox)
    pairs, stats = _pairs_in_batches(
        rows, judge, {"questions_no_failing_mutant": 0, "questions_fewer_mutants": 0, "canonical_failures": 0},
        subset=subset, batch_size=batch_size, max_pairs=max_pairs, on_batch=on_batch,
    )
    stats["sandbox_runs"] = sandbox["canonical"] + sandbox.get("tried", 0)
    for key in ("tried", "failing", "passing", "unconfirmed", "errors"):
        stats[f"mutants_{key}"] = sandbox.get(key, 0)
    return pairs, stats
