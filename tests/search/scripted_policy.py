"""A scripted stand-in for `rewardlab.policy.Policy` (same `generate` / `mark_steps` interface) and a hand-written
step scorer, for search tests whose right answer and budget are known in advance."""

from __future__ import annotations

from collections import defaultdict

from rewardlab.types import Rollout, RewardOutput, split_steps

EOS = 0  # token ids are character codes; 0 is the end-of-sequence token


class ScriptedPolicy:
    """Character-level policy whose samples come from scripts.

    With `stop` (one step): the k-th sample continuing prefix P is `steps[P][k % len(steps[P])]`, k counting every
    sample ever drawn for P. A scripted step that does not end with `stop` ends the solution (an EOS token follows).
    Without `stop` (whole solutions): the k-th sample of prompt Q is `solutions[Q][k % len(solutions[Q])]`, + EOS;
    greedy decoding gives `solutions[Q][0]` and does not count as a sample.
    Records every call's arguments in `calls`.
    """

    def __init__(self, steps: dict[str, list[str]] | None = None, solutions: dict[str, list[str]] | None = None):
        self.steps = steps or {}
        self.solutions = solutions or {}
        self.counter: dict[str, int] = defaultdict(int)
        self.calls: list[dict] = []

    def generate(self, prompts, *, n=1, temperature=1.0, top_p=1.0, max_new_tokens=32, greedy=False, rows=None,
                 batch_size=None, prefixes=None, stop=None):
        self.calls.append({"prompts": list(prompts), "n": n, "prefixes": prefixes, "stop": stop, "greedy": greedy})
        out = []
        for i, prompt in enumerate(prompts):
            prefix = prefixes[i] if prefixes is not None else ""
            for _ in range(n):
                if greedy:  # the first scripted solution; sampling counters untouched
                    key, text, ended = None, self.solutions[prompt][0], True
                elif stop is None:
                    key = prompt
                    text = self.solutions[key][self.counter[key] % len(self.solutions[key])]
                    ended = True
                else:
                    key = prefix
                    text = self.steps[key][self.counter[key] % len(self.steps[key])]
                    ended = not text.endswith(stop)
                if key is not None:
                    self.counter[key] += 1
                ids = [ord(c) for c in text] + ([EOS] if ended else [])
                out.append(Rollout(prompt=prompt + prefix, prompt_ids=[ord(c) for c in prompt + prefix],
                                   completion=text, completion_ids=ids, logprobs=[0.0] * len(ids),
                                   row=dict(rows[i]) if rows is not None else {}, group=i))
        return out

    def mark_steps(self, rollout: Rollout, separator: str = "\n") -> Rollout:
        spans = split_steps(rollout.completion, separator)
        rollout.steps = [(a, b) for a, b in spans]
        if rollout.steps:  # the EOS token joins the last step
            rollout.steps[-1] = (rollout.steps[-1][0], len(rollout.completion_ids))
        rollout.step_text = [rollout.completion[a:b] for a, b in spans]
        return rollout


class KnownStepScorer:
    """A process scorer that knows the right steps: step j scores 1.0 when it equals `right[j]` (stripped), else
    0.0; the outcome score is 1.0 when all steps are right and there are len(right) of them. Counts every rollout
    it scores in `scored`."""

    name = "known_steps"

    def __init__(self, right: list[str]) -> None:
        self.right = right
        self.scored = 0

    def __call__(self, rollouts):
        self.scored += len(rollouts)
        out = []
        for r in rollouts:
            steps = r.step_text or [r.completion[a:b] for a, b in split_steps(r.completion)]
            scores = [float(j < len(self.right) and s.strip() == self.right[j]) for j, s in enumerate(steps)]
            whole = float(len(steps) == len(self.right) and all(scores))
            out.append(RewardOutput(score=whole, components={"correct": whole}, step_scores=scores))
        return out


class TableScorer:
    """An outcome scorer that looks the completion up in a table (default 0.0); counts rollouts in `scored`."""

    name = "table"

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table
        self.scored = 0

    def __call__(self, rollouts):
        self.scored += len(rollouts)
        return [RewardOutput(score=self.table.get(r.completion, 0.0)) for r in rollouts]
