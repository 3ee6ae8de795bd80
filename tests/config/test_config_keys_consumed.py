"""No silent settings: every key of `train` (and `evaluate`) is read by the run, in both modes that accept it (a
single-turn task and an environment task), or refused when set in a mode where it does not apply.

The walk records which config fields the run reads (attribute reads, and whole sections dumped with model_dump),
over a few runs that switch on the features that read the conditional keys (the critic of gae, the reference of a KL
penalty, a group filter, process rewards, IGPO), and compares that with every leaf key of the schema.
"""

from __future__ import annotations

import pytest
from conftest import TINY_OVERRIDES, write_jsonl
from pydantic import BaseModel

from rewardlab.config import EvaluateConfig, TrainConfig, load_config
from rewardlab.config.loader import ConfigError
from rewardlab.config.reference import config_keys
from rewardlab.config.schema import TinyArch, _Base

import episode_envs  # noqa: F401  (registers env:test_turns, its reward and the test_walk_steps process reward)

#: Keys that only apply in one mode, with the override that sets them, refused in the other mode.
ENV_ONLY = ["env.max_turns=2", "env.max_episode_tokens=30", "env.max_tool_tokens=20", "env.tool_keep=end",
            "env.tool_timeout_s=2", "env.max_tool_calls_per_turn=2", "rl.turn_rewards=info_gain"]
SINGLE_TURN_ONLY = ["rl.step_separator=';'", "rl.canaries.fraction=0.5", "rl.canaries.generator=wrong_answer",
                    "rl.monitor.every=1", "rl.monitor.n=5", "rl.monitor.samples=2", "rl.monitor.gold=exact_match",
                    "rl.monitor.kl_to_init=true", "rl.monitor.window=1", "rl.monitor.confidence=0.9",
                    "rl.monitor.min_drop=0.1", "rl.monitor.patience=1", "rl.monitor.resamples=10",
                    "rl.monitor.stop_on_alarm=true"]
#: Keys that only engine ray reads, refused on engine local (every run below) in both modes.
RAY_ONLY = ["rl.ray.rollout_workers=3", "rl.ray.reward_workers=1", "rl.ray.address=auto",
            "rl.ray.rollout_worker_cpus=1", "rl.ray.rollout_worker_gpus=0.5", "rl.ray.reward_worker_cpus=1",
            "rl.ray.reward_worker_gpus=0.5", "rl.ray.dashboard=true", "rl.ray.max_staleness=1"]


@pytest.fixture
def reads(monkeypatch):
    """The (class name, field) pairs of config models read while the fixture is active."""
    seen: set[tuple[str, str]] = set()
    get = BaseModel.__getattribute__

    def getattribute(self, name):
        fields = type(self).model_fields
        if name in fields:
            seen.add((type(self).__name__, name))
        return get(self, name)

    monkeypatch.setattr(_Base, "__getattribute__", getattribute)
    return seen


def _consumed(seen: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The reads, with the embedded model's size read whole when `model.tiny` is (policy_options dumps it)."""
    return seen | ({("TinyArch", name) for name in TinyArch.model_fields} if ("ModelConfig", "tiny") in seen else set())


def _leaf_owners(cls: type[BaseModel]) -> dict[str, tuple[str, str]]:
    """Dotted leaf key -> (owning class name, field)."""
    out: dict[str, tuple[str, str]] = {}

    def walk(model_cls, prefix):
        for name, field in model_cls.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            else:
                out[prefix + name] = (model_cls.__name__, name)

    walk(cls, "")
    assert set(out) == {k.key for k in config_keys(cls)}
    return out


def _single_task(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    return [f"task.spec=jsonl:{write_jsonl(tmp_path / 'task.jsonl', rows)}", "task.options={test_size: 5}"]


BASE = [*TINY_OVERRIDES, "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=3",
        "save_every=1", "keep_checkpoints=1", "threads=1", "rl.eval.every=1", "rl.eval.n=2", "rl.logging.log_samples=3",
        "rl.sampling.rollout_chunk=2"]
SINGLE_RUNS = [
    [],
    ["rl.estimator=gae", "rl.beta=0.1", "rl.kl_in=reward", "rl.ref_refresh_every=1", "rl.entropy_coef=0.01",
     "rl.mask_truncated=true", "rl.lr_schedule=cosine", "rl.warmup_steps=1"],
    ["rl.filtering.group_filter=dapo", "rl.filtering.filter_metric=score", "rl.filtering.max_rounds=2",
     "rl.clip_eps=0.3", "rl.filtering.curriculum=pass_rate", "rl.beta=0.1", "rl.kl_in=loss"],
    ["rl.estimator=pure", "rl.step_separator='+'", "rewards=[{name: test_walk_steps}]", "on_error=skip"],
    ["rl.canaries.fraction=0.5", "rl.canaries.generator=wrong_answer", "rl.monitor.stop_on_alarm=true"],
]
ENV_RUNS = [
    ["rl.estimator=turn_grpo", "rl.turn_rewards=info_gain"],
    ["rl.estimator=gae", "rl.beta=0.1", "rl.mask_truncated={max_turns: 0.5}", "rl.filtering.group_filter=dapo",
     "rl.minibatch_size=1", "rl.epochs=2"],
]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "env"])
def test_every_train_key_is_read_in_each_mode_or_refused(mode, tmp_path, reads):
    from rewardlab.rl.trainer import train

    task = _single_task(tmp_path) if mode == "single" else ["task.spec=env:test_turns", "env.max_episode_tokens=30"]
    runs = SINGLE_RUNS if mode == "single" else ENV_RUNS
    for i, extra in enumerate(runs):
        cfg = load_config(TrainConfig, None, [*task, *BASE, f"out={tmp_path / f'run{i}'}", *extra])
        train(cfg, show_progress=False)
    read = _consumed(reads)  # before the schema walk below, which reads every default
    owners = _leaf_owners(TrainConfig)
    refused = (ENV_ONLY if mode == "single" else SINGLE_TURN_ONLY) + RAY_ONLY
    refused_keys = {o.partition("=")[0] for o in refused}
    unread = sorted(k for k, owner in owners.items()
                    if owner not in read and k not in refused_keys)
    assert unread == [], f"{mode}: config keys no run read (silent settings): {unread}"
    for override in refused:  # ... and each key that does not apply is refused when set, naming it
        key = override.partition("=")[0]
        cfg_args = [*task, *BASE, f"out={tmp_path / 'refused'}", override]
        if key == "rl.turn_rewards":
            cfg_args.append("rl.estimator=turn_grpo")
        with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
            train(load_config(TrainConfig, None, cfg_args), show_progress=False)
        assert not (tmp_path / "refused").exists()


@pytest.mark.slow
def test_every_evaluate_key_is_read_on_an_environment_task(tmp_path, reads):
    from rewardlab.cli import main

    assert main(["evaluate", "task.spec=env:test_turns", *TINY_OVERRIDES, "env.max_turns=2",
                 "env.max_episode_tokens=20", "eval.n=2", "eval.k=[1,2]", "eval.max_new_tokens=3", "eval.limit=2",
                 "eval.batch_size=1", "eval.temperature=0.9", "eval.top_p=0.9", "split=test", "threads=1",
                 f"--out={tmp_path / 'eval'}"]) == 0
    read = _consumed(reads)  # before the schema walk below, which reads every default
    owners = _leaf_owners(EvaluateConfig)
    tool_keys = {"env.max_tool_tokens", "env.tool_keep", "env.tool_timeout_s",
                 "env.max_tool_calls_per_turn"}  # refused: test_turns has no tools
    unread = sorted(k for k, owner in owners.items() if owner not in read and k not in tool_keys)
    assert unread == [], f"evaluate: config keys no run read (silent settings): {unread}"
