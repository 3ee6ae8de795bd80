"""Worked solutions with written-out steps: integer `+`/`-` chains as partial sums, one step per line."""

from __future__ import annotations

import re

_CHAIN = re.compile(r"(-?\d+)((?:[+-]\d+)*)")
_TERM = re.compile(r"([+-])(\d+)")


def parse_chain(expression: str) -> tuple[int, list[tuple[str, int]]]:
    """The first term and the `(operator, operand)` pairs of an integer chain of `+` and `-`.

    Example: parse_chain("3 + 4 - 2") -> (3, [("+", 4), ("-", 2)]). Whitespace is ignored; the first term may be
    negative.

    Raises:
        ValueError: when `expression` is not integers joined by `+` and `-`.
    """
    m = _CHAIN.fullmatch(expression.replace(" ", ""))
    if m is None:
        raise ValueError(f"expression {expression!r}: expected integers joined by + and -, e.g. '3 + 4 - 2'")
    return int(m.group(1)), [(op, int(v)) for op, v in _TERM.findall(m.group(2))]


def worked_steps(expression: str) -> str:
    """A chain of `+`/`-` worked as partial sums, one step per line (steps end at "\\n", see `types.split_steps`).

    Step k is `<previous result><op><operand>=<result>`, the first step starting from the first term:
    worked_steps("3 + 4 - 2") == "3+4=7\\n7-2=5". The last line's result is the chain's value. A single term
    gives just that term ("5").

    Raises:
        ValueError: see `parse_chain`.
    """
    value, terms = parse_chain(expression)
    if not terms:
        return str(value)
    lines = []
    for op, operand in terms:
        result = value + operand if op == "+" else value - operand
        lines.append(f"{value}{op}{operand}={result}")
        value = result
    return "\n".join(lines)
