import math

import pytest

from conftest import make_rollout
from rewardlab.types import Rollout, RewardOutput


def test_rollout_rejects_logprobs_of_other_length():
    with pytest.raises(ValueError, match="logprobs has 1 entries but completion_ids has 2"):
        make_rollout("2", n_tokens=2, logprobs=[-0.5])


def test_rollout_answer_comes_from_row():
    assert make_rollout("2", {"answer": "2"}).answer == "2"
    assert make_rollout("2").answer is None


def test_rollout_defaults():
    r = Rollout(prompt="1+1=", prompt_ids=[1, 21, 15, 21, 33], completion="2", completion_ids=[22, 2],
                logprobs=[-0.5, -0.1])
    assert (r.group, r.steps, r.truncated, r.row) == (0, [], False, {})


def test_reward_output_nan_without_error_is_rejected():
    with pytest.raises(ValueError, match="NaN"):
        RewardOutput(score=math.nan)


def test_reward_output_nan_with_error_is_allowed():
    out = RewardOutput(score=math.nan, error="r: failed")
    assert out.error == "r: failed" and math.isnan(out.score)


def test_reward_output_defaults():
    out = RewardOutput(score=0.5)
    assert (out.components, out.step_scores, out.error) == ({}, None, None)


def test_split_steps_tiles_the_text_and_merges_blank_pieces():
    from rewardlab.types import split_steps

    text = "a\nb\n\nc"
    spans = split_steps(text)
    assert [text[a:b] for a, b in spans] == ["a\n", "b\n\n", "c"]  # the blank line joins step "b"
    assert split_steps("") == []
    assert [("\nx\n")[a:b] for a, b in split_steps("\nx\n")] == ["\nx\n"]  # a blank first piece joins the next
    assert split_steps("x. y. ", ". ") == [(0, 3), (3, 6)]
    with pytest.raises(ValueError, match="separator"):
        split_steps("x", "")


def test_step_text_must_match_steps():
    with pytest.raises(ValueError, match="step_text"):
        Rollout(prompt="p", prompt_ids=[1], completion="ab", completion_ids=[4, 5], logprobs=[0.0, 0.0],
                steps=[(0, 2)], step_text=["a", "b"])
