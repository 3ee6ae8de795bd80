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
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import lru_cache
from typing import Any

from rewardlab.rewards.base import reward
from rewardlab.rewards.extract import NUMBER, check_methods, extract_answer, extract_tagged_answer, last_tag


def _references(answer: Any, references: Any = None) -> list[str]:
    """The row's reference(s) as a non-empty list of strings: its `references` field when it has one (a list; the
    JSONL loader keeps it as is, while it stores a non-string `answer` as JSON text), else its `answer` (a string,
    a number, or a list).

    Raises:
        ValueError: no reference, or an empty list.
    """
    field = "references" if references is not None else "answer"
    value = references if references is not None else answer
    if value is None:
        raise ValueError("row has no 'answer'")
    refs = [str(a) for a in value] if isinstance(value, (list, tuple)) else [str(value)]
    if not refs:
        raise ValueError(f"'{field}' is an empty list")
    return refs


# ---------------------------------------------------------------------------------------------- numbers
def parse_number(text: str) -> float | None:
    """A number written as in `extract.NUMBER` ("1,000", "-2.5", ".5", "1e-3", "3/4") as a float; None otherwise."""
    text = text.strip().replace(",", "")
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(Fraction(Decimal(num)) / Fraction(Decimal(den)))
        return float(Decimal(text))
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None


def _canonical_number(match: re.Match[str]) -> str:
    """"1,000" / "1000.0" / "+1000" / "1e3" -> "1000"; "0.50" -> "0.5"; fractions are left as written."""
    text = match.group(0)
    if "/" in text:
        return text
    value = Decimal(text.replace(",", ""))
    return "0" if value == 0 else format(value.normalize(), "f")


def normalize_numbers(text: str) -> str:
    """Rewrite every number in `text` in one canonical form (see `_canonical_number`): "x = 1,000.0" -> "x = 1000"."""
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
    "1000"; "0.50" -> "0.5"). Score range {0, 1}. Components: `correct` (same value).

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
@reward(name="numeric", fields=("references",))
def numeric(
    completion: str, answer: Any = None, abs_tol: float = 1e-6, rel_tol: float = 1e-6,
    extract: Sequence[str] | str = ("last_number",), references: Any = None,
) -> dict:
    """1.0 when the number in the completion equals the reference within tolerance, else 0.0.

    The completion's number: the first of the `extract` methods that finds an answer ("answer_tag", "boxed",
    "last_number"; default: the last number in the text), then the last number in that text ("1,000", "-2.5", ".5",
    "1e-3", "3/4" are numbers). The reference: the row's `answer`, a number or a numeric string (or a list: any
    matches). Equal when |got - ref| <= max(rel_tol * max(|got|, |ref|), abs_tol) (Python's `math.isclose`);
    defaults abs_tol = rel_tol = 1e-6. Score range {0, 1}; 0.0 when the completion has no number.
    Components: `correct` (same value), `extracted` (1.0 when a number was found).

    Errors: a row without `answer`, or a reference that is not a number ("numeric: ValueError: reference answer
    'abc' is not a number").
    """
    refs = []
    for ref in _references(answer, references):
        value = parse_number(ref)
        if value is None:
            raise ValueError(f"reference answer {ref!r} is not a number")
        refs.append(value)
    found, _ = extract_answer(completion, check_methods(extract))
    numbers = NUMBER.findall(found) if found is not None else []
    got = parse_number(numbers[-1]) if numbers else None
    if got is None:
        return {"score": 0.0, "correct": 0.0, "extracted": 0.0}
    value = float(any(math.isclose(got, ref, rel_tol=rel_tol, abs_tol=abs_tol) for ref in refs))
    return {"score": value, "correct": value, "extracted": 1.0}


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
