"""`math`: final-answer correctness checked with math-verify, in a process pool with a hard per-item timeout."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

from rewardlab.rewards.base import register_reward
from rewardlab.rewards.executor import TIMEOUT, TaskError, shared_executor
from rewardlab.rewards.extract import answer_candidates, check_methods, last_boxed
from rewardlab.rewards.text import NumberOutOfRange, parse_number
from rewardlab.types import Rollout, RewardOutput

#: The default extraction order: an explicit answer tag (it may hold a \boxed{}), then the last \boxed{}, then the
#: last number in the text.
DEFAULT_EXTRACT = ("answer_tag", "boxed", "last_number")


_EXPONENT = re.compile(r"\s*([-+]?)\s*(\d+(?:\.\d+)?|[A-Za-z_]\w*|\()")


def python_powers(text: str) -> str:
    """Python/sympy powers as LaTeX: "x**12" -> "x^{12}", "(2*x)**(3/2)" -> "(2*x)^{(3/2)}".

    math-verify reads neither "**" (LaTeX parsing) nor multi-digit exponents without braces correctly: it parses
    "-903*y**5 - 588*y**3" as the number 588, so a wrong polynomial with the same last coefficient would match.
    A "**" not followed by a number, a name or a closed parenthesis group is left as is.
    """
    out, pos = [], 0
    while (star := text.find("**", pos)) >= 0:
        m = _EXPONENT.match(text, star + 2)
        end = None
        if m is not None and m.group(2) == "(":
            depth = 0
            for j in range(m.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                if depth == 0:
                    end = j + 1
                    break
        elif m is not None:
            end = m.end()
        if end is None:
            out.append(text[pos : star + 2])
            pos = star + 2
            continue
        exponent = m.group(1) + text[m.start(2) : end]
        out.append(f"{text[pos:star]}^{{{exponent}}}")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _as_latex(answer: str) -> str:
    """An extracted answer as math-verify input: a `\\boxed{}` around it, so math-verify reads the whole text as the
    answer instead of searching it; surrounding `$` and a final period are dropped, Python powers become LaTeX."""
    answer = answer.strip()
    if answer.endswith(".") and not answer.endswith("\\."):
        answer = answer[:-1]
    answer = answer.strip().strip("$").strip()
    return f"\\boxed{{{python_powers(answer)}}}"


_WORKER_READY = False


def verify_answer(item: tuple[str, str, dict[str, Any]]) -> bool:
    """Worker side: parse the reference and the prediction with math-verify and compare them.

    `item` = (reference, extracted prediction, verify options); each text is wrapped by `_as_latex`. math-verify's own
    `signal.alarm` timeouts are off (`parsing_timeout=None`, `timeout_seconds=None`): they turn a timeout into a
    silent False, and the executor's hard per-item timeout replaces them.

    Raises:
        ValueError: the reference cannot be parsed.
    """
    global _WORKER_READY
    from math_verify import parse, verify

    if not _WORKER_READY:  # math-verify warns once per process that its timeouts are off; they are on purpose
        import logging

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        _WORKER_READY = True
    reference, prediction, options = item
    gold = parse(_as_latex(reference), parsing_timeout=None)
    if not gold:
        raise ValueError(f"reference answer {reference!r} could not be parsed")
    pred = parse(_as_latex(prediction), parsing_timeout=None)
    return bool(pred) and bool(verify(gold, pred, timeout_seconds=None, **options))


def check_reference(item: tuple[str, dict[str, Any]]) -> bool:
    """Worker side: parse a reference alone and compare it with the answer "0" (to tell whose fault a timed-out
    comparison was: a reference that sympy cannot evaluate in time, such as 10^{10^{10}}, times out here too).

    `item` = (reference, verify options).

    Raises:
        ValueError: the reference cannot be parsed.
    """
    from math_verify import parse, verify

    reference, options = item
    gold = parse(_as_latex(reference), parsing_timeout=None)
    if not gold:
        raise ValueError(f"reference answer {reference!r} could not be parsed")
    verify(gold, parse(_as_latex("0"), parsing_timeout=None), timeout_seconds=None, **options)
    return True


#: References that are no value math-verify reads as meant (it reads "nan" as the product n*a*n, "inf" as i*n*f).
_NOT_A_VALUE = re.compile(r"[-+]?\s*(nan|inf|infinity)", re.IGNORECASE)


def _same_numeral(found: str, reference: str) -> bool:
    """True when both texts are plain numerals (`text.parse_number`: "1e20", "2,000", "3/4") of exactly the same
    value. math-verify reads "1e20" as 1*e*20 (Euler's e) and rounds huge values apart ("2e400" != "20e399"); equal
    exact values are equal answers under any of its rules. Bounded (a few ms); False when either is no numeral or
    holds a comma (parse_number drops commas, which would read the pair "1,2" as 12)."""
    if "," in found or "," in reference:
        return False
    try:
        a, b = parse_number(found), parse_number(reference)
    except NumberOutOfRange:
        return False
    return a is not None and a == b


class MathTimeoutWarning(RuntimeWarning):
    """A completion's answer took longer than the `math` reward's timeout to check and scored 0 (`timed_out`)."""


class MathReward:
    """Final-answer correctness by math-verify (Hugging Face, 2025): symbolic and numeric equivalence.

    The answer is extracted from the completion by the methods in `extract`, in order (the first that finds one
    decides): "answer_tag" (the last `<answer>...</answer>`; a `\\boxed{}` inside it gives the box's content),
    "boxed" (the last `\\boxed{...}`, nested braces included; a box quoted from the prompt - its text with the two
    words before it also in the prompt, `extract.is_quoted` - is the question's, not an answer) and "last_number"
    (the last number in the text, e.g. "1,000", "-2.5", "3/4"). Several distinct answers in the deciding form -
    `\\boxed{1} ... \\boxed{2}`, two different answer tags, a last line that hedges between numbers ("1 or 2 or 3",
    "4, 5 or 6") - score 0 with the component `ambiguous` 1.0 (a policy must not win by listing candidates), unless
    multiple_answers="last" (the last one, as extraction did before). The extracted text and the row's `answer` (a
    string or number; a `\\boxed{}` in it is unwrapped) are each parsed with `math_verify.parse` and compared with
    `math_verify.verify(gold, prediction)`: equal strings, equal numbers after rounding to `float_rounding` decimals
    (so 1/2 = 0.5 = \\frac{1}{2}, 1,000 = 1000.0), symbolically equal expressions (x^2+2x+1 = (x+1)^2), equal sets
    and intervals, equations and matrices.

    The math-verify calls of a whole batch go to the process pool in one submission (`Executor.map`); each item has
    a hard wall timeout of `timeout` seconds, after which its worker is killed and replaced.

    Before math-verify, an answer and a reference that are both plain numerals ("1e20", "100000000000000000000",
    "3/4"; no commas; read exactly within 4,300 digits and 10**±4300 by `text.parse_number`) and of the same value
    score 1.0: math-verify reads "1e20" as 1*e*20 (Euler's number) and compares huge values after rounding ("2e400"
    vs "20e399" would be 0). Other pairs, different numerals included, go to math-verify.

    Score: 1.0 when the answer is equivalent to the reference, else 0.0 (also 0.0 when no answer was found).
    Components: `correct` (= score), `extracted` (1.0 when an extraction method found an answer), `ambiguous` (1.0
    when it found several distinct ones, see above), `timed_out` (1.0
    when checking the completion's answer ran past `timeout`, e.g. `\\boxed{9^{9^{9}}}`, which sympy evaluates
    eagerly: the worker is killed and the answer scores 0 - not an error, so a policy's output cannot stop its own
    run through `rl.max_reward_error_frac`; the reference alone is parsed again and compared with "0" within
    `timeout` to be sure the fault was the answer's; a `MathTimeoutWarning` is issued once per process, and the
    component's mean is logged each step as `reward/timed_out/mean` (`reward/math/timed_out/mean` when composed)).

    Errors (RewardOutput.error, score 0): "math: row has no 'answer'" (or an empty one), "math: reference answer
    'nan' is not a value (write \\infty for infinity)" (also "inf", "infinity"), "math: ValueError: reference answer
    '...' could not be parsed", "math: reference answer '...' timed out after T s" (the reference alone could not be
    parsed and compared with "0" within `timeout`), "math: worker process died (killed by SIGKILL)" (or "(exit code
    N)"; only the item the worker was checking).

    Args:
        extract: extraction methods in order; default ("answer_tag", "boxed", "last_number").
        timeout: per-item wall-clock limit, seconds (default 5).
        workers: pool size; default: the run's `threads` setting (else the CPUs this process may use). Rewards with
            the same `workers` share a pool.
        chunk_size: items per pool task (default 1).
        float_rounding, numeric_precision, strict: passed to `math_verify.verify` (defaults 6, 15, True: decimals
            compared after rounding, digits of numeric evaluation, variables and set/tuple distinctions matter).
        multiple_answers: "zero" (default: several distinct answers score 0) or "last" (the last one is checked).

    Raises:
        ValueError: an unknown extraction method, timeout <= 0, workers or chunk_size < 1, an unknown
            multiple_answers.
    """

    name = "math"
    #: The row fields it cannot score without (read by the TRL and verl adapters' column check).
    row_fields = ("answer",)

    def __init__(
        self,
        extract: Sequence[str] | str = DEFAULT_EXTRACT,
        timeout: float = 5.0,
        workers: int | None = None,
        chunk_size: int = 1,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        multiple_answers: str = "zero",
    ) -> None:
        self.extract = check_methods(extract)
        if multiple_answers not in ("zero", "last"):
            raise ValueError(f"multiple_answers: expected 'zero' or 'last', got {multiple_answers!r}")
        self.multiple_answers = multiple_answers
        if not timeout > 0:
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers: expected >= 1, got {workers}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size: expected >= 1, got {chunk_size}")
        self.timeout, self.workers, self.chunk_size = float(timeout), workers, int(chunk_size)
        self.verify_options = {"float_rounding": float_rounding, "numeric_precision": numeric_precision,
                               "strict": strict}
        # One check here, in this process: a missing math-verify fails at build time, and workers forked from this
        # process start with math-verify imported and its LaTeX parser built (~0.5 s), so a worker that replaces a
        # killed one is ready at once.
        verify_answer(("1/2", "0.5", self.verify_options))

    def final_answer(self, completion: str, prompt: str = "") -> tuple[str | None, bool]:
        """(the completion's answer or None, whether it is ambiguous): the first extraction method that finds an
        answer decides (`extract.answer_candidates`; a box also in `prompt` is the question's, not an answer); with
        several distinct candidates in that form (two different boxes, two different answer tags, a last line
        hedging between numbers) the answer is ambiguous unless multiple_answers is "last"."""
        for method in self.extract:
            found = answer_candidates(completion, method, prompt)
            if found:
                distinct = {"".join(c.split()) for c in found}
                return found[-1], len(distinct) > 1 and self.multiple_answers == "zero"
        return None, False

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        outputs: list[RewardOutput | None] = [None] * len(rollouts)
        todo: list[int] = []
        items: list[tuple[str, str, dict[str, Any]]] = []
        for i, r in enumerate(rollouts):
            reference = r.row.get("answer")
            if reference is None or not str(reference).strip():
                why = "has no 'answer'" if reference is None else "has an empty 'answer'"
                outputs[i] = _output(0.0, 0.0, error=f"math: row {why}")
                continue
            reference = str(reference)
            reference = last_boxed(reference) or reference
            if _NOT_A_VALUE.fullmatch(reference.strip().strip("$").strip()):
                outputs[i] = _output(0.0, 0.0, error=f"math: reference answer {reference!r} is not a value (write "
                                                      "\\infty for infinity)")
                continue
            found, ambiguous = self.final_answer(r.completion, r.prompt + "\n" + str(r.row.get("prompt", "")))
            if ambiguous:
                outputs[i] = _output(0.0, 1.0, ambiguous=1.0)
            elif found is None:
                outputs[i] = _output(0.0, 0.0)
            elif _same_numeral(found, reference):
                outputs[i] = _output(1.0, 1.0)
            else:
                todo.append(i)
                items.append((reference, found, self.verify_options))
        executor = shared_executor(self.workers)
        results = executor.map(verify_answer, items, timeout=self.timeout, chunk_size=self.chunk_size)
        # Whose fault was a timeout? Check each such reference alone (against the answer "0"), within the same limit.
        late = sorted({items[k][0] for k, res in enumerate(results) if isinstance(res, TaskError)
                       and res.kind == TIMEOUT})
        checks = executor.map(check_reference, [(ref, self.verify_options) for ref in late], timeout=self.timeout)
        reference_ok = dict(zip(late, checks))
        for (i, result), (reference, _, _) in zip(zip(todo, results), items):
            if not isinstance(result, TaskError):
                outputs[i] = _output(float(bool(result)), 1.0)
            elif result.kind != TIMEOUT:
                outputs[i] = _output(0.0, 1.0, error=f"math: {result}")
            elif isinstance(checked := reference_ok[reference], TaskError):
                why = (f"reference answer {reference!r} timed out after {self.timeout:g} s" if checked.kind == TIMEOUT
                       else str(checked))
                outputs[i] = _output(0.0, 1.0, error=f"math: {why}")
            else:
                _warn_timeout(self.timeout)
                outputs[i] = _output(0.0, 1.0, timed_out=1.0)
        return outputs  # type: ignore[return-value]


def _output(score: float, extracted: float, *, timed_out: float = 0.0, ambiguous: float = 0.0,
            error: str | None = None) -> RewardOutput:
    return RewardOutput(score, {"correct": score, "extracted": extracted, "timed_out": timed_out,
                                "ambiguous": ambiguous}, error=error)


_WARNED_TIMEOUT = False


def _warn_timeout(timeout: float) -> None:
    global _WARNED_TIMEOUT
    if not _WARNED_TIMEOUT:
        _WARNED_TIMEOUT = True
        warnings.warn(f"math: a completion's answer took longer than timeout={timeout:g} s to check; it scores 0 "
                      "(component timed_out, logged as reward/timed_out/mean; raise `timeout` if honest answers "
                      "are slow on this machine)", MathTimeoutWarning, stacklevel=3)


register_reward("math")(MathReward)
