"""Split-invariance: an episode's advantages and its weight in the loss do not depend on how many rows it became.

Random episodes (random turns, environment-token spans between turns and after the last, rewards, turn rewards,
values, step rewards, state keys) are laid out twice: merged (one row per episode) and split (each episode cut at
turn boundaries into 1-3 rows, the rows shuffled; the environment tokens between turns are in both forms). Every
registered estimator must give identical advantages on every sampled token; every registered policy loss x
aggregation, trained in minibatches of whole episodes for 2 epochs on a leaf tensor standing in for the model's
per-token log-probs, must give the same gradients (to 1e-6).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from rewardlab.rl.advantages import ESTIMATORS, compute_advantages
from rewardlab.rl.episodes import episode_advantages, episode_minibatches
from rewardlab.rl.losses import AGGREGATIONS, POLICY_LOSSES, aggregate, compute_policy_loss, kl_penalty

SEEDS = range(6)
#: values given to the estimator options that declare them (discounting makes env-token handling visible)
OPTIONS = {"gamma": 0.9, "lam": 0.8}


@dataclass
class Layout:
    """One form of a batch of episodes: row tensors [R, T] and where each episode's sampled tokens sit."""

    mask: torch.Tensor  # [R, T] 1 on sampled tokens
    episode: torch.Tensor  # [R]
    order: torch.Tensor  # [R]
    group: torch.Tensor  # [R]
    positions: list[list[tuple[int, int]]]  # per episode, (row, col) of its sampled tokens in order
    env_positions: list[tuple[int, int]]  # (row, col) of every environment token


def _episodes(rng: random.Random, n_episodes: int):
    """Per episode: a list of turns, each (sampled length, environment tokens after it)."""
    out = []
    for _ in range(n_episodes):
        turns = [(rng.randint(1, 4), rng.randint(0, 3)) for _ in range(rng.randint(1, 4))]
        out.append(turns)
    out[0] = [(2, 1), (3, 2), (1, 0)]  # at least one multi-turn episode with environment tokens
    return out


def _layout(episodes, ids, groups, rows_of: list[list[list[int]]], rng: random.Random | None) -> Layout:
    """Lay out the episodes: rows_of[e] = the turn indices of each row of episode e. rng shuffles the rows."""
    rows = []  # (episode index, order, [(kind, turn, j)]) where kind is "s" (sampled) or "e" (environment)
    for e, turns in enumerate(episodes):
        for part in rows_of[e]:
            tokens = []
            for k in part:
                length, env = turns[k]
                tokens += [("s", k, j) for j in range(length)] + [("e", k, j) for j in range(env)]
            rows.append((e, part[0], tokens))
    if rng is not None:
        rng.shuffle(rows)
    width = max(len(t) for _, _, t in rows) + 1  # one padding column at least
    mask = torch.zeros(len(rows), width)
    positions: list[list[tuple[int, int]]] = [[] for _ in episodes]
    env_positions = []
    for i, (e, _, tokens) in enumerate(rows):
        for c, (kind, _k, _j) in enumerate(tokens):
            if kind == "s":
                mask[i, c] = 1.0
                positions[e].append((i, c))
            else:
                env_positions.append((i, c))
    # a row's tokens are in episode order and rows of an episode are ordered by their first turn
    for e in range(len(episodes)):
        positions[e].sort(key=lambda rc: (rows[rc[0]][1], rc[1]))
    return Layout(mask, torch.tensor([ids[e] for e, _, _ in rows]), torch.tensor([o for _, o, _ in rows]),
                  torch.tensor([groups[e] for e, _, _ in rows]), positions, env_positions)


def _forms(seed: int):
    rng = random.Random(seed)
    n_episodes = 8
    episodes = _episodes(rng, n_episodes)
    ids = rng.sample(range(100, 200), n_episodes)  # ids in no particular order
    groups = [e // 4 for e in range(n_episodes)]  # two prompt groups of four episodes
    merged_rows = [[list(range(len(t)))] for t in episodes]
    split_rows = []
    for turns in episodes:
        k = len(turns)
        cuts = sorted(rng.sample(range(1, k), min(k - 1, rng.randint(0, 2)))) if k > 1 else []
        bounds = [0, *cuts, k]
        split_rows.append([list(range(a, b)) for a, b in zip(bounds, bounds[1:])])
    assert any(len(r) > 1 for r in split_rows), "some episode must be split"
    merged = _layout(episodes, ids, groups, merged_rows, None)
    split = _layout(episodes, ids, groups, split_rows, rng)
    return episodes, merged, split


def _token_data(episodes, gen: torch.Generator):
    """Per episode, its sampled tokens' data in order (a dict of 1-D tensors), and per-episode values."""
    data = []
    for turns in episodes:
        n = sum(length for length, _ in turns)
        turn_of = torch.tensor([k for k, (length, _) in enumerate(turns) for _ in range(length)])
        last_of_turn = torch.zeros(n)
        ends = torch.cumsum(torch.tensor([length for length, _ in turns]), 0) - 1
        last_of_turn[ends] = 1.0
        outcome = torch.zeros(n)
        outcome[-1] = float(torch.randint(0, 3, (1,), generator=gen)) / 2
        keys = torch.randint(0, 2, (len(turns),), generator=gen)  # few states, so anchor groups form
        data.append({
            "token_rewards": outcome,
            "turn_rewards": last_of_turn * torch.randint(0, 3, (n,), generator=gen).float() / 2,
            "turn_index": turn_of,
            "turn_key": keys[turn_of],
            "values": torch.randn(n, generator=gen),
            "step_rewards": torch.rand(n, generator=gen),
            "step_mask": (torch.rand(n, generator=gen) < 0.4).float(),
            "logprobs": -torch.rand(n, generator=gen) - 0.1,
            "old_logprobs": -torch.rand(n, generator=gen) - 0.1,
            "ref_logprobs": -torch.rand(n, generator=gen) - 0.1,
        })
    per_episode = {"baseline": torch.rand(len(episodes), generator=gen),
                   "components": torch.rand(len(episodes), 2, generator=gen)}
    return data, per_episode


def _place(layout: Layout, data, key: str, gen: torch.Generator) -> torch.Tensor:
    """A [R, T] tensor holding data[e][key] at episode e's sampled positions and random junk everywhere else
    (the junk differs between the forms, so a value read off a sampled token shows up as a difference)."""
    like = data[0][key]
    out = torch.randn(layout.mask.shape, generator=gen) * 7
    if not like.dtype.is_floating_point:
        out = torch.randint(-5, 50, layout.mask.shape, generator=gen)
    for e, pos in enumerate(layout.positions):
        rows, cols = torch.tensor(pos).T
        out[rows, cols] = data[e][key].to(out.dtype)
    return out


def _inputs(layout: Layout, data, per_episode, gen: torch.Generator) -> dict[str, torch.Tensor]:
    row_e = [next(e for e, pos in enumerate(layout.positions) if any(r == i for r, _ in pos))
             for i in range(layout.mask.shape[0])]
    token = {k: _place(layout, data, k, gen) for k in data[0]}
    token["token_rewards"] = token["token_rewards"] * layout.mask  # the outcome: 0 off sampled tokens
    return {**token, "baseline": per_episode["baseline"][row_e], "components": per_episode["components"][row_e],
            "weights": torch.tensor([1.0, 0.5])}


def _on_sampled(layout: Layout, x: torch.Tensor, e: int) -> torch.Tensor:
    rows, cols = torch.tensor(layout.positions[e]).T
    return x[rows, cols]


def _estimator_inputs(name: str, inputs: dict) -> dict:
    needs = (*ESTIMATORS.meta(name)["needs"], *ESTIMATORS.inputs(name))
    declared = ESTIMATORS.options(name)
    return {**{k: inputs[k] for k in needs}, **{k: v for k, v in OPTIONS.items() if k in declared}}


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("seed", SEEDS)
def test_every_estimator_gives_identical_advantages_merged_and_split(seed, name):
    episodes, merged, split = _forms(seed)
    gen = torch.Generator().manual_seed(seed)
    data, per_episode = _token_data(episodes, gen)
    forms = [(merged, _inputs(merged, data, per_episode, gen)), (split, _inputs(split, data, per_episode, gen))]
    out = []
    for layout, inputs in forms:
        a = episode_advantages(name, token_rewards=inputs["token_rewards"], mask=layout.mask, group=layout.group,
                               episode=layout.episode, order=layout.order, **_estimator_inputs(name, inputs))
        assert torch.all(a[layout.mask == 0] == 0), name  # nothing on environment tokens or padding
        out.append(a)
    for e in range(len(episodes)):
        assert torch.equal(_on_sampled(merged, out[0], e), _on_sampled(split, out[1], e)), (name, e)
    assert bool(out[0].abs().sum() > 0), name  # the comparison is not 0 == 0


def test_turn_estimators_see_turns_and_states_in_the_random_episodes():
    # The invariance above would be vacuous for turn_grpo/gigpo if their turn terms were 0 on these episodes.
    episodes, merged, _ = _forms(0)
    data, per_episode = _token_data(episodes, torch.Generator().manual_seed(0))
    inputs = _inputs(merged, data, per_episode, torch.Generator().manual_seed(1))
    kw = dict(token_rewards=inputs["token_rewards"], mask=merged.mask, group=merged.group, episode=merged.episode)
    grpo = episode_advantages("grpo", **kw)
    for name in ("turn_grpo", "gigpo"):
        a = episode_advantages(name, **kw, **_estimator_inputs(name, inputs))
        assert not torch.equal(a, grpo), name


def test_gae_on_a_split_episode_bootstraps_across_environment_tokens():
    # Episode: turn 0 = sampled tokens at columns 0, 1; environment token at 2; turn 1 = sampled token at 3.
    # V = [1, 2, (env), 3], outcome 1 on the last token, gamma = 1, lam = 0.5, no whitening:
    # delta_0 = V_1 - V_0 = 1, delta_1 = V_3 - V_1 = 1 (the next *sampled* token's value), delta_3 = 1 - V_3 = -2;
    # A_3 = -2, A_1 = 1 + 0.5 * -2 = 0, A_0 = 1 + 0.5 * 0 = 1.
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    values = torch.tensor([[1.0, 2.0, 99.0, 3.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    options = dict(values=values, gamma=1.0, lam=0.5, whiten=False)
    a = episode_advantages("gae", token_rewards=rewards, mask=mask, group=torch.tensor([0]), **options)
    assert a.tolist() == [[1.0, 0.0, 0.0, -2.0]]
    # the rows directly treat the turn end as terminal (V after column 1 is the environment token's, zeroed)
    naive = compute_advantages("gae", token_rewards=rewards, mask=mask, group=torch.tensor([0]), **options)
    assert naive[0, 1].item() != 0.0
    # the same episode split into two rows, the second row first in the batch: same advantages
    split_mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    split = episode_advantages("gae", token_rewards=torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]),
                               mask=split_mask, group=torch.tensor([0, 0]), episode=torch.tensor([7, 7]),
                               order=torch.tensor([1, 0]), values=torch.tensor([[3.0, 0.0, 0.0], [1.0, 2.0, 0.0]]),
                               gamma=1.0, lam=0.5, whiten=False)
    assert split.tolist() == [[-2.0, 0.0, 0.0], [1.0, 0.0, 0.0]]


def _train(layout: Layout, inputs, advantages, loss: str, agg: str, theta0: torch.Tensor, starts: list[int]):
    """2 epochs of SGD on theta (one leaf entry per sampled token of every episode, concatenated) through
    minibatches of whole episodes; returns each update's gradient of theta."""
    theta = theta0.clone()
    grads = []
    index = torch.zeros(layout.mask.shape, dtype=torch.long)  # theta entry of each sampled position
    for e, pos in enumerate(layout.positions):
        rows, cols = torch.tensor(pos).T
        index[rows, cols] = torch.arange(starts[e], starts[e] + len(pos))
    on = layout.mask > 0
    generator = torch.Generator().manual_seed(123)
    options = {"max_len": 8} if "max_len" in (AGGREGATIONS.options(agg) or ()) else {}
    for _ in range(2):
        for idx in episode_minibatches(layout.episode, 3, generator):
            leaf = theta.clone().requires_grad_(True)
            junk = inputs["logprobs"][idx]  # environment/padding positions: values that must not matter
            logprobs = torch.where(on[idx], leaf[index[idx]], junk)
            m, ep = layout.mask[idx], layout.episode[idx]
            value, _ = compute_policy_loss(loss, logprobs=logprobs, old_logprobs=inputs["old_logprobs"][idx],
                                           advantages=advantages[idx], mask=m, agg=agg, episode=ep, **options)
            kl = aggregate(kl_penalty("k3", logprobs, inputs["ref_logprobs"][idx]), m, agg, episode=ep, **options)
            entropy = aggregate(-logprobs.exp() * logprobs, m, agg, episode=ep, **options)  # a per-token stand-in
            (value + 0.1 * kl - 0.01 * entropy).backward()
            grads.append(leaf.grad.clone())
            theta = theta - 0.5 * leaf.grad
    return grads


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_every_loss_and_aggregation_gives_the_same_gradients_merged_and_split(seed, loss):
    episodes, merged, split = _forms(seed)
    gen = torch.Generator().manual_seed(seed)
    data, per_episode = _token_data(episodes, gen)
    forms = [(merged, _inputs(merged, data, per_episode, gen)), (split, _inputs(split, data, per_episode, gen))]
    lengths = [len(p) for p in merged.positions]
    starts = [sum(lengths[:e]) for e in range(len(lengths))]
    theta0 = torch.cat([d["logprobs"] for d in data])
    for agg in AGGREGATIONS:
        runs = []
        for layout, inputs in forms:
            adv = episode_advantages("turn_grpo", token_rewards=inputs["token_rewards"], mask=layout.mask,
                                     group=layout.group, episode=layout.episode, order=layout.order,
                                     turn_rewards=inputs["turn_rewards"], turn_index=inputs["turn_index"])
            runs.append(_train(layout, inputs, adv, loss, agg, theta0, starts))
        assert len(runs[0]) == len(runs[1]) >= 4, agg  # 2 epochs of at least 2 minibatches each
        for g_merged, g_split in zip(*runs):
            assert g_merged.abs().sum() > 0, (loss, agg)
            torch.testing.assert_close(g_split, g_merged, rtol=0, atol=1e-6, msg=f"{loss} x {agg}")


def test_without_episode_ids_a_split_episode_is_weighed_by_its_rows():
    # The negative control: seq-mean-token-mean with each row its own sequence gives a split episode more weight.
    episodes, merged, split = _forms(0)
    gen = torch.Generator().manual_seed(0)
    data, per_episode = _token_data(episodes, gen)
    inputs = [_inputs(merged, data, per_episode, gen), _inputs(split, data, per_episode, gen)]
    losses = []
    for (layout, x), episode in (((merged, inputs[0]), None), ((split, inputs[1]), None),
                                 ((split, inputs[1]), split.episode)):
        per_token = torch.where(layout.mask > 0, -x["logprobs"], 0.0)
        losses.append(aggregate(per_token, layout.mask, "seq-mean-token-mean", episode=episode))
    assert not torch.isclose(losses[0], losses[1])
    torch.testing.assert_close(losses[2], losses[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_environment_positions_get_no_gradient_and_change_nothing(loss):
    episodes, merged, split = _forms(1)
    gen = torch.Generator().manual_seed(1)
    data, per_episode = _token_data(episodes, gen)
    x = _inputs(split, data, per_episode, gen)
    m, ep = split.mask, split.episode
    env = torch.zeros_like(m, dtype=torch.bool)
    for r, c in split.env_positions:
        env[r, c] = True
    assert env.any()
    adv = episode_advantages("grpo", token_rewards=x["token_rewards"], mask=m, group=split.group, episode=ep)
    results = []
    for shift in (0.0, 5.0):
        logprobs = (x["logprobs"] + shift * env).requires_grad_(True)
        ref = x["ref_logprobs"] - shift * env
        total, parts = 0.0, []
        for agg in AGGREGATIONS:
            old = x["old_logprobs"] + 3 * shift * env
            value, stats = compute_policy_loss(loss, logprobs=logprobs, old_logprobs=old, advantages=adv, mask=m,
                                               agg=agg, episode=ep)
            kl = aggregate(kl_penalty("k3", logprobs, ref), m, agg, episode=ep)
            count = aggregate(torch.ones_like(m), m, agg, episode=ep)  # the aggregation's token count
            entropy = aggregate(-logprobs.exp() * logprobs, m, agg, episode=ep)
            parts += [value.item(), kl.item(), count.item(), entropy.item(), stats["policy/ratio_mean"]]
            total = total + value + kl + entropy
        total.backward()
        assert torch.all(logprobs.grad[env] == 0), loss
        assert logprobs.grad[m > 0].abs().sum() > 0
        results.append(parts)
    assert results[0] == results[1], loss
