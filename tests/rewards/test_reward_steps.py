"""Worked-steps chain_sum: the worked target, the step-checking reward `arithmetic_steps`, and SFT on `target`."""

import json

import pytest

from conftest import TINY_OVERRIDES, make_rollout
from rewardlab.config import SFTConfig, load_config
from rewardlab.rewards import build_reward
from rewardlab.rewards.steps import check_steps, final_answer
from rewardlab.tasks import load
from rewardlab.tasks.steps import parse_chain, worked_steps


# ---------------------------------------------------------------- worked solutions
def test_parse_chain():
    assert parse_chain("3 + 4 - 2") == (3, [("+", 4), ("-", 2)])
    assert parse_chain("-3+10") == (-3, [("+", 10)])
    with pytest.raises(ValueError, match="expected integers joined by"):
        parse_chain("3 * 4")


def test_worked_steps_are_partial_sums_one_per_line():
    # 3 + 4 = 7; 7 - 2 = 5; 5 - 9 = -4
    assert worked_steps("3 + 4 - 2 - 9") == "3+4=7\n7-2=5\n5-9=-4"
    assert worked_steps("8") == "8"


def test_reasoning_gym_steps_target_keeps_the_answer():
    task = load("reasoning_gym:chain_sum", size=60, test_size=5, seed=0, template="compact", target="steps",
                min_terms=3, max_terms=3, min_digits=1, max_digits=1)
    assert task.reward == "arithmetic_steps"
    for row in task.train + task.test:
        assert row["target"] == worked_steps(row["metadata"]["expression"])
        assert row["target"].count("\n") == 1  # 3 terms -> 2 steps
        assert row["target"].rpartition("=")[2] == row["answer"]  # the last result is the final answer


def test_reasoning_gym_unknown_target():
    with pytest.raises(ValueError, match="target must be one of"):
        load("reasoning_gym:chain_sum", size=10, test_size=2, target="proof")


def test_reasoning_gym_steps_target_needs_a_chain():
    # checked before the prompt, so the message names the target (not the compact template) whatever the template
    for template in ("compact", "question"):
        with pytest.raises(ValueError, match=r"^task reasoning_gym:leg_counting: target 'steps' needs an integer "
                                             r"\+/- chain in metadata\['expression'\]"):
            load("reasoning_gym:leg_counting", size=5, test_size=1, template=template, target="steps")


# ---------------------------------------------------------------- the step checker
def test_final_answer():
    assert final_answer("3+4=7\n7-2=5") == "5"
    assert final_answer("3+4=7\n7-2=5\n\n") == "5"
    assert final_answer("12") == "12"
    assert final_answer("so <answer> 1/2 </answer>") == "1/2"
    assert final_answer("") == ""


@pytest.mark.parametrize(
    "steps, cumulative, expected",
    [
        (["3+4=7\n", "7-2=5"], True, [1.0, 1.0]),
        (["3+4=8\n", "8-2=6"], True, [0.0, 0.0]),  # 3+4 is not 8; everything after the first error is 0
        (["3+4=8\n", "8-2=6"], False, [0.0, 1.0]),  # on its own, 8-2=6 continues 8 and is right
        (["3+4=7\n", "6-2=4"], False, [1.0, 0.0]),  # 6 does not continue the previous result 7
        (["3+4=7\n", "7+2=9"], False, [1.0, 0.0]),  # the chain's second term is -2, not +2
        (["3+5=8\n", "8-2=6"], False, [0.0, 1.0]),  # +5 is not the first term's successor +4
        (["3+4=7\n", "7-2=5\n", "5+0=5"], True, [1.0, 1.0, 0.0]),  # a step past the last term
        (["3 + 4 = 7\n", " 7 - 2 = 5 "], True, [1.0, 1.0]),  # spaces are ignored
        (["seven\n", "7-2=5"], False, [0.0, 0.0]),  # unparsable; the next step has no result to continue
    ],
)
def test_check_steps(steps, cumulative, expected):
    assert check_steps(steps, "3 + 4 - 2", cumulative) == expected


def test_check_steps_one_term_chain():
    # a one-term chain is worked as the term itself (worked_steps("8") == "8"); anything after it is past the end
    assert check_steps(["8"], "8") == [1.0]
    assert check_steps([" 8 \n", "8+0=8"], "8") == [1.0, 0.0]
    assert check_steps(["9"], "8") == [0.0] and check_steps(["8=8"], "8") == [0.0]
    assert check_steps(["-3"], "-3") == [1.0]


ROW = {"prompt": "3+4-2=", "answer": "5", "metadata": {"expression": "3 + 4 - 2"}}


def test_arithmetic_steps_reward_scores_steps_and_final_answer():
    reward = build_reward("arithmetic_steps")
    right, wrong_step, short = reward([make_rollout("3+4=7\n7-2=5", ROW), make_rollout("3+4=7\n7-2=4", ROW),
                                       make_rollout("3+4=7", ROW)])
    assert (right.score, right.step_scores, right.components["steps_correct"]) == (1.0, [1.0, 1.0], 1.0)
    assert (wrong_step.score, wrong_step.step_scores) == (0.0, [1.0, 0.0])
    assert wrong_step.components["steps_correct"] == 0.5 and wrong_step.components["n_steps"] == 2.0
    # stopping after the first step: its one step is right, the final answer 7 is not 5
    assert (short.score, short.step_scores, short.components["correct"]) == (0.0, [1.0], 0.0)


def test_arithmetic_steps_reads_marked_step_texts_and_an_expression_field():
    row = {"prompt": "q", "answer": "-1", "expression": "2 - 3"}
    r = make_rollout("2-3=-1", row)
    r.steps, r.step_text = [(0, 6)], ["2-3=-1"]
    (out,) = build_reward("arithmetic_steps")([r])
    assert out.score == 1.0 and out.step_scores == [1.0]


def test_arithmetic_steps_on_worked_rows_reads_final():
    # worked:chain_sum rows: answer is the worked solution, final the number
    row = {"prompt": "3+4-2=", "answer": "3+4=7\n7-2=5", "final": "5", "metadata": {"expression": "3 + 4 - 2"}}
    right, wrong = build_reward("arithmetic_steps")([make_rollout("3+4=7\n7-2=5", row),
                                                     make_rollout("3+4=7\n7-2=6", row)])
    assert (right.score, right.step_scores) == (1.0, [1.0, 1.0])
    assert (wrong.score, wrong.step_scores) == (0.0, [1.0, 0.0])


def test_arithmetic_steps_without_an_expression_is_an_error():
    (out,) = build_reward("arithmetic_steps")([make_rollout("1+1=2", {"prompt": "q", "answer": "2"})])
    assert out.error is not None and out.error.startswith("arithmetic_steps: KeyError")


# ---------------------------------------------------------------- SFT on the worked target
def test_sft_target_field_must_exist(tmp_path):
    from rewardlab.commands.sft import run as run_sft

    cfg = load_config(SFTConfig, overrides=[f"out={tmp_path / 'sft'}", "sft.target=target", "sft.steps=1",
                                            "task.options={size: 40, test_size: 4}", *TINY_OVERRIDES])
    with pytest.raises(ValueError, match="sft.target: training row 0 .* has no field 'target'"):
        run_sft(cfg, show_progress=False)
    assert not (tmp_path / "sft").exists()


def test_sft_trains_on_the_worked_target(tmp_path):
    from rewardlab.commands.sft import run as run_sft

    cfg = load_config(SFTConfig, overrides=[
        f"out={tmp_path / 'sft'}", "sft.target=target", "sft.steps=2", "sft.batch_size=4",
        "task.options={size: 40, test_size: 4, template: compact, target: steps, min_terms: 3, max_terms: 3, "
        "min_digits: 1, max_digits: 1}", *TINY_OVERRIDES])
    run_sft(cfg, show_progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    # tokens per second * seconds = answer tokens of the batch: 4 rows of "a+b=c\nc-d=e" (11 to 14 characters)
    # plus EOS each, so between 4 * 12 = 48 and 4 * 15 = 60 -- far more than 4 one-number answers (<= 12).
    tokens = metrics[0]["time/tokens_per_s"] * metrics[0]["time/step_s"]
    assert 48 <= round(tokens) <= 60
