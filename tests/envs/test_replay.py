"""The samples.jsonl episode record (`episode_record`) and `replay`: replayed rollouts pack into the same tensors as
the live ones, and a golden episode file pins the format.

Regenerate the golden file (only when the format changes on purpose) with:
    PYTHONPATH=src python tests/envs/test_replay.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from episode_fakes import BOS, EOS, CalcEnv, RawRenderer, ScriptedSampler, assert_prefixes, run_episodes_flat

from rewardlab.envs import StepResult, episode_record, replay, run_episodes
from rewardlab.policy import rollout_batch
from rewardlab.policy.batch import collate
from rewardlab.types import RewardOutput

GOLDEN = Path(__file__).parent / "data" / "golden_episode.jsonl"


class PadPolicy:
    """What `rollout_batch` needs of a policy: `collate` with pad id 0."""

    def collate(self, prompt_ids, completion_ids):
        return collate(prompt_ids, completion_ids, pad_id=0)


class AskEnv:
    """Each action with a "?" gets the tool answer "7" (reward 0.5); an action without one ends the episode."""

    stop = ("?",)

    def reset(self, row):
        return {}

    def step(self, state, action):
        if "?" not in action:
            return StepResult(None, True, None, {"termination": "stop", "tool_calls": []})
        return StepResult([{"role": "tool", "name": "ask", "content": "7"}], False, 0.5,
                          {"tool_calls": [{"name": "ask", "arguments": {"q": action}, "status": "ok", "seconds": 0.0}]})


def golden_episode():
    """The golden episode: prompt "Q"; turns "a?", "c?", "b</s>"; tool output "[7]" twice; the chat template cannot
    append the second observation, so the episode is two rows."""
    renderer = RawRenderer(split_at=(2,), tool=("[", "]"))
    sampler = ScriptedSampler({0: ["a?", "c?", "b$"]}, renderer=renderer)
    rollouts = run_episodes_flat(sampler, AskEnv(), [{"prompt": "Q", "answer": "b"}], n=1, max_turns=3,
                                 max_new_tokens=4, max_episode_tokens=16, temperature=1.0, renderer=renderer)
    assert_prefixes(sampler, rollouts)
    return rollouts, episode_record(rollouts, RewardOutput(1.0, {"correct": 1.0}), [0.25, 0.5, 1.0])


def test_the_golden_episode_replays_into_the_training_tensors_written_by_hand():
    (record,) = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    rows = replay(record)
    batch, old = rollout_batch(PadPolicy(), rows)
    # ids: <s>=1 </s>=2 Q=53 a=69 ?=35 [=63 7=27 ]=65 c=71 b=70, pad 0
    assert batch.prompt_len == 12
    assert batch.input_ids.tolist() == [
        [0] * 10 + [1, 53] + [69, 35, 63, 27, 65, 71, 35],
        [1, 53, 69, 35, 63, 27, 65, 71, 35, 63, 27, 65] + [70, 2, 0, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[0] * 10 + [1] * 9, [1] * 14 + [0] * 5]
    assert batch.position_ids[0].tolist() == [0] * 11 + list(range(1, 9))
    assert batch.mask.tolist() == [[1.0] * 7, [1.0, 1.0] + [0.0] * 5]
    assert old.tolist() == [[-1.0, -1.015625, 0.0, 0.0, 0.0, -1.25, -1.265625], [-1.5, -1.515625] + [0.0] * 5]
    assert [r.loss_mask for r in rows] == [[1, 1, 0, 0, 0, 1, 1], [1, 1]]
    assert [r.turns for r in rows] == [[(0, 2), (5, 7)], [(0, 2)]]
    assert [r.first_turn for r in rows] == [0, 2] and [r.episode_id for r in rows] == [0, 0]
    assert [r.termination for r in rows] == [None, "stop"]
    assert [r.turn_rewards for r in rows] == [[0.5, 0.5], [0.0]]
    assert [r.completion for r in rows] == ["c?", "b"] and rows[1].prompt == "Qa?[7]c?[7]"
    assert [len(r.messages) for r in rows] == [4, 6]
    assert record["reward"] == 1.0 and record["components"] == {"correct": 1.0}
    assert record["advantages"] == [0.25, 0.5, 1.0] and record["n_turns"] == 3


def test_the_golden_file_is_what_the_loop_writes_today():
    """A change of the episode layout or of the record format fails here (regenerate the file on purpose)."""
    _, record = golden_episode()
    assert json.loads(json.dumps(record)) == json.loads(GOLDEN.read_text())


def test_replayed_rollouts_equal_the_live_ones_and_pack_into_the_same_tensors():
    renderer = RawRenderer(split_at=(4,))  # extends in batch order: the 4th is episode 1's second
    scripts = {0: ["<c>1+1</c>", "#2$"], 1: ["<c>1+2</c>", "<c>3+4</c>", "<c>5+6</c>", "x$"],
               2: ["yyyyyyyyyyyy$"], 3: ["<c>9+9</c>", "18$"]}
    sampler = ScriptedSampler(scripts, renderer=renderer)
    rows = [{"prompt": "A", "answer": "2"}, {"prompt": "B", "answer": "3"}]
    live = run_episodes_flat(sampler, CalcEnv(), rows, n=2, max_turns=4, max_new_tokens=10, max_episode_tokens=60,
                             temperature=1.0, renderer=renderer)
    assert [r.episode_id for r in live] == [0, 1, 1, 2, 3]  # episode 1 was split
    episodes = [[r for r in live if r.episode_id == e] for e in range(4)]
    records = [episode_record(rs, RewardOutput(float(e), {"correct": 0.0}), [0.5] * sum(len(r.turns) for r in rs))
               for e, rs in enumerate(episodes)]
    replayed = [r for rec in records for r in replay(json.loads(json.dumps(rec)))]
    assert replayed == live  # every field, the termination only on the last row of each episode
    (b1, o1), (b2, o2) = rollout_batch(PadPolicy(), live), rollout_batch(PadPolicy(), replayed)
    for name in ("input_ids", "attention_mask", "position_ids", "completion_ids", "mask"):
        assert torch.equal(getattr(b1, name), getattr(b2, name)), name
    assert torch.equal(o1, o2)
    assert records[2]["termination"] == "max_new_tokens" and records[2]["truncated"]
    assert records[1]["turn_rewards"] == [0.5, 0.5, 0.5, 0.0] and len(records[1]["rows"]) == 2


def test_episode_record_and_replay_refuse_bad_input_in_one_line():
    rollouts, record = golden_episode()
    with pytest.raises(ValueError, match="2 advantages for 3 turns"):
        episode_record(rollouts, None, [0.0, 0.0])
    with pytest.raises(ValueError, match="only the episode's last row has a termination"):
        episode_record(rollouts[:1])
    with pytest.raises(ValueError, match="no rollouts"):
        episode_record([])
    bad = json.loads(json.dumps(record))
    del bad["rows"][1]["loss_mask"]
    with pytest.raises(ValueError, match="rows\\[1\\] has no 'loss_mask'"):
        replay(bad)
    bad = json.loads(json.dumps(record))
    bad["rows"][0]["logprobs"].pop()
    with pytest.raises(ValueError, match="rows\\[0\\]: Rollout.logprobs has 6 entries"):
        replay(bad)
    with pytest.raises(ValueError, match="has no 'rows' \\(not an episode record\\)"):
        replay({k: v for k, v in record.items() if k != "rows"})
    bad = json.loads(json.dumps(record))
    bad["rows"][1]["first_turn"] = 1
    with pytest.raises(ValueError, match="rows\\[1\\].first_turn is 1, but the rows before it have 2 turns"):
        replay(bad)
    assert record["rows"][0]["prompt_ids"] == [BOS, 53] and record["rows"][1]["completion_ids"] == [70, EOS]


if __name__ == "__main__":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(golden_episode()[1]) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
