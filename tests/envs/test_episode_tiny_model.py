"""The episode loop end to end with the embedded tiny model (`Policy.sample_ids`) and the default renderer, raw and
with a ChatML-like chat template (written here; the tiny tokenizer spells its markers character by character).

The random model's turns are kept short by stop strings (every lowercase letter and digit ends a turn), and the
environment answers every turn with a tool message until the third, so every episode has several turns."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import TINY_ARCH

from episode_fakes import run_episodes_flat

from rewardlab.envs import StepResult, run_episodes
from rewardlab.policy import Policy, load_policy, rollout_batch
from rewardlab.policy.tiny import build_model, build_tokenizer

#: ChatML-style and append-only, with the tiny tokenizer's <s> and </s> as its markers.
CHAT = ("{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}")

pytestmark = pytest.mark.skipif(
    not hasattr(Policy, "sample_ids") or importlib.util.find_spec("rewardlab.envs.render") is None,
    reason="needs Policy.sample_ids and rewardlab.envs.render",
)


class Echo:
    """Answers each turn with a tool message holding its length; done (env_done, reward 1) after turn 3."""

    stop = tuple("abcdefghijklmnopqrstuvwxyz0123456789")

    def reset(self, row):
        return {"turn": 0}

    def step(self, state, action):
        state["turn"] += 1
        if state["turn"] == 3:
            return StepResult(None, True, 1.0, {})
        return StepResult([{"role": "tool", "name": "len", "content": str(len(action))}], False, 0.25,
                          {"tool_calls": [{"name": "len", "arguments": {}, "status": "ok", "seconds": 0.0}]})

    def raw_text(self, message):
        return f"<o>{message['content']}</o>"


class Recording:
    """A TokenSampler proxy that records what the policy was given and returned."""

    def __init__(self, policy):
        self.policy, self.calls = policy, []
        self.eos_token_id, self.context_window = policy.eos_token_id, policy.context_window
        self.tokenizer, self.prompt_format = policy.tokenizer, policy.prompt_format

    def sample_ids(self, prompts, **kw):
        out = self.policy.sample_ids(prompts, **kw)
        self.calls.append((prompts, kw["streams"], out))
        return out


def episodes(policy, seed=0):
    rows = [{"prompt": "Q: 12+34=?\n", "answer": "46"}, {"prompt": "Q: 5*6=?\n", "answer": "30"}]
    return run_episodes_flat(policy, Echo(), rows, n=2, max_turns=4, max_new_tokens=12, max_episode_tokens=100,
                             temperature=1.0, seed=seed, step=1)


def tiny(fmt):
    if fmt == "raw":
        return load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    tok = build_tokenizer()
    tok.chat_template = CHAT
    return Policy(build_model(tok, seed=0, **TINY_ARCH), tok, "chat")


@pytest.mark.parametrize("fmt", ["raw", "chat"])
def test_tiny_model_episodes_are_token_exact_and_their_logprobs_are_the_models(fmt):
    policy = tiny(fmt)
    rec = Recording(policy)
    out = episodes(rec)
    assert len(out) == 4 and [r.group for r in out] == [0, 0, 1, 1]
    by_id = {r.episode_id: r for r in out}
    for prompts, streams, sampled in rec.calls:  # each turn saw exactly its row's prefix
        for ids, stream, s in zip(prompts, streams, sampled):
            r = by_id[stream[2]]
            a, b = r.turns[stream[4]]
            assert list(ids) == r.prompt_ids + r.completion_ids[:a] and s.ids == r.completion_ids[a:b]
    for r in out:
        formatted = policy.format_prompt(r.row["prompt"])
        assert r.prompt_ids == policy.encode_prompt(formatted) and r.prompt == formatted  # the single-turn path's
        assert r.termination in ("env_done", "max_new_tokens", "max_episode_tokens")
        sampled = [i for a, b in r.turns for i in range(a, b)]
        assert [k for k, m in enumerate(r.loss_mask) if m] == sampled
        assert all(r.logprobs[k] == 0.0 for k in range(len(r.loss_mask)) if not r.loss_mask[k])
    assert sum(len(r.turns) for r in out) > len(out)  # episodes have several turns
    # the behaviour log-probs are what the model gives the trained ids (no drift between sampling and training)
    batch, old = rollout_batch(policy, out)
    with torch.no_grad():
        new, _ = policy.token_logprobs(batch)
    mask = torch.zeros_like(old)
    for i, r in enumerate(out):
        mask[i, : len(r.loss_mask)] = torch.tensor(r.loss_mask, dtype=torch.float32)
    assert torch.allclose(new * mask, old, atol=1e-4)
    # streams make episodes reproducible, and another seed draws others
    again = episodes(policy)
    assert [r.completion_ids for r in again] == [r.completion_ids for r in out]
    other = episodes(policy, seed=1)
    assert [r.completion_ids for r in other] != [r.completion_ids for r in out]
