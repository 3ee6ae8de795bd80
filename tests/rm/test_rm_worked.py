"""The worked:chain_sum task: partial-sum steps, the exact first error, and the worked_answer verifier."""

import pytest

from rewardlab.rewards import build_reward
from rewardlab.rm.data import make_rollout
from rewardlab.tasks import load
from rewardlab.tasks.worked import chain_sum_steps, final_number, first_error


def test_chain_sum_steps_hand_computed():
    assert chain_sum_steps("3 + 4 - 2") == ["3+4=7", "7-2=5"]
    # 0 - 4 = -4; -4 - 8 = -12; -12 - 7 = -19
    assert chain_sum_steps("0 - 4 - 8 - 7") == ["0-4=-4", "-4-8=-12", "-12-7=-19"]
    assert chain_sum_steps("5") == ["5=5"]
    with pytest.raises(ValueError, match="chain_sum expression"):
        chain_sum_steps("3 * 4")


def test_first_error_rules():
    ref = ["3+4=7", "7-2=5", "5+5=10"]
    assert first_error(ref, ["3+4=7", "7-2=5", "5+5=10"]) == -1
    assert first_error(ref, ["3+4=7", "7 - 2 = 5", "5+5=10"]) == -1  # whitespace does not matter
    assert first_error(ref, ["3+4=8", "8-2=6", "6+5=11"]) == 0  # wrong result
    assert first_error(ref, ["3+4=7", "7+2=9", "9+5=14"]) == 1  # wrong operator
    assert first_error(ref, ["3+4=7", "8-2=6", "6+5=11"]) == 1  # left operand is not the previous result
    assert first_error(ref, ["3+4=7", "7-2=5"]) == 1  # stops early: its last step states a wrong answer
    assert first_error(ref, ["3+4=7", "7-2=5", "5+5=10", "10+1=11"]) == 3  # an extra step
    with pytest.raises(ValueError, match="no steps"):
        first_error(ref, [])


def test_final_number():
    assert final_number("3+4=7\n7-2=5") == "5"
    assert final_number(" 12 ") == "12"


def test_worked_task_rows():
    task = load("worked:chain_sum", size=60, test_size=5, seed=0, min_terms=3, max_terms=3, min_digits=1,
                max_digits=1)
    row = task.train[0]
    expr = row["metadata"]["expression"]
    assert row["prompt"] == expr.replace(" ", "") + "="
    assert row["answer"] == "\n".join(chain_sum_steps(expr)) and row["reference_steps"] == chain_sum_steps(expr)
    assert row["final"] == row["answer"].rsplit("=", 1)[1]
    assert task.reward == "worked_answer" and task.name == "worked:chain_sum"
    with pytest.raises(ValueError, match="template"):
        load("worked:chain_sum", template="question")
    with pytest.raises(ValueError, match="no worked-solution writer; valid: chain_sum"):
        load("worked:leg_counting")


def test_worked_answer_reward():
    reward = build_reward("worked_answer")
    row = {"prompt": "3+4-2=", "final": "5"}
    outs = reward([make_rollout("3+4-2=", t, row) for t in ("3+4=7\n7-2=5", "3+4=7\n7-2=6", "5", "3+4=7\n7-2=x")])
    assert [o.score for o in outs] == [1.0, 0.0, 1.0, 0.0]
    assert all(o.error is None for o in outs) and outs[0].components["correct"] == 1.0
