"""Policy.generate's step sampling on the tiny model: continuing a prefix and stopping at a separator."""

import torch

from rewardlab.policy.hf import Policy


def test_prefix_continues_the_formatted_prompt(tiny_policy):
    torch.manual_seed(0)
    rollouts = tiny_policy.generate(["3+4-2=", "1+1="], n=2, max_new_tokens=4, prefixes=["3+4=7\n", ""])
    assert [r.prompt for r in rollouts] == ["3+4-2=3+4=7\n"] * 2 + ["1+1="] * 2
    # char tokenizer: BOS + one id per character of prompt + prefix
    assert rollouts[0].prompt_ids == tiny_policy.encode_prompt("3+4-2=3+4=7\n")
    assert len(rollouts[0].prompt_ids) == 1 + 12


def test_stop_ends_each_completion_right_after_the_separator(tiny_policy):
    # The untrained model writes "\n" with probability about 1/101 per token: over 64 samples of up to 40 tokens
    # some stop at it. Every completion ends at its first "\n", at EOS, or at the token limit (truncated).
    torch.manual_seed(0)
    rollouts = tiny_policy.generate(["3+4-2="], n=64, max_new_tokens=40, stop="\n")
    eos = tiny_policy.tokenizer.eos_token_id
    stopped = [r for r in rollouts if "\n" in r.completion]
    assert stopped, "no sample wrote the separator; the test needs at least one"
    for r in rollouts:
        if "\n" in r.completion:
            assert r.completion.index("\n") == len(r.completion) - 1 and not r.truncated
            assert eos not in r.completion_ids
        elif eos in r.completion_ids:
            assert r.completion_ids[-1] == eos and not r.truncated
        else:
            assert r.truncated and len(r.completion_ids) == 40
        assert len(r.logprobs) == len(r.completion_ids)
    # without stop, the same seed samples past the separator
    torch.manual_seed(0)
    free = tiny_policy.generate(["3+4-2="], n=64, max_new_tokens=40)
    assert any(r.completion.count("\n") > 0 and not r.completion.endswith("\n") for r in free)


def test_stop_end_counts_a_separator_that_starts_in_the_prompt(tiny_policy):
    # "\n\n" split across prompt ("...\n") and the first new token ("\n"): the stop ends after that one token.
    ids = tiny_policy.tokenizer("\nab", add_special_tokens=False)["input_ids"]
    assert Policy._stop_end(tiny_policy, ids, "\n\n", "\n") == 1
    assert Policy._stop_end(tiny_policy, ids, "\n\n", "x") is None
    ids = tiny_policy.tokenizer("ab\n\ncd", add_special_tokens=False)["input_ids"]
    assert Policy._stop_end(tiny_policy, ids, "\n\n", "x") == 4  # a, b, \n, \n
