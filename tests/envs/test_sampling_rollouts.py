"""`sample_rollouts`: single completions and episodes through one call, independent of batching; `episode_ends`
and `episode_rows` read a batch of rows per episode."""

from __future__ import annotations

import pytest
from conftest import TINY_ARCH

from rewardlab.envs import make_env
from rewardlab.envs.sampling import EpisodeSettings, episode_ends, episode_rows, sample_rollouts
from rewardlab.policy import SamplingSettings, load_policy
from rewardlab.types import Rollout


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)


ROWS = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "3+4=", "answer": "7"}, {"prompt": "2+2=", "answer": "4"}]


def _key(r: Rollout):
    return (r.group, r.prompt_ids, r.completion_ids, r.episode_id, r.termination)


def test_single_completions_are_the_trainers_streams_and_do_not_depend_on_batching(policy):
    sampling = SamplingSettings(max_new_tokens=5)
    whole = sample_rollouts(policy, ROWS, sampling, episodes=None, n=2, stream=(3, 7, 1))
    chunked = sample_rollouts(policy, ROWS, sampling, episodes=None, n=2, stream=(3, 7, 1), batch_size=1)
    direct = policy.generate([r["prompt"] for r in ROWS], n=2, max_new_tokens=5, rows=ROWS,
                             streams=[(3, 7, k, 1) for k in range(6)])
    assert [_key(r) for r in whole] == [_key(r) for r in chunked] == [_key(r) for r in direct]
    assert [r.group for r in whole] == [0, 0, 1, 1, 2, 2]
    assert episode_ends(whole) == whole and all(v == [r] for r, v in zip(whole, episode_rows(whole).values()))


def test_episodes_are_grouped_by_row_and_do_not_depend_on_batching(policy):
    env = make_env("guess_number", n=8, size=4, test_size=1)
    rows = env.rows("train", n=3)
    settings = EpisodeSettings(env, max_turns=3, max_episode_tokens=40)
    sampling = SamplingSettings(max_new_tokens=6)
    whole = sample_rollouts(policy, rows, sampling, episodes=settings, n=2, stream=(0, 1, 1))
    chunked = sample_rollouts(policy, rows, sampling, episodes=settings, n=2, stream=(0, 1, 1), batch_size=2)
    assert [_key(r) for r in whole] == [_key(r) for r in chunked]
    ends = episode_ends(whole)
    assert [r.episode_id for r in ends] == [0, 1, 2, 3, 4, 5] and [r.group for r in ends] == [0, 0, 1, 1, 2, 2]
    assert all(r.termination is not None for r in ends)


def _row(episode, last):
    return Rollout(prompt="p", prompt_ids=[1], completion="c", completion_ids=[5], logprobs=[0.0], episode_id=episode,
                   termination="stop" if last else None)


def test_episode_rows_groups_consecutive_rows_and_refuses_an_episode_without_its_last_row():
    a0, a1, b0, single = _row(0, False), _row(0, True), _row(1, True), Rollout("p", [1], "c", [5], [0.0])
    rows = episode_rows([a0, a1, single, b0])
    assert list(rows.values()) == [[a0, a1], [single], [b0]]
    assert episode_ends([a0, a1, single, b0]) == [a1, single, b0]
    with pytest.raises(ValueError, match="episode 0: no last row"):
        episode_rows([a0, b0])
    with pytest.raises(ValueError, match="episode 0: no last row"):
        episode_rows([a0])


def test_episode_metrics_by_hand():
    from rewardlab.envs import episode_metrics

    ok, bad = {"name": "calc", "status": "ok"}, {"name": "calc", "status": "timeout"}
    # episode A: two rows, 3 turns (calls: [ok], [], [bad, ok]), ends max_turns; episode B: one row, 1 turn, stop
    a0 = Rollout("p", [1], "c", [5, 6, 7], [0.0] * 3, loss_mask=[1, 0, 1], turns=[(0, 1), (2, 3)],
                 tool_calls=[[ok], []], episode_id=0)
    a1 = Rollout("p", [1], "c", [8, 9], [0.0] * 2, loss_mask=[0, 1], turns=[(1, 2)], tool_calls=[[bad, ok]],
                 episode_id=0, termination="max_turns", first_turn=2)
    b0 = Rollout("p", [1], "c", [4], [0.0], tool_calls=[[]], episode_id=1, termination="stop")
    m = episode_metrics([[a0, a1], [b0]])
    assert m["episode/turns_mean"] == 2.0 and m["episode/rows_mean"] == 1.5
    assert m["episode/tokens_mean"] == 3.0 and m["episode/sampled_tokens_mean"] == 2.0
    assert m["episode/termination/max_turns"] == 0.5 and m["episode/termination/stop"] == 0.5
    assert m["episode/termination/context"] == 0.0
    assert m["tool/calls_mean"] == 1.5 and m["tool/errors_mean"] == 0.5 and m["tool/errors/timeout"] == 0.5
    assert m["tool/call_rate"] == 2 / 4
    assert episode_metrics([]) == {}
