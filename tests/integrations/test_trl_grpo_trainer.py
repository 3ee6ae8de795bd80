"""TRL's own GRPOTrainer, on CPU with the tiny model saved as a Hugging Face checkpoint, trains on rewardlab rewards
given by `as_trl_reward_funcs`: it logs every component, and the rewards it recorded for the completions it sampled
are rewardlab's own scores of those texts."""

import math

import pytest

pytest.importorskip("trl")

from rewardlab.integrations.trl import as_trl_reward_funcs  # noqa: E402
from rewardlab.rewards import REWARDS, WeightedSum, reward  # noqa: E402
from rewardlab.types import Rollout  # noqa: E402


@reward(name="chars", register=False)
def chars(completion):
    """0.01 per character: a score that varies from completion to completion of a random model."""
    return 0.01 * len(completion)


def test_grpo_trainer_logs_components_and_trains_on_rewardlabs_scores(tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rewardlab.policy.tiny import create_tiny

    path = create_tiny(tmp_path / "tiny", seed=0)
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]
    composed = WeightedSum([(REWARDS.get("exact_match")(), 1.0), (chars(), 0.5)], labels=["exact_match", "chars"])
    funcs, weights = as_trl_reward_funcs(composed)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, max_steps=2, logging_steps=1, save_strategy="no",
                      reward_weights=weights, learning_rate=1e-3, disable_tqdm=True, dataloader_num_workers=0,
                      bf16=False, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), reward_funcs=funcs, args=args,
                          train_dataset=Dataset.from_list(rows),
                          processing_class=AutoTokenizer.from_pretrained(path))
    trainer.train()

    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    for name in ("rewardlab", "rewardlab/exact_match", "rewardlab/chars"):
        assert all(f"rewards/{name}/mean" in h for h in logged), name

    # The last generation batch TRL kept: its prompts, completions and per-function rewards.
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    answers = {r["prompt"]: r["answer"] for r in rows}
    rollouts = [Rollout(prompt=p, prompt_ids=[], completion=c, completion_ids=[], logprobs=[],
                        row={"prompt": p, "answer": answers[p]}) for p, c in zip(prompts, completions)]
    ours = composed(rollouts)
    assert len(ours) == 4 and any(len(c) > 0 for c in completions)
    assert list(trainer._logs["rewards"]["rewardlab"]) == pytest.approx([o.score for o in ours])
    assert list(trainer._logs["rewards"]["rewardlab/chars"]) == pytest.approx([0.01 * len(c) for c in completions])
    assert list(trainer._logs["rewards"]["rewardlab/exact_match"]) == \
        [float(c.strip() == answers[p]) for p, c in zip(prompts, completions)]
    # TRL's reward metric is the weighted sum over the functions: exactly the composed score's mean
    assert logged[-1]["reward"] == pytest.approx(sum(o.score for o in ours) / 4)
    assert all(h["rewardlab/errors"] == 0.0 for h in logged)  # the failure count reaches TRL's logs via log_metric
    assert not any(math.isnan(h["reward"]) for h in logged)
