"""The built-in environments: the ast calculator's safety, calculator rows and tool calls, guess_number's dynamics
and per-turn rewards by hand, the outcome rewards, the python tool in the sandbox, ENVIRONMENTS' options."""

import string

import pytest
from conftest import make_rollout

from rewardlab.envs import ENVIRONMENTS, calc, evaluate_arithmetic, make_env
from rewardlab.rewards import REWARDS

PRINTABLE = set(string.printable) - set("\r\x0b\x0c")


# ------------------------------------------------------------------------------------------------ calc
@pytest.mark.parametrize("expression,value", [
    ("1663-5242-9376", "-12955"), ("1234*5678", "7006652"), ("(2+3)*4", "20"), ("7/2", "3.5"), ("6/3", "2"),
    ("7//2", "3"), ("-7%3", "2"), ("2**10", "1024"), ("2**-2", "0.25"), ("-(3)", "-3"), (" 1 + 1 ", "2"),
    ("10**15", "1000000000000000"),
])
def test_calc_values(expression, value):
    assert calc(expression) == value


@pytest.mark.parametrize("expression,match", [
    ("9**9**9", "exponent too large: 387420489 \\(limit 64\\)"),
    ("2**100", "exponent too large: 100"),
    ("99999**20", "number too large"),
    ("10**16", "number too large"),
    ("1" * 20, "number too large"),
    ("1e300", "number too large"),
    ("99999999*99999999", "number too large"),
    ("x+1", "names are not allowed"),
    ("(1).real", "attributes are not allowed"),
    ("__import__('os').system('true')", "calls are not allowed"),
    ("abs(-1)", "calls are not allowed"),
    ("'a'*3", "only numbers are allowed"),
    ("True+1", "only numbers are allowed"),
    ("1<2", "comparisons are not allowed"),
    ("[1][0]", "subscripts are not allowed"),
    ("[1]+1", "List nodes are not allowed"),
    ("(-8)**0.5", "fractional power"),
    ("1+", "not an arithmetic expression"),
    ("1+" * 150 + "1", "expression too long"),
])
def test_calc_refuses_what_is_not_bounded_arithmetic(expression, match):
    with pytest.raises(ValueError, match=match):
        evaluate_arithmetic(expression)


def test_calc_division_by_zero_raises():
    with pytest.raises(ZeroDivisionError):
        calc("1/0")
    with pytest.raises(ZeroDivisionError):
        calc("5%0")


# ------------------------------------------------------------------------------------------------ calculator env
@pytest.fixture(scope="module")
def calculator():
    with make_env("calculator", size=300, test_size=30, workers=1) as env:
        yield env


def test_calculator_rows_are_deterministic_ascii_and_their_answers_are_what_calc_computes(calculator):
    rows = calculator.rows("train", n=20, seed=0)
    assert len(rows) == 20
    assert rows == make_env("calculator", size=300, test_size=30).rows("train", n=20, seed=0)
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in calculator.rows("train", n=20, seed=1)]
    for row in rows:
        prompt = row["prompt"]
        assert set(prompt) <= PRINTABLE and prompt.endswith("=") and " " not in prompt
        terms = prompt[:-1].replace("-", "+").split("+")
        assert 2 <= len(terms) <= 3 and all(3 <= len(t) <= 4 for t in terms)
        assert calc(prompt[:-1]) == row["answer"]
    train = {r["prompt"] for r in calculator.rows("train")}
    test = {r["prompt"] for r in calculator.rows("test")}
    assert len(test) == 30 and not train & test
    assert calculator.task(0).reward == calculator.reward == "reasoning_gym"


def test_calculator_tool_call_and_its_refusals(calculator):
    row = calculator.rows("train", n=1)[0]
    state = calculator.reset(row)
    ok = calculator.step(state, f"<c>{row['prompt'][:-1]}</c>")
    assert calculator.raw_text(ok.observation[0]) == f"<o>{row['answer']}</o>"
    refused = calculator.step(state, "<c>9**9**9</c>")
    assert refused.info["tool_calls"][0]["status"] == "error"
    assert refused.observation[0]["content"] == "error: ValueError: exponent too large: 387420489 (limit 64)"
    zero = calculator.step(state, "<c>1/0</c>")
    assert zero.info["tool_calls"][0]["status"] == "error"
    assert zero.observation[0]["content"] == "error: ZeroDivisionError: division by zero"
    assert calculator.step(state, row["answer"]).info["termination"] == "stop"


def test_calculator_outcome_reward_scores_the_final_answer(calculator):
    row = calculator.rows("train", n=1)[0]
    score = REWARDS[calculator.reward](**calculator.reward_options)
    right, wrong = score([make_rollout(row["answer"], row), make_rollout(str(int(row["answer"]) + 1), row)])
    assert (right.score, wrong.score) == (1.0, 0.0)


def test_calculator_products_and_hermes_prompts():
    env = make_env("calculator", dataset="products", min_terms=2, max_terms=2, size=50, test_size=5,
                   parser="hermes")
    row = env.rows("train", n=1)[0]
    assert "*" in row["metadata"]["expression"]
    assert row["prompt"].endswith("Use the calc tool, then give the final answer as <answer>N</answer>.")
    assert env.stop == ("</tool_call>",)


# ------------------------------------------------------------------------------------------------ guess_number
def test_guess_number_dynamics_and_per_turn_rewards_by_hand():
    env = make_env("guess_number", n=64)
    state = env.reset({"prompt": env.prompt(), "answer": "10", "n": 64})
    assert env.state_key(state) == (1, 64)
    step = env.step(state, "<g>32</g>")  # secret 10: lower; [1, 64] -> [1, 31]
    assert (step.observation, step.done, step.reward) == ("<o>lower</o>", False, (64 - 31) / 64)
    assert env.state_key(state) == (1, 31)
    step = env.step(state, "<g>5</g>")  # higher; [1, 31] -> [6, 31]
    assert (step.observation, step.reward) == ("<o>higher</o>", (31 - 26) / 31)
    step = env.step(state, "<g>50</g>")  # outside [6, 31]: still answered truthfully, no reward, no change
    assert (step.observation, step.reward, env.state_key(state)) == ("<o>lower</o>", 0.0, (6, 31))
    step = env.step(state, "ten")  # no guess: a turn with a clear observation
    assert (step.observation, step.done, step.reward) == ("<o>invalid: write <g>K</g> with K from 1 to 64</o>",
                                                          False, 0.0)
    step = env.step(state, "<g> 10 </g>")  # correct: [6, 31] -> [10, 10], done
    assert (step.observation, step.done, step.reward) == (None, True, (26 - 1) / 26)
    assert state["turn"] == 5 and state["found"]


def test_binary_search_finds_every_secret_within_ceil_log2_n_turns():
    env = make_env("guess_number", n=64)
    for secret in range(1, 65):
        state = env.reset({"prompt": "p", "answer": str(secret), "n": 64})
        turns = 0
        while True:
            turns += 1
            step = env.step(state, f"<g>{(state['lo'] + state['hi']) // 2}</g>")
            if step.done:
                break
        assert turns <= 7 and state["found"]  # ceil(log2(64)) + 1 guesses, the last one correct


def test_guess_found_reward_reads_the_final_turn():
    score = REWARDS["guess_found"]()
    row = {"answer": "10"}
    outs = score([make_rollout("<g>10</g>", row), make_rollout("<g>11</g>", row), make_rollout("10", row)])
    assert [o.score for o in outs] == [1.0, 0.0, 0.0]
    assert outs[0].components["correct"] == 1.0


def test_guess_number_rows_are_deterministic_per_seed_and_ascii():
    env = make_env("guess_number", n=64, size=50, test_size=20)
    rows = env.rows("train", seed=3)
    assert len(rows) == 50 and len(env.rows("test", seed=3)) == 20
    assert rows == make_env("guess_number", size=50).rows("train", seed=3)
    assert [r["answer"] for r in rows] != [r["answer"] for r in env.rows("train", seed=4)]
    assert all(1 <= int(r["answer"]) <= 64 and set(r["prompt"]) <= PRINTABLE for r in rows)
    assert len({r["answer"] for r in rows}) > 20  # drawn, not constant
    assert env.rows("train", n=5, seed=3) == rows[:5]
    with pytest.raises(ValueError, match="row answer must be an integer from 1 to 64"):
        env.reset({"prompt": "p", "answer": "65"})


# ------------------------------------------------------------------------------------------------ python
def test_python_env_runs_code_in_the_sandbox_and_code_scores_the_fenced_answer():
    with make_env("python", workers=1) as env:
        row = env.rows("test", n=1)[0]
        assert [m["role"] for m in row["messages"]] == ["system", "user"]
        assert row["prompt"] in row["messages"][1]["content"]
        state = env.reset(row)
        assert state["messages"] == row["messages"]
        step = env.step(state, '<tool_call>{"name": "run_python", "arguments": {"code": "print(6*7)\\nassert 0"}}'
                               '</tool_call>')
        content = step.observation[0]["content"]
        assert step.info["tool_calls"][0]["status"] == "ok"
        assert content.startswith("42\n") and "AssertionError" in content and content.endswith("]")
        answer = f"Here it is:\n```python\n{row['prompt']}{row['answer']}```"
        score = REWARDS[env.reward](**env.reward_options)
        good, bad = score([make_rollout(answer, row), make_rollout("```python\ndef nothing(): pass\n```", row)])
        assert (good.score, bad.score) == (1.0, 0.0)


# ------------------------------------------------------------------------------------------------ registry
def test_environments_registry_checks_options():
    assert set(ENVIRONMENTS) >= {"calculator", "guess_number", "python"}
    assert ENVIRONMENTS.options("guess_number") == ("n", "size", "test_size")
    with pytest.raises(ValueError, match="env guess_number: unknown option 'secret' for environment 'guess_number'; "
                                         "valid: n, size, test_size"):
        make_env("guess_number", secret=3)
    with pytest.raises(ValueError, match="unknown environment 'chess'; valid: calculator, guess_number, python"):
        make_env("chess")
    with pytest.raises(ValueError, match="env guess_number.n: expected an integer, got 'many'"):
        make_env("guess_number", n="many")
    with pytest.raises(ValueError, match="env guess_number.n: expected an integer >= 2"):
        make_env("guess_number", n=1)
    with pytest.raises(ValueError, match="env calculator.dataset: expected one of chain_sum, products"):
        make_env("calculator", dataset="leg_counting")
    with pytest.raises(ValueError, match="env calculator: .*bad dataset option"):
        make_env("calculator", min_terms=5, max_terms=2)
