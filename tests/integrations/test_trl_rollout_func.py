"""TRL's GRPOTrainer with `as_trl_rollout_func`: rewardlab's episode loop on guess_number generates, token in and
token out, and the reward functions score the episodes themselves."""

import string

import pytest

pytest.importorskip("trl")

from rewardlab.envs import GuessNumberEnv  # noqa: E402
from rewardlab.rewards import REWARDS, WeightedSum, reward  # noqa: E402
from rewardlab.integrations.trl import (  # noqa: E402
    ROLLOUT_COLUMN, as_trl_reward_funcs, as_trl_rollout_func, env_dataset,
)


def test_rollout_func_refuses_untagged_prompts():
    from rewardlab.envs import make_env

    env = make_env("guess_number", n=4)
    func = as_trl_rollout_func(env, env.rows("train", 2), max_turns=2, max_new_tokens=4, max_episode_tokens=32)
    with pytest.raises(ValueError, match=r"as_trl_rollout_func: prompt 'Guess my number.*' does not start with a "
                                         r"<rewardlab-row I> tag of one of the 2 rows; build the dataset with"):
        func(["Guess my number from 1 to 4."], trainer=None)


def test_env_dataset_tags_each_row():
    ds = env_dataset([{"prompt": "p", "answer": "3", "n": 4}, {"prompt": "p", "answer": "1"}])
    assert ds["prompt"] == ["<rewardlab-row 0>p", "<rewardlab-row 1>p"]
    assert ds["answer"] == ["3", "1"] and ds["n"] == [4, None]


@reward(name="final_turn_chars", register=False)
def final_turn_chars(completion):
    """0.01 per character of the completion the reward is given (an episode's: its final model turn)."""
    return 0.01 * len(completion)


class QuickTurns(GuessNumberEnv):
    """guess_number whose model turns also end at any letter, so that the random tiny model's episodes have several
    turns (each answered with guess_number's "invalid" observation) within a few tokens."""

    stop = ("</g>", *string.ascii_letters)


def test_grpo_trainer_runs_rewardlab_episodes_on_guess_number(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rewardlab.policy.tiny import create_tiny

    path = create_tiny(tmp_path / "tiny", seed=0)
    env = QuickTurns(n=4)
    rows = env.rows("train", 4)
    inner = as_trl_rollout_func(env, rows, max_turns=3, max_new_tokens=6, max_episode_tokens=160, seed=0)
    batches = []

    def rollout_func(prompts, trainer):
        out = inner(prompts, trainer)
        batches.append((list(prompts), out))
        return out

    composed = WeightedSum([(REWARDS.get("guess_found")(), 1.0), (final_turn_chars(), 1.0)],
                           labels=["guess_found", "final_turn_chars"])
    funcs, weights = as_trl_reward_funcs(composed)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=160, max_steps=2, logging_steps=1, save_strategy="no",
                      reward_weights=weights, learning_rate=1e-3, disable_tqdm=True, dataloader_num_workers=0,
                      bf16=False, seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=funcs, args=args,
                          train_dataset=env_dataset(rows), processing_class=tok, rollout_func=rollout_func)
    trainer.train()

    assert len(batches) == 2
    for prompts, out in batches:
        episodes = out[ROLLOUT_COLUMN]
        assert len(episodes) == len(prompts) == 4
        for prompt, r, ids, mask, logps, pids in zip(prompts, episodes, out["completion_ids"], out["env_mask"],
                                                     out["logprobs"], out["prompt_ids"]):
            row = rows[int(prompt.split(">")[0].split()[-1])]
            assert r.row["answer"] == row["answer"]                       # the tagged row, secret included
            assert "rewardlab-row" not in tok.decode(pids)                 # the model never sees the tag
            # as sampled; an episode that ended on its own gets an EOS TRL sees but never trains (mask 0, logp 0)
            extra = len(ids) - len(r.completion_ids)
            assert extra == (0 if r.truncated or r.completion_ids[-1] == tok.eos_token_id else 1)
            assert ids[:len(ids) - extra] == r.completion_ids and ids[len(ids) - extra:] == [tok.eos_token_id] * extra
            assert mask == r.loss_mask + [0] * extra and logps == r.logprobs + [0.0] * extra
            assert sum(mask) == sum(e - s for s, e in r.turns)            # 1 exactly on sampled tokens
            assert all(lp == 0.0 for lp, k in zip(logps, mask) if k == 0)  # env tokens carry no log-prob
    # TRL counts only the model's tokens (env_mask = its tool mask) in its completion lengths.
    last_prompts, last = batches[-1]
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged[-1]["completions/mean_length"] == pytest.approx(sum(map(sum, last["env_mask"])) / 4)
    assert any(0 in mask for mask in last["env_mask"])  # several turns: environment tokens in the sequences
    # The rewards TRL recorded are rewardlab's on the episodes: the final model turn, not TRL's decoded sequence
    # (which holds every turn and observation).
    finals = [r.completion for r in last[ROLLOUT_COLUMN]]
    assert list(trainer._logs["rewards"]["rewardlab/final_turn_chars"]) == pytest.approx([0.01 * len(c) for c in finals])
    assert all(len(c) > len(f) for c, f in zip(trainer._logs["completion"], finals))
    ours = [o.score for o in composed(last[ROLLOUT_COLUMN])]
    assert list(trainer._logs["rewards"]["rewardlab"]) == pytest.approx(ours)
    assert all("rewards/rewardlab/guess_found/mean" in h for h in logged)


def test_episodes_that_end_on_their_own_are_not_truncated_for_mask_truncated_completions(tmp_path):
    """TRL counts a completion truncated when its last id is not EOS or pad, and `mask_truncated_completions`
    leaves those out of the loss: an episode ended by a stop string, the environment or max_turns must not look
    truncated (else every episode is masked and the loss is exactly 0), one that hit its token budget must."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rewardlab.policy.tiny import create_tiny

    class LowercaseTurns(GuessNumberEnv):  # turns end at a lowercase letter or hit max_new_tokens: both kinds
        stop = ("</g>", *string.ascii_lowercase)

    path = create_tiny(tmp_path / "tiny", seed=0)
    env = LowercaseTurns(n=4)
    rows = env.rows("train", 4)
    inner = as_trl_rollout_func(env, rows, max_turns=2, max_new_tokens=3, max_episode_tokens=160, seed=0)
    batches = []

    def rollout_func(prompts, trainer):
        out = inner(prompts, trainer)
        batches.append(out)
        return out

    funcs, weights = as_trl_reward_funcs(final_turn_chars())
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=160, max_steps=1, logging_steps=1, save_strategy="no",
                      reward_weights=weights, learning_rate=1e-2, disable_tqdm=True, dataloader_num_workers=0,
                      bf16=False, seed=0, mask_truncated_completions=True)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=env_dataset(rows),
                          processing_class=tok, rollout_func=rollout_func)
    trainer.train()

    (out,) = batches
    episodes = out[ROLLOUT_COLUMN]
    truncated = [r.truncated for r in episodes]
    assert 0 < sum(truncated) < len(truncated), [r.termination for r in episodes]  # both kinds in the batch
    # TRL's own test (GRPOTrainer._generate and the masking in _generate_and_score_completions)
    ends = [*trainer.eos_token_ids, tok.pad_token_id]
    assert [ids[-1] not in ends for ids in out["completion_ids"]] == truncated
    logged = [h for h in trainer.state.log_history if "completions/clipped_ratio" in h]
    assert logged[-1]["completions/clipped_ratio"] == pytest.approx(sum(truncated) / len(truncated))
    # the episodes that ended on their own were trained: the step moved the weights
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
