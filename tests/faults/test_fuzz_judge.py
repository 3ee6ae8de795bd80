"""Property-based fuzzing of the LLM-judge reply parsers in rewards/judge/parse.py.

Property: for any reply text (score, yes/no and pairwise modes), any first-token top log-probs and any JSON reply
shape, parsing gives a value on the documented range (a score on the scale, a probability in [0, 1]) or a
`JudgeError` with one line; never another exception type, and never a hang (a reply is parsed in linear time).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rewardlab.rewards.judge import parse as judge_module
from rewardlab.rewards.judge import Judge, JudgeError, choice_probability, parse_choice, parse_score, read_choice

# FUZZ_EXAMPLES=5000 for a longer hunt; the suite's budget is 200.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

number_text = st.one_of(st.integers().map(str), st.floats().map(repr), st.sampled_from(["1e999", "-0", "9" * 400]),
                        st.from_regex(r"-?[0-9]{1,4}(\.[0-9]{1,3})?", fullmatch=True))
reply_text = st.one_of(
    st.text(max_size=80),
    st.tuples(st.sampled_from(["Score", "score", "**Score:**", "**Score**:", "SCORE ="]),
              st.text(alphabet=" *:=\n\t", max_size=6), number_text, st.text(max_size=10)).map("".join),
    st.tuples(st.text(max_size=10), st.sampled_from(["[[A]]", "[[B]]", "Yes", "no", "A", "b", "[[ C ]]"]),
              st.text(max_size=10)).map("".join),
)
scale = st.tuples(st.floats(-1e6, 1e6), st.floats(1e-3, 1e6)).map(lambda t: (t[0], t[0] + t[1]))
logprob = st.one_of(st.floats(), st.floats(max_value=0.0), st.sampled_from([0.0, -math.inf, math.inf, math.nan]))
top = st.lists(st.tuples(st.one_of(st.sampled_from(["Yes", " yes", "NO", "A", " B", "[[A", "b."]), st.text(max_size=4)),
                         logprob), max_size=6)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "message", "content", "logprobs", "top_logprobs", "token", "logprob", "x"]),
        inner, max_size=4),
    max_leaves=12)


def _one_line_error(exc: JudgeError) -> None:
    assert str(exc) and "\n" not in str(exc) and "\r" not in str(exc), repr(str(exc))


@FUZZ
@given(text=reply_text, lo_hi=scale)
@example(text="Score: " + "9" * 400, lo_hi=(1.0, 10.0))  # inf: off the scale
def test_parse_score_fuzz(text, lo_hi):
    lo, hi = lo_hi
    try:
        value = parse_score(text, lo, hi)
    except JudgeError as exc:
        _one_line_error(exc)
        return
    assert math.isfinite(value) and lo <= value <= hi


@FUZZ
@given(text=reply_text, mode=st.sampled_from(["yes_no", "pairwise"]))
def test_parse_choice_fuzz(text, mode):
    try:
        value = parse_choice(text, mode)
    except JudgeError as exc:
        _one_line_error(exc)
        return
    assert value in (0.0, 1.0)


@FUZZ
@given(top_logprobs=top, mode=st.sampled_from(["yes_no", "pairwise"]))
@example(top_logprobs=[("Yes", 1000.0)], mode="yes_no")  # exp overflowed: OverflowError
@example(top_logprobs=[("Yes", math.inf), ("No", -1.0)], mode="yes_no")  # inf / inf: NaN returned as a probability
@example(top_logprobs=[("A", math.nan)], mode="pairwise")  # NaN returned as a probability
def test_choice_probability_fuzz(top_logprobs, mode):
    try:
        value = choice_probability(top_logprobs, mode)
    except JudgeError as exc:
        _one_line_error(exc)
        return
    assert 0.0 <= value <= 1.0


@FUZZ
@given(reply=json_value, mode=st.sampled_from(["score", "yes_no", "pairwise"]))
@example(reply={"choices": [{"message": {"content": 7}}]}, mode="score")  # TypeError in the regex
@example(reply={"choices": [{"message": {"content": ["Yes"]}}]}, mode="yes_no")  # TypeError in the regex
@example(reply={"choices": [{"message": {"content": "Yes"}, "logprobs": {"content": [
    {"token": "Yes", "logprob": 1e308, "top_logprobs": []}]}}]}, mode="yes_no")  # OverflowError
def test_reply_to_verdict_fuzz(reply, mode):
    """A server's decoded JSON reply through `read_choice` and the judge's verdict: a value in [0, 1] or an error."""
    judge = Judge(mode=mode, base_url="http://127.0.0.1:9", model="m")  # no request is made
    try:
        text, top_logprobs = read_choice(reply)
        value, components = judge._verdict(text, top_logprobs)
    except JudgeError as exc:
        _one_line_error(exc)
        return
    assert 0.0 <= value <= 1.0 and all(math.isfinite(v) for v in components.values())


def test_long_whitespace_runs_parse_in_linear_time():
    """"Score" followed by thousands of spaces made the score regex backtrack cubically (1,000 spaces took 4 s,
    4,000 spaces minutes). The parsers' patterns run in a bare subprocess (no torch import) so that a regression
    fails by the timeout instead of hanging the suite: a 1000-fold margin over the milliseconds they take now."""
    # as parse_score and parse_choice use them: findall for the score and the verdict, fullmatch for a bare number
    uses = [(p.pattern, p.flags, use) for p, use in ((judge_module._SCORE_RE, "findall"),
                                                    (judge_module._NUMBER_RE, "fullmatch"),
                                                    (judge_module._VERDICT_RE, "findall"))]
    code = (
        "import re\n"
        "texts = ['score' + ' ' * 20000 + 'x', '1' + ' ' * 20000 + 'x', 'Score:' + '*' * 20000 + 'x',\n"
        "         '**score' + '*' * 20000 + ':' + ' ' * 20000, 'score' * 5000, '[[' + ' ' * 20000]\n"
        f"for pattern, flags, use in {uses!r}:\n"
        "    for t in texts:\n"
        "        getattr(re.compile(pattern, flags), use)(t)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    for text in ("score" + " " * 20000 + "x", "1" + " " * 20000 + "x"):  # and the parsers themselves agree
        try:
            parse_score(text, 1, 10)
        except JudgeError as exc:
            _one_line_error(exc)


def test_fixed_parsers_by_hand():
    assert parse_score("**Score**: 8", 1, 10) == 8.0  # bold label, colon outside: was unparsable
    assert parse_score("Score : ** 7", 1, 10) == 7.0 and parse_score("5 . ", 1, 10) == 5.0
    assert choice_probability([("Yes", 1e-9), ("No", math.log(0.25))], "yes_no") == 0.8  # rounding above 0
    try:
        choice_probability([("Yes", 1000.0)], "yes_no")
    except JudgeError as exc:
        assert str(exc) == "top log-prob of token 'Yes' is 1000.0, not a log-probability"
    else:
        raise AssertionError("a log-prob of 1000 was accepted")
    try:
        read_choice({"choices": [{"message": {"content": 7}}]})
    except JudgeError as exc:
        assert str(exc).startswith("unexpected reply shape (choices[0].message.content is a int, not text)")
    else:
        raise AssertionError("a non-text content was accepted")
    try:
        Judge(mode="score", base_url="http://127.0.0.1:9", model="m", scale=[0, math.inf])
    except ValueError as exc:
        assert str(exc).startswith("judge.scale: expected [lo, hi] with lo < hi, both finite")
    else:
        raise AssertionError("an infinite scale was accepted")
