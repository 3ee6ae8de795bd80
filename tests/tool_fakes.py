"""Tools shared by the ToolEnv tests (module-level, so that the pool's worker processes find them by reference)."""

from __future__ import annotations

import json
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: the text
    """
    return text.upper()


def boom(text: str) -> str:
    """Always fails.

    Args:
        text: anything
    """
    raise KeyError(text)


def hang(text: str) -> str:
    """Never returns.

    Args:
        text: anything
    """
    time.sleep(120)
    return text


def call(name: str, **arguments) -> str:
    """A hermes tool call of `name` with `arguments`, as a model would write it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
