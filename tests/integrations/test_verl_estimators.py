"""rewardlab's estimators in verl's advantage-estimator registry. The first tests call the wrappers the way verl
calls a registered estimator (no verl needed); the others run verl's own `compute_advantage` and compare with
verl's built-in estimators where the formulas coincide (they skip where verl is not installed: `make test-verl`)."""

import importlib.util
import sys

import numpy as np
import pytest
import torch
from conftest import child_last_line

from rewardlab.integrations.verl import UNSUPPORTED, VERL_ESTIMATORS, verl_estimator

needs_verl = pytest.mark.skipif(importlib.util.find_spec("verl") is None,
                                reason="verl is not installed here (make test-verl builds .venv-verl with it)")


def outcome(rewards, lengths, T=4):
    """[N, T] token rewards with each rollout's reward on its last response token, and the [N, T] mask."""
    N = len(rewards)
    r, m = torch.zeros(N, T), torch.zeros(N, T)
    for i, (x, n) in enumerate(zip(rewards, lengths)):
        m[i, :n] = 1
        r[i, n - 1] = x
    return r, m


def test_grpo_by_hand_with_uid_strings():
    r, m = outcome([1.0, 0.0, 3.0, 3.0], [2, 4, 1, 3])
    adv, ret = verl_estimator("grpo")(token_level_rewards=r, response_mask=m, index=np.array(["u1", "u1", "u2", "u2"],
                                                                                             dtype=object))
    s = 1 / (2 ** 0.5 + 1e-6)  # (1 - 0.5) / (unbiased std 0.7071 + eps); the second group is all equal -> 0
    assert adv[0].tolist() == pytest.approx([s, s, 0, 0], abs=1e-6)
    assert adv[1].tolist() == pytest.approx([-s] * 4, abs=1e-6)
    assert adv[2:].abs().max() == 0
    assert torch.equal(adv, ret) and adv.dtype == torch.float32


def test_reinforce_pp_returns_are_the_discounted_reward_to_go_with_configs_gamma():
    r, m = outcome([1.0, 2.0], [3, 2])
    adv, ret = verl_estimator("reinforce_pp")(token_level_rewards=r, response_mask=m, config={"gamma": 0.5})
    assert ret.tolist() == [[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]]
    tokens = ret[m.bool()]
    assert adv[m.bool()].tolist() == pytest.approx(((tokens - tokens.mean()) / (tokens.std() + 1e-6)).tolist())


def test_remax_uses_reward_baselines():
    r, m = outcome([1.0, 0.0], [2, 1])
    adv, ret = verl_estimator("remax")(token_level_rewards=r, response_mask=m,
                                       reward_baselines=torch.tensor([0.25, 0.5]))
    assert adv.tolist() == [[0.75, 0.75, 0, 0], [-0.5, 0, 0, 0]]
    assert ret.tolist() == [[1.0, 1.0, 0, 0], [0.0, 0, 0, 0]]
    with pytest.raises(ValueError, match="rewardlab_remax: verl passed no reward_baselines"):
        verl_estimator("remax")(token_level_rewards=r, response_mask=m)


def test_what_verl_can_feed_is_derived_from_the_registrys_declarations():
    from rewardlab.rl.advantages import ESTIMATORS

    assert set(VERL_ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opo", "remax"}
    assert not set(VERL_ESTIMATORS) & set(UNSUPPORTED) and set(VERL_ESTIMATORS) | set(UNSUPPORTED) == set(ESTIMATORS)
    assert VERL_ESTIMATORS["remax"] == "reward_baselines as the baseline"
    assert VERL_ESTIMATORS["reinforce_pp"] == "config.gamma (default 1.0)"
    assert VERL_ESTIMATORS["rloo"] == "index (uid) as the group"


def test_estimators_verl_cannot_feed_are_one_line_errors():
    assert set(UNSUPPORTED) == {"pure", "process_sum", "prime", "gdpo", "gae", "turn_grpo", "gigpo"}
    with pytest.raises(ValueError, match=r"^rewardlab_gae cannot run in verl: it needs the critic's values"):
        verl_estimator("gae")
    with pytest.raises(ValueError, match=r"^no rewardlab estimator 'ppo' for verl; valid: grpo, dr_grpo, rloo"):
        verl_estimator("ppo")


# ---------------------------------------------------------------------------------------------- against verl
def verl_advantages(name, r, m, uid, baselines=None, **config):
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    tensors = {"token_level_rewards": r.clone(), "response_mask": m.clone()}
    if baselines is not None:
        tensors["reward_baselines"] = baselines.clone()
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": np.array(uid, dtype=object)})
    norm = config.pop("norm_adv_by_std_in_grpo", True)
    out = compute_advantage(data, name, norm_adv_by_std_in_grpo=norm, config=AlgoConfig(**config))
    return out.batch["advantages"], out.batch["returns"]


def random_batch(seed, groups=4, size=4, T=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (groups * size,), generator=g).tolist()
    rewards = torch.randn(groups * size, generator=g).tolist()
    r, m = outcome(rewards, lengths, T)
    uid = [f"prompt-{i // size}" for i in range(groups * size)]
    return r, m, uid


@needs_verl
def test_registered_in_verls_registry():
    import rewardlab.integrations.verl  # noqa: F401 - registers
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    for name in VERL_ESTIMATORS:
        assert get_adv_estimator_fn(f"rewardlab_{name}").__name__ == f"rewardlab_{name}"
    r, m = outcome([1.0], [1])
    with pytest.raises(ValueError, match="rewardlab_gigpo cannot run in verl"):
        get_adv_estimator_fn("rewardlab_gigpo")(token_level_rewards=r, response_mask=m, index=["a"])


@needs_verl
@pytest.mark.parametrize("ours,theirs,config", [
    ("grpo", "grpo", {}),
    ("dr_grpo", "grpo", {"norm_adv_by_std_in_grpo": False}),
    ("rloo", "rloo", {}),
    ("opo", "opo", {}),
    ("reinforce_pp_baseline", "reinforce_plus_plus_baseline", {}),
    ("reinforce_pp", "reinforce_plus_plus", {"gamma": 0.9}),
    ("remax", "remax", {}),
])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_verls_own_estimator_through_compute_advantage(ours, theirs, config, seed):
    """Same formula, same inputs: equal up to the whitening convention (rewardlab divides by std + 1e-6, verl
    multiplies by rsqrt(var + 1e-8)) and float32 vs float64 statistics."""
    import rewardlab.integrations.verl  # noqa: F401 - registers

    r, m, uid = random_batch(seed)
    baselines = torch.randn(r.shape[0], generator=torch.Generator().manual_seed(seed + 100)) if ours == "remax" else None
    a_ours, ret_ours = verl_advantages(f"rewardlab_{ours}", r, m, uid, baselines, **config)
    a_verl, ret_verl = verl_advantages(theirs, r, m, uid, baselines, **config)
    assert a_ours.shape == a_verl.shape == r.shape
    assert torch.allclose(a_ours, a_verl, atol=1e-4), (a_ours - a_verl).abs().max()
    if ours in ("reinforce_pp", "remax"):
        assert torch.allclose(ret_ours, ret_verl, atol=1e-5)


@needs_verl
def test_group_of_one_differs_as_documented():
    """verl's grpo gives a lone rollout (R - 0) / (1 + eps); rewardlab's grpo gives it 0 (no comparison, no signal)."""
    import rewardlab.integrations.verl  # noqa: F401 - registers

    r, m = outcome([2.0, 1.0, 3.0], [1, 1, 1], T=1)
    uid = ["a", "b", "b"]
    a_ours, _ = verl_advantages("rewardlab_grpo", r, m, uid)
    a_verl, _ = verl_advantages("grpo", r, m, uid)
    assert a_ours[0, 0].item() == 0.0
    assert a_verl[0, 0].item() == pytest.approx(2.0 / (1 + 1e-6))
    assert torch.allclose(a_ours[1:], a_verl[1:], atol=1e-5)


@needs_verl
def test_verl_imports_rewardlab_from_its_external_modules_variable():
    """VERL_USE_EXTERNAL_MODULES=rewardlab.integrations.verl: importing verl registers the estimators (how verl's
    driver process gets them)."""
    code = ("import verl\nfrom verl.trainer.ppo.core_algos import get_adv_estimator_fn\n"
            "print(get_adv_estimator_fn('rewardlab_rloo').__name__)")
    assert child_last_line(code, VERL_USE_EXTERNAL_MODULES="rewardlab.integrations.verl") == "rewardlab_rloo"


@needs_verl
def test_verl_loads_compute_score_from_its_config_and_calls_it():
    """verl's own loader (`get_custom_reward_fn`) with `path: pkg://rewardlab.integrations.verl` and reward_kwargs,
    called the way its reward loop calls it (keywords)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://rewardlab.integrations.verl", "name": "compute_score", "reward_kwargs": {"on_error": "zero"}}}})
    fn = get_custom_reward_fn(config)
    got = fn(data_source="openai/gsm8k", solution_str="The answer is 18.", ground_truth="18",
             extra_info={"split": "test", "index": 0, "rollout_reward_scores": {}, "num_turns": 2})
    assert got == {"score": 1.0, "numeric": 1.0, "error": 0.0}


@needs_verl
def test_verls_batch_reward_manager_calls_compute_score_batch(tmp_path):
    """verl's BatchRewardManager decodes the responses, calls the batch form once with its lists (and its
    reward_kwargs), puts each score on the response's last token and stacks the other keys per key."""
    from verl import DataProto
    from verl.workers.reward_manager.batch import BatchRewardManager

    from rewardlab.integrations.verl import compute_score_batch
    from rewardlab.policy.tiny import build_tokenizer

    tok = build_tokenizer()
    prompts = ["2+2=", "3+3=", "1+1="]
    responses = ["<answer>4</answer>", "7", "so 2"]
    P = max(len(tok(p)["input_ids"]) for p in prompts)
    R = max(len(tok(r, add_special_tokens=False)["input_ids"]) for r in responses)
    prompt_ids = torch.full((3, P), tok.pad_token_id)
    response_ids = torch.full((3, R), tok.pad_token_id)
    attention = torch.zeros(3, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids, r_ids = tok(p)["input_ids"], tok(r, add_special_tokens=False)["input_ids"]
        prompt_ids[i, P - len(p_ids):] = torch.tensor(p_ids)        # verl left-pads prompts
        response_ids[i, :len(r_ids)] = torch.tensor(r_ids)          # and right-pads responses
        attention[i, P - len(p_ids):P + len(r_ids)] = 1
    data = DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": attention},
        non_tensors={"data_source": np.array(["mine", "mine", "openai/gsm8k"], dtype=object),
                     "reward_model": np.array([{"ground_truth": "4"}, {"ground_truth": "6"}, {"ground_truth": "2"}],
                                              dtype=object),
                     "extra_info": np.array([{"reward": "exact_match"}, {"reward": "exact_match"}, {}], dtype=object)})
    manager = BatchRewardManager(tok, num_examine=0, compute_score=compute_score_batch, on_error="zero")
    out = manager(data, return_dict=True)
    rewards = out["reward_tensor"]
    lengths = [len(tok(r, add_special_tokens=False)["input_ids"]) for r in responses]
    assert [rewards[i, lengths[i] - 1].item() for i in range(3)] == [1.0, 0.0, 1.0]
    assert rewards.sum().item() == 2.0  # nothing anywhere else
    info = out["reward_extra_info"]
    assert info["error"] == [0.0, 0.0, 0.0] and info["score"] == [1.0, 0.0, 1.0]


def test_register_without_verl_names_the_extra_to_install(monkeypatch):
    from rewardlab.integrations.verl import register_verl_estimators

    for name in ("verl", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.core_algos"):
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: the import fails as if not installed
    with pytest.raises(ModuleNotFoundError) as caught:
        register_verl_estimators()
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("register_verl_estimators: verl is not installed; install rewardlab's verl extra: "
                           "pip install 'rewardlab[verl]'")
