"""The worked:chain_sum task (a preset of reasoning_gym:chain_sum with target steps), the exact first error of a
worked solution (`rewards.steps.first_error` on `check_steps` scores), and the worked_answer verifier."""

import random
import re

import pytest

from rewardlab.rewards import build_reward
from rewardlab.rewards.steps import first_error
from rewardlab.rm.data import make_rollout
from rewardlab.rm.labels import reference_first_error
from rewardlab.tasks import load
from rewardlab.tasks.steps import worked_steps
from rm_scripted import chain_row

OPTS = dict(size=60, test_size=5, seed=0, min_terms=3, max_terms=3, min_digits=1, max_digits=1)


# ---------------------------------------------------------------- first_error(step_scores, correct)
def test_first_error_from_step_scores_and_outcome():
    assert first_error([1.0, 1.0, 1.0], True) == -1
    assert first_error([1.0, 0.0, 0.0], False) == 1  # the first 0
    assert first_error([1.0, 0.0, 1.0], False) == 1  # non-cumulative scores: the first 0 is the same
    assert first_error([0.0], True) == 0  # a 0 wins over a right outcome
    assert first_error([1.0, 1.0], False) == 1  # every step right, outcome wrong (stops early): the last step
    with pytest.raises(ValueError, match="no steps"):
        first_error([], False)


# ---------------------------------------------------------------- the exact first error of a worked solution
def test_reference_first_error_hand_computed():
    """The cases of the former `tasks.worked.first_error` test, same expected values (computed by hand)."""
    row = chain_row("3+4-2+5")  # reference 3+4=7, 7-2=5, 5+5=10
    assert reference_first_error(row, ["3+4=7", "7-2=5", "5+5=10"]) == -1
    assert reference_first_error(row, ["3+4=7", "7 - 2 = 5", "5+5=10"]) == -1  # whitespace does not matter
    assert reference_first_error(row, ["3+4=8", "8-2=6", "6+5=11"]) == 0  # wrong result
    assert reference_first_error(row, ["3+4=7", "7+2=9", "9+5=14"]) == 1  # wrong operator
    assert reference_first_error(row, ["3+4=7", "8-2=6", "6+5=11"]) == 1  # left operand is not the previous result
    assert reference_first_error(row, ["3+4=7", "7-2=5"]) == 1  # stops early: its last step states a wrong answer
    assert reference_first_error(row, ["3+4=7", "7-2=5", "5+5=10", "10+1=11"]) == 3  # an extra step
    assert reference_first_error(row, ["3+4=7", "7-3=4", "4+5=9"]) == 1  # wrong operand
    assert reference_first_error(row, ["seven", "7-2=5", "5+5=10"]) == 0  # not a step
    # stops early on a partial sum that equals the answer: still wrong at its last step (3+4-0: "3+4=7" is 7)
    assert reference_first_error(chain_row("3+4-0"), ["3+4=7"]) == 0
    assert reference_first_error(chain_row("3+4-0"), ["3+4=7", "7-0=7"]) == -1
    with pytest.raises(ValueError, match="no steps"):
        reference_first_error(row, [])


def _old_first_error(reference_steps, steps):
    """The removed `tasks.worked.first_error` (string comparison with the reference steps), as the test's oracle."""
    norm = [re.sub(r"\s+", "", s) for s in reference_steps]
    for i, step in enumerate(steps):
        if i >= len(norm) or re.sub(r"\s+", "", step) != norm[i]:
            return i
    return len(steps) - 1 if len(steps) < len(norm) else -1


def _mutations(steps, rng):
    """Solutions derived from the worked steps: (kind, steps)."""
    i = rng.randrange(len(steps))
    a, op, b, c = re.fullmatch(r"(-?\d+)([+-])(\d+)=(-?\d+)", steps[i]).groups()
    delta = 1 if op == "+" else -1
    last = steps[-1].split("=")[1]

    def carried(k, first_value):  # steps k.. redone from a wrong value, with the right terms
        out, value = list(steps[:k]), first_value
        out.append(re.sub(r"=-?\d+$", f"={value}", steps[k]))
        for s in steps[k + 1:]:
            _, o, t, _ = re.fullmatch(r"(-?\d+)([+-])(\d+)=(-?\d+)", s).groups()
            new = value + int(t) if o == "+" else value - int(t)
            out.append(f"{value}{o}{t}={new}")
            value = new
        return out

    return [
        ("correct", list(steps)),
        ("spaces", [s.replace("=", " = ") for s in steps]),
        ("wrong result", steps[:i] + [f"{a}{op}{b}={int(c) + 1}"] + steps[i + 1:]),
        ("wrong result, carried", carried(i, int(c) + 1)),
        ("wrong operand", steps[:i] + [f"{a}{op}{int(b) + 1}={int(c) + delta}"] + steps[i + 1:]),
        ("wrong operator", steps[:i] + [f"{a}{'-' if op == '+' else '+'}{b}={int(a) - delta * int(b)}"]
         + steps[i + 1:]),
        ("broken continuity", steps[:i] + [f"{int(a) + 1}{op}{b}={int(c) + 1}"] + steps[i + 1:]),
        ("stops early", steps[: rng.randrange(1, len(steps))] if len(steps) > 1 else list(steps)),
        ("goes past the end", steps + [f"{last}+1={int(last) + 1}"]),
        ("skips a step", steps[:i] + steps[i + 1:] or ["x"]),
        ("truncated", steps[:i] + [steps[i][: rng.randrange(len(steps[i]))]]),
    ]


def test_reference_first_error_equals_the_old_rule_on_generated_solutions():
    """For many chains (2 to 6 terms, 1 or 2 digits) and solutions derived from their worked steps, the step checker
    gives the first error the old string comparison with `reference_steps` gave."""
    rng = random.Random(0)
    task = load("worked:chain_sum", size=300, test_size=5, seed=0, min_terms=2, max_terms=6, min_digits=1,
                max_digits=2)
    seen = set()
    for row in task.train:
        for kind, steps in _mutations(row["reference_steps"], rng):
            assert reference_first_error(row, steps) == _old_first_error(row["reference_steps"], steps), (kind, row,
                                                                                                          steps)
            seen.add(kind)
    assert len(seen) == 11


def test_reference_first_error_known_departures_from_the_old_rule():
    """Where the checker and the old string comparison differ, by design: numbers are compared as integers, and a
    one-term chain is worked as the term itself (`worked_steps("8") == "8"`, formerly "8=8")."""
    row = chain_row("3+4-2")
    assert reference_first_error(row, ["3+4=07", "7-2=5"]) == -1  # old: 0 ("07" is not the text "7")
    assert _old_first_error(row["reference_steps"], ["3+4=07", "7-2=5"]) == 0
    one = chain_row("8")
    assert one["reference_steps"] == ["8"] and one["answer"] == "8"
    assert reference_first_error(one, ["8"]) == -1 and reference_first_error(one, ["8=8"]) == 0


# ---------------------------------------------------------------- the task
def test_worked_rows_are_the_reasoning_gym_steps_rows():
    """Same rows, order, prompts and split as reasoning_gym:chain_sum with template compact and target steps; the
    worked solution moves to `answer`, the number to `final`."""
    task = load("worked:chain_sum", **OPTS)
    base = load("reasoning_gym:chain_sum", template="compact", target="steps", **OPTS)
    assert task.reward == "worked_answer" and task.name == "worked:chain_sum"
    for split in ("train", "test"):
        rows, base_rows = task.split(split), base.split(split)
        assert len(rows) == len(base_rows) > 0
        for row, b in zip(rows, base_rows):
            assert list(row) == ["prompt", "answer", "question", "metadata", "dataset", "dataset_config", "final",
                                 "reference_steps"]
            assert {k: v for k, v in row.items() if k not in ("answer", "final", "reference_steps")} == {
                k: v for k, v in b.items() if k not in ("answer", "target")}
            assert row["answer"] == b["target"] == worked_steps(b["metadata"]["expression"])
            assert row["final"] == b["answer"] and row["reference_steps"] == b["target"].split("\n")
    row = task.train[0]
    assert row["prompt"] == row["metadata"]["expression"].replace(" ", "") + "="
    assert row["final"] == row["answer"].rsplit("=", 1)[1]


def test_worked_options_and_errors():
    with pytest.raises(ValueError, match="^task worked:chain_sum: option 'template' is fixed to 'compact'$"):
        load("worked:chain_sum", template="question")
    with pytest.raises(ValueError, match="^task worked:chain_sum: option 'target' is fixed to 'steps'$"):
        load("worked:chain_sum", target="answer")
    with pytest.raises(ValueError, match=r"^task worked:leg_counting: target 'steps' needs an integer \+/- chain "
                                         r"in metadata\['expression'\]") as info:
        load("worked:leg_counting", size=5, test_size=1)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- the verifier
def test_worked_answer_reward():
    reward = build_reward("worked_answer")
    row = {"prompt": "3+4-2=", "final": "5", "answer": "3+4=7\n7-2=5"}
    outs = reward([make_rollout("3+4-2=", t, row) for t in ("3+4=7\n7-2=5", "3+4=7\n7-2=6", "5", "3+4=7\n7-2=x")])
    assert [o.score for o in outs] == [1.0, 0.0, 1.0, 0.0]
    assert all(o.error is None for o in outs) and outs[0].components["correct"] == 1.0
    assert outs[0].step_scores is None  # an outcome check: no step scores
    # the final answer is `final_answer`'s: the last non-blank line (formerly the text after the last "=")
    (last_line,) = reward([make_rollout("3+4-2=", "3+4=7\n7-2=5\n5", row)])
    assert last_line.score == 1.0


def test_worked_answer_reads_answer_without_final():
    reward = build_reward("worked_answer")
    row = {"prompt": "3+4-2=", "answer": "5", "metadata": {"expression": "3 + 4 - 2"}}  # reasoning_gym steps row
    right, wrong = reward([make_rollout("3+4-2=", t, row) for t in ("3+4=7\n7-2=5", "3+4=7\n7-2=4")])
    assert (right.score, wrong.score) == (1.0, 0.0)
    (missing,) = reward([make_rollout("q", "5", {"prompt": "q"})])
    assert missing.error is not None and "neither 'final' nor 'answer'" in missing.error
