"""The RL trainer on environment tasks: episodes sampled, scored once, credited on the episode view, logged as
episode records that replay into the training rows, resumed exactly; and an episode split into rows gets the credit
it gets as one row."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import TINY_ARCH, TINY_OVERRIDES

from rewardlab.config import TrainConfig, load_config
from rewardlab.envs import replay
from rewardlab.policy import load_policy, rollout_batch
from rewardlab.rl.credit import assign_credit
from rewardlab.rl.rollouts import ScoredEpisode, StepBatch
from rewardlab.rl.specs import resolve_specs
from rewardlab.rl.trainer import train
from rewardlab.types import Rollout, RewardOutput

import episode_envs  # noqa: E402,F401  (registers env:test_turns and its reward)


def _config(tmp_path, out, *overrides):
    return load_config(TrainConfig, None, [
        "task.spec=env:test_turns", f"out={tmp_path / out}", *TINY_OVERRIDES, "rl.prompts_per_step=2",
        "rl.group_size=4", "rl.sampling.max_new_tokens=4", "env.max_turns=3", "env.max_episode_tokens=40", "rl.lr=1e-2",
        *overrides])


def _lines(path, name):
    return [json.loads(line) for line in (path / name).read_text().splitlines()]


def test_an_environment_task_trains_on_episodes_logs_their_figures_and_records_that_replay(tmp_path):
    train(_config(tmp_path, "run", "rl.steps=2", "rl.estimator=turn_grpo", "rl.epochs=2", "rl.minibatch_size=4"),
          show_progress=False)
    metrics = _lines(tmp_path / "run", "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout/generated"] == 8.0  # episodes, each counted once
        assert 1.0 <= m["episode/turns_mean"] <= 3.0
        ends = sum(v for k, v in m.items() if k.startswith("episode/termination/"))
        assert ends == pytest.approx(1.0)
        assert m["tool/call_rate"] == 0.0  # the environment runs no tools
    records = _lines(tmp_path / "run", "samples.jsonl")
    assert len(records) == 16 and all(r["kept"] for r in records)
    several = [r for r in records if r["n_turns"] > 1]
    assert several, "the random model ended every episode in its first turn"
    for rec in several:
        rows = replay(rec)
        assert sum(len(r.turns) for r in rows) == rec["n_turns"] == len(rec["advantages"])
        row = rows[0]
        observed = [t for t, m in enumerate(row.loss_mask) if not m]
        assert observed and all(row.logprobs[t] == 0.0 for t in observed)  # observation tokens: not sampled
        assert rows[-1].completion == rec["completion"]  # the final model turn's text
        # the observations are in the row's ids: "<o>1</o>" after the first turn
        first_end = row.turns[0][1]
        assert row.completion_ids[first_end:first_end + 3] == [ord("<") - 28, ord("o") - 28, ord(">") - 28]


@pytest.mark.slow
def test_a_resumed_agent_run_logs_what_the_uninterrupted_run_logs(tmp_path):
    extra = ["save_every=1", "rl.epochs=2", "rl.minibatch_size=4", "rl.estimator=gigpo"]
    train(_config(tmp_path, "a", "rl.steps=3", *extra), show_progress=False)
    train(_config(tmp_path, "b", "rl.steps=2", *extra), show_progress=False)
    summary = train(_config(tmp_path, "b", "rl.steps=3", *extra), mode="resume", show_progress=False)
    assert summary["resumed_from"] == 2
    a, b = _lines(tmp_path / "a", "metrics.jsonl"), _lines(tmp_path / "b", "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3]
    keys = {k for k in a[2] if not k.startswith("time/")}
    assert keys == {k for k in b[2] if not k.startswith("time/")}
    for k in sorted(keys):
        assert b[2][k] == pytest.approx(a[2][k], abs=1e-6), k
    step3 = [r for r in _lines(tmp_path / "a", "samples.jsonl") if r["step"] == 3]
    assert step3 == [r for r in _lines(tmp_path / "b", "samples.jsonl") if r["step"] == 3]


# ---------------------------------------------------------------- split rows get the credit of one row
def _lay_out(turns, obs):
    """Model turns `turns` (lists of ids) with observation k after turn k: (ids, loss mask, turn spans)."""
    ids, mask, spans = [], [], []
    for k, t in enumerate(turns):
        spans.append((len(ids), len(ids) + len(t)))
        ids += t
        mask += [1] * len(t)
        if k < len(obs):
            ids += obs[k]
            mask += [0] * len(obs[k])
    return ids, mask, spans


def _episode(eid, group, turns, obs, *, split):
    """An episode of model turns `turns` (lists of ids) with observations `obs` between them, as one row or with a
    new row after the first observation (its prompt the history so far)."""
    prompt = [1, 40, 41]
    parts = [(prompt, turns, obs, 0)] if not split else [(prompt, turns[:1], obs[:1], 0),
                                                         (prompt + [7] + turns[0] + obs[0], turns[1:], obs[1:], 1)]
    rows = []
    for i, (p, ts, os, first) in enumerate(parts):
        ids, mask, spans = _lay_out(ts, os)
        last = i == len(parts) - 1
        rows.append(Rollout("p", p, "c", ids, [-0.5 * m for m in mask], loss_mask=mask, turns=spans,
                            turn_rewards=[0.1 * (first + k + 1) for k in range(len(ts))], episode_id=eid,
                            group=group, termination="stop" if last else None, first_turn=first,
                            row={"answer": "1"}))
    return rows


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "turn_grpo", "gigpo"])
def test_an_episode_split_into_rows_gets_the_credit_it_gets_as_one_row(estimator):
    policy = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    specs = [(0, 0, [[50, 51], [52], [53, 2]], [[60, 61], [62]]), (1, 0, [[54], [55, 56, 2]], [[63]]),
             (2, 1, [[57, 58], [59, 2]], [[64, 65, 66]]), (3, 1, [[70], [71], [72, 2]], [[67], [68]])]
    scores = [1.0, 0.0, 0.5, 0.25]
    cfg = load_config(TrainConfig, None, [f"rl.estimator={estimator}"])
    state = SimpleNamespace(cfg=cfg, specs=resolve_specs(cfg), policy=policy, reference=None, critic=None, reward=None,
                            episodes=object())

    def credit(split):
        episodes = [_episode(e, g, t, o, split=split) for e, g, t, o in specs]
        batch = StepBatch([ScoredEpisode(tuple(rows), RewardOutput(s)) for rows, s in zip(episodes, scores)],
                          kept=list(range(len(episodes))))
        c = assign_credit(state, batch)
        # each episode's advantages on its sampled tokens, in order
        per_episode = {}
        for i, row in enumerate(c.rows):
            per_episode.setdefault(row.episode_id, []).extend(
                c.advantages[i, t].item() for t, m in enumerate(row.loss_mask) if m)
            assert all(c.advantages[i, t] == 0 for t, m in enumerate(row.loss_mask) if not m)
            assert all(c.loss_mask[i, t] == m for t, m in enumerate(row.loss_mask))
        return per_episode, c

    merged, one = credit(False)
    split, two = credit(True)
    assert len(two.rows) == 8 and len(one.rows) == 4
    assert merged == split
    assert any(v != 0 for adv in merged.values() for v in adv)
    # the outcome sits on the last sampled token of the episode's last row (not on an observation)
    packed, _ = rollout_batch(policy, two.rows)
    assert packed.completion_ids.shape[0] == 8
