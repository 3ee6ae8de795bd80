"""`format`: credit for a completion's structure - all of it well formed, or nothing."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

from rewardlab.registry import Registry
from rewardlab.rewards.base import register_reward
from rewardlab.rewards.extract import boxed_spans
from rewardlab.types import Rollout, RewardOutput

#: Named patterns: name -> factory(<its tag options>, allow_empty=) -> check(text) -> bool.
PATTERNS: Registry[Callable[..., Callable[[str], bool]]] = Registry("format pattern")


#: Default_Ignorable_Code_Point ranges (Unicode 15.1, DerivedCoreProperties.txt) outside category Cf: combining
#: grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian variation selectors, variation selectors, and the
#: unassigned ignorable blocks; plus U+2800 BRAILLE PATTERN BLANK, which renders as a blank.
_INVISIBLE_RANGES = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
                     (0x2800, 0x2800), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
                     (0xE0000, 0xE0FFF))


def is_invisible(c: str) -> bool:
    """True for a character that shows nothing: whitespace (`str.isspace`), a format character (category Cf:
    U+200B zero width space, U+200C/U+200D joiners, U+2060 word joiner, U+FEFF byte order mark, U+00AD soft
    hyphen, bidi controls, tags, ...) or another default-ignorable code point (variation selectors, Hangul
    fillers, U+034F; see `_INVISIBLE_RANGES`)."""
    if c.isspace() or unicodedata.category(c) == "Cf":
        return True
    o = ord(c)
    return any(a <= o <= b for a, b in _INVISIBLE_RANGES)


def is_blank(text: str) -> bool:
    """True when `text` has no visible content: every character `is_invisible` (so "", "  ", "\\u200b\\ufeff")."""
    return all(is_invisible(c) for c in text)


def _no_tags(tags: Sequence[str]) -> str:
    """A regex for text that contains none of `<tag>` / `</tag>` for the given tags."""
    alternatives = "|".join(rf"</?{re.escape(t)}>" for t in tags)
    return rf"(?:(?!{alternatives}).)*"


@PATTERNS.register("think_answer")
def think_answer(
    think_tag: str = "think", answer_tag: str = "answer", allow_empty: bool = False
) -> Callable[[str], bool]:
    """Exactly one `<think>...</think>` followed by exactly one `<answer>...</answer>`, only whitespace before,
    between and after, no tag of either kind inside either block, and (unless `allow_empty`) non-blank contents
    (`is_blank`: zero-width and other invisible characters are not content)."""
    inner = _no_tags((think_tag, answer_tag))
    t, a = re.escape(think_tag), re.escape(answer_tag)
    regex = re.compile(rf"\s*<{t}>({inner})</{t}>\s*<{a}>({inner})</{a}>\s*", re.DOTALL)

    def check(text: str) -> bool:
        m = regex.fullmatch(text)
        return m is not None and (allow_empty or (not is_blank(m.group(1)) and not is_blank(m.group(2))))

    return check


@PATTERNS.register("answer")
def answer(answer_tag: str = "answer", allow_empty: bool = False) -> Callable[[str], bool]:
    """Exactly one `<answer>` and one `</answer>`, in that order (other text around is allowed), and (unless
    `allow_empty`) a non-blank content (`is_blank`)."""
    open_tag, close_tag = f"<{answer_tag}>", f"</{answer_tag}>"

    def check(text: str) -> bool:
        if text.count(open_tag) != 1 or text.count(close_tag) != 1:
            return False
        start, end = text.index(open_tag) + len(open_tag), text.index(close_tag)
        return start <= end and (allow_empty or not is_blank(text[start:end]))

    return check


@PATTERNS.register("boxed")
def boxed(allow_empty: bool = False) -> Callable[[str], bool]:
    """Exactly one `\\boxed` in the text, its `{` closed by a matching `}` (nested braces balanced, escaped `\\{`
    `\\}` not counted), and (unless `allow_empty`) a non-blank content (`is_blank`). `\\boxed{\\boxed{1}}` has
    two: 0."""

    def check(text: str) -> bool:
        if len(re.findall(r"\\boxed(?![A-Za-z])", text)) != 1:
            return False
        spans = boxed_spans(text)
        if len(spans) != 1 or spans[0][3] < 0:
            return False
        _, a, b, _ = spans[0]
        return allow_empty or not is_blank(text[a:b])

    return check


class FormatReward:
    """1.0 when the completion has the full, well-formed structure, else 0.0 - no partial credit.

    Structures (`pattern`): "think_answer" (default; the DeepSeek-R1 format, Guo et al. 2025: exactly one
    `<think>...</think>` followed by exactly one `<answer>...</answer>`, only whitespace around and between, nothing
    after), "answer" (exactly one `<answer>...</answer>` anywhere), "boxed" (exactly one `\\boxed{...}` whose braces
    balance). Malformed, unclosed, nested or repeated tags score 0; so do blank contents unless `allow_empty`: blank
    means nothing visible, so whitespace and invisible characters (zero width space U+200B, byte order mark U+FEFF,
    word joiner U+2060, every other format character, variation selectors, Hangul fillers; `is_blank`) are not
    content, and `<think>\\u200b</think><answer>\\ufeff</answer>` scores 0.
    Or `regex`: your own Python regex, which must match the whole completion (`re.fullmatch`, `re.DOTALL`) after
    leading and trailing whitespace are removed.

    Input: the completion only. Score range {0, 1}. Never an error at scoring time.

    Args:
        pattern: a name in `PATTERNS`; ignored when `regex` is given.
        regex: a full-match regex instead of a named pattern.
        think_tag, answer_tag: tag names (defaults "think", "answer"), for the patterns that have those tags
            (think_answer: both; answer: answer_tag; boxed: none).
        allow_empty: accept blank tag/box contents (default False).
    Raises:
        ValueError: an unknown pattern name (the message lists them and points to `regex`), both `pattern` and `regex`, a tag option the
            pattern does not have or given with `regex` (the message lists the pattern's options), or a regex that
            does not compile.
    """

    name = "format"
    #: The row fields it cannot score without (read by the TRL adapter's column check): none.
    row_fields: tuple = ()

    def __init__(self, pattern: str | None = None, regex: str | None = None, think_tag: str | None = None,
                 answer_tag: str | None = None, allow_empty: bool = False) -> None:
        if pattern is not None and regex is not None:
            raise ValueError("pattern, regex: give one of them, not both")
        tags = {k: v for k, v in (("think_tag", think_tag), ("answer_tag", answer_tag)) if v is not None}
        if regex is not None:
            if tags:
                raise ValueError(f"{', '.join(tags)}: not used with regex (the regex spells out its own tags)")
            try:
                compiled = re.compile(regex, re.DOTALL)
            except re.error as exc:
                raise ValueError(f"regex: does not compile: {exc}") from None
            self.check: Callable[[str], bool] = lambda text: compiled.fullmatch(text.strip()) is not None
            self.pattern = None
        else:
            pattern = pattern or "think_answer"
            if pattern not in PATTERNS:
                raise ValueError(f"pattern: unknown format pattern {pattern!r}; valid: {', '.join(sorted(PATTERNS))}; "
                                 "for your own regular expression give regex: instead of pattern:")
            try:
                factory = PATTERNS.get(pattern)
                PATTERNS.check(pattern, tags)
            except ValueError as exc:
                raise ValueError(f"pattern: {exc}") from None
            self.check = factory(allow_empty=allow_empty, **tags)
            self.pattern = pattern
        self.regex = regex

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        return [RewardOutput(score=float(self.check(r.completion))) for r in rollouts]


register_reward("format")(FormatReward)
