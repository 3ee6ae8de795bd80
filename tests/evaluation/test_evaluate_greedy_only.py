"""`evaluate_policy` with n=0: greedy completions only (held-out evaluation during training), no sampling."""

import torch

from rewardlab.evaluation.policy import EvalSettings, evaluate_policy

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rewards import reward

ROWS = [{"prompt": "a1", "answer": "x"}, {"prompt": "b2", "answer": "y"}, {"prompt": "a3", "answer": "z"}]


@reward(register=False)
def _prompt_starts_with_a(prompt):
    return float(prompt.startswith("a"))


def test_n0_scores_greedy_completions_only_and_draws_no_random_numbers(tiny_policy, monkeypatch):
    calls = []
    generate = type(tiny_policy).generate

    def counting_generate(self, prompts, **kw):
        calls.append(kw.get("greedy", False))
        return generate(self, prompts, **kw)

    monkeypatch.setattr(type(tiny_policy), "generate", counting_generate)
    before = torch.get_rng_state()
    result = evaluate_policy(tiny_policy, ROWS, _prompt_starts_with_a(), SamplingSettings(max_new_tokens=2),
                             settings=EvalSettings(n=0, ks=(), batch_size=2))
    assert calls == [True, True]  # two batches of greedy completions, nothing sampled
    assert torch.equal(torch.get_rng_state(), before)
    assert result["accuracy"] == 2 / 3 and result["samples_per_question"] == 0
    assert not [k for k in result if k.startswith("pass@")]
