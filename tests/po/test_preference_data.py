"""Preference data for `rewardlab po` (issue 36): the rm pairs format and TRL's formats, and bad rows as FILE:LINE
errors or counted skips."""

import json

import pytest

from conftest import write_jsonl
from rewardlab.po.data import load_preference_rows


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_the_rm_pairs_format_keeps_its_task_row(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3", "subset": "s",
                                               "row": {"answer": "2"}}])
    rows, skipped = load_preference_rows(path)
    assert [(r.prompt, r.chosen, r.rejected) for r in rows] == [("1+1=", "2", "3")]
    assert rows[0].row == {"subset": "s", "answer": "2"} and not rows[0].conversational
    assert set(skipped.values()) == {0}


def test_trls_conversational_and_implicit_prompt_formats(tmp_path):
    prompt = _msgs(("system", "be brief"), ("user", "1+1?"))
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": prompt, "chosen": _msgs(("assistant", "2")), "rejected": _msgs(("assistant", "3"))},
        {"chosen": prompt + _msgs(("assistant", "2")), "rejected": prompt + _msgs(("assistant", "3"))},
    ])
    rows, _ = load_preference_rows(path)
    for r in rows:
        assert r.conversational and r.prompt == prompt
        assert r.chosen == _msgs(("assistant", "2")) and r.rejected == _msgs(("assistant", "3"))


@pytest.mark.parametrize("row, message", [
    ({"prompt": "p", "chosen": "a"}, ":1: missing field 'rejected'"),
    ({"chosen": "a", "rejected": "b"}, ":1: missing field 'prompt'"),
    ({"prompt": "p", "chosen": 3, "rejected": "b"}, ":1: field 'chosen' must be a string or a list"),
    ({"prompt": "p", "chosen": _msgs(("assistant", "a")), "rejected": "b"}, "all be strings or all be messages"),
    ({"chosen": _msgs(("user", "x"), ("assistant", "a")), "rejected": _msgs(("user", "y"), ("assistant", "b"))},
     "share no first message"),
    ({"prompt": "p", "chosen": "  ", "rejected": "b"}, ":1: field 'chosen' is empty"),
    ({"prompt": "p", "chosen": "a", "rejected": ""}, ":1: field 'rejected' is empty"),
    ({"prompt": "p", "chosen": "a", "rejected": "a"}, ":1: 'chosen' and 'rejected' are the same response"),
])
def test_bad_rows_are_one_line_errors_naming_file_and_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "p.jsonl", [row])
    with pytest.raises(ValueError, match=message) as info:
        load_preference_rows(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_empty_and_identical_rows_are_skipped_and_counted_on_request(tmp_path):
    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "p", "chosen": "", "rejected": "b"},
            {"prompt": "p", "chosen": "a", "rejected": "a"}, {"prompt": "p", "chosen": "a", "rejected": "a"},
            {"prompt": "p", "chosen": "a", "rejected": " \n"}]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(ValueError, match=":2: field 'chosen' is empty"):
        load_preference_rows(path)
    kept, skipped = load_preference_rows(path, skip_invalid=True)
    assert len(kept) == 1 and skipped == {"empty_chosen": 1, "empty_rejected": 1, "identical": 2}
    # a malformed row is never skipped
    path.write_text(path.read_text() + json.dumps({"prompt": "p", "chosen": "a"}) + "\n")
    with pytest.raises(ValueError, match=":6: missing field 'rejected'"):
        load_preference_rows(path, skip_invalid=True)


def test_a_file_whose_rows_are_all_skipped_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "a"}])
    with pytest.raises(ValueError, match="every row was skipped \\(identical 1\\)"):
        load_preference_rows(path, skip_invalid=True)
