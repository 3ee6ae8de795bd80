"""Single-turn prompts against the model's context window (issue 31 item 4): `Policy.generate` refuses a prompt that
fills the window and clamps a budget that would run past it (as `sample_ids` does), and cuts prompts from the left
with TRL's `max_prompt_length`."""

import pytest

from conftest import TINY_ARCH

#: The tests' tiny model with a 64-position window, so a prompt past it is a short one.
WINDOW = 64
LONG = "1" * 100 + "="  # 102 tokens with BOS: more than the window


@pytest.fixture
def policy():
    from rewardlab.policy import load_policy

    return load_policy("tiny", tiny_arch={**TINY_ARCH, "max_position_embeddings": WINDOW}, seed=0)


# ------------------------------------------------------------------------------------------------ Policy.generate
def test_generate_refuses_a_prompt_that_fills_the_context_window(policy):
    with pytest.raises(ValueError) as err:  # before: sampled past the window (a 10**6-char prompt: a 1 TB alloc)
        policy.generate(["1+1=", LONG], max_new_tokens=2)
    assert str(err.value) == ("generation.prompts[1]: 102 prompt tokens leave no room in the model's context window of "
                              "64 tokens; shorten the prompt, or cut prompts from the left with max_prompt_length "
                              "(below 64)")


def test_generate_clamps_a_budget_that_would_run_past_the_window(policy):
    prompt = "1" * 59 + "="  # 61 tokens with BOS: 3 left in the window
    (r,) = policy.generate([prompt], greedy=True, max_new_tokens=20)
    assert len(r.prompt_ids) == 61 and len(r.prompt_ids) + len(r.completion_ids) <= WINDOW
    assert len(r.completion_ids) == 3 and r.truncated or r.completion_ids[-1] == policy.eos_token_id


def test_generate_max_prompt_length_keeps_the_last_tokens(policy):
    full = policy.encode_prompt(LONG)
    short, cut = policy.generate(["2+2=", LONG], n=2, max_new_tokens=3, max_prompt_length=16)[::2]
    assert short.prompt_ids == policy.encode_prompt("2+2=") and short.prompt == "2+2="
    assert cut.prompt_ids == full[-16:] and cut.prompt == "1" * 15 + "="  # TRL: prompt_ids[:, -max_prompt_length:]
    with pytest.raises(ValueError, match=r"^generation.max_prompt_length: must be an integer >= 1 or None, got 0$"):
        policy.generate(["1="], max_prompt_length=0)
