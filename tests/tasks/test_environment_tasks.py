"""The `env:NAME` task kind: a built-in environment's rows as a task (options checked naming task.options), rows
that share a prompt kept apart, and the outcome reward as a spec that build_reward reads."""

import pytest

from conftest import make_rollout
from rewardlab.rewards import build_reward
from rewardlab.tasks import dedup_and_split, load, row_key, spec_examples
from rewardlab.tasks.jsonl import _unique


def test_guess_number_task_names_its_environment_and_keeps_rows_that_share_a_prompt():
    task = load("env:guess_number", n=8, size=6, test_size=4, seed=2)
    assert task.name == "env:guess_number"
    assert task.env == {"name": "guess_number", "options": {"n": 8, "size": 6, "test_size": 4}}  # seed excluded
    assert task.reward == "guess_found"
    rows = task.split("all")
    assert len(rows) == 10 and len({r["prompt"] for r in rows}) == 1  # one prompt ...
    assert len({row_key(r) for r in rows}) == 10  # ... ten questions
    assert [r["row_id"] for r in task.test] == [f"env:guess_number/test/{i}" for i in range(4)]
    # de-duplication by row_key keeps every row; by prompt it would keep one
    train, test = dedup_and_split(rows, key=row_key, test_size=2, seed=0)
    assert len(train) + len(test) == 10
    # the secrets are the environment's own (same seed, same rows)
    from rewardlab.envs import make_env

    env_rows = make_env("guess_number", n=8, size=6, test_size=4).rows("test", seed=2)
    assert [r["answer"] for r in task.test] == [r["answer"] for r in env_rows]


def test_row_id_of_another_form_changes_nothing_for_file_rows():
    # a file's own row_id column is not an environment id: rows stay keyed (and de-duplicated) by prompt
    rows = [{"prompt": "1+1=", "answer": "2", "row_id": 7}, {"prompt": "1+1=", "answer": "2", "row_id": "b"}]
    assert row_key(rows[0]) == row_key(rows[1]) == "1+1="
    unique, _ = _unique([(1, rows[0]), (2, rows[1])], "f.jsonl")
    assert unique == [rows[0]]


def test_calculator_and_python_tasks():
    calc = load("env:calculator", size=40, test_size=5)
    assert calc.env == {"name": "calculator", "options": {"size": 40, "test_size": 5}}
    assert calc.reward == "reasoning_gym" and len(calc.test) == 5
    assert calc.train[0]["prompt"].endswith("=") and " " not in calc.train[0]["prompt"]  # the compact prompt
    py = load("env:python", test_size=0.1)
    assert py.env == {"name": "python", "options": {"test_size": 0.1}}
    assert py.reward == {"name": "code", "fenced": True}
    assert len(py.train) + len(py.test) == 164
    assert py.where(py.test[0]) == f"humaneval {py.test[0]['task_id']}"  # origins follow the re-keyed rows


def test_python_task_reward_spec_scores_the_fenced_final_answer():
    task = load("env:python")
    row = task.test[0]
    good = f"Done:\n```python\n{row['prompt']}{row['answer']}```"
    wrong = "Done:\n```python\ndef nothing(): pass\n```"
    scores = [o.score for o in build_reward(task.reward)([make_rollout(good, row), make_rollout(wrong, row)])]
    assert scores == [1.0, 0.0]
    # the option matters: without fenced the prose around the block is run as code and fails
    assert build_reward("code")([make_rollout(good, row)])[0].score == 0.0


@pytest.mark.parametrize("spec,options,message", [
    ("env:guess_number", {"secret": 3},
     "task.options: unknown option 'secret' for environment 'guess_number'; valid: n, seed, size, test_size"),
    ("env:guess_number", {"n": "many"}, "task.options.n: expected an integer, got 'many'"),
    ("env:guess_number", {"n": 1}, "task.options: env guess_number.n: expected an integer >= 2, got 1"),
    ("env:guess_number", {"seed": "x"}, "task.options.seed: expected an integer, got 'x'"),
    ("env:calculator", {"timeout_s": 2}, "task.options.timeout_s: set env.tool_timeout_s instead"),
    ("env:python", {"max_calls_per_turn": 2},
     "task.options.max_calls_per_turn: set env.max_tool_calls_per_turn instead"),
    ("env:chess", {}, "task spec 'env:chess': unknown environment 'chess'; valid: calculator, guess_number, python"),
])
def test_bad_options_are_one_line_errors_naming_task_options(spec, options, message):
    with pytest.raises(ValueError) as err:
        load(spec, **options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_kind_is_listed_among_the_spec_examples():
    assert "env:NAME" in spec_examples()
    with pytest.raises(ValueError, match="env:NAME"):
        load("env:")
