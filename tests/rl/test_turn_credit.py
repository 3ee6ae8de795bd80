"""Turn-level credit: turn_grpo (MT-GRPO), gigpo (GiGPO), the episode view, episode-aware aggregations, whole-episode
minibatches, the credit inputs built from Rollouts, and the Registry's caller-computed inputs. Values by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rewardlab.registry import Registry
from rewardlab.rl.critic import ValueModel
from rewardlab.rl.advantages import ESTIMATORS, compute_advantages
from rewardlab.rl.episodes import EpisodeView, episode_advantages, episode_minibatches, episode_tensors
from rewardlab.rl.losses import AGGREGATIONS, POLICY_LOSSES, aggregate, compute_policy_loss
from rewardlab.types import Rollout

R3 = math.sqrt(3.0)


def _close(a: torch.Tensor, expected) -> None:
    torch.testing.assert_close(a, torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------------ turn_grpo
def _three_episodes():
    """One group of three episodes on 4 tokens each: turns, per-turn rewards, outcomes (1, 0, 1)."""
    rewards = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0], [0, 0, 0, 1.0]])
    turn_index = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 2], [0, 0, 0, 0]])
    turn_rewards = torch.tensor([[0, 1.0, 0, 0], [1.0, 0, 0.5, 0], [0, 0, 0, 0]])
    return rewards, torch.ones(3, 4), torch.tensor([0, 0, 0]), turn_index, turn_rewards


def test_turn_grpo_three_turn_fixture_by_hand():
    r, m, g, ti, tr = _three_episodes()
    a = compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=ti, turn_rewards=tr, eps=0.0)
    # A^O: outcomes 1, 0, 1 -> mean 2/3, std sqrt(1/3): 1/sqrt(3), -2/sqrt(3), 1/sqrt(3).
    # Turn 0 rewards 1, 1, 0 (all three reached it): A^T_0 = 1/sqrt(3), 1/sqrt(3), -2/sqrt(3).
    # Turn 1 rewards 0 (ep 0), 0.5 (ep 1); ep 2 never reached it: A^T_1 = -1/sqrt(2), +1/sqrt(2).
    # ep 0: turn 0 gets A^O + A^T_0 = 2/sqrt(3); turn 1 is its last: A^O.
    # ep 1: turn 0: -2/sqrt(3) + 1/sqrt(3); turn 1: -2/sqrt(3) + 1/sqrt(2); turn 2 (last): -2/sqrt(3).
    # ep 2: one turn, its last: A^O.
    s2 = 1 / math.sqrt(2)
    _close(a, [[2 / R3, 2 / R3, 1 / R3, 1 / R3],
               [-1 / R3, -2 / R3 + s2, -2 / R3 + s2, -2 / R3],
               [1 / R3] * 4])


def test_turn_grpo_lam_weights_the_turn_term_and_a_turn_reached_by_one_episode_gets_zero():
    # Group of two: ep A has turns 0, 1, 2 (turn rewards 1, 5, 0), ep B one turn (reward 0). Outcomes 1, 0.
    # A^O = +-1/sqrt(2). Turn 0: rewards 1 vs 0 -> A^T_0(A) = 1/sqrt(2). Turn 1: only A reached it -> 0.
    # lam = 0.5: A's turn 0 = 1/sqrt(2) + 0.5/sqrt(2); turn 1 = 1/sqrt(2); turn 2 (last) = 1/sqrt(2).
    r = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0]])
    m = torch.tensor([[1, 1, 1, 1.0], [1, 0, 0, 0]])
    ti = torch.tensor([[0, 1, 1, 2], [0, -1, -1, -1]])  # -1 outside the mask: any value is ignored there
    tr = torch.tensor([[1.0, 0, 5.0, 0], [0, 0, 0, 0]])
    a = compute_advantages("turn_grpo", token_rewards=r, mask=m, group=torch.tensor([4, 4]), turn_index=ti,
                           turn_rewards=tr, lam=0.5, eps=0.0)
    s = 1 / math.sqrt(2)
    _close(a, [[1.5 * s, s, s, s], [-s, 0, 0, 0]])


def test_turn_grpo_equals_grpo_without_turn_rewards_or_with_one_turn_per_episode():
    r, m, g, ti, tr = _three_episodes()
    grpo = compute_advantages("grpo", token_rewards=r, mask=m, group=g)
    zero = compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=ti,
                              turn_rewards=torch.zeros_like(tr))
    one_turn = compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=torch.zeros_like(ti),
                                  turn_rewards=tr)
    assert torch.equal(zero, grpo) and torch.equal(one_turn, grpo)
    with_turns = compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=ti, turn_rewards=tr)
    assert not torch.equal(with_turns, grpo)


def test_turn_grpo_refuses_a_negative_turn_index_inside_the_mask():
    r, m, g, ti, tr = _three_episodes()
    ti = ti.clone()
    ti[1, 2] = -1
    with pytest.raises(ValueError, match=r"input 'turn_index': negative turn -1 at index \[1, 2\]"):
        compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=ti, turn_rewards=tr)
    with pytest.raises(ValueError, match="input 'turn_index' must be an integer tensor"):
        compute_advantages("turn_grpo", token_rewards=r, mask=m, group=g, turn_index=ti.float(), turn_rewards=tr)


@pytest.mark.parametrize("name", ["turn_grpo", "gigpo"])
def test_a_non_finite_turn_reward_on_a_sampled_token_is_an_error_and_ignored_elsewhere(name):
    r, m, g, ti, tr = _three_episodes()
    m = m.clone()
    m[2, 3] = 0.0
    bad = tr.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"'turn_rewards': non-finite value nan at index \[1, 2\]"):
        compute_advantages(name, token_rewards=r * m, mask=m, group=g, turn_index=ti, turn_rewards=bad)
    padded = tr.clone()
    padded[2, 3] = float("inf")
    a = compute_advantages(name, token_rewards=r * m, mask=m, group=g, turn_index=ti, turn_rewards=padded)
    assert torch.equal(a, compute_advantages(name, token_rewards=r * m, mask=m, group=g, turn_index=ti,
                                             turn_rewards=tr))


# ------------------------------------------------------------------------------------------------ gigpo
def _gigpo_fixture():
    """One group: E0 turns 0,1 in states s0,s1, outcome 1; E1 turns 0,1,2 in s0,s1,s2, turn 0 reward 0.5,
    outcome 0; E2 one turn in s0, outcome 1. Two tokens per turn (E2: one turn of 2 tokens)."""
    r = torch.tensor([[0, 0, 0, 1.0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0]])
    m = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0.0]])
    ti = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0]])
    tr = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0.5, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0.0]])
    keys = torch.tensor([[10, 10, 11, 11, -1, -1], [10, 10, 11, 11, 12, 12], [10, 10, -1, -1, -1, -1]])
    return r, m, torch.tensor([0, 0, 0]), ti, tr, keys


def test_gigpo_fixture_by_hand():
    r, m, g, ti, tr, keys = _gigpo_fixture()
    a = compute_advantages("gigpo", token_rewards=r, mask=m, group=g, turn_index=ti, turn_rewards=tr,
                           turn_key=keys, gamma=0.5, omega=1.0, eps=0.0)
    # A^E (grpo of outcomes 1, 0, 1): 1/sqrt(3), -2/sqrt(3), 1/sqrt(3).
    # Per-turn rewards (turn reward + outcome in the last turn): E0 [0, 1], E1 [0.5, 0, 0], E2 [1];
    # returns with gamma 0.5: E0 [0.5, 1], E1 [0.5, 0, 0], E2 [1].
    # Anchor s0 = {0.5, 0.5, 1}: mean 2/3, std sqrt(1/12): A^S = -1/sqrt(3), -1/sqrt(3), 2/sqrt(3).
    # Anchor s1 = {1 (E0), 0 (E1)}: A^S = +-1/sqrt(2). Anchor s2 = {E1} alone: 0.
    s2 = 1 / math.sqrt(2)
    _close(a, [[0, 0, 1 / R3 + s2, 1 / R3 + s2, 0, 0],
               [-R3, -R3, -2 / R3 - s2, -2 / R3 - s2, -2 / R3, -2 / R3],
               [R3, R3, 0, 0, 0, 0]])


def test_gigpo_equals_grpo_with_omega_zero_or_anchor_groups_of_one():
    r, m, g, ti, tr, keys = _gigpo_fixture()
    grpo = compute_advantages("grpo", token_rewards=r, mask=m, group=g)
    kw = dict(token_rewards=r, mask=m, group=g, turn_index=ti, turn_rewards=tr)
    assert torch.equal(compute_advantages("gigpo", **kw, turn_key=keys, omega=0.0), grpo)
    distinct = ti + 10 * torch.arange(3)[:, None]  # no two turns share a state: anchor groups of one
    assert torch.equal(compute_advantages("gigpo", **kw, turn_key=distinct), grpo)
    assert torch.equal(compute_advantages("gigpo", **kw), grpo)  # no keys: every turn its own state
    assert not torch.equal(compute_advantages("gigpo", **kw, turn_key=keys), grpo)


def test_gigpo_anchor_groups_do_not_cross_prompt_groups_and_norm_none_only_centres():
    r, m, _g, ti, tr, keys = _gigpo_fixture()
    kw = dict(token_rewards=r, mask=m, turn_index=ti, turn_rewards=tr, turn_key=keys, gamma=0.5, eps=0.0)
    alone = compute_advantages("gigpo", group=torch.tensor([0, 1, 2]), **kw)
    assert torch.equal(alone, torch.zeros_like(alone))  # every group and anchor group has one member
    a = compute_advantages("gigpo", group=torch.tensor([0, 0, 0]), norm="none", **kw)
    # A^E = outcome - mean = 1/3, -2/3, 1/3; A^S = return - anchor mean: s0 (0.5, 0.5, 1) -> -1/6, -1/6, 1/3;
    # s1 (1, 0) -> 0.5, -0.5.
    _close(a, [[1 / 6, 1 / 6, 5 / 6, 5 / 6, 0, 0], [-5 / 6, -5 / 6, -7 / 6, -7 / 6, -2 / 3, -2 / 3],
               [2 / 3, 2 / 3, 0, 0, 0, 0]])


def test_gigpo_refuses_a_turn_whose_tokens_carry_different_keys_and_bad_options():
    r, m, g, ti, tr, keys = _gigpo_fixture()
    keys = keys.clone()
    keys[1, 3] = 99
    with pytest.raises(ValueError, match=r"input 'turn_key': the tokens of turn 1 of episode row 1 carry different"):
        compute_advantages("gigpo", token_rewards=r, mask=m, group=g, turn_index=ti, turn_key=keys)
    with pytest.raises(ValueError, match="gigpo: unknown norm 'x'; valid: none, std"):
        compute_advantages("gigpo", token_rewards=r, mask=m, group=g, norm="x")
    with pytest.raises(ValueError, match=r"gigpo: gamma must be in \[0, 1\], got 1.5"):
        compute_advantages("gigpo", token_rewards=r, mask=m, group=g, gamma=1.5)


# ------------------------------------------------------------------------------------------------ registry inputs
def test_trainer_inputs_are_not_user_options():
    assert ESTIMATORS.options("turn_grpo") == ("lam", "eps")
    assert ESTIMATORS.inputs("gigpo") == ("turn_rewards", "turn_index", "turn_key")
    assert ESTIMATORS.meta("turn_grpo")["needs"] == ()  # without them it runs as on single-turn rollouts (grpo)
    assert ESTIMATORS.meta("gae")["needs"] == ("values",) and ESTIMATORS.inputs("gae") == ()
    with pytest.raises(ValueError, match=r"^rl.estimator_options: unknown option 'turn_index' for advantage "
                                         r"estimator 'turn_grpo'; valid: eps, lam$"):
        ESTIMATORS.check("turn_grpo", {"turn_index": [0]}, field="rl.estimator_options")
    with pytest.raises(ValueError, match="unknown option 'turn_key'"):
        ESTIMATORS.validate("gigpo", {"turn_key": 1})


def test_registry_inputs_meta_is_left_out_of_options():
    r = Registry("thing", reserved=("x",))

    @r.register("a", inputs=("aux",))
    def a(*, x, aux=None, depth: int = 1):
        return depth

    assert r.options("a") == ("depth",) and r.inputs("a") == ("aux",) and r.meta("a")["inputs"] == ("aux",)
    with pytest.raises(ValueError, match=r"unknown option 'aux' for thing 'a'; valid: depth"):
        r.check("a", {"aux": 1})
    with pytest.raises(ValueError, match="thing 'b': inputs must be a tuple of parameter names"):
        r.register("b", inputs="aux")(a)


# ------------------------------------------------------------------------------------------------ the episode view
def test_episode_view_concatenates_sampled_tokens_in_row_order_and_scatters_back():
    # Episode 5: row 1 (order 0) has sampled cols 0, 1, env col 2, sampled col 3; row 0 (order 1) sampled col 0.
    # Episode 2: row 2, sampled cols 0, 1.
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 0, 0]])
    x = torch.tensor([[40, 41, 42, 43], [10, 11, 12, 13], [20, 21, 22, 23]])
    view = EpisodeView(mask, torch.tensor([5, 5, 2]), torch.tensor([1, 0, 0]))
    assert view.ids.tolist() == [2, 5] and not view.identity
    assert view.gather(x).tolist() == [[20, 21, 0, 0], [10, 11, 13, 40]]
    assert view.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert view.scatter(view.gather(x)).tolist() == [[40, 0, 0, 0], [10, 11, 0, 13], [20, 21, 0, 0]]
    with pytest.raises(ValueError, match="group: the rows of episode 5 disagree"):
        view.per_episode(torch.tensor([0, 1, 1]), "group")
    assert view.per_episode(torch.tensor([7, 7, 3])).tolist() == [3, 7]
    with pytest.raises(ValueError, match="order: rows 0 and 1 of episode 5 both have order 0"):
        EpisodeView(mask, torch.tensor([5, 5, 2]), torch.tensor([0, 0, 0]))
    assert EpisodeView(torch.tensor([[1, 1, 0], [1, 0, 0]])).identity


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_single_row_episodes_give_exactly_compute_advantages(name):
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([3, 5, 1, 4, 5, 2])
    m = (torch.arange(5)[None, :] < lengths[:, None]).float()
    r = torch.zeros(6, 5)
    r[torch.arange(6), lengths - 1] = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.25])
    inputs = {"values": torch.randn(6, 5, generator=gen), "baseline": torch.rand(6, generator=gen),
              "components": torch.rand(6, 2, generator=gen), "weights": torch.tensor([1.0, 0.5]),
              "step_rewards": torch.rand(6, 5, generator=gen),
              "step_mask": m, "turn_rewards": torch.zeros(6, 5), "turn_index": torch.zeros(6, 5, dtype=torch.long),
              "turn_key": torch.zeros(6, 5, dtype=torch.long)}
    kw = {k: inputs[k] for k in (*ESTIMATORS.meta(name)["needs"], *ESTIMATORS.inputs(name))}
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    expected = compute_advantages(name, token_rewards=r, mask=m, group=g, **kw)
    got = episode_advantages(name, token_rewards=r, mask=m, group=g, episode=torch.tensor([1, 2, 3, 4, 5, 6]),
                             order=torch.zeros(6, dtype=torch.long), **kw)
    assert torch.equal(got, expected)


def test_critic_returns_bootstrap_across_environment_tokens_and_rows():
    # As in the gae test of test_split_invariance: V = [1, 2, (env), 3], outcome 1, gamma = 1, lam = 0.5:
    # A = [1, 0, -, -2], so the returns A + V = [2, 2, 0, 1]; the same episode split into two rows gives the same.
    critic = ValueModel.__new__(ValueModel)  # returns() reads no model
    merged = critic.returns(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), torch.tensor([[1.0, 1.0, 0.0, 1.0]]),
                            torch.tensor([0]), torch.tensor([[1.0, 2.0, 0.0, 3.0]]), gamma=1.0, lam=0.5)
    assert merged.tolist() == [[2.0, 2.0, 0.0, 1.0]]
    split = critic.returns(torch.tensor([[0.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
                           torch.tensor([0, 0]), torch.tensor([[1.0, 2.0], [3.0, 0.0]]),
                           episode=torch.tensor([4, 4]), order=torch.tensor([0, 1]), gamma=1.0, lam=0.5)
    assert split.tolist() == [[2.0, 2.0], [1.0, 0.0]]


# ------------------------------------------------------------------------------------------------ aggregations
def test_seq_mean_aggregations_count_an_episode_once():
    # rows 0 and 1 are one episode (3 tokens, losses 1, 1, 4), row 2 another (2 tokens, losses 2, 2)
    loss = torch.tensor([[1.0, 1.0, 0.0], [4.0, 0.0, 0.0], [2.0, 2.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]])
    ep = torch.tensor([0, 0, 1])
    assert aggregate(loss, m, "seq-mean-token-mean", episode=ep).item() == pytest.approx((6 / 3 + 4 / 2) / 2)
    assert aggregate(loss, m, "seq-mean-token-mean").item() == pytest.approx((1 + 4 + 2) / 3)  # rows, as before
    assert aggregate(loss, m, "seq-mean-token-sum", episode=ep).item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, m, "seq-mean-token-sum-norm", episode=ep, max_len=5).item() == pytest.approx(10 / (2 * 5))
    assert aggregate(loss, m, "token-mean", episode=ep).item() == pytest.approx(10 / 5)


def test_gspo_takes_the_sequence_ratio_over_the_episode_rows():
    # One episode in two rows: d = log-ratio 0.3 on two tokens of row 0 and -0.6 on one token of row 1:
    # s = exp((0.3 + 0.3 - 0.6) / 3) = 1 (no clip), A = 1: every token's loss is -1.
    old = torch.zeros(2, 2)
    lp = torch.tensor([[0.3, 0.3], [-0.6, 0.0]], requires_grad=True)
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    per_token, stats = POLICY_LOSSES["gspo"](logprobs=lp, old_logprobs=old, advantages=torch.ones(2, 2), mask=m,
                                             episode=torch.tensor([9, 9]))
    _close(per_token.detach(), [[-1, -1], [-1, 0]])
    assert stats["policy/ratio_mean"] == pytest.approx(1.0)
    rows, _ = POLICY_LOSSES["gspo"](logprobs=lp, old_logprobs=old, advantages=torch.ones(2, 2), mask=m)
    assert not torch.allclose(rows, per_token)  # per row the ratios are exp(0.3) and exp(-0.6), clipped


def test_episode_ids_are_refused_by_a_loss_that_cannot_take_them():
    @POLICY_LOSSES.register("rows_only_test")
    def rows_only(*, logprobs, old_logprobs, advantages, mask):
        return -advantages * logprobs * mask, {}

    try:
        one = torch.zeros(1, 1)
        loss, _ = compute_policy_loss("rows_only_test", logprobs=one, old_logprobs=one, advantages=one,
                                      mask=torch.ones(1, 1))
        assert loss.item() == 0.0
        with pytest.raises(ValueError, match="policy loss 'rows_only_test' takes no 'episode' input"):
            compute_policy_loss("rows_only_test", logprobs=one, old_logprobs=one, advantages=one,
                                mask=torch.ones(1, 1), episode=torch.tensor([0]))
    finally:
        POLICY_LOSSES.unregister("rows_only_test")
    assert set(AGGREGATIONS.options("seq-mean-token-sum-norm")) == {"max_len"}  # episode is an input


# ------------------------------------------------------------------------------------------------ minibatches
def test_episode_minibatches_hold_whole_episodes():
    episode = torch.tensor([3, 1, 3, 2, 1, 5, 3])
    batches = episode_minibatches(episode, 2, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(batches).tolist()) == list(range(7))
    seen = [set(episode[b].tolist()) for b in batches]
    assert [len(s) for s in seen] == [2, 2]  # 4 episodes, 2 per minibatch
    assert seen[0].isdisjoint(seen[1])
    for b in batches:  # every row of each episode in the minibatch is there
        for e in set(episode[b].tolist()):
            assert set((episode == e).nonzero().flatten().tolist()) <= set(b.tolist())
    # without episode ids: the trainer's randperm(n).split(size), draw for draw
    same = episode_minibatches(None, 3, torch.Generator().manual_seed(4), n=7)
    expected = torch.randperm(7, generator=torch.Generator().manual_seed(4)).split(3)
    assert [b.tolist() for b in same] == [b.tolist() for b in expected]


# ------------------------------------------------------------------------------------------------ inputs from rollouts
def test_episode_tensors_from_rollouts():
    # Episode 7 in two rows: row A = turn 0 (sampled 2 tokens) + 1 tool token + turn 1 (1 token); row B = turn 2.
    a = Rollout("p", [1], "x", [5, 6, 9, 7], [-0.1, -0.2, 0.0, -0.3], loss_mask=[1, 1, 0, 1],
                turns=[(0, 2), (3, 4)], turn_rewards=[0.5, 0.25], turn_keys=["s0", "s1"], episode_id=7)
    b = Rollout("p", [1], "y", [8, 2], [-0.4, -0.5], loss_mask=[1, 1], turns=[(0, 2)], turn_rewards=[1.0],
                turn_keys=["s0"], first_turn=2, episode_id=7, termination="stop")
    single = Rollout("q", [1], "z", [3], [-0.1])
    t = episode_tensors([a, b, single], 5)
    assert t["sampled"].tolist() == [[1, 1, 0, 1, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert t["episode"].tolist() == [7, 7, 8] and t["order"].tolist() == [0, 2, 0]
    assert t["turn_index"].tolist() == [[0, 0, -1, 1, -1], [2, 2, -1, -1, -1], [0, -1, -1, -1, -1]]
    assert t["turn_rewards"].tolist() == [[0, 0.5, 0, 0.25, 0], [0, 1.0, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert t["turn_key"].tolist() == [[0, 0, -1, 1, -1], [0, 0, -1, -1, -1], [-2, -1, -1, -1, -1]]
    with pytest.raises(ValueError, match="row 0: completion of 4 tokens is longer than the batch width 3"):
        episode_tensors([a], 3)
