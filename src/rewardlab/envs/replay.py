"""The samples.jsonl record of one episode (`episode_record`) and the rollouts rebuilt from it (`replay`).

A record holds everything the training rows were built from, so `replay(episode_record(rows))` gives rollouts whose
batch tensors (`rewardlab.policy.rollout_batch`, the loss masks, the turns) equal those of the live ones:

    {"episode_id": int, "group": int, "row": {task row}, "termination": str, "truncated": bool,
     "completion": str (the episode's final model turn), "messages": [the whole transcript],
     "n_turns": int (model turns, across rows), "tool_calls": [per turn, the calls],
     "turn_rewards": [per turn, float], "turn_keys": [per turn, str],
     "reward": float | None, "components": {name: float}, "error": str | None,   (the reward output, when given)
     "advantages": [per turn, float] | None,
     "rows": [{"prompt": str, "prompt_ids": [int], "completion": str, "completion_ids": [int],
               "loss_mask": [0 | 1], "logprobs": [float], "turns": [[start, end], ...],
               "first_turn": int, "n_messages": int (the transcript length at the row's end)}, ...]}

Per-turn lists (tool calls, turn rewards and keys, advantages) run over the episode's turns in order, across rows;
row r owns turns first_turn .. first_turn + len(turns) - 1. Log-probs are stored as JSON floats (Python's shortest
round-trip repr), so they come back bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rewardlab.types import RewardOutput, Rollout

#: The keys every episode record has, and those of each of its rows.
RECORD_KEYS = ("episode_id", "group", "row", "termination", "messages", "tool_calls", "turn_rewards", "turn_keys",
               "rows")
ROW_KEYS = ("prompt", "prompt_ids", "completion", "completion_ids", "loss_mask", "logprobs", "turns", "first_turn",
            "n_messages")


def episode_record(rollouts: Sequence[Rollout], reward_output: RewardOutput | None = None,
                   advantages_per_turn: Sequence[float] | None = None) -> dict[str, Any]:
    """The JSON-serialisable samples.jsonl record of one episode (the module doc lists its keys).

    Args:
        rollouts: the episode's rows, in order (as `run_episodes` returns them): one episode_id, the last row with
            the termination.
        reward_output: the episode's reward (called once per episode); stored as reward, components, error and
            step_scores (when it has them).
        advantages_per_turn: one advantage per model turn of the episode (across rows), e.g. each turn's
            advantage on its first sampled token.
    Raises:
        ValueError: no rollouts, rows of different episodes, a termination on a row that is not the last or none
            on the last, or advantages of another length than the episode's turns.
    """
    if not rollouts:
        raise ValueError("episode_record: no rollouts")
    ids = {r.episode_id for r in rollouts}
    if len(ids) != 1:
        raise ValueError(f"episode_record: the rollouts belong to several episodes: {sorted(ids, key=str)}")
    if any(r.termination is not None for r in rollouts[:-1]) or rollouts[-1].termination is None:
        raise ValueError("episode_record: only the episode's last row has a termination")
    last = rollouts[-1]
    turns = sum(len(r.turns) for r in rollouts)
    if advantages_per_turn is not None and len(advantages_per_turn) != turns:
        raise ValueError(f"episode_record: {len(advantages_per_turn)} advantages for {turns} turns")
    rec: dict[str, Any] = {
        "episode_id": last.episode_id, "group": last.group, "row": dict(last.row), "termination": last.termination,
        "truncated": last.truncated, "completion": last.completion, "messages": [dict(m) for m in last.messages],
        "n_turns": turns, "tool_calls": [list(c) for r in rollouts for c in r.tool_calls],
        "turn_rewards": [float(x) for r in rollouts for x in r.turn_rewards],
        "turn_keys": [str(k) for r in rollouts for k in r.turn_keys],
        "reward": None, "components": {}, "error": None,
        "advantages": None if advantages_per_turn is None else [float(a) for a in advantages_per_turn],
    }
    if reward_output is not None:
        rec.update(reward=float(reward_output.score), components=dict(reward_output.components),
                   error=reward_output.error)
        if reward_output.step_scores is not None:
            rec["step_scores"] = list(reward_output.step_scores)
    n_messages = []
    for r in rollouts:  # each row's transcript is a prefix of the whole one: store its length
        k = len(r.messages)
        if r.messages != last.messages[:k]:
            raise ValueError("episode_record: a row's messages are not a prefix of the episode's transcript")
        n_messages.append(k)
    rec["rows"] = [
        {"prompt": r.prompt, "prompt_ids": list(r.prompt_ids), "completion": r.completion,
         "completion_ids": list(r.completion_ids), "loss_mask": list(r.loss_mask),
         "logprobs": [float(x) for x in r.logprobs], "turns": [[int(a), int(b)] for a, b in r.turns],
         "first_turn": r.first_turn, "n_messages": k}
        for r, k in zip(rollouts, n_messages)
    ]
    return rec


def replay(record: dict[str, Any]) -> list[Rollout]:
    """Rebuild the rollouts of one samples.jsonl episode record (`episode_record`), in row order.

    The rebuilt rollouts equal the live ones field by field (prompt and completion ids and text, loss mask,
    behaviour log-probs, turns, turn rewards and keys, tool calls, first turn, episode id, group, termination on the
    last row, each row's transcript, the task row), so batch tensors built from them are equal.

    Raises:
        ValueError: one line naming a missing key (`rows[1].loss_mask`), per-turn lists whose length is not the
            episode's turns, a row whose first_turn does not follow the rows before it, or a row that `Rollout` refuses (lengths that differ).
    """
    if not isinstance(record, dict):
        raise ValueError(f"replay: expected an episode record (a dict), got {type(record).__name__}")
    for key in RECORD_KEYS:
        if key not in record:
            raise ValueError(f"replay: the record has no {key!r} (not an episode record)")
    rows = record["rows"]
    if not isinstance(rows, list) or not rows:
        raise ValueError("replay: 'rows' must be a non-empty list")
    for i, row in enumerate(rows):
        for key in ROW_KEYS:
            if key not in row:
                raise ValueError(f"replay: rows[{i}] has no {key!r}")
    turns = 0
    for i, row in enumerate(rows):
        if row["first_turn"] != turns:
            raise ValueError(f"replay: rows[{i}].first_turn is {row['first_turn']}, but the rows before it have "
                             f"{turns} turns")
        turns += len(row["turns"])
    for key in ("tool_calls", "turn_rewards", "turn_keys"):
        if len(record[key]) != turns:
            raise ValueError(f"replay: {key!r} has {len(record[key])} entries for {turns} turns")
    out = []
    for i, row in enumerate(rows):
        a, b = row["first_turn"], row["first_turn"] + len(row["turns"])
        try:
            out.append(Rollout(
                prompt=row["prompt"], prompt_ids=list(row["prompt_ids"]), completion=row["completion"],
                completion_ids=list(row["completion_ids"]), logprobs=[float(x) for x in row["logprobs"]],
                row=dict(record["row"]), group=record["group"], loss_mask=list(row["loss_mask"]),
                turns=[(int(s), int(e)) for s, e in row["turns"]], turn_rewards=list(record["turn_rewards"][a:b]),
                turn_keys=list(record["turn_keys"][a:b]), first_turn=a, episode_id=record["episode_id"],
                termination=record["termination"] if i == len(rows) - 1 else None,
                tool_calls=[list(c) for c in record["tool_calls"][a:b]],
                messages=[dict(m) for m in record["messages"][:row["n_messages"]]],
            ))
        except ValueError as e:
            raise ValueError(f"replay: rows[{i}]: {e}") from None
    return out
