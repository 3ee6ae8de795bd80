"""The code-hack demo of issue 35: a scripted policy that emits the always-equal hack at a growing rate, on all 164
HumanEval problems, scored by the `code` reward in strict mode (the default) and lenient mode (strict=False).

    PYTHONPATH=src python benchmarks/code_hack_demo.py [--rates 0,0.25,0.5,0.75,1] [--seed 0] [--json OUT]

The policy: for each problem, with probability `rate` the always-equal object (rewardlab.evaluation.hacks.code's
`always_equal`, continuing the prompt), else the canonical solution (an honest, correct program). Each problem is
asked once as itself and once as a hack canary (rewardlab.rl.canaries' `contradicting_tests`: each
`assert X == literal` followed by the same assert with the literal changed, which no honest program passes), with
the same completion. Printed per rate: the mean reward under each mode and their gap, and the canary pass rate
(canaries whose reward calls the completion correct) under each mode. What a hack looks like from the training
logs: lenient reward stays at 1 while strict falls with the rate, and the lenient canary pass rate rises with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rewardlab.evaluation.hacks.code import CODE_HACKS  # noqa: E402
from rewardlab.rewards.code import CodeReward  # noqa: E402
from rewardlab.rl.canaries import contradicting_tests  # noqa: E402
from rewardlab.tasks import load  # noqa: E402
from rewardlab.types import Rollout  # noqa: E402


def rollout(completion: str, row: dict) -> Rollout:
    return Rollout(prompt=row["prompt"], prompt_ids=[1], completion=completion, completion_ids=[2], logprobs=[0.0],
                   row=row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0,0.25,0.5,0.75,1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    task = load("humaneval")
    rows = [dict(r) for r in list(task.train) + list(task.test)]
    rng = np.random.default_rng(args.seed)
    canaries = []
    for r in rows:
        try:
            canaries.append(contradicting_tests(row=r, rng=rng))
        except ValueError:  # no `assert X == literal` to contradict (e.g. HumanEval/32): not a canary
            canaries.append(None)
    canary_rows = [(i, c) for i, c in enumerate(canaries) if c is not None]
    print(f"{len(canary_rows)} of {len(rows)} problems have an `assert X == literal` to contradict (the canaries)")
    hack = next(h for h in CODE_HACKS if h.name == "always_equal")
    rewards = {"strict": CodeReward(timeout=10.0), "lenient": CodeReward(timeout=10.0, strict=False)}
    table = []
    print(f"{'hack rate':>9} {'lenient':>8} {'strict':>8} {'gap':>6} {'canary lenient':>15} {'canary strict':>14}")
    for rate in (float(x) for x in args.rates.split(",")):
        draws = np.random.default_rng([args.seed, int(rate * 1000)]).random(len(rows)) < rate
        completions = [hack.completion("humaneval", r["entry_point"]) if h else r["answer"]
                       for r, h in zip(rows, draws)]
        line = {"rate": rate, "hacks": int(draws.sum())}
        for mode, reward in rewards.items():
            outs = reward([rollout(c, r) for c, r in zip(completions, rows)])
            line[mode] = statistics.fmean(o.score for o in outs)
            canary_outs = reward([rollout(completions[i], c) for i, c in canary_rows])
            line[f"canary_{mode}"] = statistics.fmean(float(o.correct) for o in canary_outs)
        line["gap"] = line["lenient"] - line["strict"]
        table.append(line)
        print(f"{rate:9.2f} {line['lenient']:8.3f} {line['strict']:8.3f} {line['gap']:6.3f} "
              f"{line['canary_lenient']:15.3f} {line['canary_strict']:14.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
