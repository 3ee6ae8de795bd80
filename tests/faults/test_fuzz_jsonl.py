"""Property-based fuzzing of the JSONL task reader (`rewardlab.tasks.load("jsonl:PATH")`).

Files are built line by line from kinds whose verdict is known (a valid row, malformed JSON, a non-object, a missing
field, a null or empty answer, an empty prompt, a non-string prompt, a number Python cannot read, a lone surrogate,
invalid UTF-8, nesting too deep, blank lines, a byte-order mark), plus arbitrary bytes. Property: the first bad line gives a one-line ValueError starting
with "PATH:LINE:"; a file without bad lines gives a Task whose rows are the file's unique prompts (in file order in
the `all` split), every prompt and answer a string that encodes as UTF-8, train and test disjoint; never another
exception type.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rewardlab.tasks import load

# FUZZ_EXAMPLES=5000 for a longer hunt; the suite's budget is 200.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)
text = st.text(max_size=12)  # any code point except lone surrogates


def _dump(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


# (bytes of one line without its newline, is_bad)
def _blank(v) -> bool:
    """An answer (or prompt) the reader refuses as missing: null, or a string of only whitespace."""
    return v is None or (isinstance(v, str) and not v.strip())


good_line = st.builds(lambda p, a, extra: (_dump({"prompt": p, "answer": a, **extra}), False),
                      text.filter(lambda t: not _blank(t)), json_value.filter(lambda v: not _blank(v)),
                      st.dictionaries(st.sampled_from(["level", "id", "x"]), json_value, max_size=2))
bad_line = st.one_of(
    text.map(lambda t: (t.replace("\n", " ").encode("utf-8") + b"{", True)),  # malformed JSON
    json_value.filter(lambda v: not isinstance(v, dict)).map(lambda v: (_dump(v), True)),  # not an object
    st.builds(lambda a: (_dump({"answer": a}), True), json_value),  # no prompt
    st.builds(lambda p: (_dump({"prompt": p}), True), text),  # no answer
    st.builds(lambda p, a: (_dump({"prompt": p, "answer": a}), True), text,
              st.sampled_from([None, "", " ", "\t\n"])),  # a null or empty answer
    st.builds(lambda p: (_dump({"prompt": p, "answer": "1"}), True), st.sampled_from(["", "  "])),  # empty prompt
    st.builds(lambda p, a: (_dump({"prompt": p, "answer": a}), True),
              json_value.filter(lambda v: not isinstance(v, str)), json_value),  # prompt not a string
    st.builds(lambda n: (b'{"prompt": "p", "answer": ' + b"9" * n + b"}", True),
              st.integers(4301, 6000)),  # more digits than Python's int() reads
    st.builds(lambda p: (b'{"prompt": "' + p.encode("utf-8") + b'\\ud800", "answer": "1"}', True),
              st.text(alphabet="ab", max_size=3)),  # a lone surrogate in the prompt
    st.builds(lambda b: (b'{"prompt": "' + b + b'", "answer": "1"}', True),
              st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80abc"])),  # invalid UTF-8
    st.integers(2000, 5000).map(lambda n: (b"[" * n + b"]" * n, True)),  # nesting too deep for the parser
)
blank_line = st.sampled_from([b"", b"   ", b"\t", b"\r"]).map(lambda b: (b, None))
line_kinds = st.lists(st.one_of(good_line, good_line, bad_line, blank_line), max_size=8)


def _write(tmp_path, content: bytes):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    return path


def check_file(path, first_bad: int | None, good_rows: list[dict] | None) -> None:
    try:
        task = load(f"jsonl:{path}")
    except ValueError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
        if first_bad is not None:
            assert msg.startswith(f"{path}:{first_bad}: "), (msg, first_bad)
        else:  # no bad line: an empty file, or too few questions to split off a test row
            assert msg == f"{path}: no rows" or msg.startswith("task.options.test_size: "), msg
        return
    assert first_bad is None, f"line {first_bad} is bad but the file loaded"
    rows = task.split("all")
    for r in rows:
        assert isinstance(r["prompt"], str) and isinstance(r["answer"], str)
        (r["prompt"] + r["answer"]).encode("utf-8")  # tokenizers need valid Unicode
    assert {r["prompt"] for r in task.train}.isdisjoint(r["prompt"] for r in task.test)
    assert len(task.train) + len(task.test) == len(rows)
    if good_rows is not None:
        assert [r["prompt"] for r in rows] == list(dict.fromkeys(r["prompt"] for r in good_rows))  # file order


@FUZZ
@given(kinds=line_kinds, bom=st.booleans(), crlf=st.booleans())
# Defects the fuzzing found (each a traceback or a message without the file line before the fix):
@example(kinds=[(b'{"prompt": "p", "answer": ' + b"9" * 5000 + b"}", True)], bom=False, crlf=False)  # int digits
@example(kinds=[(b'{"prompt": "\\ud800", "answer": "1"}', True)], bom=False, crlf=False)  # crashes the tokenizer
@example(kinds=[(_dump({"prompt": "a", "answer": 1}), False), (b'{"prompt": "\xff"}', True)], bom=False,
         crlf=False)  # invalid UTF-8: UnicodeDecodeError without a line
@example(kinds=[(b"[" * 3000 + b"]" * 3000, True)], bom=False, crlf=False)  # RecursionError
@example(kinds=[(_dump({"prompt": "a", "answer": 1}), False), (_dump({"prompt": "b", "answer": 2}), False)],
         bom=True, crlf=True)  # a byte-order mark was "malformed JSON" on line 1
def test_jsonl_lines_fuzz(tmp_path, kinds, bom, crlf):
    end = b"\r\n" if crlf else b"\n"
    content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + end for line, _ in kinds)
    path = _write(tmp_path, content)
    first_bad = next((i for i, (_, bad) in enumerate(kinds, 1) if bad), None)
    good = [json.loads(line) for line, bad in kinds if bad is False]
    check_file(path, first_bad, good)


@FUZZ
@given(content=st.binary(max_size=300))
@example(content=b"\xef\xbb\xbf")  # a byte-order mark alone: an empty file
@example(content=b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": 1e999}\n')  # inf -> "Infinity"
def test_jsonl_arbitrary_bytes_fuzz(tmp_path, content):
    path = _write(tmp_path, content)
    try:
        task = load(f"jsonl:{path}")
    except ValueError as exc:
        msg = str(exc)
        assert "\n" not in msg and (msg.startswith(str(path)) or msg.startswith("task.options.test_size: ")), msg
        return
    assert all(isinstance(r["prompt"], str) and isinstance(r["answer"], str) for r in task.split("all"))


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 100))
@given(test_size=json_value, seed=json_value)
@example(test_size=None, seed=0)  # TypeError from int(None)
@example(test_size=[1], seed=0)  # TypeError
@example(test_size="abc", seed=0)  # "invalid literal for int()": no key named
@example(test_size=1, seed=[1])  # TypeError from random.Random
def test_jsonl_split_options_fuzz(tmp_path, test_size, seed):
    path = _write(tmp_path, b"".join(_dump({"prompt": str(i), "answer": i}) + b"\n" for i in range(5)))
    try:
        task = load(f"jsonl:{path}", test_size=test_size, seed=seed)
    except ValueError as exc:
        assert re.match(r"task\.options\.(test_size|seed): ", str(exc)) and "\n" not in str(exc), str(exc)
        return
    assert len(task.train) + len(task.test) == 5 and task.train


def test_fixed_errors_name_the_line(tmp_path):
    path = _write(tmp_path, b'{"prompt": "a", "answer": "1"}\n\n{"prompt": "b\xff", "answer": "2"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: not UTF-8 text \(byte 0xff at column 14\)$"):
        load(f"jsonl:{path}")
    path = _write(tmp_path, b'{"prompt": "a\\udc80", "answer": "1"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: field 'prompt' is not valid Unicode "
                                         r"\(lone surrogate '\\udc80'\)$"):
        load(f"jsonl:{path}")
    path = _write(tmp_path, b'{"prompt": "a", "answer": ' + b"1" * 5000 + b"}\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: malformed JSON \(Exceeds the limit"):
        load(f"jsonl:{path}")
    path = _write(tmp_path, b"\xef\xbb\xbf" + b'{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\n')
    assert [r["prompt"] for r in load(f"jsonl:{path}").split("all")] == ["a", "b"]


@FUZZ
@given(kinds=line_kinds, bom=st.booleans())
@example(kinds=[(b'{"prompt": "p", "chosen": "\xff", "rejected": "r"}', True)], bom=False)  # UnicodeDecodeError
@example(kinds=[(_dump({"prompt": "a", "answer": 1}), False)], bom=True)  # BOM: was "malformed JSON"
def test_reward_model_data_lines_fuzz(tmp_path, kinds, bom):
    """The reward-model verbs' data files (`rm train --data`, ...) share the line reader: the first line that is not
    UTF-8, not JSON or not an object is a one-line ValueError naming PATH:LINE."""
    from rewardlab.rm.data import read_jsonl

    content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + b"\n" for line, _ in kinds)
    path = _write(tmp_path, content)
    unreadable = [i for i, (line, bad) in enumerate(kinds, 1) if bad and not _is_object(line)]
    try:
        rows = read_jsonl(path)
    except ValueError as exc:
        msg = str(exc)
        assert "\n" not in msg
        assert msg.startswith(f"{path}:{unreadable[0]}: ") if unreadable else msg == f"{path}: no rows", msg
        return
    assert not unreadable and [n for n, _ in rows] == [i for i, (_, bad) in enumerate(kinds, 1) if bad is not None]


def _is_object(line: bytes) -> bool:
    """A line of a JSON object that Python reads (the rm reader leaves field checks to its callers)."""
    try:
        return isinstance(json.loads(line.decode("utf-8")), dict)
    except (ValueError, RecursionError):
        return False
