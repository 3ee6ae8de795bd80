"""`rl.rollouts.produce` samples each rollout from its own random stream (seed, step, index in the round's batch,
round)."""

import torch

import rewardlab.rl.trainer as trainer
from rewardlab.rl.rollouts import produce
from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.policy import Policy


def _config(tmp_path, name, *overrides):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / name}", *TINY_OVERRIDES,
        "rl.prompts_per_step=3", "rl.group_size=2", "rl.sampling.max_new_tokens=4", "rewards=[{name: exact_match}]",
        "seed=7", *overrides,
    ])


def _collect(cfg, step, torch_seed):
    run, progress = trainer.setup(cfg)
    try:
        torch.manual_seed(torch_seed)  # what the global generator holds must not matter
        return [e.last for e in produce(run, step).episodes]
    finally:
        trainer.close(run, progress)


def test_produce_passes_one_stream_per_rollout_and_round(tmp_path, monkeypatch):
    # The untrained model never answers right: every group is tied, dapo drops them all, and a second round runs.
    seen = []
    generate = Policy.generate

    def recording_generate(self, prompts, **kw):
        seen.append(kw.get("streams"))
        return generate(self, prompts, **kw)

    monkeypatch.setattr(Policy, "generate", recording_generate)
    _collect(_config(tmp_path, "run", "rl.filtering.group_filter=dapo", "rl.filtering.max_rounds=2"), step=3,
             torch_seed=0)
    assert seen == [[(7, 3, k, 1) for k in range(6)], [(7, 3, k, 2) for k in range(6)]]


def test_collected_rollouts_do_not_depend_on_the_global_generator(tmp_path):
    a = _collect(_config(tmp_path, "a"), step=1, torch_seed=0)
    b = _collect(_config(tmp_path, "b"), step=1, torch_seed=1)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    c = _collect(_config(tmp_path, "c"), step=2, torch_seed=0)  # another step: other streams
    assert [r.completion_ids for r in c] != [r.completion_ids for r in a]
