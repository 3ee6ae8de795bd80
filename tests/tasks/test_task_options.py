"""Task loaders: one registry with a duplicate check, and every task option checked by name before loading."""

import pytest

from conftest import write_jsonl
from rewardlab.tasks import LOADERS, load, register_loader


def test_registering_a_taken_loader_kind_raises_and_keeps_the_first():
    first = LOADERS["jsonl"]
    with pytest.raises(ValueError, match="task kind 'jsonl' is already registered"):
        register_loader("jsonl")(lambda path, /: None)
    assert LOADERS["jsonl"] is first  # before, the second registration silently replaced the loader


def test_a_temporary_loader_declares_its_options():
    @register_loader("test_const", argument_optional=True)
    def const(arg, /, *, n: int = 1):
        return [arg] * n

    try:
        assert load("test_const", n=2) == ["", ""] and load("test_const:x") == ["x"]
        with pytest.raises(ValueError) as err:
            load("test_const:x", m=2)
        assert str(err.value) == "task.options: unknown option 'm' for task kind 'test_const'; valid: n"
    finally:
        LOADERS.unregister("test_const")


def test_unknown_jsonl_option_is_a_one_line_error_naming_it(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}])
    # before: a TypeError traceback ("unexpected keyword argument"), which the CLI does not turn into one line
    with pytest.raises(ValueError) as err:
        load(f"jsonl:{path}", tst_size=1)
    assert str(err.value) == ("task.options: unknown option 'tst_size' for task kind 'jsonl'; valid: reward, seed, "
                              "test_path, test_size")
    assert len(load(f"jsonl:{path}", test_size=1).test) == 1


def test_reasoning_gym_options_are_checked_against_the_dataset_config_fields():
    with pytest.raises(ValueError) as err:
        load("reasoning_gym:chain_sum", size=10, min_term=2)
    assert str(err.value) == (
        "task reasoning_gym:chain_sum: unknown option 'min_term' for reasoning-gym dataset 'chain_sum'; valid: "
        "allow_negation, max_digits, max_terms, min_digits, min_terms, seed, size, target, template, test_size")
    with pytest.raises(ValueError, match="^task worked:chain_sum: unknown option 'foo' for reasoning-gym dataset"):
        load("worked:chain_sum", size=10, foo=1)
    task = load("reasoning_gym:chain_sum", size=12, test_size=2, min_terms=2, max_terms=2, max_digits=1)
    assert all(row["prompt"].count("+") + row["prompt"].count("-") == 1 for row in task.train)
