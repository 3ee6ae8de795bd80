"""The episode loop over the real chat renderer (`rewardlab.envs.render`), with chat templates written here on the
tiny char tokenizer (its <s> and </s> spelled character by character in the template; the model's EOS, id 2,
decodes to "</s>"): append-only (one row, the template's tokens after each turn with loss mask 0) and one that strips
the reasoning of earlier turns (the episode continues in a new row whose prompt is the re-rendered history)."""

from __future__ import annotations

import importlib.util

import pytest
from episode_fakes import EOS, THINK_STRIP, RecordedChat, ScriptedSampler, assert_prefixes, enc, run_episodes_flat

from rewardlab.envs import StepResult, run_episodes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("rewardlab.envs.render") is None,
                                reason="needs rewardlab.envs.render")

CHATML = ("{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


class Guess:
    """Answers "higher" (a user message) until the model's turn ends in "7"."""

    def reset(self, row):
        return {}

    def step(self, state, action):
        if action.endswith("7"):
            return StepResult(None, True, 1.0, {})
        return StepResult("higher", False, 0.0, {})


def play(template):
    renderer = RecordedChat(template)
    sampler = ScriptedSampler({0: ["<think>hm</think>5$", "<think>ok</think>7$"]}, renderer=renderer)
    out = run_episodes_flat(sampler, Guess(), [{"prompt": "Q"}], n=1, max_turns=3, max_new_tokens=30,
                            max_episode_tokens=200, temperature=1.0, renderer=renderer)
    assert_prefixes(sampler, out)
    return out


def test_an_append_only_template_gives_one_row_with_its_own_tokens_masked():
    (r,) = play(CHATML)
    assert r.prompt_ids == enc("<s>user\nQ</s>\n<s>assistant\n")
    inserted = enc("\n<s>user\nhigher</s>\n<s>assistant\n")  # after the sampled EOS ("</s>")
    t1, t2 = enc("<think>hm</think>5") + [EOS], enc("<think>ok</think>7") + [EOS]
    assert r.completion_ids == t1 + inserted + t2
    assert r.loss_mask == [1] * len(t1) + [0] * len(inserted) + [1] * len(t2)
    assert r.termination == "env_done" and r.completion == "<think>ok</think>7"
    assert r.prompt == "<s>user\nQ</s>\n<s>assistant\n"


def test_a_template_that_rewrites_an_earlier_turn_continues_the_episode_in_a_new_row():
    first, second = play(THINK_STRIP)
    assert first.episode_id == second.episode_id
    assert first.completion_ids == enc("<think>hm</think>5") + [EOS] and first.loss_mask == [1] * 19
    assert first.termination is None and first.turns == [(0, 19)]
    # the new row's prompt is the template's rendering of the history: the earlier reasoning is gone
    assert second.prompt_ids == enc("<s>user\nQ</s>\n<s>assistant\n5</s>\n<s>user\nhigher</s>\n<s>assistant\n")
    assert second.completion_ids == enc("<think>ok</think>7") + [EOS] and second.first_turn == 1
    assert second.termination == "env_done" and second.turn_rewards == [1.0]
    assert [m["content"] for m in second.messages] == ["Q", "<think>hm</think>5", "higher", "<think>ok</think>7"]
