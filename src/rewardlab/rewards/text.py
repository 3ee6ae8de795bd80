"""Text-matching rewards: `exact_match`, `numeric`, `bleu`, `chrf`, `token_f1`, `rouge_l`.

Each compares the completion's answer (the last `<answer>...</answer>` tag's content, else the whole completion,
stripped) with the row's `answer`. Several references may be given as a list, in the row's `references` field
(which takes precedence) or in `answer` itself; the score is then the best over the references.
"""

from __future__ import annotations

import collections
import math
import re
import string
import unicodedata
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import Any

from rewardlab.rewards.base import reward
from rewardlab.rewards.extract import (
    NUMBER, check_methods, extract_answer, extract_tagged_answer, last_number, last_tag,
)


def _references(answer: Any, references: Any = None) -> list[str]:
    """The row's reference(s) as a non-empty list of strings: its `references` field when it has one (a list; the
    JSONL loader keeps it as is, while it stores a non-string `answer` as JSON text), else its `answer` (a string,
    a number, or a list).

    Raises:
        ValueError: no reference, or an empty list.
    """
    return _named_references(answer, references)[1]


def _named_references(answer: Any, references: Any = None) -> tuple[str, list[str]]:
    """(the row field the references come from, "references" or "answer"; the references): see `_references`."""
    field = "references" if references is not None else "answer"
    value = references if references is not None else answer
    if value is None:
        raise ValueError("row has no 'answer'")
    refs = [str(a) for a in value] if isinstance(value, (list, tuple)) else [str(value)]
    if not refs:
        raise ValueError(f"'{field}' is an empty list")
    return field, refs


# ---------------------------------------------------------------------------------------------- numbers
#: The bounds of an exactly read number, decided from its text before any big-number arithmetic: at most
#: `MAX_DIGITS` significant digits (CPython's own default limit on int <-> str conversion, 4300, set for the same
#: reason: the cost of big numbers grows faster than their length) and a magnitude from 10**-MAX_EXPONENT to
#: 10**MAX_EXPONENT (zero included). Within them a comparison costs a few milliseconds at most; `numeric` scores a
#: completion's number beyond them 0 ("out_of_range"), and a reference beyond them is an error.
MAX_DIGITS = 4300
MAX_EXPONENT = 4300
#: `normalize_numbers` writes a number in fixed point when 10**-(FIXED_POINT_EXPONENT - 1) <= |value| <
#: 10**FIXED_POINT_EXPONENT (or it is 0), else in scientific notation ("1e+999999"): the output of a numeral is at
#: most FIXED_POINT_EXPONENT + 3 characters longer than the numeral itself.
FIXED_POINT_EXPONENT = 100
#: An exponent with more digits than this (leading zeros aside) is beyond any bound (no text is 10**18 long).
_EXPONENT_DIGITS = 18

_NUMERAL = re.compile(r"([-+]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([-+]?[0-9]+))?")


class NumberOutOfRange(ValueError):
    """A numeral beyond the bounds `MAX_DIGITS` / `MAX_EXPONENT` (or with an exponent of more than 18 digits)."""


def _read_numeral(text: str) -> tuple[bool, str, int] | None:
    """A decimal numeral ("-1000.50", ".5", "1e-3"; any Unicode decimal digits, no commas) as (negative, its
    significant digits without leading or trailing zeros, the power of ten of the last one): "-1000.50" ->
    (True, "10005", -1); zero -> (False, "", 0). None when `text` is not such a numeral (also "nan", "inf").
    Linear in len(text): no arithmetic on the digits.

    Raises:
        NumberOutOfRange: a nonzero numeral whose exponent has more than 18 digits.
    """
    if not text.isascii():
        text = "".join(str(unicodedata.decimal(c, c)) for c in text)  # "٣" -> "3"
    m = _NUMERAL.fullmatch(text)
    if m is None:
        return None
    sign, whole, frac, exponent = m.groups()
    frac = frac or ""
    if not whole and not frac:
        return None
    digits = (whole + frac).lstrip("0")
    if not digits:
        return False, "", 0
    significant = digits.rstrip("0")
    low = len(digits) - len(significant) - len(frac)
    if exponent is not None:
        e_sign, e_digits = ("-", exponent[1:]) if exponent[0] == "-" else ("", exponent.lstrip("+"))
        e_digits = e_digits.lstrip("0") or "0"
        if len(e_digits) > _EXPONENT_DIGITS:
            raise NumberOutOfRange(f"{text[:20]!r}...: its exponent has {len(e_digits)} digits")
        low += int(e_sign + e_digits)
    return sign == "-", significant, low


def _exact(text: str) -> Fraction | None:
    """The exact value of a decimal numeral (see `_read_numeral`); None when it is not one.

    Raises:
        NumberOutOfRange: more than MAX_DIGITS significant digits, or magnitude beyond 10**±MAX_EXPONENT.
    """
    read = _read_numeral(text)
    if read is None:
        return None
    negative, digits, low = read
    if not digits:
        return Fraction(0)
    magnitude = low + len(digits) - 1  # value in [10**magnitude, 10**(magnitude + 1))
    if len(digits) > MAX_DIGITS or abs(magnitude) > MAX_EXPONENT:
        what = f"{len(digits)} significant digits" if len(digits) > MAX_DIGITS else f"magnitude 10**{magnitude}"
        raise NumberOutOfRange(f"{what} is beyond the bounds ({MAX_DIGITS} digits, 10**±{MAX_EXPONENT})")
    n = int(Decimal(digits))  # not int(digits): that depends on sys.set_int_max_str_digits
    value = Fraction(n * 10**low) if low >= 0 else Fraction(n, 10**-low)
    return -value if negative else value


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as in `extract.NUMBER` ("1,000", "-2.5", ".5", "1e-3", "3/4"; any
    Unicode decimal digits) as a Fraction; None when `text` is not such a number (also "nan", "inf", "1/0").

    Bounded: the bounds are checked on the text (linear time) before any big-number arithmetic, so a parse costs
    at most a few milliseconds however the numeral is written.

    Raises:
        NumberOutOfRange: the numeral (or a side of a fraction) has more than MAX_DIGITS (4300) significant digits
            or a magnitude beyond 10**±MAX_EXPONENT (10**±4300).
    """
    text = text.strip().replace(",", "")
    if "/" in text:
        num, den = text.split("/", 1)
        a, b = _exact(num.strip()), _exact(den.strip())
        return None if a is None or b is None or b == 0 else a / b
    return _exact(text)


def _canonical_number(match: re.Match[str]) -> str:
    """"1,000" / "1000.0" / "+1000" / "1e3" -> "1000"; "0.50" -> "0.5"; "1e999999" -> "1e+999999" (beyond
    10**±FIXED_POINT_EXPONENT: scientific notation, one digit before the point); fractions and numerals whose
    exponent has more than 18 digits are left as written. Linear time: no arithmetic on the digits."""
    text = match.group(0)
    if "/" in text:
        return text
    try:
        read = _read_numeral(text.replace(",", ""))
    except NumberOutOfRange:
        return text
    if read is None:  # not reached for NUMBER's matches
        return text
    negative, digits, low = read
    if not digits:
        return "0"
    magnitude = low + len(digits) - 1
    if abs(magnitude) >= FIXED_POINT_EXPONENT:
        body = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "") + f"e{magnitude:+d}"
    elif low >= 0:
        body = digits + "0" * low
    elif magnitude >= 0:
        body = f"{digits[:magnitude + 1]}.{digits[magnitude + 1:]}"
    else:
        body = "0." + "0" * (-magnitude - 1) + digits
    return "-" + body if negative else body


def normalize_numbers(text: str) -> str:
    """Rewrite every number in `text` in one canonical form (see `_canonical_number`): "x = 1,000.0" -> "x = 1000".

    Equal values get equal text. Linear in len(text); each number's canonical form is at most
    FIXED_POINT_EXPONENT + 3 characters longer than as written, so the output is bounded too.
    """
    return NUMBER.sub(_canonical_number, text)


# ---------------------------------------------------------------------------------------------- exact_match
@reward(name="exact_match", fields=("references",))
def exact_match(
    completion: str, answer: Any = None, case: bool = True, whitespace: bool = True, strip: bool = True,
    numbers: bool = False, references: Any = None,
) -> dict:
    """1.0 when the extracted answer equals a reference after normalization, else 0.0.

    Inputs: the completion's answer (last `<answer>` tag's content, else the whole completion) and the row's
    `references` (a list of acceptable strings) or else its `answer` (a string, a number, or a list). Normalization,
    applied to both sides:
    `strip` (default True) removes leading/trailing whitespace; `case=False` ignores letter case; `whitespace=False`
    ignores all whitespace; `numbers=True` writes every number canonically ("1,000", "1000.0", "+1000", "1e3" ->
    "1000"; "0.50" -> "0.5"; beyond 10**±100 in scientific notation, "1e999999" -> "1e+999999"), in linear time
    and bounded memory whatever the numerals (see `normalize_numbers`). Score range {0, 1}. Components: `correct`
    (same value). The options come from the config only: a row field named like one (`case`) is ignored.

    Errors: a row without `answer` (RewardOutput.error "exact_match: ValueError: row has no 'answer'").
    """
    got = last_tag(completion, strip=False)
    if got is None:
        got = completion

    def norm(text: str) -> str:
        if strip:
            text = text.strip()
        if numbers:
            text = normalize_numbers(text)
        if not case:
            text = text.lower()
        if not whitespace:
            text = re.sub(r"\s+", "", text)
        return text

    got = norm(got)
    value = float(any(got == norm(ref) for ref in _references(answer, references)))
    return {"score": value, "correct": value}


# ---------------------------------------------------------------------------------------------- numeric
def _tolerance(name: str, value: float) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return Fraction(value)


def is_close(a: Fraction, b: Fraction, rel_tol: Fraction, abs_tol: Fraction) -> bool:
    """`math.isclose` in exact arithmetic: |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol). No rounding and no
    overflow: 1e309 and 10**400 are not close (as floats both are inf, and inf is close to inf)."""
    return abs(a - b) <= max(rel_tol * max(abs(a), abs(b)), abs_tol)


@reward(name="numeric", fields=("references",))
def numeric(
    completion: str, answer: Any = None, abs_tol: float = 1e-6, rel_tol: float = 1e-6,
    extract: Sequence[str] | str = ("last_number",), references: Any = None,
) -> dict:
    """1.0 when the number in the completion equals the reference within tolerance, else 0.0.

    The completion's number: the first of the `extract` methods that finds an answer ("answer_tag", "boxed",
    "last_number"; default: the last number in the text), then the last number in that text ("1,000", "-2.5", ".5",
    "1e-3", "3/4" are numbers). The reference: the row's `references` or else its `answer`, a number or a numeric
    string (or a list: any matches). Both are read exactly (`parse_number`) and compared exactly:
    equal when |got - ref| <= max(rel_tol * max(|got|, |ref|), abs_tol) (`math.isclose`'s rule without rounding
    or float overflow); defaults abs_tol = rel_tol = 1e-6 (each a finite number >= 0, set in the config only: a row
    field named like an option is ignored). Score range {0, 1}; 0.0 when the completion has no number.
    Bounded work: a completion's number with more than `MAX_DIGITS` (4300) significant digits or a magnitude beyond
    10**±`MAX_EXPONENT` (10**±4300) scores 0 with `out_of_range` 1.0 (not an error), decided from its text in linear
    time; every comparison within the bounds takes a few milliseconds at most.
    Components: `correct` (same value), `extracted` (1.0 when a number was found), `out_of_range` (1.0 when that
    number is beyond the bounds).

    Errors: a row without `answer`, a reference that is not a finite number ("numeric: ValueError: row field
    'answer': reference 'nan' is not a number") or is beyond the bounds, a tolerance that is negative or not finite.
    """
    rel, absolute = _tolerance("rel_tol", rel_tol), _tolerance("abs_tol", abs_tol)
    field, texts = _named_references(answer, references)
    refs = []
    for ref in texts:
        try:
            value = parse_number(ref)
        except NumberOutOfRange as exc:
            raise ValueError(f"row field {field!r}: reference {ref[:40]!r} is out of range: {exc}") from None
        if value is None:
            raise ValueError(f"row field {field!r}: reference {ref[:40]!r} is not a number")
        refs.append(value)
    found, _ = extract_answer(completion, check_methods(extract))
    written = last_number(found) if found is not None else None
    try:
        got = parse_number(written) if written is not None else None
    except NumberOutOfRange:
        return {"score": 0.0, "correct": 0.0, "extracted": 1.0, "out_of_range": 1.0}
    if got is None:
        return {"score": 0.0, "correct": 0.0, "extracted": 0.0, "out_of_range": 0.0}
    value = float(any(is_close(got, ref, rel, absolute) for ref in refs))
    return {"score": value, "correct": value, "extracted": 1.0, "out_of_range": 0.0}


# ---------------------------------------------------------------------------------------------- BLEU, chrF
@lru_cache(maxsize=16)
def _bleu_metric(lowercase: bool, tokenize: str | None, smooth_method: str):
    from sacrebleu.metrics import BLEU

    return BLEU(lowercase=lowercase, tokenize=tokenize, smooth_method=smooth_method, effective_order=True)


@lru_cache(maxsize=16)
def _chrf_metric(char_order: int, word_order: int, beta: int):
    from sacrebleu.metrics import CHRF

    return CHRF(char_order=char_order, word_order=word_order, beta=beta)


@reward(name="bleu", fields=("references",))
def bleu(completion: str, answer: Any = None, lowercase: bool = False, tokenize: str | None = None,
         smooth_method: str = "exp", references: Any = None) -> float:
    """Sentence-level BLEU of the answer against the reference(s), scaled to [0, 1] (sacrebleu score / 100).

    BLEU (Papineni et al., 2002) via sacrebleu (Post, 2018): BP * exp(sum_n 1/4 log p_n), p_n the clipped n-gram
    precision for n = 1..4 over all references, BP = min(1, exp(1 - r/c)) the brevity penalty; at sentence level
    with effective order and `smooth_method` ("exp", "floor", "add-k" or "none"; default "exp"). `tokenize`: a
    sacrebleu tokenizer name ("13a" by default, "zh", "intl", "char", ...). Inputs: the answer (last `<answer>` tag,
    else the completion) and the row's `answer` (string or list of references). Errors: a row without `answer`.
    """
    metric = _bleu_metric(lowercase, tokenize, smooth_method)
    return metric.sentence_score(extract_tagged_answer(completion), _references(answer, references)).score / 100.0


@reward(name="chrf", fields=("references",))
def chrf(completion: str, answer: Any = None, char_order: int = 6, word_order: int = 0, beta: int = 2,
         references: Any = None) -> float:
    """Sentence-level chrF of the answer against the reference(s), scaled to [0, 1] (sacrebleu score / 100).

    chrF (Popovic, 2015) via sacrebleu: the F-beta score of character n-gram precision and recall averaged over
    n = 1..char_order, F = (1 + beta^2) P R / (beta^2 P + R), beta = 2 (recall weighs more); `word_order=2` adds
    word bigrams (chrF++, Popovic 2017). Whitespace is ignored. With several references the best is used. Inputs as
    `bleu`. Errors: a row without `answer`.
    """
    metric = _chrf_metric(char_order, word_order, beta)
    return metric.sentence_score(extract_tagged_answer(completion), _references(answer, references)).score / 100.0


# ---------------------------------------------------------------------------------------------- token F1
_PUNCTUATION = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
    """SQuAD answer normalization: lowercase, drop ASCII punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(c for c in text if c not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def squad_f1(prediction: str, reference: str) -> float:
    """Token-overlap F1 of two answers after `squad_normalize`.

    common = |tokens(pred) ∩ tokens(ref)| (multiset), P = common / |pred|, R = common / |ref|, F1 = 2PR / (P + R);
    0 when nothing is shared; when either side is empty, 1 if both are empty else 0 (SQuAD 2.0 convention).
    """
    pred, ref = squad_normalize(prediction).split(), squad_normalize(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@reward(name="token_f1", fields=("references",))
def token_f1(completion: str, answer: Any = None, references: Any = None) -> float:
    """SQuAD-style token F1 of the answer against the reference(s), the maximum over references; range [0, 1].

    Source: the SQuAD evaluation script (Rajpurkar et al., 2016): normalize (lowercase, no punctuation, no
    articles a/an/the, single spaces), then F1 = 2PR / (P + R) over the token multisets (see `squad_f1`).
    Inputs: the answer (last `<answer>` tag, else the completion) and the row's `answer` (string or list).
    Errors: a row without `answer`.
    """
    prediction = extract_tagged_answer(completion)
    return max(squad_f1(prediction, ref) for ref in _references(answer, references))


# ---------------------------------------------------------------------------------------------- ROUGE-L
@lru_cache(maxsize=4)
def _rouge_scorer(use_stemmer: bool):
    from rouge_score.rouge_scorer import RougeScorer  # imports nltk (~3 s): only when the reward is used

    return RougeScorer(["rougeL"], use_stemmer=use_stemmer)


@reward(name="rouge_l", fields=("references",))
def rouge_l(completion: str, answer: Any = None, use_stemmer: bool = False, references: Any = None) -> dict:
    """ROUGE-L F-measure of the answer against the reference(s) via rouge-score; range [0, 1].

    ROUGE-L (Lin, 2004): with LCS the longest common token subsequence, P = LCS / |pred|, R = LCS / |ref|,
    F = 2PR / (P + R). rouge-score's tokenizer lowercases and keeps only [a-z0-9] tokens, so text in other scripts
    scores 0; `use_stemmer=True` applies the Porter stemmer. With several references the one with the best F counts
    (rouge-score's `score_multi`). Components: `precision`, `recall`. Errors: a row without `answer`.
    """
    refs = _references(answer, references)
    scores = _rouge_scorer(use_stemmer).score_multi(refs, extract_tagged_answer(completion))["rougeL"]
    return {"score": scores.fmeasure, "precision": scores.precision, "recall": scores.recall}
