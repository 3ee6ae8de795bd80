"""The figures of benchmarks/overoptimization.py on hand-made monitor traces (no training): the gold peak, the alarm's
distance from it, the aggregation over seeds, the table, and reading a run directory."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "overoptimization.py"
_spec = importlib.util.spec_from_file_location("overoptimization_bench", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _probe(step, proxy, gold, sqrt_kl, alarm=0.0):
    return {"step": step, "monitor/proxy": proxy, "monitor/gold": gold, "monitor/gap": proxy - gold,
            "monitor/sqrt_kl": sqrt_kl, "monitor/alarm": alarm}


# Gao et al.'s shape: the proxy keeps rising, the gold peaks at step 10 and falls.
HACKING = [_probe(5, 0.55, 0.30, 0.3), _probe(10, 0.60, 0.34, 0.5), _probe(15, 0.65, 0.28, 0.7),
           _probe(20, 0.70, 0.20, 0.9, alarm=1.0)]
INITIAL = _probe(0, 0.50, 0.25, 0.0)


def test_run_figures_find_the_gold_peak_and_the_alarm_after_it():
    f = bench.run_figures(HACKING, INITIAL, alarm_steps=[20])
    assert f["gold_start"] == 0.25 and f["proxy_start"] == 0.50
    assert f["gold_peak"] == 0.34 and f["gold_peak_step"] == 10 and f["gold_peak_sqrt_kl"] == 0.5
    assert f["gold_end"] == 0.20 and f["proxy_end"] == 0.70
    assert f["gap_end"] == pytest.approx(0.50) and f["sqrt_kl_end"] == 0.9
    assert f["proxy_rise"] == pytest.approx(0.20) and f["gold_change"] == pytest.approx(-0.05)
    assert f["alarm_step"] == 20 and f["alarm_after_peak"] == 10
    assert f["gold_at_alarm"] == 0.20 and f["sqrt_kl_at_alarm"] == 0.9
    assert [c["step"] for c in f["curve"]] == [0, 5, 10, 15, 20]


def test_a_gold_that_only_falls_peaks_at_the_initial_probe_and_no_alarm_is_none():
    falling = [_probe(5, 0.6, 0.2, 0.3), _probe(10, 0.7, 0.1, 0.6)]
    f = bench.run_figures(falling, INITIAL)
    assert f["gold_peak_step"] == 0 and f["gold_peak"] == 0.25
    assert f["alarm_step"] is None and f["alarm_after_peak"] is None and f["gold_at_alarm"] is None
    # without the initial probe the peak is the first probe's
    assert bench.run_figures(falling)["gold_peak_step"] == 5


def test_run_figures_refuse_a_run_without_probes():
    with pytest.raises(ValueError, match="probes"):
        bench.run_figures([])


def test_aggregate_gives_mean_and_sample_sd_over_seeds_and_the_table_shows_them():
    runs = [bench.run_figures(HACKING, INITIAL, [20]),
            bench.run_figures([_probe(5, 0.5, 0.30, 0.2), _probe(10, 0.5, 0.26, 0.4)], INITIAL)]
    s = bench.aggregate(runs)
    assert s["seeds"] == 2 and s["alarms"] == [20, None]
    assert s["gold_end"]["mean"] == pytest.approx((0.20 + 0.26) / 2)
    assert s["gold_end"]["sd"] == pytest.approx(abs(0.20 - 0.26) / 2 ** 0.5)
    assert s["gold_peak_step"]["mean"] == pytest.approx(7.5)
    text = bench.table({"baseline": s})
    lines = text.splitlines()
    assert len(lines) == 3 and lines[1].count("---") == lines[0].count("|") - 1
    assert "| baseline | 0.250 ± 0.000 | 0.320 ± 0.028 (8, 0.35) | 0.230 ± 0.042 |" in lines[2]
    assert lines[2].endswith("| 20 (0.200), — |") and s["gold_at_alarms"] == [0.20, None]
    with pytest.raises(ValueError, match="runs"):
        bench.aggregate([])


def test_read_run_takes_the_probes_and_the_alarm_events(tmp_path):
    lines = [{"step": 1, "reward/mean": 0.1}, *HACKING]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "start"}) + "\n"
                                           + json.dumps({"event": "monitor_alarm", "step": 20}) + "\n")
    probes, alarms = bench.read_run(tmp_path)
    assert [p["step"] for p in probes] == [5, 10, 15, 20] and alarms == [20]
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    assert bench.read_run(tmp_path)[1] == [20]  # from monitor/alarm when no event says it


def test_every_configuration_has_overrides_and_a_description():
    rms = ["a", "b", "c"]
    for name in bench.CONFIGS:
        assert bench.config_overrides(name, rms) and name in bench.DESCRIPTIONS
    assert "reduce: min" in bench.config_overrides("ens_min", rms)[0]
    assert bench.config_overrides("ens_mean", rms)[0].count("reward_model") == 3
    with pytest.raises(KeyError):
        bench.config_overrides("nope", rms)
