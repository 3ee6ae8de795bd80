"""Rollout engines without Ray: chunking (rl.sampling.rollout_chunk), sampling a batch chunk by chunk, the local engine,
the engine config keys, the policy version, and the one-line error of engine ray without the ray package."""

from __future__ import annotations

import json
import pickle
import sys

import pytest
from conftest import TINY_ARCH, TINY_OVERRIDES, make_rollout, write_jsonl

from rewardlab.config import TrainConfig, load_config
from rewardlab.config.loader import ConfigError
from rewardlab.envs import make_env
from rewardlab.envs.sampling import EpisodeSettings, sample_rollouts
from rewardlab.policy import Policy, load_policy
from rewardlab.policy import SamplingSettings
from rewardlab.rl.engines import LocalEngine, chunk_spans, row_spans
from rewardlab.rl.trainer import train
from rewardlab.types import RewardOutput

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 2)]]


def test_chunk_spans_cover_the_batch_in_order_and_a_chunk_holds_whole_groups():
    assert chunk_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_spans(5, None) == [(0, 5)]
    assert chunk_spans(0, 3) == [] and chunk_spans(0, None) == []
    assert row_spans(6, 2, 4) == [(0, 2), (2, 4), (4, 6)]  # 4 rollouts = 2 rows of 2 samples
    assert row_spans(6, 2, None) == [(0, 6)]
    with pytest.raises(ValueError, match="rl.sampling.rollout_chunk: 3 is not a multiple"):
        row_spans(6, 2, 3)


def _same(a, b):
    return [(r.completion_ids, r.logprobs, r.group, r.episode_id, r.termination) for r in a] == \
        [(r.completion_ids, r.logprobs, r.group, r.episode_id, r.termination) for r in b]


@pytest.mark.parametrize("episodes", [False, True])
def test_sampling_a_batch_chunk_by_chunk_gives_the_batch_sampled_in_those_chunks(episodes):
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    settings = None
    rows = ROWS
    if episodes:
        settings = EpisodeSettings(make_env("guess_number", n=8), max_turns=2, max_episode_tokens=24,
                                   name="guess_number")
        rows = make_env("guess_number", n=8).rows("train", n=6, seed=0)
    kw = dict(episodes=settings, n=2, stream=(5, 3, 1))
    sampling = SamplingSettings(max_new_tokens=4)
    whole = sample_rollouts(policy, rows, sampling, batch_size=2, **kw)
    chunked = [r for a in (0, 2, 4) for r in sample_rollouts(policy, rows[a:a + 2], sampling, first_row=a, **kw)]
    assert _same(chunked, whole)
    ends = [r for r in chunked if r.termination is not None]
    assert [r.group for r in ends] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # groups numbered across the batch
    if episodes:
        assert [r.episode_id for r in ends] == list(range(12))


def test_the_local_engine_samples_in_rollout_chunks_with_the_published_version(monkeypatch):
    calls = []
    generate = Policy.generate

    def recording(self, prompts, **kw):
        calls.append(len(prompts))
        return generate(self, prompts, **kw)

    monkeypatch.setattr(Policy, "generate", recording)
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    engine = LocalEngine(SamplingSettings(max_new_tokens=3, chunk=4), episodes=None, reward=None)
    engine.publish(policy, version=3)
    out = engine.generate(ROWS, n=2, stream=(0, 4, 1))
    assert calls == [2, 2, 2]  # 6 rows of 2 samples, 4 rollouts (2 rows) a chunk
    assert len(out) == 12 and {r.policy_version for r in out} == {3}
    one = LocalEngine(SamplingSettings(max_new_tokens=3), episodes=None, reward=None)
    one.publish(policy, version=3)
    calls.clear()
    assert _same(one.generate(ROWS, n=2, stream=(0, 4, 1)), sample_rollouts(
        policy, ROWS, SamplingSettings(max_new_tokens=3), episodes=None, n=2, stream=(0, 4, 1)))
    assert calls == [6, 6]  # null: the whole batch is one chunk (as the trainer sampled before engines)


def test_the_local_engine_scores_chunk_by_chunk_and_keeps_errors():
    sizes = []

    def reward(rollouts):
        sizes.append(len(rollouts))
        return [RewardOutput(score=0.0, error="r: boom") if r.completion == "x" else RewardOutput(score=1.0)
                for r in rollouts]

    engine = LocalEngine(SamplingSettings(max_new_tokens=3, chunk=4), episodes=None, reward=reward)
    out = engine.score([make_rollout("x" if i == 5 else "a") for i in range(10)])
    assert sizes == [4, 4, 2]
    assert [o.error for o in out] == [None] * 5 + ["r: boom"] + [None] * 4


def test_a_rollout_travels_as_plain_data():
    r = make_rollout("ab", row={"prompt": "p", "answer": "3"}, episode_id=4, termination="stop", policy_version=2,
                     messages=[{"role": "user", "content": "p"}, {"role": "assistant", "content": "ab"}],
                     tool_calls=[[{"name": "calc", "arguments": {"x": 1}, "status": "ok", "seconds": 0.1}]])
    assert pickle.loads(pickle.dumps(r)) == r


def _config(tmp_path, name, *overrides):
    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)}
                                                 for a in range(10) for b in range(3)])
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / name}", *TINY_OVERRIDES,
        "rl.steps=2", "rl.prompts_per_step=3", "rl.group_size=2", "rl.sampling.max_new_tokens=4", "rl.lr=1e-2",
        "rewards=[{name: exact_match}]", "threads=1", *overrides])


@pytest.mark.parametrize("override, key", [
    ("rl.sampling.rollout_chunk=3", "rl.sampling.rollout_chunk"),  # not a multiple of rl.group_size=2
    ("rl.ray.rollout_workers=4", "rl.ray.rollout_workers"),
    ("rl.ray.reward_workers=1", "rl.ray.reward_workers"),
    ("rl.ray.address=auto", "rl.ray.address"),
    ("rl.ray.rollout_worker_gpus=1", "rl.ray.rollout_worker_gpus"),
    ("rl.ray.dashboard=true", "rl.ray.dashboard"),
])
def test_engine_keys_that_do_not_apply_are_refused_naming_the_key(tmp_path, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _config(tmp_path, "run", override)


def test_the_dashboard_of_a_cluster_that_is_joined_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.ray\.dashboard: .*joins an existing one"):
        _config(tmp_path, "run", "rl.engine=ray", "rl.ray.address=auto", "rl.ray.dashboard=true")


def test_engine_ray_without_ray_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ValueError, match=r"^rl\.engine: ray needs the ray package.*pip install rewardlab\[ray\]$"):
        train(_config(tmp_path, "run", "rl.engine=ray"), show_progress=False)
    assert not (tmp_path / "run").exists()  # refused before the run directory is touched


def test_a_rollout_chunk_of_the_whole_batch_is_the_default(tmp_path):
    lines = []
    for name, extra in [("default", []), ("whole", ["rl.sampling.rollout_chunk=6"])]:
        train(_config(tmp_path, name, *extra), show_progress=False)
        lines.append([{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                      for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    assert lines[0] == lines[1] and len(lines[0]) == 2


def test_step_s_samples_with_policy_version_s_minus_1_also_after_a_resume(tmp_path, monkeypatch):
    seen = []
    generate = LocalEngine.generate

    def recording(self, rows, **kw):
        out = generate(self, rows, **kw)
        seen.append(sorted({r.policy_version for r in out}))
        return out

    monkeypatch.setattr(LocalEngine, "generate", recording)
    train(_config(tmp_path, "run", "save_every=1"), show_progress=False)
    assert seen == [[0], [1]]  # the initial weights, then the weights step 1's update produced
    seen.clear()
    train(_config(tmp_path, "run", "save_every=1", "rl.steps=3"), mode="resume", show_progress=False)
    assert seen == [[2]]
