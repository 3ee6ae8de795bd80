"""Final-answer extraction shared by the verifiable rewards: the last `\\boxed{}`, an answer tag, the last number.

Each extractor returns the answer text or None when the completion has none; `extract_answer` tries a list of them
in order and returns the first hit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: A number as written in answers: optional sign, digits with optional thousands commas ("1,000"), optional decimal
#: part, or a leading-dot decimal (".5"), optional exponent ("1e-3"), optional "/denominator" ("3/4"). Not part of a
#: longer word or number (no letter, digit or dot right before or after).
NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?(?!\w)"
)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def balanced_braces(text: str, open_at: int) -> int | None:
    """Index just past the `}` that closes the `{` at `text[open_at]`, or None when it never closes.

    Backslash-escaped braces (`\\{`, `\\}`) do not count, so `\\boxed{\\{1, 2\\}}` closes at the last `}`.
    """
    depth, i = 0, open_at
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def boxed_spans(text: str) -> list[tuple[int, int, int, int]]:
    """Every `\\boxed{...}` / `\\fbox{...}` in `text` as (start, content_start, content_end, end); unclosed ones are
    reported with content_end = end = -1. Nested boxes inside a box's content are not listed separately."""
    spans, pos = [], 0
    while (m := _BOXED.search(text, pos)) is not None:
        close = balanced_braces(text, m.end() - 1)
        if close is None:
            spans.append((m.start(), m.end(), -1, -1))
            pos = m.end()
        else:
            spans.append((m.start(), m.end(), close - 1, close))
            pos = close
    return spans


def last_boxed(text: str) -> str | None:
    """The content of the last closed `\\boxed{...}` (or `\\fbox{...}`), nested braces included; None if none."""
    closed = [s for s in boxed_spans(text) if s[3] >= 0]
    if not closed:
        return None
    _, a, b, _ = closed[-1]
    return text[a:b].strip()


def last_tag(text: str, tag: str = "answer", *, strip: bool = True) -> str | None:
    """The content of the last `<tag>...</tag>` (shortest match, may span lines), stripped unless `strip=False`;
    None if none."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    if not found:
        return None
    return found[-1].strip() if strip else found[-1]


def extract_tagged_answer(completion: str) -> str:
    """The content of the last `<answer>...</answer>` tag, else the whole completion; stripped."""
    found = last_tag(completion)
    return completion.strip() if found is None else found


def last_number(text: str) -> str | None:
    """The last number in `text` as written (see `NUMBER`: "1,000", "-2.5", ".5", "1e-3", "3/4"); None if none."""
    found = NUMBER.findall(text)
    return found[-1] if found else None


EXTRACTORS = {"boxed": last_boxed, "answer_tag": last_tag, "last_number": last_number}


def check_methods(methods: Sequence[str] | str, field: str = "extract") -> tuple[str, ...]:
    """Validate extractor names; a single name may be given as a string.

    Raises:
        ValueError: an unknown name or an empty list (the message lists the valid names).
    """
    methods = (methods,) if isinstance(methods, str) else tuple(methods)
    bad = [m for m in methods if m not in EXTRACTORS]
    if bad or not methods:
        raise ValueError(f"{field}: expected a non-empty list of {sorted(EXTRACTORS)}, got {list(methods)}")
    return methods


#: The end of a line that hedges between numbers: "1 or 2 or 3", "4, 5 or 6.", "either 2 or -2", "7 and/or 8".
_HEDGE = re.compile(rf"(?:{NUMBER.pattern})(?:\s*(?:,|;|\bor\b|\band/or\b|/)\s*(?:{NUMBER.pattern}))*"
                    rf"\s*(?:,\s*)?(?:\bor\b|\band/or\b)\s*(?:{NUMBER.pattern})\s*[.!]?\s*$")


def is_quoted(text: str, start: int, end: int, quoted: str) -> bool:
    """True when the box `text[start:end]` is quoted from `quoted` (the prompt): the box's text together with the two
    words just before it appears in `quoted` (punctuation and spaces between them aside). "what is \\boxed{7}"
    quoted back is the question's box; an answer "\\boxed{5}" after the prompt's example "e.g. \\boxed{5}" is not,
    unless the completion repeats the example's own words."""
    words = re.findall(r"\w+", text[max(0, start - 60):start])[-2:]
    if not quoted or not words:
        return False
    pattern = r"\W+".join(map(re.escape, words)) + r"\W*" + re.escape(text[start:end])
    return re.search(rf"\b{pattern}", quoted, re.IGNORECASE) is not None


def answer_candidates(text: str, method: str, quoted: str = "") -> list[str]:
    """Every answer `method` finds in `text`, in order, for ambiguity checks (`extract_answer` keeps the last):

        boxed        the content of each closed `\boxed{}`, except a box whose whole text also appears in `quoted`
                     (a completion that quotes its question does not answer with the question's box)
        answer_tag   the content of each `<answer>...</answer>` (a box inside one gives the box's content)
        last_number  the last number outside the quoted boxes; when the last line ends by hedging between
                     numbers ("1 or 2 or 3", "4, 5 or 6"), every number of that hedge

    Empty contents are left out. Raises KeyError for an unknown method.
    """
    out: list[str] = []
    if method == "boxed":
        for start, a, b, end in boxed_spans(text):
            if end >= 0 and not is_quoted(text, start, end, quoted) and text[a:b].strip():
                out.append(text[a:b].strip())
    elif method == "answer_tag":
        for found in re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL):
            found = found.strip()
            inner = last_boxed(found)
            if (inner if inner is not None else found):
                out.append(inner if inner is not None else found)
    elif method == "last_number":
        if quoted:  # the question's own boxes, quoted, hold no number of the answer's
            for start, _, _, end in reversed(boxed_spans(text)):
                if end >= 0 and is_quoted(text, start, end, quoted):
                    text = text[:start] + text[end:]
        lines = [line for line in text.strip().splitlines() if line.strip()]
        hedge = _HEDGE.search(lines[-1]) if lines else None
        out = NUMBER.findall(hedge.group(0)) if hedge else [n for n in [last_number(text)] if n]
    else:
        raise KeyError(method)
    return out


def extract_answer(text: str, methods: Sequence[str]) -> tuple[str | None, str | None]:
    """(answer text, the method that found it) for the first method in `methods` that finds one, else (None, None).

    An answer tag whose content holds a `\\boxed{}` gives that box's content ("<answer>\\boxed{5}</answer>" -> "5").
    """
    for method in methods:
        found = EXTRACTORS[method](text)
        if found:
            if method != "boxed" and (inner := last_boxed(found)) is not None:
                found = inner
            return found, method
    return None, None
