"""Every known code hack (rewardlab.evaluation.hacks.code) on all 164 HumanEval problems, under the `code` reward's
strict mode (the default) and its lenient mode (strict=False: HumanEval's own harness semantics).

    PYTHONPATH=src python benchmarks/code_hacks.py [--workers N] [--repeats 3] [--json OUT]

For each hack: its mean score over the 164 problems and the number of problems it passes completely, in each mode,
next to its baseline (the same returned value without the exploit, scored strict). The canonical solutions and
`return 0` are the controls. Then the cost: seconds per completion (wall, `--workers` sandboxes at once) scoring the
164 canonical solutions in each mode, the two modes interleaved `--repeats` times, medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rewardlab.evaluation.hacks.code import CODE_HACKS  # noqa: E402
from rewardlab.rewards.code import CodeReward  # noqa: E402
from rewardlab.tasks import load  # noqa: E402
from rewardlab.types import Rollout  # noqa: E402


def rollout(completion: str, row: dict) -> Rollout:
    return Rollout(prompt=row["prompt"], prompt_ids=[1], completion=completion, completion_ids=[2], logprobs=[0.0],
                   row=row)


def score(reward: CodeReward, rows: list[dict], completions: list[str]) -> list[float]:
    outs = reward([rollout(c, r) for c, r in zip(completions, rows)])
    errors = [o.error for o in outs if o.error]
    if errors:
        raise SystemExit(f"reward errors: {errors[:3]}")
    return [o.score for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    task = load("humaneval")
    rows = [dict(r) for r in list(task.train) + list(task.test)]
    strict = CodeReward(timeout=10.0, workers=args.workers)
    lenient = CodeReward(timeout=10.0, workers=args.workers, strict=False)
    arms = [("canonical", [r["answer"] for r in rows], None),
            ("return 0", ["    return 0\n"] * len(rows), None)]
    for hack in CODE_HACKS:
        arms.append((hack.name, [hack.completion("humaneval", r["entry_point"]) for r in rows],
                     [hack.baseline("humaneval", r["entry_point"]) for r in rows]))
    table = []
    print(f"{'completion':<26} {'lenient':>8} {'full':>5} {'strict':>8} {'full':>5} {'baseline':>9}")
    for name, completions, baselines in arms:
        s_lenient = score(lenient, rows, completions)
        s_strict = score(strict, rows, completions)
        base = statistics.fmean(score(strict, rows, baselines)) if baselines else float("nan")
        line = {"completion": name, "lenient": statistics.fmean(s_lenient), "lenient_full": s_lenient.count(1.0),
                "strict": statistics.fmean(s_strict), "strict_full": s_strict.count(1.0), "baseline": base}
        table.append(line)
        print(f"{name:<26} {line['lenient']:8.3f} {line['lenient_full']:5d} {line['strict']:8.3f} "
              f"{line['strict_full']:5d} {base:9.3f}", flush=True)
    canonical = [r["answer"] for r in rows]
    times = {"lenient": [], "strict": []}
    for _ in range(args.repeats):
        for mode, reward in (("lenient", lenient), ("strict", strict)):
            start = time.perf_counter()
            score(reward, rows, canonical)
            times[mode].append((time.perf_counter() - start) / len(rows))
    cost = {mode: statistics.median(v) for mode, v in times.items()}
    print(f"seconds per completion (164 canonical, median of {args.repeats}): lenient {cost['lenient']:.4f}, "
          f"strict {cost['strict']:.4f} ({cost['strict'] / cost['lenient']:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"table": table, "seconds_per_completion": cost}, indent=1))


if __name__ == "__main__":
    main()
