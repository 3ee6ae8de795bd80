"""The math reward: answer extraction, math-verify equivalences and non-equivalences, timeouts through the pool."""

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.extract import extract_answer, last_boxed, last_number, last_tag
from rewardlab.rewards.math import MathReward, MathTimeoutWarning, python_powers



# ---------------------------------------------------------------- extraction
def test_last_boxed_takes_the_last_box_with_nested_and_escaped_braces():
    assert last_boxed(r"first \boxed{3}, then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"  # \{ \} do not close the box
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"\boxed{1} and an unclosed \boxed{2") == "1"
    assert last_boxed("no box") is None


def test_last_tag_and_last_number():
    assert last_tag("<answer>1</answer> <answer>\n 2 \n</answer>") == "2"
    assert last_tag("<answer>unclosed") is None
    assert last_number("3 apples cost $1,250.50 in total.") == "1,250.50"
    assert last_number("roots -2 and 3/4") == "3/4"
    assert last_number("x = .5 or 1e-3") == "1e-3"
    assert last_number("the 5th, 3rd and v2 are words") is None


def test_extract_answer_order_and_answer_tag_holding_a_box():
    text = r"<think>maybe \boxed{3}</think><answer>5</answer>"
    assert extract_answer(text, ["answer_tag", "boxed", "last_number"]) == ("5", "answer_tag")
    assert extract_answer(text, ["boxed", "answer_tag"]) == ("3", "boxed")
    assert extract_answer(r"<answer>so \boxed{7}</answer>", ["answer_tag"]) == ("7", "answer_tag")
    assert extract_answer("no answer here", ["boxed", "answer_tag"]) == (None, None)


def test_python_powers_become_latex():
    assert python_powers("-903*y**5 - 588*y**3") == "-903*y^{5} - 588*y^{3}"
    assert python_powers("x**12") == "x^{12}"  # not x^1 * 2
    assert python_powers("(2*x - 8)**(3/2)") == "(2*x - 8)^{(3/2)}"
    assert python_powers("2**-1") == "2^{-1}"
    assert python_powers("x**") == "x**"  # nothing to raise to: left alone


# ---------------------------------------------------------------- equivalence (math-verify through the pool)
EQUIVALENT = [
    (r"\boxed{0.5}", "1/2"),  # fraction vs decimal
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{\frac12}", "1/2"),
    (r"\boxed{2/4}", r"\frac{1}{2}"),  # unreduced fraction
    (r"\boxed{0.333333}", "1/3"),  # equal after rounding to float_rounding = 6 decimals
    ("The total is 1,000 dollars.", "1000"),  # last number, thousands separator
    (r"\boxed{1000.0}", "1000"),
    (r"\boxed{-3.0}", "-3"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\sqrt{2}/2"),  # LaTeX
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}"),
    (r"\boxed{(x+1)^2}", "x^2+2x+1"),  # symbolic
    (r"\boxed{\{3, 2, 1\}}", r"\{1,2,3\}"),  # sets ignore order
    (r"\boxed{[1, 2)}", "[1,2)"),  # interval
    (r"\boxed{(-\infty, 0)}", r"(-\infty,0)"),
    (r"<answer>-588y^3 - 903y^5</answer>", "-903*y**5 - 588*y**3"),  # reference in Python syntax
    (r"<answer>$\frac{3}{4}$.</answer>", 0.75),  # numeric reference, $ and final period dropped
    (r"so \boxed{12}", r"\boxed{12}"),  # a boxed reference is unwrapped
]
NOT_EQUIVALENT = [
    (r"\boxed{0.333}", "1/3"),  # differs at the 4th decimal
    (r"\boxed{\frac{1}{3}}", "0.5"),
    (r"\boxed{4}", "3"),  # wrong answer
    (r"\boxed{(1, 2)}", "[1,2)"),  # open vs half-open interval
    (r"\boxed{\{1, 2\}}", r"\{1,2,3\}"),  # missing element
    (r"\boxed{x^2+1}", "(x+1)^2"),
    (r"<answer>-900*y**5 - 588*y**3</answer>", "-903*y**5 - 588*y**3"),  # 588 = 588 without python_powers
    ("I think it is 7, not 8.", "7"),  # the last number is 8
]


def test_equivalences_and_non_equivalences_in_one_batch():
    cases = [(c, a, 1.0) for c, a in EQUIVALENT] + [(c, a, 0.0) for c, a in NOT_EQUIVALENT]
    # a generous limit: not a timeout test
    outs = MathReward(timeout=30)([make_rollout(c, {"answer": a}) for c, a, _ in cases])
    wrong = [(c, a, want, o) for (c, a, want), o in zip(cases, outs) if o.score != want or o.error is not None]
    assert not wrong
    assert all(o.components == {"correct": o.score, "extracted": 1.0, "timed_out": 0.0, "ambiguous": 0.0} for o in outs)


def test_no_answer_found_is_a_zero_not_an_error():
    r = MathReward(extract=["boxed"])
    (out,) = r([make_rollout("the answer is 5", {"answer": "5"})])  # no \boxed{} and only boxes are looked for
    assert out.score == 0.0 and out.error is None
    assert out.components == {"correct": 0.0, "extracted": 0.0, "timed_out": 0.0, "ambiguous": 0.0}


def test_missing_or_empty_reference_is_an_error():
    none, empty = MathReward()([make_rollout(r"\boxed{1}"), make_rollout(r"\boxed{1}", {"answer": " "})])
    assert none.error == "math: row has no 'answer'" and none.score == 0.0
    assert empty.error == "math: row has an empty 'answer'"


def test_a_hung_answer_scores_0_timed_out_not_an_error_and_the_batch_still_scores(monkeypatch):
    # sympy evaluates 9^(9^9) eagerly; with math-verify's own alarm timeouts off it never returns, so only the
    # pool's hard timeout ends it - by killing the worker. The reference alone checks in time: the answer was the
    # slow part, so it is a 0 (component timed_out), not a reward error a policy could stop its own run with.
    monkeypatch.setattr("rewardlab.rewards.math._WARNED_TIMEOUT", False)  # once per process: another test may have
    reward = MathReward(timeout=2.0)
    cases = [(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{9^{9^{9}}}", "5"), (r"\boxed{4}", "3"),
             (r"\boxed{1,000}", "1000")]
    with pytest.warns(MathTimeoutWarning, match="timed_out"):
        outs = reward([make_rollout(c, {"answer": a}) for c, a in cases])
    assert [o.score for o in outs] == [1.0, 0.0, 0.0, 1.0]
    assert [o.error for o in outs] == [None] * 4
    assert outs[1].components == {"correct": 0.0, "extracted": 1.0, "timed_out": 1.0, "ambiguous": 0.0}
    assert [o.components["timed_out"] for o in (outs[0], outs[2], outs[3])] == [0.0] * 3
    # the replaced worker scores the next batch
    assert reward([make_rollout(r"\boxed{6}", {"answer": "6"})])[0].score == 1.0


def test_a_reference_that_cannot_be_checked_in_time_is_the_error():
    # 10^(10^10) as the row's answer: compared with any answer, sympy evaluates it; the check of the reference alone
    # (against "0") times out too, so the data is at fault and the item is a reward error.
    reward = MathReward(timeout=1.0)
    out, fine = reward([make_rollout(r"\boxed{1}", {"answer": "10^{10^{10}}"}),
                        make_rollout(r"\boxed{2}", {"answer": "2"})])
    assert out.error == "math: reference answer '10^{10^{10}}' timed out after 1 s" and out.score == 0.0
    assert out.components["timed_out"] == 0.0
    assert fine.score == 1.0 and fine.error is None


@pytest.mark.parametrize("reference", ["nan", "NaN", "-inf", "Infinity", "$nan$", r"\boxed{nan}"])
def test_nan_and_inf_references_are_errors(reference):
    # math-verify reads "nan" as the product n*a*n: the completion "nan" would score 1 against it
    (out,) = MathReward()([make_rollout(r"\boxed{nan}", {"answer": reference})])
    assert out.score == 0.0 and out.error.startswith("math: reference answer ") and "is not a value" in out.error
    (inf,) = MathReward()([make_rollout(r"\boxed{\infty}", {"answer": r"\infty"})])
    assert inf.score == 1.0 and inf.error is None


@pytest.mark.parametrize("answer, reference, want", [
    ("1e20", "100000000000000000000", 1.0),  # math-verify alone: 1*e*20 (Euler's e), 0
    ("2e400", "20e399", 1.0),                 # math-verify alone: rounded apart, 0
    ("-2.50", "-5/2", 1.0),
    ("1e20", "1e21", 0.0),
    ("1,2", "12", 0.0),                       # a pair is not twelve: commas stay with math-verify
])
def test_equal_plain_numerals_are_equal_answers(answer, reference, want):
    (out,) = MathReward()([make_rollout(rf"\boxed{{{answer}}}", {"answer": reference})])
    assert out.score == want and out.error is None


def test_registered_and_composed_with_format():
    assert REWARDS["math"] is MathReward
    built = build_reward([{"name": "math", "weight": 1.0}, {"name": "format", "pattern": "think_answer",
                                                            "weight": 0.2}])
    both, wrong, malformed = built([
        make_rollout("<think>2+3</think><answer>5</answer>", {"answer": "5"}),
        make_rollout("<think>2+3</think><answer>6</answer>", {"answer": "5"}),
        make_rollout("<answer>5</answer>", {"answer": "5"}),
    ])
    assert both.score == pytest.approx(1.2)  # 1.0 * 1 + 0.2 * 1
    assert wrong.score == pytest.approx(0.2)  # 1.0 * 0 + 0.2 * 1
    assert malformed.score == pytest.approx(1.0)  # 1.0 * 1 + 0.2 * 0
    assert both.components["math/correct"] == 1.0 and both.components["format"] == 1.0


@pytest.mark.parametrize("spec, message", [
    ({"extract": ["boxed", "last_line"]}, r"extract: expected a non-empty list"),
    ({"timeout": 0}, "timeout"),
    ({"workers": 0}, "workers"),
    ({"tolerance": 1}, "unknown option 'tolerance' for reward 'math'"),
])
def test_bad_options_fail_at_build_time(spec, message):
    with pytest.raises(ValueError, match=rf"rewards\[0\]( \(math\))?: .*{message}"):
        build_reward([{"name": "math", **spec}])


# ------------------------------------------------------------------------------------------- hedged answers
HEDGES = [
    (r"\boxed{1} or maybe \boxed{2}", "2"),                       # two different boxes: the last one is right
    (r"\boxed{3}\boxed{2}\boxed{1}", "1"),
    ("<answer>4</answer> <answer>5</answer>", "5"),              # two different answer tags
    ("So the answer is 1 or 2 or 3.", "3"),                      # a last line hedging between numbers
    ("It could be 4, 5 or 6", "6"),
    ("either 2 or -2", "-2"),
    (r'The question asks "what is \boxed{7}?" and I do not know.', "7"),  # only the question's own box
    ("the answer is seven", "7"),                                # outside the accepted forms
]


def test_several_candidate_answers_a_quoted_box_and_other_forms_score_zero():
    rows = [{"prompt": r'what is \boxed{7}?', "answer": a} for _, a in HEDGES]
    outs = MathReward(timeout=30)([make_rollout(c, row) for (c, _), row in zip(HEDGES, rows)])
    assert [o.score for o in outs] == [0.0] * len(HEDGES) and all(o.error is None for o in outs)
    assert [o.components["ambiguous"] for o in outs] == [1.0] * 6 + [0.0, 0.0]
    # ... while extraction alone (multiple_answers: last) would have taken the last, right, answer
    lenient = MathReward(timeout=30, multiple_answers="last")([make_rollout(c, row) for (c, _), row in
                                                                zip(HEDGES[:6], rows)])
    assert [o.score for o in lenient] == [1.0] * 6


def test_one_answer_said_twice_steps_with_numbers_and_a_box_of_ones_own_still_count():
    cases = [(r"\boxed{12} ... so again, \boxed{ 12 }", "12"), ("3 + 4 = 7", "7"),
             ("<answer>5</answer><answer>5</answer>", "5"),
             (r'The question: "is \boxed{7} prime?" My answer: \boxed{8}', "8"),
             (r"The answer is \boxed{7}.", "7"), ("Steps 1, 2, 3, then 10.", "10")]
    outs = MathReward(timeout=30)([make_rollout(c, {"prompt": r"Question: is \boxed{7} prime?", "answer": a})
                                   for c, a in cases])
    assert [o.score for o in outs] == [1.0] * len(cases)
    with pytest.raises(ValueError, match="multiple_answers"):
        MathReward(multiple_answers="first")
