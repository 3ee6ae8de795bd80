"""Search methods compared: accuracy against the sample budget N for each method, with pass@N and greedy
(`compare_methods`, which `rewardlab search` runs), and the accuracy-vs-N plot.

Best-of-N, majority and weighted majority are computed on nested prefixes of one pool of max(N) samples per
question (the first N samples for budget N), so their curves and pass@N come from the same samples. Beam search
and DVTS generate their own trees for each N (N >= M, M dividing N).

The work is done in units - greedy decoding, the sample pool (sampled, verified and scored), then one unit per
method and N - and each finished unit is appended to units.jsonl with what later units need and torch's RNG state
after it, so `--resume` after an interruption skips the finished units and writes the report an uninterrupted run
writes (but for wall-clock fields).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from rewardlab.policy import Policy, SamplingSettings
from rewardlab.registry import Registry
from rewardlab.rewards.base import Reward
from rewardlab.rewards.steps import final_answer
from rewardlab.search.base import Pool, SearchSettings, sample_solutions, score_solutions
from rewardlab.train_state import restore_rng_state, rng_state_record
from rewardlab.search.beam import beam, dvts
from rewardlab.search.best_of_n import best_of_n
from rewardlab.search.voting import EQUIVALENCES, VerifierEquivalence, Voting, majority, weighted_majority
from rewardlab.types import ProgressBar, Rollout

#: The methods `rewardlab search` can compare, in table order. Meta: `display` (name in tables and plots), `style`
#: (matplotlib marker and line style), `pool` (True: `fn(rows, samples, scores, n, equivalent) -> list[SearchResult]`
#: over the first N samples of the shared pool, `info["index"]` the chosen sample; False: a tree search
#: `fn(policy, rows, scorer, *, n, ...)` run afresh for each N), `scorer` (whether it calls the scorer).
METHODS: Registry = Registry("search method")


# Pool methods: each calls the library's public function on the first n pooled samples (and scores) of each row,
# so the report's figures are that function's figures.
@METHODS.register("best_of_n", display="best-of-N", style=("o", "-"), pool=True, scorer=True)
def _pool_best_of_n(rows, samples, scores, n, equivalent):
    return best_of_n(None, rows, None, n=n, pool=Pool(samples, scores))


@METHODS.register("majority", display="majority", style=("s", "-"), pool=True, scorer=False)
def _pool_majority(rows, samples, scores, n, equivalent):
    return majority(None, rows, n=n, voting=Voting(equivalent, final_answer), pool=Pool(samples))


@METHODS.register("weighted_majority", display="weighted majority", style=("x", "--"), pool=True, scorer=True)
def _pool_weighted_majority(rows, samples, scores, n, equivalent):
    return weighted_majority(None, rows, None, n=n, voting=Voting(equivalent, final_answer),
                             pool=Pool(samples, scores))


METHODS.register("beam", display="beam search", style=("^", "-"), pool=False, scorer=True)(beam)
METHODS.register("dvts", display="DVTS", style=("D", "-"), pool=False, scorer=True)(dvts)
POOL_METHODS = tuple(m for m in METHODS if METHODS.meta(m)["pool"])
TREE_METHODS = {m: METHODS[m] for m in METHODS if not METHODS.meta(m)["pool"]}


class _Memo:
    """An equivalence with its answers-pair results cached (votes over nested prefixes repeat comparisons)."""

    def __init__(self, equivalent) -> None:
        self.equivalent = equivalent
        self.cache: dict[tuple[str, str, int], bool] = {}

    def __call__(self, a: str, b: str, row=None) -> bool:
        key = (a, b, id(row))
        if key not in self.cache:
            self.cache[key] = self.equivalent(a, b, row)
        return self.cache[key]


def _correct(verifier, rollouts) -> list[bool]:
    return [o.correct for o in verifier(list(rollouts))] if rollouts else []


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def _enc(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # strict JSON: -inf (a failed score) as "-inf"


class Units:
    """The finished units of a search run: skipped on resume (their records returned), logged when new.

    Units are visited in the same order on every run; before the first unit that is not in `done`, torch's RNG
    state is restored from the last done unit visited, so the remaining units draw what they would have drawn.
    `log(record)` is called with each new unit's record ({"unit", ..., "rng"}; the CLI appends it to units.jsonl).
    """

    def __init__(self, log: Callable[[dict[str, Any]], None] | None = None,
                 done: Sequence[dict[str, Any]] = ()) -> None:
        self.log = log
        self.done = {rec["unit"]: rec for rec in done}
        self.pending_rng: dict[str, Any] | None = None

    def get(self, unit: str) -> dict[str, Any] | None:
        rec = self.done.get(unit)
        if rec is not None:
            self.pending_rng = rec["rng"]
        elif self.pending_rng is not None:
            restore_rng_state(self.pending_rng)
            self.pending_rng = None
        return rec

    def put(self, unit: str, data: dict[str, Any]) -> None:
        if self.log is not None:
            self.log({"unit": unit, **data, "rng": rng_state_record()})


class _NoBar:
    def advance(self, n: int = 1, **fields: float) -> None:
        pass


@contextmanager
def _no_stage(name: str, total: int) -> Iterator[ProgressBar]:
    yield _NoBar()


#: How many pooled samples `reads_reference` scores (twice) to tell whether a scorer reads the reference answer.
PROBE_SAMPLES = 16


def reads_reference(scorer: Reward, rollouts: Sequence[Rollout], *, field: str = "answer",
                    extract: Callable[[str], str] = final_answer) -> bool:
    """Whether `scorer` reads the rows' reference answer (`row[field]`), so that ranking by it is an oracle.

    Each rollout is scored twice: with `row[field]` set to the rollout's own final answer (`extract(completion)`),
    which an answer-checking verifier scores as right, and with it set to a string no completion gives. A scorer
    that does not read the field (a reward model, a step checker, a length rule) gives the same outputs (score,
    step scores, error or not) both times; any difference means it reads it.

    Args:
        rollouts: a few candidate solutions with their rows (e.g. `PROBE_SAMPLES` of the pool).
    Returns:
        True when any output differs between the two scorings.
    """
    if not rollouts:
        return False
    own = [dataclasses.replace(r, row={**r.row, field: extract(r.completion)}) for r in rollouts]
    other = [dataclasses.replace(r, row={**r.row, field: "\u2400no reference\u2400"}) for r in rollouts]
    a, b = scorer(own), scorer(other)
    return any((x.score, x.step_scores, x.error is None) != (y.score, y.step_scores, y.error is None)
               for x, y in zip(a, b))


def check_settings(settings: Any) -> None:
    """Fail fast on settings `compare_methods` cannot run.

    Raises:
        ValueError: one line naming the key: an unknown method or equivalence, or a budget below 1.
    """
    for m in settings.methods:
        try:
            METHODS.get(m)
        except ValueError as exc:
            raise ValueError(f"search.methods: {exc}") from None
    if settings.equivalence != "verifier" and settings.equivalence not in EQUIVALENCES:
        raise ValueError(f"search.equivalence: expected verifier, {', '.join(EQUIVALENCES)}; "
                         f"got {settings.equivalence!r}")
    if any(n < 1 for n in settings.n):
        raise ValueError(f"search.n: each budget must be >= 1, got {settings.n}")


@dataclasses.dataclass(frozen=True)
class _Comparison:
    """What every unit of `compare_methods` reads: its arguments, with `units` and `stage` filled in."""

    policy: Policy
    rows: Sequence[dict[str, Any]]
    verifier: Reward
    scorer: Reward
    settings: Any
    units: Units
    stage: Callable[[str, int], AbstractContextManager[ProgressBar]]

    def unit(self, unit: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`unit`'s record: the logged one when `units` has it, else `compute()`, logged."""
        rec = self.units.get(unit)
        if rec is None:
            rec = compute()
            self.units.put(unit, rec)
        return rec


@dataclasses.dataclass(frozen=True)
class _Pool:
    """The pool of max(N) samples per row as `compare_methods` reads it, from the pool unit's record.

    samples: rollouts per row (text only: a resumed run has their texts, not their token ids); scores: the scorer's
    aggregated scores per row and sample, or None when no selected pool method uses the scorer; correct: the
    verifier's verdict per row and sample; tokens: completion length (tokens) per row and sample.
    """

    samples: list[list[Rollout]]
    scores: list[list[float]] | None
    correct: list[list[bool]]
    tokens: list[list[int]]

    @classmethod
    def from_record(cls, rows: Sequence[dict[str, Any]], rec: dict[str, Any], need_scores: bool) -> _Pool:
        samples = [[Rollout(prompt=str(row.get("prompt", "")), prompt_ids=[], completion=c, completion_ids=[],
                            logprobs=[], row=row, group=i) for c in g]
                   for i, (row, g) in enumerate(zip(rows, rec["completions"]))]
        scores = [[float(x) for x in g] for g in rec["scores"]] if need_scores else None
        return cls(samples, scores, rec["correct"], rec["tokens"])


def _search_settings(s: Any) -> SearchSettings:
    """What every search method reads besides its sampling settings, from the `search` section `s`."""
    return SearchSettings(separator=s.separator, batch_size=s.batch_size, aggregate=s.aggregate)


def _greedy_unit(c: _Comparison) -> dict[str, Any]:
    """Greedy decoding, the floor: {"correct", "tokens" (per row), "greedy_s"}."""
    s = c.settings
    t0 = time.perf_counter()
    greedy = [g[0] for g in sample_solutions(c.policy, c.rows, SamplingSettings(max_new_tokens=s.max_new_tokens,
                                             greedy=True), n=1, search=_search_settings(s))]
    return {"correct": _correct(c.verifier, greedy), "tokens": [len(r.completion_ids) for r in greedy],
            "greedy_s": time.perf_counter() - t0}


def _pool_unit(c: _Comparison, n_max: int, need_scores: bool) -> dict[str, Any]:
    """`n_max` samples per row, verified (and scored when `need_scores`): {"completions", "tokens", "correct" (per
    row and sample), "pool_sampling_s"[, "scores" (aggregated, -inf as "-inf"), "pool_scoring_s"]}."""
    s, rows = c.settings, c.rows
    t0 = time.perf_counter()
    with c.stage("sampling", len(rows)) as bar:
        pool = sample_solutions(c.policy, rows, SamplingSettings(max_new_tokens=s.max_new_tokens,
                                temperature=s.temperature, top_p=s.top_p), n=n_max, search=_search_settings(s))
        bar.advance(len(rows))
    flat = [r for g in pool for r in g]
    correct_flat = _correct(c.verifier, flat)
    rec = {"completions": [[r.completion for r in g] for g in pool],
           "tokens": [[len(r.completion_ids) for r in g] for g in pool],
           "correct": [correct_flat[i * n_max : (i + 1) * n_max] for i in range(len(rows))],
           "pool_sampling_s": time.perf_counter() - t0}
    if need_scores:
        t0 = time.perf_counter()
        scores_flat = score_solutions(c.scorer, flat, s.aggregate)
        rec["scores"] = [[_enc(x) for x in scores_flat[i * n_max : (i + 1) * n_max]] for i in range(len(rows))]
        rec["pool_scoring_s"] = time.perf_counter() - t0
    return rec


def _select_cell(m: str, rows: Sequence[dict[str, Any]], pool: _Pool, n: int, equivalent: _Memo, pass_at_n: float,
                 tokens: float) -> dict[str, Any]:
    """Pool method `m` on the first `n` pooled samples: {"result": {"accuracy", "ceiling" (pass@n),
    "tokens_per_question", "scorer_calls_per_question", "select_s"}}."""
    t0 = time.perf_counter()
    select, uses_scorer = METHODS[m], METHODS.meta(m)["scorer"]
    out = select(rows, pool.samples, pool.scores if uses_scorer else None, n, equivalent)
    hits = [pool.correct[i][r.info["index"]] for i, r in enumerate(out)]
    return {"result": {"accuracy": _mean(hits), "ceiling": pass_at_n, "tokens_per_question": tokens,
                       "scorer_calls_per_question": float(n) if uses_scorer else 0.0,
                       "select_s": time.perf_counter() - t0}}


def _pool_method_cells(c: _Comparison, pool: _Pool, ns: list[int], equivalent: _Memo,
                       results: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Each selected pool method at each budget into `results[method][str(N)]`; returns pass@N by str(N)."""
    pass_at = {}
    for n in ns:
        pass_at[str(n)] = _mean(any(x[:n]) for x in pool.correct)
        tokens = _mean(sum(g[:n]) for g in pool.tokens)
        for m in (m for m in POOL_METHODS if m in c.settings.methods):
            cell = c.unit(f"{m}:{n}", lambda: _select_cell(m, c.rows, pool, n, equivalent, pass_at[str(n)], tokens))
            results[m][str(n)] = cell["result"]
    return pass_at


def _tree_cell(c: _Comparison, m: str, n: int) -> dict[str, Any]:
    """Tree method `m` (beam or DVTS) run afresh at budget `n`: {"result": {"accuracy", "ceiling" (fraction of rows
    with a correct finished solution among its own trees), "tokens_per_question", "scorer_calls_per_question",
    "wall_s"}}."""
    s = c.settings
    t0 = time.perf_counter()
    step = SamplingSettings(max_new_tokens=s.max_step_tokens, temperature=s.temperature, top_p=s.top_p)
    out = TREE_METHODS[m](c.policy, c.rows, c.scorer, step, n=n, beam_width=s.beam_width, max_steps=s.max_steps,
                          search=_search_settings(s))
    hits = _correct(c.verifier, [r.best for r in out])
    flat = _correct(c.verifier, [x for r in out for x in r.candidates])  # one verifier batch
    ends = list(itertools.accumulate(len(r.candidates) for r in out))
    reachable = [any(flat[e - len(r.candidates) : e]) for r, e in zip(out, ends)]  # own candidates
    return {"result": {"accuracy": _mean(hits), "ceiling": _mean(reachable),
                       "tokens_per_question": _mean(r.tokens for r in out),
                       "scorer_calls_per_question": _mean(r.scorer_calls for r in out),
                       "wall_s": time.perf_counter() - t0}}


def _tree_method_cells(c: _Comparison, ns: list[int], results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Each selected tree method at each budget N >= beam_width that beam_width divides into `results`."""
    s = c.settings
    for m in (m for m in TREE_METHODS if m in s.methods):
        budgets = [n for n in ns if n >= s.beam_width and n % s.beam_width == 0]
        with c.stage(m, len(budgets)) as bar:
            for n in budgets:
                cell = c.unit(f"{m}:{n}", lambda: _tree_cell(c, m, n))
                results[m][str(n)] = cell["result"]
                bar.advance(1, acc=cell["result"]["accuracy"])


def compare_methods(
    policy: Policy,
    rows: Sequence[dict[str, Any]],
    verifier: Reward,
    scorer: Reward,
    settings: Any,
    *,
    units: Units | None = None,
    stage: Callable[[str, int], AbstractContextManager[ProgressBar]] = _no_stage,
) -> dict[str, Any]:
    """Every method in `settings.methods` at every budget in `settings.n` on `rows`, with greedy and pass@N.

    Greedy decoding is the floor. Best-of-N, majority and weighted majority (`POOL_METHODS`) each call their public
    function (`best_of_n`, `majority`, `weighted_majority`) on the first N samples of one pool of max(N) samples per
    question, so their curves and pass@N come from the same samples; beam search and DVTS (`beam`, `dvts`) run a
    fresh tree search for each N >= beam_width that beam_width divides. Correctness is always `verifier`'s
    (`RewardOutput.correct`); `scorer` only ranks candidates (scores aggregated over reasoning steps with
    `settings.aggregate`). With `units`, finished units are skipped and new ones logged (see `Units`). `stage(name,
    total)` gives a progress bar per stage.

    Args:
        settings: a `SearchParams` (methods, n, equivalence, temperature, top_p, max_new_tokens, separator,
            batch_size, beam_width, max_steps, aggregate, max_step_tokens).
    Returns:
        {"questions", "scorer_reads_answer" (`reads_reference`: ranking by the scorer is then an oracle, and
         best-of-N is pass@N), "settings", "greedy": {"accuracy", "tokens_per_question"}, "pass@N": {N: fraction
         of rows with a correct sample among the pool's first N}, "methods": {method: {N: {"accuracy", "ceiling"
         (fraction of rows with a correct solution among the candidates the method chose from: pass@N for the pool
         methods, the finished solutions of its own trees for beam and DVTS), "tokens_per_question",
         "scorer_calls_per_question", seconds}}}, "timing_s": {...}}; accuracies are fractions of `rows`.
    """
    s = settings
    check_settings(s)
    c = _Comparison(policy, rows, verifier, scorer, s, units if units is not None else Units(), stage)
    ns = sorted(set(s.n))
    equivalent = _Memo(VerifierEquivalence(verifier) if s.equivalence == "verifier" else EQUIVALENCES[s.equivalence])
    greedy = c.unit("greedy", lambda: _greedy_unit(c))
    n_max = max(ns)  # one pool of max(N) samples per question for pass@N and the selection methods
    need_scores = any(m in s.methods and METHODS.meta(m)["scorer"] for m in POOL_METHODS)
    pool_rec = c.unit("pool", lambda: _pool_unit(c, n_max, need_scores))
    timing = {"greedy_s": greedy["greedy_s"], "pool_sampling_s": pool_rec["pool_sampling_s"]}
    if need_scores:
        timing["pool_scoring_s"] = pool_rec["pool_scoring_s"]
    pool = _Pool.from_record(rows, pool_rec, need_scores)
    results: dict[str, dict[str, dict[str, float]]] = {m: {} for m in s.methods}
    pass_at = _pool_method_cells(c, pool, ns, equivalent, results)
    _tree_method_cells(c, ns, results)
    probe = [g[j] for j in range(n_max) for g in pool.samples][:PROBE_SAMPLES]
    return {
        "questions": len(rows),
        "scorer_reads_answer": scorer is verifier or reads_reference(scorer, probe),
        "settings": s.model_dump(),
        "greedy": {"accuracy": _mean(greedy["correct"]), "tokens_per_question": _mean(greedy["tokens"])},
        "pass@N": pass_at,
        "methods": results,
        "timing_s": timing,
    }


def plot_report(report: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against N (log2 x axis) for each method, pass@N (dashed) and greedy (dotted) as reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    ns = sorted(int(n) for n in report["pass@N"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(ns, [100 * report["pass@N"][str(n)] for n in ns], "k--", label="pass@N of the pool (ceiling of the "
            "selection methods)")
    ax.axhline(100 * report["greedy"]["accuracy"], color="gray", ls=":", label="greedy (floor)")
    for m, per_n in report["methods"].items():
        pts = sorted((int(n), v["accuracy"]) for n, v in per_n.items())
        if pts:  # own marker and line style per method, so coinciding curves stay visible
            marker, ls = METHODS.meta(m)["style"]
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=marker, ls=ls, ms=5, mfc="none",
                    label=METHODS.meta(m)["display"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("N (samples / beams per question)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_title(f"{report['task']}: {report['questions']} questions, scorer {report['scorer']}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
