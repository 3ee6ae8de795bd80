"""Options come from the config, row fields from the task row: a data row cannot set (loosen) a reward's option.

The rule (`rewards.base.FunctionReward`): a parameter with a default that is not a rollout field and not declared in
`@reward(fields=...)` is an option; a row field with its name is ignored with one `RowFieldIgnoredWarning` per reward
object and field. Parameters without a default and declared fields are still read from the row.
"""

from __future__ import annotations

import warnings

import pytest

import rewardlab.envs  # noqa: F401 - registers the environments' rewards (guess_found) too
from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.rewards.base import ROLLOUT_FIELDS, RowFieldIgnoredWarning

SENTINEL = object()


def _score(spec, completion, row):
    return build_reward([spec])([make_rollout(completion, row)])[0]


def test_a_row_cannot_widen_numeric_tolerance():
    with pytest.warns(RowFieldIgnoredWarning, match=r"reward numeric: row field 'abs_tol' ignored"):
        out = _score({"name": "numeric"}, "7", {"answer": "5", "abs_tol": 1e9})
    assert out.error is None and out.score == 0.0  # |7 - 5| = 2 > the config's 1e-6 (was 1.0: the row's 1e9 won)


def test_a_row_cannot_make_exact_match_case_insensitive():
    with pytest.warns(RowFieldIgnoredWarning, match=r"reward exact_match: row field 'case' ignored"):
        out = _score({"name": "exact_match"}, "paris", {"answer": "Paris", "case": False})
    assert out.error is None and out.score == 0.0
    # the config still sets it, with no warning (the option is given, so the row is not consulted)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RowFieldIgnoredWarning)
        assert _score({"name": "exact_match", "case": False}, "paris", {"answer": "Paris", "case": True}).score == 1.0


def test_the_warning_is_one_line_and_once_per_reward_and_field():
    built = build_reward([{"name": "numeric"}])
    rows = [{"answer": "5", "abs_tol": 1e9, "rel_tol": 1.0}] * 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = built([make_rollout("7", row) for row in rows])
        built([make_rollout("7", rows[0])])
    texts = sorted(str(w.message) for w in caught if w.category is RowFieldIgnoredWarning)
    assert [o.score for o in outs] == [0.0, 0.0, 0.0]
    assert len(texts) == 2 and all("\n" not in t for t in texts)
    assert "'abs_tol'" in texts[0] and "'rel_tol'" in texts[1]


def test_no_registered_function_reward_reads_an_option_from_the_row():
    """Every registered `@reward` function: its options are exactly its defaulted parameters that are neither
    rollout fields nor declared row fields, and a row holding all of them (sentinel values) reaches none."""
    declared = {}
    for name in sorted(REWARDS):
        factory = REWARDS[name]
        if not hasattr(factory, "fn"):
            continue  # a class reward: reads the row fields it names itself (math: answer; code: tests; sql: db_path)
        if not factory.fn.__module__.startswith("rewardlab."):
            continue  # registered by another test of the session (the registry is process-wide)
        built = factory()
        declared[name] = built.fields
        row = {p: SENTINEL for p in built.option_params}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kwargs = built._kwargs(make_rollout("1", {"answer": "1", "final": "1", "expression": "1", **row}))
        assert not any(v is SENTINEL for v in kwargs.values()), name
        assert {str(w.message).split("'")[1] for w in caught} == set(row), name
    assert declared == {
        "arithmetic_steps": (), "bleu": ("references",), "chrf": ("references",), "exact_match": ("references",),
        "guess_found": (), "numeric": ("references",), "reasoning_gym": (), "rouge_l": ("references",),
        "token_f1": ("references",), "worked_answer": (),
    }
    assert REWARDS["numeric"]().option_params == ("abs_tol", "rel_tol", "extract")
    assert set(REWARDS["exact_match"]().option_params) == {"case", "whitespace", "strip", "numbers"}


def test_per_row_data_still_reaches_the_function():
    seen = []

    @reward(register=False, fields=("tests",))
    def probe(completion, answer, difficulty, tests=None, threshold=0.5):
        seen.append((answer, difficulty, tests, threshold))
        return 1.0

    with pytest.warns(RowFieldIgnoredWarning, match="row field 'threshold' ignored"):
        probe()([make_rollout("c", {"answer": "a", "difficulty": 3, "tests": ["t"], "threshold": 0.0})])
    probe(threshold=0.9)([make_rollout("c", {"answer": "a", "difficulty": 3})])
    # a parameter without a default and a declared field come from the row; the option from the config or default
    assert seen == [("a", 3, ["t"], 0.5), ("a", 3, None, 0.9)]
    # references, the text rewards' declared row field, still works
    assert _score({"name": "exact_match"}, "y", {"answer": "no", "references": ["yes", "y"]}).score == 1.0


def test_a_var_keyword_function_gets_every_other_column_but_not_its_options():
    @reward(register=False)
    def everything(completion, strict=True, **columns):
        return {"score": float(strict), "extra": float(columns["extra"]), "leaked": float("strict" in columns)}

    with pytest.warns(RowFieldIgnoredWarning):
        (out,) = everything()([make_rollout("c", {"extra": 2, "strict": False})])
    assert (out.score, out.components) == (1.0, {"extra": 2.0, "leaked": 0.0})


def test_declaring_a_field_that_is_not_a_parameter_is_an_error():
    with pytest.raises(ValueError, match=r"reward f: fields \['nope'\] are not parameters"):
        @reward(register=False, fields=("nope",))
        def f(completion):
            return 0.0
    with pytest.raises(ValueError, match=r"fields \['answer'\]"):  # a rollout field is always filled
        @reward(register=False, fields=("answer",))
        def g(completion, answer=None):
            return 0.0
    assert set(ROLLOUT_FIELDS) >= {"answer", "completion", "prompt", "row"}
