"""Math reward throughput: rewardlab's `math` reward (process pool) vs math-verify called serially in one process.

    PYTHONPATH=src python benchmarks/rewards_math.py [--items 512] [--repeats 3] [--workers N] [--chunks 1,4,16]

Items are a realistic mix generated here (no downloads): reasoning-gym answers (basic_arithmetic,
fraction_simplification, decimal_arithmetic, polynomial_multiplication, polynomial_equations) plus generated
fractions, LaTeX expressions, sets and intervals. Each completion is a short chain of thought ending in
`\\boxed{...}`; about 60% state the reference in an equivalent but different form (1/2 as \\frac{1}{2} or 0.5,
1000 as 1,000, reordered polynomial terms, permuted sets), the rest a wrong answer.

Rows printed (median of `--repeats` runs, each run on a fresh item set so no cache is shared): items/s (wall clock)
and CPU ms per item (this process plus the pool's workers, and this process alone; on a busy machine the wall-clock
ratio is bounded by the CPU share the benchmark gets, while CPU per item shows whether the pool adds work):
  serial math-verify   verify(parse(gold), parse(completion)), math-verify defaults, in this process
  serial, same work    rewardlab's worker function (extracted answer only, same options) in this process
  rewardlab math       MathReward(workers=N, chunk_size=C) on the batch: one pool submission
The pool is started and warmed before timing (its start-up is printed separately). The ratio to the first row is
the issue's target (>= 1.7x on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import time
from fractions import Fraction

from math_verify import parse, verify

from rewardlab.rewards.executor import default_workers, shared_executor
from rewardlab.rewards.extract import extract_answer
from rewardlab.rewards.math import DEFAULT_EXTRACT, MathReward, _as_latex, verify_answer
from rewardlab.types import Rollout

RG_DATASETS = ["basic_arithmetic", "fraction_simplification", "decimal_arithmetic", "polynomial_multiplication",
               "polynomial_equations"]


def _latex_poly(expr: str) -> str:
    """sympy-style "-896*x**5 + 2240*x**4" -> LaTeX "-896x^{5} + 2240x^{4}", terms reversed (same polynomial)."""
    terms = expr.replace(" - ", " + -").split(" + ")
    out = []
    for t in reversed(terms):
        t = t.replace("**", "^").replace("*", "")
        if "^" in t:
            base, power = t.split("^", 1)
            t = f"{base}^{{{power}}}"
        out.append(t)
    return " + ".join(out).replace("+ -", "- ")


def _equivalent(answer: str, rng: random.Random) -> str:
    """The reference written differently but equal."""
    a = answer.strip("$ ")
    if "**" in a:
        return _latex_poly(a)
    if "," in a:  # a list of roots -> the same values in another order
        parts = [p.strip() for p in a.split(",")]
        rng.shuffle(parts)
        return ", ".join(parts)
    if "/" in a:
        f = Fraction(a)
        return rng.choice([f"\\frac{{{f.numerator}}}{{{f.denominator}}}",
                           f"\\frac{{{2 * f.numerator}}}{{{2 * f.denominator}}}"])
    if a.lstrip("-").isdigit() and abs(int(a)) >= 1000:
        return f"{int(a):,}"
    if a.lstrip("-").isdigit():
        return f"{a}.0"
    return a


def _wrong(answer: str, rng: random.Random) -> str:
    a = answer.strip("$ ")
    if "**" in a:
        return _latex_poly(a) + " + 1"
    if "," in a:
        return a.split(",")[0]
    if "/" in a:
        f = Fraction(a)
        return f"\\frac{{{f.numerator + 1}}}{{{f.denominator}}}"
    try:
        return str(float(a) + rng.choice([1, -1, 0.5]))
    except ValueError:
        return a + "+1"


def _generated(rng: random.Random) -> tuple[str, str, str]:
    """(reference, equivalent, wrong) for fractions, decimals, LaTeX expressions, sets and intervals."""
    kind = rng.randrange(5)
    if kind == 0:
        p, q = rng.randint(1, 99), rng.randint(2, 99)
        f = Fraction(p, q)
        latex = f"\\frac{{{f.numerator}}}{{{f.denominator}}}"
        return f"{f.numerator}/{f.denominator}", latex, f"{f.numerator + 1}/{f.denominator}"
    if kind == 1:
        p = rng.randint(1, 999)
        return f"{p}/8", f"{p / 8}", f"{p / 8 + 0.125}"
    if kind == 2:
        k, m = rng.randint(2, 9), rng.randint(2, 9)
        return f"{k}\\sqrt{{{m}}}", f"\\sqrt{{{k * k * m}}}", f"{k + 1}\\sqrt{{{m}}}"
    if kind == 3:
        xs = rng.sample(range(-20, 20), 3)
        ys = list(xs)
        rng.shuffle(ys)
        s = lambda v: "\\{" + ", ".join(map(str, v)) + "\\}"  # noqa: E731
        return s(xs), s(ys), s(xs[:2] + [xs[2] + 1])
    lo, hi = sorted(rng.sample(range(-50, 50), 2))
    return f"[{lo}, {hi})", f"[{lo},{hi})", f"({lo}, {hi})"


def make_items(n: int, seed: int) -> list[tuple[str, str]]:
    """n (reference, completion) pairs, about 60% equivalent answers."""
    import reasoning_gym

    rng = random.Random(seed)
    rg = {name: reasoning_gym.create_dataset(name, size=n, seed=seed) for name in RG_DATASETS}
    items = []
    for i in range(n):
        if i % 2 == 0:
            name = RG_DATASETS[(i // 2) % len(RG_DATASETS)]
            entry = rg[name][i]
            reference = entry["answer"]
            good, bad = _equivalent(reference, rng), _wrong(reference, rng)
            question = entry["question"][:200]
        else:
            reference, good, bad = _generated(rng)
            question = "Compute the value."
        answer = good if rng.random() < 0.6 else bad
        completion = (f"{question}\nLet me work through this step by step. First I rewrite the expression, then I "
                      f"simplify each part and combine the results carefully.\nTherefore the final answer is "
                      f"\\boxed{{{answer}}}.")
        items.append((reference, completion))
    return items


def serial_math_verify(items):
    # The bare reference goes in a \boxed{} (with Python powers as LaTeX) so math-verify reads all of it, as the
    # reward does; the completion is parsed whole, with math-verify's own extraction and signal.alarm timeouts.
    return [verify(parse(_as_latex(ref)), parse(completion)) for ref, completion in items]


def serial_same_work(items):
    options = {"float_rounding": 6, "numeric_precision": 15, "strict": True}
    out = []
    for ref, completion in items:
        found, _ = extract_answer(completion, DEFAULT_EXTRACT)
        out.append(found is not None and verify_answer((ref, found, options)))
    return out


def rollouts(items):
    return [Rollout(prompt="", prompt_ids=[0], completion=c, completion_ids=[0], logprobs=[0.0], row={"answer": r})
            for r, c in items]


def _cpu() -> tuple[float, float]:
    """(this process, its reaped children) CPU seconds, user + system."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--chunks", default="1,4,16")
    args = ap.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]

    print(f"python {sys.version.split()[0]}, {args.workers} workers, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    seeds = iter(range(1000, 10_000))
    serial_math_verify(make_items(32, next(seeds)))  # warm-up: imports, sympy's first-use costs
    pool = shared_executor(args.workers)

    rows: dict[str, list[tuple[float, float, float]]] = {}  # label -> [(items/s, CPU ms/item, this process's)]
    agree = []
    for _ in range(args.repeats):
        for label, fn in [("serial math-verify", serial_math_verify), ("serial, same work", serial_same_work)]:
            items = make_items(args.items, next(seeds))
            t, c = time.perf_counter(), _cpu()
            fn(items)
            wall, cpu = time.perf_counter() - t, sum(_cpu()) - sum(c)
            rows.setdefault(label, []).append((len(items) / wall, 1e3 * cpu / len(items), 1e3 * cpu / len(items)))
        for chunk in chunks:
            items = make_items(args.items, next(seeds))
            reward = MathReward(workers=args.workers, chunk_size=chunk, timeout=30)
            pool.close()  # a fresh pool per run, so its workers' CPU time is counted when they are reaped
            t0 = time.perf_counter()
            pool.map(verify_answer, [("1", "1", {})] * args.workers)  # start and warm the workers (not timed)
            start_s = time.perf_counter() - t0
            t, c = time.perf_counter(), _cpu()
            outs = reward(rollouts(items))
            wall = time.perf_counter() - t
            parent = _cpu()[0] - c[0]
            pool.close()
            cpu = sum(_cpu()) - sum(c)  # parent + workers
            rows.setdefault(f"rewardlab math, chunk_size={chunk}", []).append(
                (len(items) / wall, 1e3 * cpu / len(items), 1e3 * parent / len(items)))
            assert all(o.error is None for o in outs), [o.error for o in outs if o.error][:3]
        # agreement of the reward with plain math-verify on the same items (the last set)
        agree.append(sum(bool(x) == (o.score == 1.0) for x, o in zip(serial_math_verify(items), outs)) / len(items))
    print(f"pool start (fork {args.workers} workers, first item each): {start_s:.2f} s")
    base = statistics.median(r[0] for r in rows["serial math-verify"])
    print(f"{'':32s} {'items/s':>8s} {'vs serial math-verify':>22s} {'CPU ms/item':>12s} {'of which parent':>16s}")
    for label, values in rows.items():
        rate, cpu, own = (statistics.median(v[k] for v in values) for k in range(3))
        print(f"{label:32s} {rate:8.1f} {rate / base:21.2f}x {cpu:12.1f} {own:16.2f}")
    print(f"agreement with plain math-verify on the same items: {min(agree):.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
