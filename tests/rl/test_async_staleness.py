"""Asynchronous training's fixed lag (rl.ray.max_staleness = k): step s trains on the batch of step s sampled by policy
version max(0, s - 1 - k), staleness logged, every finished rollout trained, filtered or in flight, and a resume
trains what the uninterrupted run trains.

The schedule itself is checked without Ray (`Prefetch` on a stub engine); the end-to-end runs use the session's
`ray_cluster` with one rollout and one reward worker and a tiny model (engine local refuses a lag)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import TINY_OVERRIDES

from rewardlab.config import TrainConfig, load_config
from rewardlab.config.loader import ConfigError
from rewardlab.rl import rollouts, trainer
from rewardlab.rl.rollouts import Prefetch, ScoredEpisode, StepBatch
from rewardlab.rl.trainer import train
from rewardlab.train_state import load_state
from rewardlab.types import RewardOutput, Rollout

#: A dense reward without errors (fraction of characters of even code), imported by path so the reward worker
#: imports it too: groups are rarely tied, so every step moves the weights.
REWARD = '''
def dense(completion):
    return sum(ord(c) % 2 == 0 for c in completion) / max(1, len(completion))
'''
TASK = ["task.spec=reasoning_gym:chain_sum", "task.options={size: 40, test_size: 4, min_terms: 2, max_terms: 2, "
        "min_digits: 1, max_digits: 1, template: compact}", "rl.prompts_per_step=2", "rl.group_size=2",
        "rl.sampling.max_new_tokens=4", "rl.lr=5e-2", "threads=1", "seed=5"]
RAY = ["rl.engine=ray", "rl.ray.rollout_workers=1", "rl.ray.reward_workers=1"]
PER_STEP = 4  # rollouts per batch: 2 prompts x 2


# -- the schedule, without Ray ---------------------------------------------------------------------------------------

def _stub_run(lag: int, steps: int, start_step: int = 0):
    engine = SimpleNamespace(version=start_step)
    cfg = SimpleNamespace(rl=SimpleNamespace(ray=SimpleNamespace(max_staleness=lag), steps=steps, engine="local",
                                             max_reward_error_frac=None))
    return SimpleNamespace(cfg=cfg, engine=engine)


def _fake_produce(made):
    def produce(run, step, version=None):
        made.append((step, version, run.engine.version))
        r = Rollout(prompt="p", prompt_ids=[1], completion="c", completion_ids=[2], logprobs=[-1.0],
                    policy_version=version)
        return StepBatch([ScoredEpisode((r,), RewardOutput(score=1.0))], [0])
    return produce


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_step_s_trains_the_batch_of_step_s_sampled_by_version_max_0_s_minus_1_minus_k(lag, monkeypatch):
    made: list[tuple[int, int, int]] = []
    monkeypatch.setattr(rollouts, "produce", _fake_produce(made))
    state = _stub_run(lag, steps=5)
    pre = Prefetch(state)
    stale = []
    for step in range(1, 6):  # the train loop's order: take, update, publish, log, (checkpoint), submit
        batch = pre.take(step)
        stale.append(batch.metrics["async/staleness_max"])
        assert batch.episodes[0].last.policy_version == max(0, step - 1 - lag)
        state.engine.version = step  # publish
        counts = pre.counts(step)
        assert counts["async/trained"] == step  # one rollout per batch, each trained once
        assert counts["async/in_flight"] == max(0, min(lag - 1, 5 + lag - step))  # batches step+1..step+lag-1
        if lag:
            pre.submit()
    # batches 1..steps+lag, each once, in step order; batch t sampled by version max(0, t-1-lag), and submitted
    # as soon as that version was published (never with a newer one in the engine)
    assert [t for t, _, _ in made] == list(range(1, 6 + lag))
    assert all(v == max(0, t - 1 - lag) == published for t, v, published in made)
    # off by one: step 1 trains on version 0 whatever the lag; the staleness grows by one a step up to the lag
    assert stale == [float(min(s - 1, lag)) for s in range(1, 6)]
    if lag == 2:
        assert stale == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert sorted(pre.batches) == list(range(6, 6 + lag))  # the last `lag` batches are in flight at the end
    assert pre.counts(float("inf"))["async/in_flight"] == lag


def test_a_resumed_prefetch_goes_on_from_the_checkpoint_without_older_weights(monkeypatch):
    made: list[tuple[int, int, int]] = []
    monkeypatch.setattr(rollouts, "produce", _fake_produce(made))
    state = _stub_run(2, steps=6)
    pre = Prefetch(state)
    for step in (1, 2, 3):
        pre.take(step)
        state.engine.version = step
        pre.counts(step)
        saved = pre.state_dict()  # a checkpoint of step 3 at the last pass
        pre.submit()
    made.clear()
    resumed = Prefetch(_stub_run(2, steps=6, start_step=3), 3, saved)
    assert sorted(resumed.batches) == [4, 5] and resumed.next == 6 and resumed.trained == 3
    assert resumed.take(4).episodes[0].last.policy_version == 1  # the stored batch, sampled by version 1
    assert made == [(6, 3, 3)]  # the first batch produced after the resume: step 6 on version 3, the current one


def test_max_staleness_on_engine_local_is_one_line_naming_the_key():
    with pytest.raises((ConfigError, ValueError), match=r"rl\.ray\.max_staleness: applies to rl\.engine ray only"):
        load_config(TrainConfig, None, [*TINY_OVERRIDES, *TASK, "rl.ray.max_staleness=1"])


# -- lag 0 on the asynchronous code path is the synchronous loop, byte for byte ---------------------------------------

def test_lag_0_produced_in_the_prefetch_thread_logs_what_the_plain_run_logs(tmp_path, monkeypatch):
    """Episodes of env:test_turns (several turns, terminations, truncations by the episode's token budget), once
    through `Prefetch` with its background thread and version-pinned generation (engine ray's path, on engine
    local), once as engine local runs it (each batch produced in this thread when its step takes it): the same
    samples.jsonl bytes and metrics."""
    import episode_envs  # noqa: F401  (registers env:test_turns and its reward)

    def run(name):
        cfg = load_config(TrainConfig, None, [
            "task.spec=env:test_turns", f"out={tmp_path / name}", *TINY_OVERRIDES, "rl.prompts_per_step=2",
            "rl.group_size=4", "rl.sampling.max_new_tokens=4", "env.max_turns=3", "env.max_episode_tokens=24",
            "rl.lr=1e-2", "rl.steps=3", "rl.estimator=turn_grpo", "threads=1", "seed=3"])
        train(cfg, show_progress=False)
        return _lines(tmp_path / name / "metrics.jsonl"), (tmp_path / name / "samples.jsonl").read_bytes()

    with monkeypatch.context() as m:
        threads = []
        real = rollouts.produce
        m.setattr(rollouts, "produce", lambda *a, **kw: threads.append(__import__("threading").current_thread().name)
                  or real(*a, **kw))
        m.setattr(trainer, "Prefetch", lambda run, start, saved: Prefetch(run, start, saved, background=True))
        metrics, samples = run("thread")
        assert threads == ["rewardlab-prefetch_0"] * 3  # each batch produced in the prefetch thread
    sync_metrics, sync_samples = run("sync")
    records = [json.loads(x) for x in samples.splitlines()]
    ends = {r["termination"] for r in records}
    assert {"max_turns", "max_new_tokens", "max_episode_tokens"} <= ends, ends  # three truncation decisions
    assert any(r["n_turns"] > 1 for r in records)
    assert samples == sync_samples  # ids, masks, log-probs, turns, terminations, rewards, advantages, versions
    assert [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics] == \
        [{k: v for k, v in m.items() if not k.startswith("time/")} for m in sync_metrics]
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 0.0, 0.0]
    assert [r["policy_version"] for r in records] == [s for s in (0, 1, 2) for _ in range(8)]


# -- end to end on Ray -----------------------------------------------------------------------------------------------

def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(tmp_path, name, *overrides, mode="new"):
    (tmp_path / "r.py").write_text(REWARD)
    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *TASK, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]",
                                          f"out={tmp_path / name}", *overrides])
    summary = train(cfg, show_progress=False, mode=mode)
    return _lines(tmp_path / name / "metrics.jsonl"), _lines(tmp_path / name / "samples.jsonl"), summary


def _semantic(metrics):
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "ray/"))} for m in metrics]


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """Engine local, synchronous, rl.lr=1e-30 (each AdamW step is below float32's resolution of the weights): every
    policy version holds the initial weights."""
    return _run(tmp_path_factory.mktemp("frozen"), "frozen", "rl.steps=4", "rl.lr=1e-30")


@pytest.mark.slow  # trains once on Ray (in `make test`, within its 90 s of Ray tests)
def test_lag_2_on_ray_staleness_warm_up_accounting_and_the_checkpoint(tmp_path, ray_cluster, frozen):
    k, steps = 2, 4
    metrics, samples, summary = _run(tmp_path, "lag", *RAY, f"rl.ray.max_staleness={k}", f"rl.steps={steps}",
                                     "save_every=1")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[0]["policy/grad_norm"] > 0  # the weights move: versions differ
    # staleness = s - 1 - version: 0, 1 while warming up (steps 1..k+1 train on version 0), then exactly k
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 2.0, 2.0]
    assert [m["async/staleness_mean"] for m in metrics] == [0.0, 1.0, 2.0, 2.0]
    assert [s["policy_version"] for s in samples] == [v for v in (0, 0, 0, 1) for _ in range(PER_STEP)]
    # the loss's ratio is new / behaviour (the log-probs recorded when sampling): 1 up to float32 rounding on the
    # weights that sampled (step 1; sampling with a KV cache and scoring in one pass differ in the last bits),
    # spread once they are 1 or 2 updates old (a learner that recomputed the old log-probs with its current
    # weights would log no spread at any step)
    assert metrics[0]["policy/ratio_std"] < 1e-5
    assert all(m["policy/ratio_std"] > 0.1 for m in metrics[1:]), [m["policy/ratio_std"] for m in metrics]
    # the warm-up batches are sampled by the initial weights: what a run whose weights never move samples at
    # those steps (same prompts, streams and rewards; the batch of step s keyed by s whatever the lag)
    pick = lambda rows: [(r["step"], r["prompt"], r["completion"], r["reward"]) for r in rows]  # noqa: E731
    assert pick(samples[:3 * PER_STEP]) == pick(frozen[1][:3 * PER_STEP])
    # every finished rollout trained, filtered or in flight: counts against samples.jsonl and the final checkpoint
    for m in metrics:
        upto = [s for s in samples if s["step"] <= m["step"]]
        assert m["async/trained"] == sum(s["kept"] for s in upto)
        assert m["async/filtered"] == sum(not s["kept"] for s in upto)
        assert m["async/in_flight"] == (k - 1) * PER_STEP  # batch step+1 finished, step+2 generating
    assert summary["async"] == {"async/trained": float(len(samples)), "async/filtered": 0.0,
                                "async/in_flight": float(k * PER_STEP)}  # batches 5 and 6, prefetched past the end
    saved = load_state(tmp_path / "lag" / "checkpoints" / f"step-{steps}")["prefetch"]
    assert sorted(saved["batches"]) == [5, 6] and saved["next"] == 7
    assert [rows[-1].policy_version for t in (5, 6) for rows in saved["batches"][t]["rows"]] == [2] * 4 + [3] * 4


@pytest.mark.slow
@pytest.mark.ray_long  # two more runs on Ray, beyond `make test`'s Ray budget
def test_lag_2_a_run_resumed_from_its_final_checkpoint_for_more_steps_logs_the_longer_run(tmp_path, ray_cluster):
    """A run of 2 steps, resumed for 4: the final checkpoint's prefetched batches (step 3 on version 0, step 4 on
    version 1) make it log what the uninterrupted 4-step run logs, staleness included."""
    k = 2
    metrics, samples, _ = _run(tmp_path, "whole", *RAY, f"rl.ray.max_staleness={k}", "rl.steps=4", "save_every=1")
    first, _, _ = _run(tmp_path, "split", *RAY, f"rl.ray.max_staleness={k}", "rl.steps=2", "save_every=1")
    assert _semantic(first) == _semantic(metrics[:2])
    again, again_samples, _ = _run(tmp_path, "split", *RAY, f"rl.ray.max_staleness={k}", "rl.steps=4",
                                   "save_every=1", mode="resume")
    assert _semantic(again) == _semantic(metrics)
    assert [m["async/staleness_max"] for m in again] == [0.0, 1.0, 2.0, 2.0]
    assert again_samples == samples


@pytest.mark.slow
@pytest.mark.ray_long  # a child driver on the session's cluster, killed, and two more runs
def test_lag_1_killed_by_sigkill_and_resumed_logs_the_uninterrupted_run(tmp_path, ray_cluster):
    """The child joins the session's cluster (rl.ray.address), is SIGKILLed after a seeded number of metrics
    lines, and is resumed here: steps 1..6 once each, the uninterrupted run's metrics (timings and ray/* aside),
    staleness 0 at step 1 and exactly 1 after, before and after the resume."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
    from sigkill_resume import kill_midway

    (tmp_path / "r.py").write_text(REWARD)
    address = ray_cluster.get_runtime_context().gcs_address
    common = [*TINY_OVERRIDES, *TASK, f"rewards=[{{name: '{tmp_path / 'r.py'}:dense'}}]", *RAY,
              f"rl.ray.address={address}", "rl.ray.max_staleness=1", "rl.steps=6", "save_every=2", "keep_checkpoints=2"]
    cfg = lambda out: load_config(TrainConfig, None, [*common, f"out={out}"])  # noqa: E731
    train(cfg(tmp_path / "a"), show_progress=False)
    k, _ = kill_midway("TrainConfig", [*common, f"out={tmp_path / 'b'}"], "rewardlab.rl.trainer.train",
                       tmp_path / "b", rng=random.Random(7), after=(3, 4), pause=0.3, timeout=300)
    assert len(_lines(tmp_path / "b" / "metrics.jsonl")) < 6
    train(cfg(tmp_path / "b"), show_progress=False, mode="resume")
    a, b = _lines(tmp_path / "a" / "metrics.jsonl"), _lines(tmp_path / "b" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    resumed_from = [json.loads(x)["step"] for x in (tmp_path / "b" / "events.jsonl").read_text().splitlines()
                    if json.loads(x)["event"] == "resume_from"]
    assert resumed_from in ([2], [4])  # its checkpoint holds a prefetched batch (3 on version 1, or 5 on 3)
    assert _semantic(b) == _semantic(a)
    assert [m["async/staleness_max"] for m in b] == [0.0] + [1.0] * 5
    assert _lines(tmp_path / "b" / "samples.jsonl") == _lines(tmp_path / "a" / "samples.jsonl")


@pytest.mark.slow
@pytest.mark.ray_long  # two more actors on Ray, beyond `make test`'s Ray budget
def test_engine_ray_samples_with_the_version_asked_and_keeps_the_last_k_plus_1(ray_cluster):
    """publish v0 then v1 (other weights): generate(version=0) after v1 was published samples what v0 sampled
    (the worker reloads it), version 1 samples otherwise; with k = 1, v0 is dropped once v2 is published."""
    import torch

    from rewardlab.policy import load_policy
    from rewardlab.policy import SamplingSettings
    from rewardlab.rl.engines.ray_engine import RayEngine
    from rewardlab.tasks import load as load_task

    cfg = load_config(TrainConfig, None, [*TINY_OVERRIDES, *TASK, *RAY, "rl.ray.max_staleness=1"])
    rows = load_task(cfg.task.spec, **cfg.task.options).train[:2]
    policy = load_policy("tiny", seed=cfg.seed, **cfg.model.policy_options())
    engine = RayEngine(cfg, SamplingSettings(max_new_tokens=4), threads=1)
    try:
        engine.publish(policy, version=0)
        first = engine.generate(rows, n=2, stream=(5, 1, 1))
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(-3.0)
        engine.publish(policy, version=1)
        old = engine.generate(rows, n=2, stream=(5, 1, 1), version=0)
        new = engine.generate(rows, n=2, stream=(5, 1, 1))
        engine.publish(policy, version=2)
        with pytest.raises(RuntimeError, match=r"policy version 0 is not kept \(kept: \[1, 2\]\)"):
            engine.generate(rows, n=2, stream=(5, 1, 1), version=0)
    finally:
        engine.close()
    assert [r.policy_version for r in old] == [0] * 4 and [r.policy_version for r in new] == [1] * 4
    assert [(r.completion_ids, r.logprobs) for r in old] == [(r.completion_ids, r.logprobs) for r in first]
    assert [r.logprobs for r in new] != [r.logprobs for r in first]
