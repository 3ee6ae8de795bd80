"""`python -m rewardlab.evaluation.hacks [SPEC ...]`: the hack probe table for reward specs (YAML each) and the
count of probes each passes."""

from __future__ import annotations

import sys

import yaml

from rewardlab.evaluation.hacks import DEFAULT_SPECS, probe_table, run_probes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    specs = [yaml.safe_load(a) for a in args] or list(DEFAULT_SPECS)
    results = [r for spec in specs for r in run_probes(spec)]
    print(probe_table(results))
    for label in dict.fromkeys(r.reward for r in results):
        mine = [r for r in results if r.reward == label]
        print(f"{label}: {sum(r.passed for r in mine)} of {len(mine)} probes passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
