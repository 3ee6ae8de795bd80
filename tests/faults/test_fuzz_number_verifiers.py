"""Property-based fuzzing of the number verifiers on adversarial numerals (issue 31, item 2).

Numerals are built from parts whose value an independent oracle knows: a sign, up to 6000 digits (with or without
thousands commas, leading and trailing zeros), a fraction part, an exponent from 0 to 10**17 (with leading zeros,
near the bounds, near float overflow), a denominator, Unicode decimal digits. The oracle reads them with `decimal`
(exactly: the constructor applies no context) and `fractions`.

Properties:
- `numeric`: never an error for a completion's number, at most 1 s per item; a number within the bounds
  (`MAX_DIGITS` significant digits, magnitude 10**±`MAX_EXPONENT`) scores exactly `math.isclose`'s rule in exact
  arithmetic against the reference, one beyond them scores 0 with `out_of_range` 1; a reference beyond them is a
  one-line error naming the field.
- `exact_match` with `numbers: true`: never an error, at most 1 s per item; two numerals normalize to the same text
  exactly when their values are equal; a numeral's normal form is at most FIXED_POINT_EXPONENT + 3 characters longer.
- `math` (math-verify) is bounded by its process pool's per-item timeout: the same numerals finish within it, as a
  score, or as 0 with the component `timed_out` (never an error: the answer was the slow part).
"""

from __future__ import annotations

import math
import os
import time
from decimal import Decimal
from fractions import Fraction

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from conftest import make_rollout
from rewardlab.rewards import REWARDS
from rewardlab.rewards.text import FIXED_POINT_EXPONENT, MAX_DIGITS, MAX_EXPONENT, normalize_numbers

# FUZZ_EXAMPLES=5000 for a longer hunt; the suite's budget is 200.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
ASCII = str.maketrans("٠١٢٣٤٥٦٧٨٩", "0123456789")
FACT_200 = str(math.factorial(200))


def _digits(seed: str, n: int) -> str:
    return (seed * (n // len(seed) + 1))[:n]


def _commas(digits: str) -> str:
    head = len(digits) % 3 or 3
    return ",".join([digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)])


@st.composite
def numerals(draw, fractions: bool = True) -> str:
    """A numeral as `extract.NUMBER` matches it whole."""
    seed = draw(st.text(alphabet="0123456789", min_size=1, max_size=12))
    n = draw(st.one_of(st.integers(1, 20), st.integers(MAX_DIGITS - 10, MAX_DIGITS + 10), st.integers(1, 6000)))
    whole = _digits(seed, n)
    if len(whole) > 3 and draw(st.booleans()):
        whole = _commas(whole)
    frac = draw(st.one_of(st.just(""), st.text(alphabet="0123456789", min_size=1, max_size=30),
                          st.integers(1, 5000).map(lambda k: _digits(seed, k))))
    text = draw(st.sampled_from(["", "-", "+"])) + (whole if whole or not frac else "") + (f".{frac}" if frac else "")
    exponent = draw(st.one_of(st.none(), st.integers(-20, 20), st.integers(300, 330), st.integers(-330, -300),
                              st.integers(MAX_EXPONENT - 40, MAX_EXPONENT + 40),
                              st.integers(-MAX_EXPONENT - 40, -MAX_EXPONENT + 40), st.integers(-10**17, 10**17)))
    if exponent is not None:
        zeros = "0" * draw(st.integers(0, 3))
        text += draw(st.sampled_from("eE")) + ("-" if exponent < 0 else draw(st.sampled_from(["", "+"])))
        text += zeros + str(abs(exponent))
    if fractions and draw(st.integers(0, 4)) == 0:
        text += "/" + draw(st.one_of(st.integers(0, 10**6).map(str),
                                     st.integers(1, 6000).map(lambda k: _digits(seed, k))))
    if draw(st.integers(0, 9)) == 0:
        text = text.translate(ARABIC_INDIC)
    return text


def _decimal(text: str) -> Decimal:
    return Decimal(text.translate(ASCII).replace(",", ""))


def _in_range(d: Decimal) -> bool:
    if d == 0:
        return True
    digits = "".join(map(str, d.as_tuple().digits)).strip("0")
    return len(digits) <= MAX_DIGITS and abs(d.adjusted()) <= MAX_EXPONENT


def _oracle(text: str) -> tuple[str, Fraction | None]:
    """("value", v), ("out_of_range", None) or ("not_a_number", None) for a numeral, read by `decimal`."""
    num, _, den = text.partition("/")
    parts = [_decimal(num)] + ([_decimal(den)] if den else [])
    if not all(_in_range(d) for d in parts):
        return "out_of_range", None
    if den and parts[1] == 0:
        return "not_a_number", None
    value = Fraction(parts[0])
    return "value", value / Fraction(parts[1]) if den else value


def _close(a: Fraction, b: Fraction, tol: Fraction = Fraction(1e-6)) -> bool:
    return abs(a - b) <= max(tol * max(abs(a), abs(b)), tol)


def _rewrite(text: str) -> str:
    """The same value written another way: every significant digit before the point, the exponent moved."""
    d = _decimal(text)
    sign, digits, exponent = d.as_tuple()
    return ("-" if sign else "") + "".join(map(str, digits)) + "0" + f"e{exponent - 1}"


@FUZZ
@given(numerals(), numerals(fractions=False), st.sampled_from(["same", "rewritten", "other"]),
       st.sampled_from(["", "so the answer is ", "x = 3, y = "]))
@example("1e99999999/3", "5", "other", "")
@example("1e309", FACT_200, "other", "")
@example("9" * 400, FACT_200, "other", "")
@example("1e9999999", "1", "other", "")
def test_numeric_on_adversarial_numerals(got, ref, relation, prefix):
    if relation == "same":
        ref = got.partition("/")[0]
    elif relation == "rewritten" and _oracle(got)[0] == "value" and "/" not in got:
        ref = _rewrite(got)
    reward = REWARDS["numeric"]()
    start = time.perf_counter()
    (out,) = reward([make_rollout(prefix + got, {"answer": ref})])
    assert time.perf_counter() - start < 1.0
    ref_kind, ref_value = _oracle(ref)
    if ref_kind != "value":
        event(f"reference: {ref_kind}")
        assert out.error is not None and "\n" not in out.error
        assert out.error.startswith("numeric: ValueError: row field 'answer': reference ")
        return
    assert out.error is None, out.error
    kind, value = _oracle(got)
    event(f"completion: {kind}")
    if kind == "out_of_range":
        assert (out.score, out.components["out_of_range"], out.components["extracted"]) == (0.0, 1.0, 1.0)
    elif kind == "not_a_number":
        assert (out.score, out.components["extracted"]) == (0.0, 0.0)
    else:
        assert out.components["out_of_range"] == 0.0
        assert out.score == float(_close(value, ref_value)), (got[:40], ref[:40])
        event(f"score {out.score}")
        if relation in ("same", "rewritten") and "/" not in got:
            assert out.score == 1.0


@FUZZ
@given(numerals(fractions=False), numerals(fractions=False), st.sampled_from(["rewritten", "other"]))
@example("1e9999999", "10e9999998", "other")
@example("1e999999", "1e999998", "other")
def test_exact_match_numbers_on_adversarial_numerals(a, b, relation):
    if relation == "rewritten":
        b = _rewrite(a)
    start = time.perf_counter()
    na, nb = normalize_numbers(a), normalize_numbers(b)
    (out,) = REWARDS["exact_match"](numbers=True)([make_rollout(f"<answer>{a}</answer>", {"answer": b})])
    assert time.perf_counter() - start < 1.0
    assert out.error is None, out.error
    assert len(na) <= len(a) + FIXED_POINT_EXPONENT + 3 and len(nb) <= len(b) + FIXED_POINT_EXPONENT + 3
    da, db = _decimal(a), _decimal(b)
    assert (na == nb) == (da.compare_total(db) == 0 or da == db == 0 or _same_value(da, db))
    assert out.score == float(na == nb)
    event(f"equal: {na == nb}")


def _same_value(a: Decimal, b: Decimal) -> bool:
    """Value equality of two finite decimals of any exponent, without building either (their sign, significant
    digits and adjusted exponent)."""
    def key(d: Decimal):
        sign, digits, _ = d.as_tuple()
        return sign, "".join(map(str, digits)).strip("0"), d.adjusted()

    return a != 0 and b != 0 and key(a) == key(b)


def test_math_is_bounded_by_its_pool_timeout():
    """math-verify runs in the executor's process pool: an input that stalls sympy is killed at `timeout` and is
    scored 0 with `timed_out` 1, not an error; every other numeral scores. Nothing runs past the bound."""
    reward = REWARDS["math"](timeout=2, workers=1)
    cases = [("1e99999999/3", "5"), ("1e309", FACT_200), ("9" * 400, FACT_200), ("1e9999999", "1"),
             (" ".join(["1e999999"] * 300), "1"), ("\\boxed{9^{9^{9}}}", "5")]
    start = time.perf_counter()
    outs = reward([make_rollout(c, {"answer": a}) for c, a in cases])
    assert time.perf_counter() - start < 2 * len(cases) + 10
    assert [o.score for o in outs] == [0.0] * len(cases)
    assert [o.error for o in outs] == [None] * len(cases)
    assert [o.components["timed_out"] for o in outs] == [0.0] * (len(cases) - 1) + [1.0]
