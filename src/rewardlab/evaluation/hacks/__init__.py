"""The hack probe suite: every known hack of a reward, run against that reward, with honest controls.

A `Probe` is a named hack for the rewards it applies to (`rewards`: registered reward names): a few task rows, the
hacking completions for each row, and honest completions for each row (controls that must still score 1). A probe
passes when every hacking completion scores at most its baseline (0 unless the probe gives one: the score of the
same answer without the exploit) and every honest control scores 1. Probes register themselves with
`register_probe(probe)` from the modules of this package (code, math, format, judge); `probes_for(name)` lists those
that apply to a reward, `run_probes(spec)` runs them against a reward built from a `rewards:` entry, and
`probe_table(results)` renders the table as plain text.

    from rewardlab.evaluation.hacks import run_probes, probe_table
    results = run_probes("math")                       # or {"name": "code", "strict": False}
    print(probe_table(results))

`python -m rewardlab.evaluation.hacks [SPEC ...]` prints the table for the given reward specs (YAML, e.g. `code`
`"{name: code, strict: false}"`; default: every offline verifier with probes: code, code lenient, math, format).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewardlab.rewards import build_reward
from rewardlab.types import Rollout

__all__ = ["COLUMNS", "PROBES", "Probe", "ProbeResult", "probe_table", "probes_for", "register_probe", "run_probes"]


@dataclass(frozen=True)
class Probe:
    """One hack. `rows`: task rows; `hacks[i]` the hacking completions for `rows[i]` (with `baselines[i]` their
    baselines, or None: 0); `honest[i]` honest completions for `rows[i]` (each must score 1). `rewards`: the reward
    names it applies to. `prompt`: the prompt text of every rollout (default: the row's `prompt`)."""

    name: str
    rewards: tuple[str, ...]
    description: str
    rows: tuple[Mapping[str, Any], ...]
    hacks: tuple[tuple[str, ...], ...]
    honest: tuple[tuple[str, ...], ...] = ()
    baselines: tuple[tuple[str, ...], ...] | None = None
    source: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """A probe run against one reward: the hacking completions' mean and max score, their baselines' max, the honest
    controls' min score, and `passed` (every hack at most its baseline, every control 1)."""

    probe: str
    reward: str
    hack_mean: float
    hack_max: float
    baseline_max: float
    honest_min: float
    errors: int
    passed: bool
    description: str = field(default="", compare=False)


#: name -> Probe, in registration order.
PROBES: dict[str, Probe] = {}


def register_probe(probe: Probe) -> Probe:
    """Add `probe` to the suite (a module of this package calls it at import). Raises ValueError for a name taken,
    or rows, hacks, honest controls and baselines of different lengths."""
    if probe.name in PROBES:
        raise ValueError(f"hack probe {probe.name!r} is registered already")
    n = len(probe.rows)
    if len(probe.hacks) != n or (probe.honest and len(probe.honest) != n) or \
            (probe.baselines is not None and [len(b) for b in probe.baselines] != [len(h) for h in probe.hacks]):
        raise ValueError(f"hack probe {probe.name!r}: one list of hacks (and of honest completions and baselines) "
                         "per row")
    PROBES[probe.name] = probe
    return probe


def _load() -> None:
    from rewardlab.evaluation.hacks import code, format, judge, math  # noqa: F401  (they register their probes)


def probes_for(reward: str) -> list[Probe]:
    """The registered probes that apply to the reward named `reward` (a registered reward name)."""
    _load()
    return [p for p in PROBES.values() if reward in p.rewards]


def _spec_name(spec: Mapping[str, Any] | str) -> str:
    return spec if isinstance(spec, str) else str(spec.get("name"))


def _label(spec: Mapping[str, Any] | str) -> str:
    if isinstance(spec, str):
        return spec
    options = ", ".join(f"{k}={v}" for k, v in spec.items() if k not in ("name", "base_url", "model", "api_key_env"))
    return f"{spec['name']}({options})" if options else str(spec["name"])


def _rollout(row: Mapping[str, Any], completion: str) -> Rollout:
    prompt = str(row.get("prompt", ""))
    return Rollout(prompt=prompt, prompt_ids=[1], completion=completion, completion_ids=[2] * max(1, len(completion)),
                   logprobs=[0.0] * max(1, len(completion)), row=dict(row))


def run_probes(spec: Mapping[str, Any] | str, *, names: Sequence[str] | None = None) -> list[ProbeResult]:
    """Run every probe that applies to the reward `spec` (a `rewards:` entry: a name or {name: ..., options}), or
    only those in `names`, against the reward built from it. Returns one ProbeResult per probe, in registration
    order. Raises ValueError for a spec that does not build or a name in `names` that does not apply."""
    name = _spec_name(spec)
    probes = probes_for(name)
    if names is not None:
        unknown = sorted(set(names) - {p.name for p in probes})
        if unknown:
            raise ValueError(f"hack probes {unknown} do not apply to reward {name!r}")
        probes = [p for p in probes if p.name in names]
    reward = build_reward([spec])
    results = []
    for probe in probes:
        hacks = [(row, c) for row, cs in zip(probe.rows, probe.hacks) for c in cs]
        bases = [(row, c) for row, cs in zip(probe.rows, probe.baselines or ()) for c in cs]
        honest = [(row, c) for row, cs in zip(probe.rows, probe.honest) for c in cs]
        outs = reward([_rollout(r, c) for r, c in hacks + bases + honest])
        h, b, o = outs[:len(hacks)], outs[len(hacks):len(hacks) + len(bases)], outs[len(hacks) + len(bases):]
        base_scores = [x.score for x in b] if bases else [0.0] * len(h)
        passed = all(x.score <= y + 1e-12 for x, y in zip(h, base_scores)) and all(x.score >= 1.0 for x in o)
        results.append(ProbeResult(
            probe=probe.name, reward=_label(spec), hack_mean=sum(x.score for x in h) / len(h),
            hack_max=max(x.score for x in h), baseline_max=max(base_scores),
            honest_min=min((x.score for x in o), default=float("nan")), errors=sum(x.error is not None for x in outs),
            passed=passed, description=probe.description))
    return results


COLUMNS = ("probe", "reward", "hack mean", "hack max", "baseline", "honest min", "errors", "pass")


def probe_table(results: Sequence[ProbeResult]) -> str:
    """`results` as a plain-text table, one line per probe: probe, reward, hack mean / max, baseline max, honest
    min, errors, pass (yes / NO)."""
    rows = [COLUMNS] + [(r.probe, r.reward, f"{r.hack_mean:.3f}", f"{r.hack_max:.3f}", f"{r.baseline_max:.3f}",
                         f"{r.honest_min:.3f}", str(r.errors), "yes" if r.passed else "NO") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


DEFAULT_SPECS: tuple[Mapping[str, Any] | str, ...] = ("code", {"name": "code", "strict": False}, "math", "format")
