"""`collect` on the tiny model: ReMax's greedy baseline is generated there and counted in the step's generation
time and tokens."""

import pytest

import rewardlab.rl.trainer as trainer
from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.config import TrainConfig, load_config
from rewardlab.policy import Policy


def _config(tmp_path, *overrides):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    return load_config(TrainConfig, None, [
        f"task.spec=jsonl:{task}", "task.options={test_size: 5}", f"out={tmp_path / 'run'}", *TINY_OVERRIDES,
        "rl.prompts_per_step=3", "rl.group_size=2", "rl.max_new_tokens=4", "rewards=[{name: exact_match}]",
        *overrides,
    ])


@pytest.mark.parametrize("estimator, generate_calls", [("grpo", 1), ("remax", 2)])
def test_collect_times_every_generation(tmp_path, monkeypatch, estimator, generate_calls):
    # A fake clock that only moves inside Policy.generate, by 10 s a call: gen_s counts exactly the generations.
    clock, calls = [0.0], []
    generate = Policy.generate

    def timed_generate(self, prompts, **kw):
        calls.append(kw.get("greedy", False))
        clock[0] += 10.0
        return generate(self, prompts, **kw)

    monkeypatch.setattr(Policy, "generate", timed_generate)
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: clock[0])
    state = trainer.setup(_config(tmp_path, f"rl.estimator={estimator}"))
    try:
        state.step = 1
        batch = trainer.collect(state)
    finally:
        state.run.close()
    assert calls == [False, True][:generate_calls]  # the sampled round, then (remax) one greedy generation
    assert batch.gen_s == 10.0 * generate_calls
    sampled = sum(len(r.completion_ids) for r in batch.all_rollouts)
    if estimator == "remax":
        assert sorted(batch.inputs) == ["baseline"] and batch.inputs["baseline"].shape == (6,)  # 3 prompts x 2
        b = batch.inputs["baseline"].tolist()
        assert b[0] == b[1] and b[2] == b[3] and b[4] == b[5]  # one greedy reward per prompt group
        assert sampled < batch.gen_tokens <= sampled + 3 * 4  # + at most 4 greedy tokens for each of 3 prompts
    else:
        assert batch.inputs == {} and batch.gen_tokens == sampled
