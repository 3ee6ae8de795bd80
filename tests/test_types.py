import math

import pytest

from rewardlab.types import Rollout, RewardOutput


def _rollout(**kw):
    base = dict(prompt="1+1=", prompt_ids=[1, 21, 15, 21, 33], completion="2", completion_ids=[22, 2],
                logprobs=[-0.5, -0.1])
    base.update(kw)
    return Rollout(**base)


def test_rollout_rejects_logprobs_of_other_length():
    with pytest.raises(ValueError, match="logprobs has 1 entries but completion_ids has 2"):
        _rollout(logprobs=[-0.5])


def test_rollout_answer_comes_from_row():
    assert _rollout(row={"answer": "2"}).answer == "2"
    assert _rollout().answer is None


def test_rollout_defaults():
    r = _rollout()
    assert (r.group, r.steps, r.truncated, r.turns, r.row) == (0, [], False, [], {})


def test_reward_output_nan_without_error_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        RewardOutput(score=math.nan)


def test_reward_output_nan_with_error_is_allowed():
    out = RewardOutput(score=math.nan, error="r: failed")
    assert out.error == "r: failed" and math.isnan(out.score)


def test_reward_output_defaults():
    out = RewardOutput(score=0.5)
    assert (out.components, out.step_scores, out.error) == ({}, None, None)
