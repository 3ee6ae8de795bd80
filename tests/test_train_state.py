"""trainer_state.pt is data, never code: `load_state` unpickles with torch's weights-only unpickler, which builds
tensors, plain containers and rewardlab's own records (Rollout, RewardOutput) and refuses every other global, so a
checkpoint from someone else cannot run code on --resume."""

import os
import random

import pytest
import torch

from rewardlab.tasks.sampler import RowSampler
from rewardlab.train_state import STATE_FILE, load_state, rng_state, save_state
from rewardlab.types import RewardOutput, Rollout


class Hostile:
    """Unpickling it calls os.mkdir(marker): what a hostile trainer_state.pt does instead of restoring state."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "rng": Hostile(marker)}, tmp_path / STATE_FILE)
    with pytest.raises(ValueError) as info:
        load_state(tmp_path)
    assert not marker.exists()
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path / STATE_FILE) in msg and "mkdir" in msg and "not data" in msg


def test_a_file_that_is_no_pickle_is_one_line(tmp_path):
    (tmp_path / STATE_FILE).write_bytes(b"garbage")
    with pytest.raises(ValueError) as info:
        load_state(tmp_path)
    assert "\n" not in str(info.value) and str(tmp_path / STATE_FILE) in str(info.value)


def test_what_the_loops_save_loads_back_exactly(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    sampler = RowSampler(list(range(5)), seed=3)
    sampler.next_indices(2)
    generator = torch.Generator().manual_seed(1)
    rollout = Rollout(prompt="1+1=", prompt_ids=[1, 2], completion="2", completion_ids=[3], logprobs=[-0.5],
                      row={"prompt": "1+1=", "answer": "2", "metadata": {"terms": (1, 1)}}, steps=[(0, 1)],
                      tool_calls=[[{"name": "calc", "arguments": {"x": 1}, "status": "ok", "seconds": 0.1}]])
    state = {"step": 2, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "sampler": sampler.state_dict(), "curriculum": {"generator": generator.get_state()},
             "rng": rng_state(), "order_rng": random.Random(5).getstate(),
             "prefetch": {"next": 3, "batches": {3: {"all_rollouts": [rollout], "all_outputs": [
                 RewardOutput(score=1.0, components={"correct": 1.0}, step_scores=[1.0])],
                 "inputs": {"baseline": torch.zeros(1)}, "metrics": {"reward/mean": 1.0}}}}}
    save_state(tmp_path, state)
    loaded = load_state(tmp_path)
    assert loaded["prefetch"]["batches"][3]["all_rollouts"] == [rollout]
    assert loaded["prefetch"]["batches"][3]["all_outputs"][0] == state["prefetch"]["batches"][3]["all_outputs"][0]
    assert loaded["sampler"] == state["sampler"] and loaded["order_rng"] == state["order_rng"]
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"]) and loaded["rng"]["python"] == state["rng"][
        "python"]
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh.load_state_dict(loaded["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    RowSampler(list(range(5)), seed=0).load_state_dict(loaded["sampler"])


def test_restore_training_state_puts_back_weights_optimizer_schedule_sampler_and_rng(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rewardlab.train_state import restore_training_state

    def build(seed):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (s + 1))
        return model, optimizer, scheduler, RowSampler(list(range(5)), seed=3)

    model, optimizer, scheduler, sampler = build(0)
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    scheduler.step()
    sampler.next_indices(2)
    model.save_pretrained(tmp_path)
    save_state(tmp_path, {"step": 1, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                          "sampler": sampler.state_dict(), "rng": rng_state()})
    after = (torch.rand(3), random.random(), sampler.next_indices(3))

    fresh, fresh_opt, fresh_sched, fresh_sampler = build(1)
    params = list(fresh.parameters())
    saved = restore_training_state(tmp_path, fresh_opt, fresh_sched, model=fresh, sampler=fresh_sampler)
    assert saved["step"] == 1 and all(a is b for a, b in zip(params, fresh.parameters()))  # restored in place
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_sched.state_dict() == scheduler.state_dict()
    assert torch.equal(torch.rand(3), after[0]) and random.random() == after[1]
    assert fresh_sampler.next_indices(3) == after[2]
