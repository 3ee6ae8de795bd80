"""Text rewards: exact_match normalization, numeric tolerance, BLEU, chrF, SQuAD token F1 and ROUGE-L by hand."""

from fractions import Fraction

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.text import normalize_numbers, parse_number, squad_normalize
from rewardlab.types import Rollout


def _score(name, completion, answer, **options):
    (out,) = REWARDS[name](**options)([make_rollout(completion, {"answer": answer})])
    assert out.error is None, out.error
    return out.score


# ---------------------------------------------------------------- exact_match
def test_exact_match_strip_option():
    assert _score("exact_match", " 7\n", "7") == 1.0  # default strips
    assert _score("exact_match", " 7\n", "7", strip=False) == 0.0
    assert _score("exact_match", "<answer> 7 </answer>", " 7 ", strip=False) == 1.0  # both sides kept as written


@pytest.mark.parametrize("got, want", [("1,000", "1000"), ("1000.0", "1,000"), ("+1000", "1000"), ("1e3", "1000"),
                                       ("0.50", ".5"), ("x = 1,000.50 m", "x = 1000.5 m"), ("-0.0", "0")])
def test_exact_match_number_formatting(got, want):
    assert _score("exact_match", got, want, numbers=True) == 1.0
    assert _score("exact_match", got, want) == 0.0  # off by default: the current behaviour


def test_normalize_numbers_leaves_words_and_fractions():
    assert normalize_numbers("3rd of 1,000.00 items, 3/4 done") == "3rd of 1000 items, 3/4 done"


def test_exact_match_combined_options_and_reference_list():
    assert _score("exact_match", "<answer> The  Answer: 1,000 </answer>", "the answer:1000",
                  case=False, whitespace=False, numbers=True) == 1.0
    assert _score("exact_match", "y", ["yes", "y"]) == 1.0  # any reference
    assert _score("exact_match", "n", ["yes", "y"]) == 0.0


def test_exact_match_missing_answer_is_an_error():
    (out,) = REWARDS["exact_match"]()([make_rollout("7")])
    assert out.score == 0.0 and out.error == "exact_match: ValueError: row has no 'answer'"


# ---------------------------------------------------------------- numeric
def test_parse_number():  # exact values
    assert parse_number("1,234.5") == Fraction(2469, 2)
    assert parse_number("3/4") == Fraction(3, 4)
    assert parse_number("-1e-3") == Fraction(-1, 1000)
    assert parse_number("abc") is None and parse_number("1/0") is None
    assert parse_number("nan") is None and parse_number("inf") is None and parse_number("1_000") is None


def test_numeric_takes_the_last_number_by_default():
    assert _score("numeric", "3 apples and 4 pears", 4) == 1.0
    assert _score("numeric", "3 apples and 4 pears", 3) == 0.0
    assert _score("numeric", "The total is $1,234.50.", "1234.5") == 1.0
    assert _score("numeric", "half: 3/4 of it", 0.75) == 1.0


def test_numeric_tolerances():
    # |3.1416 - 3.14159265| = 7.35e-6
    assert _score("numeric", "3.1416", "3.14159265", abs_tol=1e-5, rel_tol=0) == 1.0  # 7.35e-6 <= 1e-5
    assert _score("numeric", "3.1416", "3.14159265") == 0.0  # 7.35e-6 > max(1e-6 * 3.1416, 1e-6) = 3.14e-6
    # |1001 - 1000| = 1; rel_tol * max(|1001|, |1000|) = 1e-3 * 1001 = 1.001 >= 1, but 1e-4 * 1001 = 0.1001 < 1
    assert _score("numeric", "1001", 1000, rel_tol=1e-3, abs_tol=0) == 1.0
    assert _score("numeric", "1001", 1000, rel_tol=1e-4, abs_tol=0) == 0.0


def test_numeric_extraction_options_and_components():
    text = "<answer>12</answer> because 3 * 4"
    assert _score("numeric", text, 12) == 0.0  # default: the last number, 4
    assert _score("numeric", text, 12, extract=["answer_tag", "last_number"]) == 1.0
    (out,) = REWARDS["numeric"]()([make_rollout("no digits here", {"answer": 5})])
    assert out.error is None and out.components == {"correct": 0.0, "extracted": 0.0, "out_of_range": 0.0}


def test_numeric_reference_must_be_a_number():
    (out,) = REWARDS["numeric"]()([make_rollout("5", {"answer": "five"})])
    assert out.score == 0.0 and out.error == "numeric: ValueError: row field 'answer': reference 'five' is not a number"


# ---------------------------------------------------------------- BLEU and chrF
def test_bleu_by_hand():
    # hyp "the cat sat on the mat" vs ref "the cat sat on a mat", 6 tokens each, so BP = 1.
    # clipped n-gram matches: 1-grams 5/6 (one "the" too many), 2-grams 3/5, 3-grams 2/4, 4-grams 1/3.
    # BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = (1/12) ** 0.25
    assert _score("bleu", "the cat sat on the mat", "the cat sat on a mat") == pytest.approx((1 / 12) ** 0.25)
    assert _score("bleu", "<answer>the cat sat on a mat</answer>", "the cat sat on a mat") == pytest.approx(1.0)
    assert _score("bleu", "dog", "the cat sat on a mat") == 0.0


def test_bleu_multiple_references():
    # the second reference matches exactly, so all n-gram precisions are 1
    assert _score("bleu", "the cat sat on the mat", ["a dog ran", "the cat sat on the mat"]) == pytest.approx(1.0)


def test_chrf_by_hand():
    # char_order 2, hyp "ab", ref "abc": 1-grams P = 2/2, R = 2/3; 2-grams {ab} vs {ab, bc}: P = 1/1, R = 1/2.
    # averaged P = 1, R = (2/3 + 1/2) / 2 = 7/12; F_2 = (1 + 4) P R / (4 P + R) = (35/12) / (55/12) = 7/11
    assert _score("chrf", "ab", "abc", char_order=2) == pytest.approx(7 / 11)
    assert _score("chrf", "the cat", "the cat") == pytest.approx(1.0)
    assert _score("chrf", "xyz", "abc") == 0.0


# ---------------------------------------------------------------- token F1 (SQuAD)
def test_squad_normalize():
    assert squad_normalize("The  Eiffel-Tower, in a city!") == "eiffeltower in city"


def test_token_f1_by_hand():
    # "the cat sat on the mat" -> [cat, sat, on, mat]; "a cat on a mat" -> [cat, on, mat]
    # common 3: P = 3/4, R = 3/3, F1 = 2 * 0.75 * 1 / 1.75 = 6/7
    assert _score("token_f1", "the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    assert _score("token_f1", "<answer>Paris!</answer>", "paris") == 1.0
    assert _score("token_f1", "cat cat", "cat") == pytest.approx(2 / 3)  # common 1: P = 1/2, R = 1, F1 = 1 / 1.5
    assert _score("token_f1", "London", "Paris") == 0.0


def test_token_f1_max_over_references_and_empty_answers():
    # vs "New York": common 2, P = 2/3, R = 2/2, F1 = 2 * (2/3) / (5/3) = 0.8; vs "NYC": 0
    assert _score("token_f1", "New York City", ["NYC", "New York"]) == pytest.approx(0.8)
    assert _score("token_f1", "the", "a") == 1.0  # both empty after normalization
    assert _score("token_f1", "the", "x") == 0.0


# ---------------------------------------------------------------- ROUGE-L
def test_rouge_l_by_hand():
    # LCS("the cat sat on the mat", "the cat on the mat") = "the cat on the mat", 5 tokens
    # P = 5/6, R = 5/5, F = 2 * (5/6) / (11/6) = 10/11
    (out,) = REWARDS["rouge_l"]()([make_rollout("the cat sat on the mat", {"answer": "the cat on the mat"})])
    assert out.score == pytest.approx(10 / 11)
    assert out.components == pytest.approx({"precision": 5 / 6, "recall": 1.0})
    # two references: the better F counts; "a dog" shares nothing
    assert _score("rouge_l", "the cat sat on the mat", ["a dog", "the cat on the mat"]) == pytest.approx(10 / 11)


def test_rouge_l_stemmer_option():
    assert _score("rouge_l", "cats running", "cat run") == 0.0
    assert _score("rouge_l", "cats running", "cat run", use_stemmer=True) == 1.0  # Porter: cats -> cat, running -> run


# ---------------------------------------------------------------- registry
@pytest.mark.parametrize("name", ["exact_match", "numeric", "bleu", "chrf", "token_f1", "rouge_l"])
def test_text_rewards_build_from_config_and_report_missing_answers(name):
    built = build_reward([{"name": name, "weight": 0.5}])
    good, missing = built([make_rollout("<answer>42</answer>", {"answer": "42"}), make_rollout("42")])
    assert good.score == pytest.approx(0.5)  # 0.5 * 1.0: a perfect match scores 1 on every text reward
    assert good.error is None
    assert missing.error == f"{name}: ValueError: row has no 'answer'"


def test_references_field_takes_precedence_over_answer():
    # as a JSONL row would hold it: the loader stores a list `answer` as JSON text, a `references` list stays a list
    row = {"answer": '["NYC", "New York"]', "references": ["NYC", "New York"]}
    r = Rollout(prompt="p", prompt_ids=[1], completion="New York City", completion_ids=[5], logprobs=[0.0], row=row)
    (out,) = REWARDS["token_f1"]()([r])
    assert out.score == pytest.approx(0.8)  # vs "New York": P = 2/3, R = 1, F1 = 0.8 (see above)
    (out,) = REWARDS["exact_match"]()([Rollout("p", [1], "NYC", [5], [0.0], row=row)])
    assert out.score == 1.0


def test_one_answer_tag_extraction_shared_by_the_text_rewards():
    from rewardlab.rewards.extract import extract_tagged_answer, last_tag

    text = "<answer> 3 </answer> then <answer>\n 4 \n</answer>"
    assert extract_tagged_answer(text) == "4" == last_tag(text)  # the last tag, stripped
    assert last_tag(text, strip=False) == "\n 4 \n"
    assert extract_tagged_answer("  no tag  ") == "  no tag  ".strip() and last_tag("no tag") is None
    # exact_match compares the raw tag content when strip=False: " 4" (with its space) is not "4"
    assert _score("exact_match", "<answer> 4</answer>", "4", strip=False) == 0.0
    assert _score("exact_match", "<answer>4</answer>", "4", strip=False) == 1.0
    assert _score("exact_match", "<answer> 4</answer>", "4") == 1.0


# ---------------------------------------------------------------- hostile numerals (issue 31, item 2)
FACT_200 = str(__import__("math").factorial(200))  # 375 digits, beyond float range


def _timed(name, completion, answer, **options):
    import time

    start = time.perf_counter()
    (out,) = REWARDS[name](**options)([make_rollout(completion, {"answer": answer})])
    return out, time.perf_counter() - start


def test_numeric_decides_the_bounds_before_big_number_arithmetic():
    # 10**99999999 was built in full (> 5 minutes); the bound is read off the text
    for text in ["1e99999999/3", "1e9999999/3", "3/1e99999999", "1e-99999999", "9" * 100_000,
                 "1e" + "9" * 5000, "0." + "0" * 100_000 + "1"]:
        out, seconds = _timed("numeric", text, 5)
        assert out.error is None and seconds < 1.0, (text[:20], out.error, seconds)
        assert (out.score, out.components) == (0.0, {"correct": 0.0, "extracted": 1.0, "out_of_range": 1.0})
    out, _ = _timed("numeric", "0e99999999", 0)  # zero with any exponent is 0: in range
    assert out.score == 1.0 and out.components["out_of_range"] == 0.0


def test_numeric_compares_values_beyond_float_range_exactly():
    # as floats, 1e309 and 200! are both inf and isclose(inf, inf) is true: they scored 1
    assert _score("numeric", "1e309", FACT_200) == 0.0
    assert _score("numeric", "9" * 400, FACT_200) == 0.0
    assert _score("numeric", "1e400", "2e400") == 0.0
    assert _score("numeric", FACT_200, FACT_200) == 1.0
    assert _score("numeric", "2e400", "20e399") == 1.0
    assert _score("numeric", "1e-400", "0") == 1.0  # within abs_tol
    assert _score("numeric", "1e-400", "0", abs_tol=0) == 0.0  # not rounded to 0.0
    assert _score("numeric", "1e4300", "1e4300") == 1.0  # the bound itself is in range
    assert parse_number("3/4") == Fraction(3, 4) and parse_number("-1e-3") == Fraction(-1, 1000)


def test_numeric_reference_that_is_not_a_finite_number_is_a_one_line_error_naming_the_field():
    for ref, field, why in [(float("nan"), "answer", "is not a number"), ("inf", "answer", "is not a number"),
                            ("-Infinity", "answer", "is not a number"), ("1e5000", "answer", "is out of range")]:
        (out,) = REWARDS["numeric"]()([make_rollout("5", {"answer": ref})])
        assert out.error is not None and "\n" not in out.error, ref
        assert out.error.startswith(f"numeric: ValueError: row field '{field}': reference") and why in out.error
    (out,) = REWARDS["numeric"]()([make_rollout("5", {"references": ["5", "nan"]})])
    assert out.error == "numeric: ValueError: row field 'references': reference 'nan' is not a number"


def test_numeric_tolerances_must_be_finite_and_non_negative():
    for options in [{"abs_tol": -1.0}, {"rel_tol": float("inf")}, {"abs_tol": float("nan")}]:
        (out,) = REWARDS["numeric"](**options)([make_rollout("5", {"answer": 5})])
        assert out.error is not None and "expected a finite number >= 0" in out.error


def test_exact_match_numbers_never_overflow_and_stay_small():
    import tracemalloc

    # decimal.Overflow was a reward error
    assert _score("exact_match", "1e9999999", "10e9999998", numbers=True) == 1.0
    assert _score("exact_match", "1e9999999", "1e9999998", numbers=True) == 0.0
    assert normalize_numbers("1e9999999 -2.50e-200 1e99 1e-99 1e100") == (
        "1e+9999999 -2.5e-200 1" + "0" * 99 + " 0." + "0" * 98 + "1 1e+100")
    text = " ".join(["1e999999"] * 300)  # 2.7 KB; each was written out in full: 575 MB
    tracemalloc.start()
    try:
        out, seconds = _timed("exact_match", text, "x", numbers=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.error is None and out.score == 0.0 and seconds < 1.0
    assert peak < 5_000_000, peak
