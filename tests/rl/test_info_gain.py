"""IGPO's information-gain turn reward: r_k = log p(answer | after turn k) - log p(answer | before turn k)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_ARCH

from rewardlab.policy import load_policy
from rewardlab.rl.info_gain import info_gain_rewards
from rewardlab.types import Rollout


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)


def _enc(policy, text):
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def _logp_answer(policy, prefix: list[int], answer: str) -> float:
    """log p(answer | prefix), token by token with one forward pass over prefix + answer (independent of collate)."""
    ids = prefix + _enc(policy, answer)
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[t - 1, ids[t]].item() for t in range(len(prefix), len(ids)))


def test_each_turn_gets_the_change_in_log_p_of_the_answer_and_the_gains_telescope(policy):
    prompt = policy.encode_prompt("12*34=")
    turn0, obs, turn1 = _enc(policy, "<c>12*34</c>"), _enc(policy, "<o>408</o>"), _enc(policy, "408")
    ids = turn0 + obs + turn1
    row = Rollout("12*34=", prompt, "408", ids, [0.0] * len(ids),
                  loss_mask=[1] * len(turn0) + [0] * len(obs) + [1] * len(turn1),
                  turns=[(0, len(turn0)), (len(turn0) + len(obs), len(ids))], turn_rewards=[0.0, 0.0],
                  row={"prompt": "12*34=", "answer": "408"}, episode_id=0, termination="stop")
    (gains,) = info_gain_rewards(policy, [[row]])
    before0 = _logp_answer(policy, prompt, "408")
    before1 = _logp_answer(policy, prompt + turn0 + obs, "408")
    end = _logp_answer(policy, prompt + ids, "408")
    assert gains == pytest.approx([before1 - before0, end - before1], abs=1e-4)
    assert sum(gains) == pytest.approx(end - before0, abs=1e-4)


def test_an_episode_split_into_two_rows_scores_its_turns_across_them(policy):
    p0, p1 = policy.encode_prompt("7+8="), policy.encode_prompt("7+8=<c>7+8</c><o>15</o>")
    a, b = _enc(policy, "<c>7+8</c>"), _enc(policy, "15")
    first = Rollout("7+8=", p0, "<c>7+8</c>", a, [0.0] * len(a), turns=[(0, len(a))], turn_rewards=[0.0],
                    row={"answer": "15"}, episode_id=3)
    second = Rollout("...", p1, "15", b, [0.0] * len(b), turns=[(0, len(b))], turn_rewards=[0.0],
                     row={"answer": "15"}, episode_id=3, termination="stop", first_turn=1)
    (gains,) = info_gain_rewards(policy, [[first, second]])
    assert gains == pytest.approx([_logp_answer(policy, p1, "15") - _logp_answer(policy, p0, "15"),
                                   _logp_answer(policy, p1 + b, "15") - _logp_answer(policy, p1, "15")], abs=1e-4)


def test_a_row_without_an_answer_is_refused(policy):
    row = Rollout("p", [1], "c", [5], [0.0], episode_id=0, termination="stop")
    with pytest.raises(ValueError, match="info_gain needs each row's ground-truth 'answer'"):
        info_gain_rewards(policy, [[row]])


def test_info_gain_turn_rewards_need_a_turn_level_estimator_and_an_environment_task(tmp_path):
    from rewardlab.config import TrainConfig
    from rewardlab.config.loader import load_config
    from rewardlab.rl.specs import resolve_specs
    from rewardlab.rl.trainer import train

    cfg = load_config(TrainConfig, None, ["rl.turn_rewards=info_gain"])
    with pytest.raises(ValueError, match="rl.turn_rewards: 'info_gain' sets the per-turn rewards of a turn-level "
                                         "estimator, and 'grpo' reads none; use turn_grpo or gigpo"):
        resolve_specs(cfg)
    cfg = load_config(TrainConfig, None, ["rl.turn_rewards=info_gain", "rl.estimator=turn_grpo",
                                          f"out={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match="reasoning_gym:chain_sum is a single-turn task"):
        train(cfg, show_progress=False)
    assert not (tmp_path / "run").exists()  # refused before the run directory is written
