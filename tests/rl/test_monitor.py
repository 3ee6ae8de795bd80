"""The over-optimization monitor (rl.monitor, `rewardlab.rl.monitor`): the alarm's decision on scripted proxy/gold
traces, the probe's figures, and in `train`: on by default at the held-out evaluation's cadence, training unchanged
by it, a gold reward other than the proxy, the alarm in metrics.jsonl, events.jsonl and the console, stop_on_alarm,
and its state across --resume."""

import json
import math

import numpy as np
import pytest

import rewardlab.rl.monitor as monitor_module
import rewardlab.rl.trainer as trainer
from conftest import TINY_ARCH, TINY_OVERRIDES, read_jsonl, sha256_of, without_keys, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.policy import load_policy
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.policy import SamplingSettings
from rewardlab.rl.monitor import (MONITOR_STREAM, AlarmDecision, Monitor, MonitorSettings, overoptimization_alarm,
                                  probe_rows)
from rewardlab.tasks.base import Task

if "test_monitor_digit_frac" not in REWARDS:  # the module may be imported twice

    @reward(name="test_monitor_digit_frac")
    def _digit_frac(completion):
        """Fraction of completion characters that are digits: a dense proxy the tiny model learns in a few steps."""
        return sum(c.isdigit() for c in completion) / max(1, len(completion))


# ------------------------------------------------------------------ the alarm on scripted traces

N_PROMPTS, SAMPLES = 64, 4


def _trace(proxy_rates, gold_rates, seed):
    """A probe history: per probe, each prompt's mean of SAMPLES Bernoulli draws at the given proxy and gold rates
    (the noise of a real probe set), probes every 25 steps."""
    rng = np.random.default_rng(seed)
    return [{"step": 25 * (k + 1), "proxy": (rng.binomial(SAMPLES, p, N_PROMPTS) / SAMPLES).tolist(),
             "gold": (rng.binomial(SAMPLES, g, N_PROMPTS) / SAMPLES).tolist()}
            for k, (p, g) in enumerate(zip(proxy_rates, gold_rates))]


def _first_alarm(history, **options):
    """The index of the first probe whose decision (on the history up to it) raises the alarm, else None."""
    return next((k for k in range(len(history)) if overoptimization_alarm(history[:k + 1], **options).alarm), None)


#: Gao et al.'s shape: the proxy keeps rising; the gold rises to probe 6, then falls.
HACK_PROXY = [min(0.95, 0.3 + 0.05 * k) for k in range(16)]
HACK_GOLD = [0.3 + 0.05 * min(k, 6) - 0.06 * max(0, k - 6) for k in range(16)]


@pytest.mark.parametrize("seed", range(5))
def test_alarm_fires_after_the_gold_peak_on_a_hacking_trace(seed):
    history = _trace(HACK_PROXY, HACK_GOLD, seed)
    first = _first_alarm(history)
    assert first is not None and 7 < first <= 12  # after the peak (probe 6), within a few probes of the fall
    decision = overoptimization_alarm(history[:first + 1])
    assert decision.alarm and decision.fired
    assert decision.proxy_rise > 0 and decision.gold_drop_low > 0 and decision.gold_drop > decision.gold_drop_low
    assert 100 <= decision.reference_step <= 225  # the best gold window ends around the peak


@pytest.mark.parametrize("seed", range(5))
def test_alarm_stays_quiet_when_proxy_and_gold_rise_together(seed):
    rates = [min(0.9, 0.3 + 0.04 * k) for k in range(16)]
    assert _first_alarm(_trace(rates, rates, seed)) is None


def test_alarm_stays_quiet_on_noise():
    # flat proxy and gold: every drop is noise, and the best window is the largest of many noisy ones (the
    # Bonferroni correction's job); without the correction more than half of these traces raise the alarm
    quiet = [_first_alarm(_trace([0.5] * 18, [0.5] * 18, seed)) is None for seed in range(20)]
    assert sum(quiet) >= 19, quiet
    uncorrected = [_first_alarm(_trace([0.5] * 18, [0.5] * 18, seed), confidence=0.5) is None for seed in range(20)]
    assert sum(uncorrected) < 19  # the test can tell noise from a hack only at a high enough level


def test_alarm_needs_the_proxy_to_rise_and_patience_consecutive_probes():
    falling = _trace([0.3] * 16, HACK_GOLD, 0)  # the gold falls, the proxy does not rise: a collapse, not a hack
    assert _first_alarm(falling) is None
    # one probe's dip that recovers at once (windows of one probe): the test fires once, the alarm (patience 2)
    # does not
    gold = [0.7] * 6 + [0.1] + [0.7] * 4
    dip = _trace([0.3] * 6 + [0.9] * 5, gold, 0)
    fired = [overoptimization_alarm(dip[:k + 1], window=1).fired for k in range(len(dip))]
    assert fired[6] and not any(fired[7:]) and _first_alarm(dip, window=1) is None
    assert _first_alarm(dip, window=1, patience=1) == 6


def test_alarm_figures_on_a_hand_trace():
    # two prompts, window 1: the best earlier window is probe 0 (gold 1.0); the current drop is 1.0 - 0.25
    history = [{"step": 1, "proxy": [0.0, 0.0], "gold": [1.0, 1.0]},
               {"step": 2, "proxy": [0.5, 0.5], "gold": [0.5, 0.5]},
               {"step": 3, "proxy": [1.0, 1.0], "gold": [0.5, 0.0]}]
    d = overoptimization_alarm(history, window=1, patience=1, resamples=200)
    assert (d.gold_drop, d.proxy_rise, d.reference_step) == (0.75, 1.0, 1)
    # resamples of 2 prompts: drops of 0.5, 0.75 or 1.0; the lowest quantile is 0.5 and the alarm fires
    assert d.gold_drop_low == 0.5 and d.alarm
    assert overoptimization_alarm(history, window=1, patience=1, resamples=200) == d  # seeded: reproducible
    early = overoptimization_alarm(history[:2], window=2)  # too few probes for two windows: no test
    assert not early.alarm and math.isnan(early.gold_drop) and early.reference_step is None
    with pytest.raises(ValueError, match=r"history\[1\] has 2 proxy and 1 gold values, the first probe 2"):
        overoptimization_alarm([history[0], {"step": 2, "proxy": [0, 0], "gold": [0]}])
    with pytest.raises(ValueError, match="confidence 1.5 in"):
        overoptimization_alarm(history, confidence=1.5)


# ------------------------------------------------------------------ the probe


def _policy(seed=0):
    return load_policy("tiny", seed=seed, tiny_arch=TINY_ARCH)


def _monitor(initial, rows, micro_batch_size=None):
    alarm = {"window": 1, "confidence": 0.99, "min_drop": 0.0, "patience": 1, "resamples": 100}
    return Monitor(rows, proxy=build_reward("test_monitor_digit_frac"), gold=build_reward("exact_match"),
                   initial=initial, settings=MonitorSettings(1, 10, 3, micro_batch_size, 7, alarm),
                   sampling=SamplingSettings(max_new_tokens=4))


def test_probe_figures_and_kl_to_init(tmp_path):
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(5)]
    policy, other = _policy(0), _policy(1)
    same = _monitor(policy, rows)
    metrics, decision = same(policy, 3)
    assert metrics["monitor/kl_to_init"] == 0.0 and metrics["monitor/sqrt_kl"] == 0.0  # the initial policy itself
    assert metrics["monitor/len_drift"] == 0.0 and 1 <= metrics["monitor/len_mean"] <= 4
    assert metrics["monitor/gap"] == metrics["monitor/proxy"] - metrics["monitor/gold"]
    assert metrics["monitor/proxy/test_monitor_digit_frac"] == metrics["monitor/proxy"]
    assert metrics["monitor/entropy"] > 0 and metrics["monitor/alarm"] == 0.0 and not decision.alarm
    # the completions come from the streams (seed, MONITOR_STREAM, step, k): the same step samples the same text
    again = _monitor(policy, rows)(policy, 3)[0]
    assert without_keys([again], "time/") == without_keys([metrics], "time/")
    want = policy.generate([r["prompt"] for r in rows], n=3, max_new_tokens=4,
                           streams=[(7, MONITOR_STREAM, 3, k) for k in range(15)])
    assert metrics["monitor/len_mean"] == np.mean([len(r.completion_ids) for r in want])
    # KL from another initial policy: positive; micro-batches change nothing but rounding
    far = _monitor(other, rows)(policy, 3)[0]
    chunked = _monitor(other, rows, micro_batch_size=4)(policy, 3)[0]
    assert far["monitor/kl_to_init"] > 0.01
    assert far["monitor/sqrt_kl"] == pytest.approx(math.sqrt(far["monitor/kl_to_init"]))
    assert chunked["monitor/kl_to_init"] == pytest.approx(far["monitor/kl_to_init"], rel=1e-5)
    assert chunked["monitor/entropy"] == pytest.approx(far["monitor/entropy"], rel=1e-5)
    # the state (history, first length, alarms) round-trips; a probe set of another size is refused
    state = same.state_dict()
    fresh = _monitor(policy, rows)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and len(state["history"]) == 1
    with pytest.raises(ValueError, match=r"^rl.monitor.n: the checkpoint's probes hold 5 prompts, and the probe set "
                                         r"has 2 now$"):
        _monitor(policy, rows[:2]).load_state_dict(state)


# ------------------------------------------------------------------ in train

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
TEST_ROWS = [{"prompt": p, "answer": a} for p, a in [("9+9=", "18"), ("4+4=", "8"), ("5+4=", "9"), ("1+0=", "1")]]


def _config(tmp_path, out, *overrides):
    task = write_jsonl(tmp_path / "task.jsonl", ROWS)
    test = write_jsonl(tmp_path / "test.jsonl", TEST_ROWS)
    # the proxy is a dense digit-fraction reward the tiny model learns in a few steps; the gold the task's verifier
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", f"task.options={{test_path: {test}}}", f"out={tmp_path / out}",
        *TINY_OVERRIDES, "rl.prompts_per_step=2", "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=1e-2",
        "rewards=[test_monitor_digit_frac]", "rl.monitor.samples=2", *overrides,
    ])


MONITORED = ["monitor/proxy", "monitor/gold", "monitor/gap", "monitor/proxy/test_monitor_digit_frac",
             "monitor/gold/exact_match", "monitor/kl_to_init", "monitor/sqrt_kl", "monitor/len_mean",
             "monitor/len_drift", "monitor/entropy", "monitor/alarm", "time/monitor_s"]


def test_monitor_is_on_at_the_eval_cadence_and_leaves_training_unchanged(tmp_path):
    trainer.train(_config(tmp_path, "off", "rl.steps=5", "rl.eval.every=2", "rl.monitor.every=0"),
                  show_progress=False)
    on = trainer.train(_config(tmp_path, "on", "rl.steps=5", "rl.eval.every=2", "rl.monitor.kl_to_init=true"),
                       show_progress=False)
    trainer.train(_config(tmp_path, "plain", "rl.steps=2"), show_progress=False)  # no eval: no monitor
    off_lines, on_lines = read_jsonl(tmp_path / "off" / "metrics.jsonl"), read_jsonl(tmp_path / "on" / "metrics.jsonl")
    assert [r["step"] for r in on_lines if "monitor/gold" in r] == [2, 4, 5]  # rl.eval.every's steps, the last
    assert not any(k.startswith("monitor/") for r in off_lines for k in r)
    assert not any(k.startswith("monitor/") for r in read_jsonl(tmp_path / "plain" / "metrics.jsonl") for k in r)
    probes = [r for r in on_lines if "monitor/gold" in r]
    assert all(set(MONITORED) <= set(r) for r in probes)
    assert ["monitor/gold_drop" in r for r in probes] == [False, False, True]  # 3 probes: two windows of 2
    # the policy learned the proxy: it moved away from the initial policy
    assert 0 < probes[0]["monitor/kl_to_init"] < probes[-1]["monitor/kl_to_init"]
    assert probes[0]["monitor/len_drift"] == 0.0
    # own random streams, the global RNGs restored: everything else the same, bit for bit
    assert without_keys(on_lines, "monitor/", "time/") == without_keys(off_lines, "time/")
    assert read_jsonl(tmp_path / "on" / "samples.jsonl") == read_jsonl(tmp_path / "off" / "samples.jsonl")
    weights = "checkpoints/step-5/model.safetensors"
    assert sha256_of(tmp_path / "on" / weights) == sha256_of(tmp_path / "off" / weights)
    assert on["monitor"] == {"alarms": [], "probes": 3} and "stop_reason" not in on


def test_monitor_gold_spec_and_its_errors(tmp_path):
    trainer.train(_config(tmp_path, "G", "rl.steps=2", "rl.monitor.every=2", "rl.monitor.kl_to_init=false",
                          "rl.monitor.gold={name: test_monitor_digit_frac}"), show_progress=False)
    line = read_jsonl(tmp_path / "G" / "metrics.jsonl")[-1]
    assert line["monitor/gold"] == line["monitor/proxy"] and line["monitor/gap"] == 0.0
    assert "monitor/kl_to_init" not in line and "eval/accuracy" not in line  # monitor on without the evaluation
    with pytest.raises(ValueError, match=r"^rl.monitor.gold: .*no_such_reward"):
        trainer.train(_config(tmp_path, "E", "rl.steps=1", "rl.monitor.every=1", "rl.monitor.gold=no_such_reward"),
                      show_progress=False)
    with pytest.raises(ValueError, match=r"^rl.monitor.every: task jsonl:.* has no held-out test rows"):
        trainer.train(_config(tmp_path, "F", "rl.steps=1", "rl.monitor.every=1", "task.options={test_size: 0}"),
                      show_progress=False)
    assert not (tmp_path / "F").exists()  # refused before the run directory is touched
    with pytest.raises(ValueError, match="rl.monitor.unknown"):
        _config(tmp_path, "H", "rl.monitor.unknown=1")
    # an environment task: off by default, refused when asked for
    env_task = Task(name="env:calculator", train=ROWS, test=TEST_ROWS, env={"name": "calculator", "options": {}})
    default_samples = "rl.monitor.samples=4"  # _config sets 2
    assert probe_rows(_config(tmp_path, "I", "rl.eval.every=2", default_samples), env_task) is None
    with pytest.raises(ValueError, match=r"^rl.monitor.every: the monitor probes single completions"):
        probe_rows(_config(tmp_path, "I", "rl.monitor.every=2", default_samples), env_task)
    with pytest.raises(ValueError, match=r"^rl.monitor.samples: the monitor probes single completions"):
        probe_rows(_config(tmp_path, "I", "rl.eval.every=2"), env_task)  # a monitor key set there: not silent
    assert len(probe_rows(_config(tmp_path, "I", "rl.eval.every=2", "rl.monitor.n=3"),
                          Task(name="t", train=ROWS, test=TEST_ROWS))) == 3


def _alarm_at(monkeypatch, step):
    """Make the alarm's decision fire at `step` (the trainer's plumbing is what is tested)."""
    decide = monitor_module.overoptimization_alarm

    def scripted(history, **options):
        if history[-1]["step"] == step:
            return AlarmDecision(True, True, 0.5, 0.25, 0.125, history[0]["step"])
        return decide(history, **options)

    monkeypatch.setattr(monitor_module, "overoptimization_alarm", scripted)


def test_alarm_is_logged_and_stop_on_alarm_keeps_the_checkpoint_before_it(tmp_path, monkeypatch, capsys):
    _alarm_at(monkeypatch, 4)
    common = ["rl.steps=6", "rl.monitor.every=2", "save_every=2", "rl.monitor.kl_to_init=false"]
    going = trainer.train(_config(tmp_path, "A", *common), show_progress=False)
    assert going["steps_done"] == 6 and going["monitor"]["alarms"] == [4] and "stop_reason" not in going
    assert [r.get("monitor/alarm") for r in read_jsonl(tmp_path / "A" / "metrics.jsonl")] == [
        None, 0.0, None, 1.0, None, 0.0]
    assert "rl.monitor: over-optimization alarm at step 4" in capsys.readouterr().err

    stopped = trainer.train(_config(tmp_path, "B", *common, "rl.monitor.stop_on_alarm=true"), show_progress=False)
    b = tmp_path / "B"
    assert stopped["steps_done"] == 4 and stopped["stop_reason"] == "monitor_alarm"
    assert stopped["interrupted"] is False and stopped["final_checkpoint"] == str(b / "checkpoints" / "step-2")
    assert sorted(p.name for p in (b / "checkpoints").iterdir()) == ["step-2"]  # not the alarm's step
    assert [r["step"] for r in read_jsonl(b / "metrics.jsonl")] == [1, 2, 3, 4]
    events = [e for e in read_jsonl(b / "events.jsonl") if e["event"] == "monitor_alarm"]
    assert len(events) == 1 and events[0]["step"] == 4 and events[0]["stop"] is True
    assert events[0]["checkpoint"] == "step-2" and events[0]["gold_drop_low"] == 0.25
    assert json.loads((b / "summary.json").read_text())["stop_reason"] == "monitor_alarm"


def test_monitor_state_survives_resume(tmp_path):
    common = ["rl.monitor.every=1", "save_every=2", "rl.monitor.window=1", "rl.monitor.patience=1"]
    trainer.train(_config(tmp_path, "A", "rl.steps=4", *common), show_progress=False)
    trainer.train(_config(tmp_path, "B", "rl.steps=2", *common), show_progress=False)
    trainer.train(_config(tmp_path, "B", "rl.steps=4", *common), mode="resume", show_progress=False)
    got = without_keys(read_jsonl(tmp_path / "B" / "metrics.jsonl"), "time/")
    want = without_keys(read_jsonl(tmp_path / "A" / "metrics.jsonl"), "time/")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for g, e in zip(got, want):
        # monitor/len_drift (the first probe's length) and monitor/gold_drop (the history) need the saved state
        assert g.keys() == e.keys()
        for key in e:
            assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    assert "monitor/gold_drop" in got[3] and "monitor/len_drift" in got[3]


def test_quickstart_results_are_the_same_with_the_monitor_on_by_default(tmp_path):
    # the quickstart (reasoning_gym chain sums, SFT then GRPO with rl.eval.every) runs the monitor by default. It
    # trains every weight with rl.beta 0: no reference and no adapter give the initial policy for free, so the
    # default (kl_to_init auto) logs no KL rather than keep a copy of the weights. Everything but monitor/* and
    # time/* is unchanged.
    from rewardlab.cli import main

    args = ["quickstart", "--no-progress", *TINY_OVERRIDES,
            "task.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, template: compact, size: 300, "
            "test_size: 20}", "sft.steps=3", "sft.batch_size=8", "rl.steps=4", "rl.prompts_per_step=2",
            "rl.group_size=2", "rl.eval.every=2", "eval.n=2", "eval.k=[1,2]"]
    assert main([*args, "--out", str(tmp_path / "on")]) == 0
    assert main([*args, "rl.monitor.every=0", "--out", str(tmp_path / "off")]) == 0
    on, off = read_jsonl(tmp_path / "on" / "grpo" / "metrics.jsonl"), read_jsonl(tmp_path / "off" / "grpo" /
                                                                                    "metrics.jsonl")
    assert [r["step"] for r in on if "monitor/gold" in r] == [2, 4]
    assert not any("monitor/kl_to_init" in r for r in on) and all("monitor/proxy" in r for r in on
                                                                   if "monitor/gold" in r)
    assert without_keys(on, "monitor/", "time/") == without_keys(off, "time/")
    summaries = [json.loads((tmp_path / d / "summary.json").read_text()) for d in ("on", "off")]
    figures = [{k: v for k, v in s.items() if k not in ("stage_seconds", "total_seconds")} for s in summaries]
    assert json.dumps(figures[0]).replace(str(tmp_path / "on"), "X") == \
        json.dumps(figures[1]).replace(str(tmp_path / "off"), "X")
