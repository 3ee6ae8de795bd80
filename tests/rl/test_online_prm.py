"""PRIME (issue 35, item 6): the `prime` estimator and the `accuracy` group filter on hand vectors, the implicit PRM's
rewards and online update, its config checks, and a run that resumes exactly."""

import math
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_ARCH, make_rollout, read_jsonl, without_keys
from rewardlab.policy import load_policy, rollout_batch
from rewardlab.rl.advantages import compute_advantages
from rewardlab.rl.filters import filter_groups
from rewardlab.rl.online_prm import (ImplicitPRM, PrmStart, implicit_prm_loss, normalized_rewards, prime,
                                     ranking_accuracy)
from rewardlab.types import RewardOutput

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_trainer import _config  # noqa: E402  (the trainer tests' jsonl task and tiny model)

from rewardlab.rl.trainer import train  # noqa: E402

# one group of three rollouts of 3, 2 and 1 tokens; every token a step (as the online PRM gives them)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
STEPS = torch.tensor([[0.1, 0.2, 0.3], [0.4, -0.2, 0.0], [0.5, 0.0, 0.0]])
OUTCOME = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # R = 1, 0, 1 on each last token
GROUP = torch.zeros(3, dtype=torch.long)


def _prime(**options):
    return compute_advantages("prime", token_rewards=OUTCOME, mask=MASK, group=GROUP, step_rewards=STEPS,
                              step_mask=MASK, **options)


# ------------------------------------------------------------------------------------------ the estimator
def test_prime_rloo_by_hand():
    # pbar = 0.2, 0.1, 0.5; leave-one-out baselines 0.3, 0.35, 0.15 -> q0 = [-.2, -.1, 0], q1 = [.05, -.55],
    # q2 = [.35]; returns to go G0 = [-.3, -.1, 0], G1 = [-.5, -.55], G2 = [.35]; outcome R - LOO mean = .5, -1, .5
    want = torch.tensor([[0.2, 0.4, 0.5], [-1.5, -1.55, 0.0], [0.85, 0.0, 0.0]])
    assert torch.allclose(_prime(whiten=False), want, atol=1e-6)


def test_prime_discount_and_coefficients_by_hand():
    # gamma 0.5: G0 = [-.2 + .5 * -.1, -.1, 0] = [-.25, -.1, 0], G1 = [.05 + .5 * -.55, -.55] = [-.225, -.55]
    got = _prime(whiten=False, gamma=0.5, process_coef=2.0, outcome_coef=0.0)
    want = 2 * torch.tensor([[-0.25, -0.1, 0.0], [-0.225, -0.55, 0.0], [0.35, 0.0, 0.0]])
    assert torch.allclose(got, want, atol=1e-6)


def test_prime_whitens_over_the_batch_tokens_by_default():
    raw = _prime(whiten=False).double()
    on = MASK > 0
    want = (raw - raw[on].mean()) / (raw[on].std() + 1e-6) * MASK
    assert torch.allclose(_prime(), want.float(), atol=1e-5)
    assert abs(float(_prime()[on].mean())) < 1e-6


def test_prime_grpo_baseline_normalizes_each_source_by_its_group():
    pbar = torch.tensor([0.2, 0.1, 0.5], dtype=torch.float64)
    R = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    q = (STEPS.double() - pbar.mean()) / (pbar.std() + 1e-6) * MASK
    G = torch.flip(torch.cumsum(torch.flip(q, [1]), 1), [1]) * MASK
    o = (R - R.mean()) / (R.std() + 1e-6)
    assert torch.allclose(_prime(baseline_type="grpo", whiten=False), (G + o[:, None] * MASK).float(), atol=1e-5)


def test_prime_refuses_bad_options_and_small_groups():
    with pytest.raises(ValueError, match="unknown baseline_type 'mean'"):
        _prime(baseline_type="mean")
    with pytest.raises(ValueError, match="unknown option 'beta'"):
        _prime(beta=1.0)
    with pytest.raises(ValueError, match="needs at least 2 rollouts per group"):
        compute_advantages("prime", token_rewards=OUTCOME, mask=MASK, group=torch.tensor([0, 0, 1]),
                           step_rewards=STEPS, step_mask=MASK)


# ------------------------------------------------------------------------------------------ the filter
def test_accuracy_filter_keeps_groups_with_a_pass_rate_in_the_band():
    metric = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.float32)
    group = torch.tensor([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)  # pass rates 1, .25, 0, .25
    assert filter_groups("accuracy", metric=metric, group=group).tolist() == [False] * 4 + [True] * 4 + \
        [False] * 4 + [True] * 4
    kept = filter_groups("accuracy", metric=metric, group=group, low=0.0, high=0.2)
    assert kept.tolist() == [False] * 8 + [True] * 4 + [False] * 4
    assert filter_groups("accuracy", metric=metric, group=group, low=0.25, high=0.25).tolist() == \
        [False] * 4 + [True] * 4 + [False] * 4 + [True] * 4  # inclusive bounds
    with pytest.raises(ValueError, match="low <= high"):
        filter_groups("accuracy", metric=metric, group=group, low=0.9, high=0.1)


# ------------------------------------------------------------------------------------------ the formulas
def test_implicit_prm_loss_is_the_cross_entropy_of_the_sequence_implicit_reward():
    q = torch.tensor([[1.0, 2.0, 5.0], [-1.0, 0.5, 0.0]])
    sampled = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # z = 0.5 * (1 + 2) = 1.5 (label 1) and 0.5 * (-1 + 0.5) = -0.25 (label 0)
    want = [-math.log(1 / (1 + math.exp(-1.5))), -math.log(1 - 1 / (1 + math.exp(0.25)))]
    got = implicit_prm_loss(q, torch.tensor([1.0, 0.0]), sampled, beta=0.5)
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def test_batch_norm_divides_by_the_largest_return_to_go():
    r = torch.tensor([[0.5, -2.0, 0.5], [1.0, 1.0, 0.0]])
    sampled = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # returns to go: [-1, -1.5, .5] and [2, 1, 0]: the largest magnitude is 2
    assert torch.allclose(normalized_rewards(r, sampled), r / (2 + 1e-6))


def test_ranking_accuracy_counts_ordered_pairs_within_groups():
    z = torch.tensor([2.0, 1.0, 0.0, 5.0, 5.0, 3.0])
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    group = torch.tensor([0, 0, 0, 1, 1, 2])
    # group 0: pairs (0>1) right, (2>1) wrong; group 1: (3>4) tie -> 1/2; group 2 has no pair
    assert ranking_accuracy(z, labels, group) == pytest.approx(1.5 / 3)
    assert ranking_accuracy(z, torch.ones(6), group) is None


# ------------------------------------------------------------------------------------------ the implicit PRM
def _policy(seed):
    return load_policy("tiny", seed=seed, tiny_arch=TINY_ARCH)


def _view(policy, labels):
    rows = [make_rollout("x" * n, group=i // 4, n_tokens=n) for i, n in enumerate([3, 2, 4, 1, 2, 3, 3, 2])]
    packed, _ = rollout_batch(policy, rows)
    return SimpleNamespace(rows=rows, outputs=[RewardOutput(v) for v in labels], packed=packed,
                           sampled=packed.mask.float())


def _prm(update, norm="none", lr=1e-2, minibatch_size=None, micro_batch_size=None):
    start = PrmStart("tiny", {"seed": 0, "tiny_arch": TINY_ARCH}, None, None, 0.0, 1.0, minibatch_size,
                     micro_batch_size)
    return prime(start, beta=0.5, lr=lr, update=update, norm=norm)


LABELS = [1, 0, 1, 0, 0, 1, 1, 0]


def _ref_logprobs(prm, view):
    return prm.reference.scored_logprobs(view.packed)


@pytest.mark.parametrize("update", ["before", "after"])
def test_process_rewards_are_beta_times_the_log_ratio_of_the_updated_or_the_sampled_prm(update):
    prm = _prm(update)
    view = _view(prm.model, LABELS)
    ref = _ref_logprobs(prm, view)
    before = prm.model.scored_logprobs(view.packed)
    out = prm.provide(view)
    after = prm.model.scored_logprobs(view.packed)
    assert not torch.allclose(before, after)  # the PRM took a step
    want = 0.5 * ((after if update == "before" else before) - ref) * view.sampled
    assert torch.allclose(out.inputs["step_rewards"], want, atol=1e-6)
    assert torch.equal(out.inputs["step_mask"], view.sampled)
    assert ("prm/loss_after" in out.metrics) == (update == "before")


def test_the_online_update_lowers_the_loss_on_the_steps_labels():
    prm = _prm("before", lr=5e-3)
    view = _view(prm.model, LABELS)
    ref = _ref_logprobs(prm, view)
    labels = torch.tensor(LABELS, dtype=torch.float32)

    def loss():
        q = prm.model.scored_logprobs(view.packed) - ref
        return float(implicit_prm_loss(q, labels, view.sampled, prm.beta).mean())

    first = loss()
    assert first == pytest.approx(math.log(2), abs=1e-6)  # pi_phi == pi_ref at the start: z = 0
    losses = []
    for _ in range(5):
        out = prm.provide(view)
        assert out.metrics["prm/loss_after"] < out.metrics["prm/loss"]
        losses.append(loss())
    assert losses == sorted(losses, reverse=True) and losses[-1] < first - 0.05
    assert out.metrics["prm/accuracy"] > 0.5


def test_micro_batches_are_a_memory_switch_for_the_prm_update():
    a, b = _prm("before"), _prm("before", micro_batch_size=2)
    out_a, out_b = a.provide(_view(a.model, LABELS)), b.provide(_view(b.model, LABELS))
    assert torch.allclose(out_a.inputs["step_rewards"], out_b.inputs["step_rewards"], atol=1e-6)
    assert out_a.metrics["prm/loss"] == pytest.approx(out_b.metrics["prm/loss"], abs=1e-6)


def test_labels_outside_zero_one_or_a_missing_component_are_refused():
    prm = _prm("before")
    view = _view(prm.model, [1.5] + LABELS[1:])
    with pytest.raises(ValueError, match=r"rl.online_prm_options.label: .*in \[0, 1\], got 1.5"):
        prm.provide(view)
    prm.label = "correct"
    with pytest.raises(ValueError, match="no component 'correct'"):
        prm.provide(_view(prm.model, LABELS))


def test_batch_norm_bounds_the_process_returns():
    prm = _prm("before", norm="batch")
    out = prm.provide(_view(prm.model, LABELS))
    r = out.inputs["step_rewards"]
    to_go = torch.flip(torch.cumsum(torch.flip(r, [1]), 1), [1])
    assert float(to_go.abs().max()) == pytest.approx(1.0, abs=1e-4)


def test_the_prm_is_a_copy_of_the_starting_model_and_the_reference_stays_frozen():
    prm = _prm("before")
    assert isinstance(prm, ImplicitPRM)
    ref0 = {k: v.clone() for k, v in prm.reference.model.state_dict().items()}
    for k, v in prm.model.model.state_dict().items():
        assert torch.equal(v, ref0[k])
    prm.provide(_view(prm.model, LABELS))
    assert all(torch.equal(v, ref0[k]) for k, v in prm.reference.model.state_dict().items())


# ------------------------------------------------------------------------------------------ config and runs
@pytest.mark.parametrize("overrides, message", [
    (["rl.online_prm=prime"], "rl.online_prm: 'prime' gives process rewards, which estimator 'grpo' does not read"),
    (["rl.online_prm=prm800k", "rl.estimator=prime"], "rl.online_prm: unknown name 'prm800k'"),
    (["rl.online_prm=prime", "rl.estimator=prime", "rl.online_prm_options={gamma: 1}"],
     "rl.online_prm_options: unknown option 'gamma' for online PRM 'prime'"),
    (["rl.online_prm=prime", "rl.estimator=prime", "rl.online_prm_options={beta: 0}"],
     "rl.online_prm_options.beta: must be a number > 0"),
    (["rl.online_prm=prime", "rl.estimator=prime", "rl.online_prm_options={update: later}"],
     "rl.online_prm_options.update: unknown value 'later'"),
    (["rl.online_prm_options={beta: 0.1}"], "rl.online_prm_options: \\['beta'\\] given without rl.online_prm"),
    (["rl.online_prm=prime", "rl.estimator=prime", "rl.step_separator='5'"],
     "rl.step_separator: rl.online_prm 'prime' rewards every sampled token"),
    (["rl.estimator=prime"], "rl.step_separator: estimator 'prime' needs process rewards on steps"),
    (["rl.filtering.group_filter=accuracy", "rl.filtering.group_filter_options={low: 0.9, high: 0.1}"],
     "accuracy needs low <= high"),
])
def test_bad_settings_are_refused_before_anything_loads(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        train(_config(tmp_path, "run", "rl.steps=1", *overrides), show_progress=False)
    assert not (tmp_path / "run").exists()


PRIME_RUN = ["rl.estimator=prime", "rl.online_prm=prime", "rl.online_prm_options={lr: 0.001}", "save_every=2"]


def test_a_prime_run_logs_the_prm_and_resumes_exactly(tmp_path):
    train(_config(tmp_path, "A", "rl.steps=4", *PRIME_RUN), show_progress=False)
    train(_config(tmp_path, "B", "rl.steps=2", *PRIME_RUN), show_progress=False)
    train(_config(tmp_path, "B", "rl.steps=4", *PRIME_RUN), mode="resume", show_progress=False)
    want = without_keys(read_jsonl(tmp_path / "A" / "metrics.jsonl"), "time/")
    got = without_keys(read_jsonl(tmp_path / "B" / "metrics.jsonl"), "time/")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for g, e in zip(got, want):
        assert g.keys() == e.keys() and "prm/loss" in g and "prm/loss_after" in g
        for key in e:
            assert g[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (g["step"], key)
    assert got[-1]["prm/loss_after"] < got[-1]["prm/loss"]
    a = load_policy(str(tmp_path / "A" / "checkpoints" / "step-4" / "online_prm"))
    b = load_policy(str(tmp_path / "B" / "checkpoints" / "step-4" / "online_prm"))
    start = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    for (k, va), vb, v0 in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                               start.model.state_dict().values()):
        assert torch.equal(va, vb), k
    assert any(not torch.equal(va, v0) for va, v0 in zip(a.model.state_dict().values(),
                                                          start.model.state_dict().values()))
