"""A scripted chain-sum "policy" with the `Policy.generate` interface, for deterministic label and pair tests."""

from __future__ import annotations

import re

from rewardlab.tasks.steps import worked_steps
from rewardlab.tasks.worked import worked_row
from rewardlab.types import Rollout


def _terms(expression: str) -> list[int]:
    """Signed terms of a compact chain sum such as "3+4-2": [3, 4, -2]."""
    return [int(t) for t in re.findall(r"[+-]?\d+", expression)]


def chain_row(expression: str) -> dict:
    """A worked:chain_sum-like row for `expression` ("3+4-2+5"): prompt, the expression, the worked solution as
    `answer` (`worked_steps`), the final answer and the reference steps (`tasks.worked.worked_row`)."""
    target = worked_steps(expression)
    return worked_row({"prompt": expression + "=", "answer": str(sum(_terms(expression))), "expression": expression,
                       "target": target})


class ScriptedPolicy:
    """Continues a chain-sum solution from the text after the prompt, one step per line.

    The continuation picks up from the last partial result in the prefix (so a wrong step carries into the final
    answer) and works the remaining terms out correctly, except that continuation j of each prompt, for
    j < `slips`, adds 1 to its first result (a deliberate arithmetic slip). With `slips=0` every continuation of a
    correct prefix is correct and every continuation of a wrong one is wrong. `calls` counts generate calls and
    `sampled` the continuations produced.
    """

    prompt_format = "raw"

    def __init__(self, slips: int = 0) -> None:
        self.slips = slips
        self.calls = 0
        self.sampled = 0

    def continue_text(self, row: dict, text: str, j: int) -> str:
        prefix = text[len(row["prompt"]):]
        lines = [line for line in prefix.split("\n") if line.strip()]
        terms = _terms(row["prompt"][:-1])
        total = int(lines[-1].rsplit("=", 1)[1]) if lines else terms[0]
        out = []
        for k, t in enumerate(terms[1 + len(lines):]):
            new = total + t + (1 if (k == 0 and j < self.slips) else 0)
            out.append(f"{total}{'+' if t >= 0 else '-'}{abs(t)}={new}")
            total = new
        return "\n".join(out)

    def generate(self, prompts, *, n=1, temperature=1.0, top_p=1.0, max_new_tokens=32, rows=None, **_):
        self.calls += 1
        out = []
        for i, text in enumerate(prompts):
            for j in range(n):
                completion = self.continue_text(rows[i], text, j)
                out.append(Rollout(prompt=text, prompt_ids=[], completion=completion, completion_ids=[], logprobs=[],
                                   row=dict(rows[i]), group=i))
        self.sampled += len(out)
        return out
