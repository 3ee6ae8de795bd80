"""Algorithm options are declared and checked: an option nothing uses is an error naming it, never ignored."""

import math

import pytest
import torch

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.config import TrainConfig, load_config
from rewardlab.rl.advantages import compute_advantages, register_estimator
from rewardlab.rl.losses import aggregate, compute_policy_loss, split_loss_options
from rewardlab.rl.specs import resolve_loss_options
from rewardlab.rl.trainer import check_config


def _one_token(ratio: float, advantage: float = 1.0):
    """One rollout of one token whose importance ratio is `ratio`: logprobs - old_logprobs = log(ratio)."""
    old = torch.tensor([[-1.0]])
    return dict(logprobs=old + math.log(ratio), old_logprobs=old, advantages=torch.tensor([[advantage]]),
                mask=torch.tensor([[1.0]]))


# ---------------------------------------------------------------------------------------------- GSPO's clip
def test_gspo_clip_is_the_symmetric_epsilon():
    # s = 1.1, A = 1: with eps = 0.2, clip(1.1, 0.8, 1.2) = 1.1 and the loss is -min(1.1, 1.1) = -1.1.
    # The paper's default range [1 - 3e-4, 1 + 4e-4] clips s to 1.0004: -min(1.1, 1.0004) = -1.0004, which is what
    # clip=0.2 gave when GSPO swallowed it.
    loss, stats = compute_policy_loss("gspo", clip=0.2, **_one_token(1.1))
    assert float(loss) == pytest.approx(-1.1)
    assert stats["policy/clip_frac"] == 0.0
    loss, stats = compute_policy_loss("gspo", **_one_token(1.1))
    assert float(loss) == pytest.approx(-1.0004)
    assert stats["policy/clip_frac_high"] == 1.0
    # clip = eps is clip_low = clip_high = eps: s = 0.7 with A = -1 -> -min(-0.7, -0.8) = 0.8 either way
    a = compute_policy_loss("gspo", clip=0.2, **_one_token(0.7, -1.0))[0]
    b = compute_policy_loss("gspo", clip_low=0.2, clip_high=0.2, **_one_token(0.7, -1.0))[0]
    assert float(a) == float(b) == pytest.approx(0.8)


@pytest.mark.parametrize("other", [{"clip_low": 0.1}, {"clip_high": 0.3}])
def test_gspo_clip_with_clip_low_or_high_is_an_error(other):
    with pytest.raises(ValueError, match="gspo: give clip .* or clip_low/clip_high, not both"):
        compute_policy_loss("gspo", clip=0.2, **other, **_one_token(1.1))


# ---------------------------------------------------------------------------------------------- entry points
def test_an_option_no_loss_declares_is_an_error_naming_it():
    with pytest.raises(ValueError) as err:
        compute_policy_loss("ppo_clip", foo=1, **_one_token(1.0))
    assert str(err.value) == "unknown option 'foo' for policy loss 'ppo_clip'; valid: clip_high, clip_low, dual_clip"
    with pytest.raises(ValueError) as err:
        compute_policy_loss("reinforce", clip_low=0.2, **_one_token(1.0))
    assert str(err.value) == "unknown option 'clip_low' for policy loss 'reinforce'; valid: (none)"


def test_options_are_split_between_the_loss_and_the_aggregation():
    # the aggregation's max_len reaches the aggregation, the loss's clip the loss; an option of neither is named
    # together with the options of both
    loss_opts, agg_opts = split_loss_options("gspo", "seq-mean-token-sum-norm", {"clip": 0.2, "max_len": 4})
    assert (loss_opts, agg_opts) == ({"clip": 0.2}, {"max_len": 4})
    # reinforce, A = [2, 1], one row: sum(-A * logprobs) / (1 * max_len) with logprobs 0 is 0; use the values: the
    # per-token loss -A*lp with lp = -1 is [2, 1], summed 3, divided by N * max_len = 1 * 4 -> 0.75 (T = 2 -> 1.5)
    lp = torch.tensor([[-1.0, -1.0]])
    batch = dict(logprobs=lp, old_logprobs=lp, advantages=torch.tensor([[2.0, 1.0]]), mask=torch.ones(1, 2))
    assert float(compute_policy_loss("reinforce", agg="seq-mean-token-sum-norm", max_len=4, **batch)[0]) == 0.75
    assert float(compute_policy_loss("reinforce", agg="seq-mean-token-sum-norm", **batch)[0]) == 1.5
    with pytest.raises(ValueError) as err:
        compute_policy_loss("gspo", agg="seq-mean-token-sum-norm", clip=0.2, max_lenn=4, **batch)
    assert str(err.value) == ("unknown option 'max_lenn' for policy loss 'gspo' or aggregation mode "
                              "'seq-mean-token-sum-norm'; valid: clip, clip_high, clip_low, max_len")
    with pytest.raises(ValueError, match="unknown option 'max_len' for policy loss 'reinforce'; valid: \\(none\\)"):
        compute_policy_loss("reinforce", agg="token-mean", max_len=4, **batch)


def test_aggregate_refuses_an_option_the_mode_does_not_declare():
    x, m = torch.tensor([[1.0, 3.0]]), torch.ones(1, 2)
    assert float(aggregate(x, m, "seq-mean-token-sum-norm", max_len=8)) == 0.5  # 4 / (1 * 8)
    with pytest.raises(ValueError) as err:
        aggregate(x, m, "token-mean", max_len=8)
    assert str(err.value) == "unknown option 'max_len' for aggregation mode 'token-mean'; valid: (none)"


def test_an_unknown_estimator_option_is_an_error():
    r, m, g = torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), torch.tensor([0, 0])
    with pytest.raises(ValueError) as err:
        compute_advantages("grpo", token_rewards=r, mask=m, group=g, epsilon=1e-3)
    assert str(err.value) == "unknown option 'epsilon' for advantage estimator 'grpo'; valid: eps, scale"
    with pytest.raises(ValueError, match="unknown option 'gamma' for advantage estimator 'rloo'; valid: \\(none\\)"):
        compute_advantages("rloo", token_rewards=r, mask=m, group=g, gamma=0.9)
    # the declared option still works: R = [1, 0], mean 0.5, std 0.7071 -> A = +-0.7071 (eps 0)
    a = compute_advantages("grpo", token_rewards=r, mask=m, group=g, eps=0.0)
    assert a[:, 0].tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5)])


def test_register_estimator_records_needs_as_meta():
    from rewardlab.rl.advantages import ESTIMATORS

    assert ESTIMATORS.meta("gae")["needs"] == ("values",)
    assert ESTIMATORS.meta("grpo")["needs"] == ()
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        register_estimator("grpo")(lambda *, token_rewards, mask, group: None)


# ---------------------------------------------------------------------------------------------- trainer config
def _cfg(tmp_path, *overrides):
    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(6)])
    return load_config(TrainConfig, None, [f"task.spec=jsonl:{task}", "task.options={test_size: 2}",
                                           f"out={tmp_path / 'run'}", *TINY_OVERRIDES, *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["rl.loss=gspo", "rl.loss_options={bogus: 1}"],
     "rl.loss_options: unknown option 'bogus' for policy loss 'gspo'; valid: clip, clip_high, clip_low"),
    (["rl.agg=seq-mean-token-sum-norm", "rl.loss_options={max_lne: 4}"],
     "rl.loss_options: unknown option 'max_lne' for policy loss 'ppo_clip' or aggregation mode "
     "'seq-mean-token-sum-norm'; valid: clip_high, clip_low, dual_clip, max_len"),
    (["rl.loss=gspo", "rl.loss_options={clip: 0.2, clip_high: 0.3}"],
     "rl.loss_options: gspo: give clip (symmetric) or clip_low/clip_high, not both"),
    (["rl.loss_options={clip_low: -0.1}"], "rl.loss_options: ppo_clip: clip_low and clip_high must be >= 0"),
    (["rl.estimator_options={lambda: 0.9}"],
     "rl.estimator_options: unknown option 'lambda' for advantage estimator 'grpo'; valid: eps, scale"),
    (["rl.filtering.curriculum=pass_rate", "rl.filtering.curriculum_options={sigmaa: 0.1}"],
     "rl.filtering.curriculum_options: unknown option 'sigmaa' for curriculum 'pass_rate'; valid: ema, initial, mu, "
     "sigma"),
    (["rl.filtering.group_filter=dapo", "rl.filtering.group_filter_options={min_std: 0.1}"],
     "rl.filtering.group_filter_options: unknown option 'min_std' for group filter 'dapo'; valid: (none)"),
    (["rl.filtering.group_filter_options={min_std: 0.1}"],
     "rl.filtering.group_filter_options: ['min_std'] given without rl.filtering.group_filter"),
    (["rl.loss=reinforce", "rl.clip_eps=0.2"], "rl.clip_eps: policy loss 'reinforce' has no clip range"),
])
def test_check_config_refuses_unknown_options_at_config_time(tmp_path, overrides, message):
    with pytest.raises(ValueError) as err:
        check_config(_cfg(tmp_path, *overrides), "new")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_clip_eps_maps_onto_the_loss_options_and_max_len_only_where_declared(tmp_path):
    rl = _cfg(tmp_path, "rl.clip_eps=0.1", "rl.sampling.max_new_tokens=6").rl
    assert resolve_loss_options(rl) == {"clip_low": 0.1, "clip_high": 0.1}  # token-mean declares no max_len
    rl = _cfg(tmp_path, "rl.clip_eps=0.1", "rl.loss_options={clip_high: 0.28}", "rl.agg=seq-mean-token-sum-norm",
              "rl.sampling.max_new_tokens=6").rl
    assert resolve_loss_options(rl) == {"clip_low": 0.1, "clip_high": 0.28, "max_len": 6}
    rl = _cfg(tmp_path, "rl.loss=gspo", "rl.clip_eps=0.1", "rl.loss_options={clip: 0.2}").rl
    assert resolve_loss_options(rl) == {"clip": 0.2}  # loss_options take precedence
    rl = _cfg(tmp_path, "rl.loss=cispo", "rl.clip_eps=0.1").rl
    assert resolve_loss_options(rl) == {"clip_low": 0.1, "clip_high": 0.1}
    check_config(_cfg(tmp_path, "rl.loss=gspo", "rl.loss_options={clip: 0.2}", "rl.agg=seq-mean-token-sum-norm"),
                 "new")


def test_cli_unknown_loss_option_exits_2_before_any_run_directory(tmp_path, capsys):
    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(6)])
    out = tmp_path / "run"
    code = main(["train", "--no-progress", "--task", f"jsonl:{task}", "--out", str(out), *TINY_OVERRIDES,
                 "rl.loss=gspo", "rl.loss_options={bogus: 1}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["rewardlab train: error: rl.loss_options: unknown option 'bogus' for policy loss 'gspo'; "
                   "valid: clip, clip_high, clip_low"]
    assert not out.exists()


def test_reward_specs_are_checked_with_the_algorithm_options(tmp_path):
    cfg = _cfg(tmp_path, "rewards=[{name: exact_match}, {name: numeric, tolerence: 0.1}]")
    with pytest.raises(ValueError, match="^rewards\\[1\\]: unknown option 'tolerence' for reward 'numeric'; valid: "):
        check_config(cfg, "new")
