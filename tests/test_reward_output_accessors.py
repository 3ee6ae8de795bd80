"""RewardOutput.correct and RewardOutput.errors: what the trainer's accuracy and reward/errors/<name> read."""

from rewardlab.types import RewardOutput, parse_errors


def test_correct_reads_the_correct_component_then_the_score():
    assert RewardOutput(1.0).correct and not RewardOutput(0.99).correct
    assert RewardOutput(0.2, {"correct": 1.0}).correct  # the component decides, not the shaped score
    assert not RewardOutput(1.0, {"correct": 0.0}).correct
    assert not RewardOutput(1.0, {"correct": 1.0}, error="math: timed out").correct  # an error is never correct


def test_errors_split_joined_texts_into_reward_and_cause():
    out = RewardOutput(0.0, error="judge: HTTP 500 from http://h/v1: x; math: timed out after 2 s")
    assert out.errors == [("judge", "HTTP 500 from http://h/v1: x"), ("math", "timed out after 2 s")]
    assert RewardOutput(1.0).errors == [] and parse_errors("") == []
    assert parse_errors("no reward named here; code: failed") == [("code", "failed")]
