"""Multi-turn traces as training rows: a conversation (`messages`) with its assistant turns written out, turned into
token ids the way an episode builds them, with a loss mask that is 1 exactly on the assistant turns' tokens.

    rows = trace_rows(renderer, messages, eos_token_id=tok.eos_token_id)
    rows[0].prompt_ids, rows[0].ids, rows[0].loss_mask     # len(ids) == len(loss_mask)

This is the layout of `run_episodes` with the assistant turns given instead of sampled: the prompt is
`renderer.start(messages before the first assistant turn)`; an assistant turn appends the ids of its text (encoded
alone, no special tokens; the last turn also its end-of-sequence token, which is how the model learns to stop),
loss 1; the observations after it append `renderer.extend(...)` (the template's tokens and the tool output), loss 0.
When the renderer cannot append (a chat template that rewrites earlier turns), the trace continues in a new row
whose prompt is `renderer.start(the history so far)`, as an episode does. Nothing is decoded and re-tokenized, so
the ids a row trains on are exactly the ids it conditions on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TraceRow:
    """One training row of a trace: `prompt_ids` (never trained on), then `ids` with `loss_mask` (same length; 1
    on assistant-turn tokens, 0 on template, observation and tool tokens)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)


def trace_rows(renderer: Any, messages: list[dict[str, Any]], *, eos_token_id: int | None) -> list[TraceRow]:
    """The training rows of one trace (see the module docstring).

    Args:
        renderer: a `rewardlab.envs.render.Renderer` (`start`, `extend`, `tokenizer`).
        messages: the conversation: one or more messages, then assistant turns, each but the last followed by one or
            more observation messages (user or tool); it ends with an assistant turn.
        eos_token_id: appended after the last assistant turn (trained on); None: nothing appended.
    Returns:
        One row, or more when the renderer had to start a new one.
    Raises:
        ValueError: one line naming the message (trace[i]): not a dict with a role and a str content; no message
            before the first assistant turn; two assistant turns in a row; no assistant turn, or a trace that does not
            end with one.
    """
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"trace[{i}]: expected a message {{'role': str, 'content': str}}, got {m!r}")
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns or turns[-1] != len(messages) - 1:
        raise ValueError(f"trace[{len(messages) - 1 if messages else 0}]: a trace ends with an assistant turn (the "
                         "final answer)")
    if turns[0] == 0:
        raise ValueError("trace[0]: an assistant turn needs a prompt before it")
    for a, b in zip(turns, turns[1:]):
        if b == a + 1:
            raise ValueError(f"trace[{b}]: two assistant turns in a row (an observation comes between turns)")
    from rewardlab.envs.render import _encode

    rows = [TraceRow(renderer.start(messages[: turns[0]]))]
    for n, i in enumerate(turns):
        row = rows[-1]
        ids = _encode(renderer.tokenizer, messages[i]["content"])
        if i == turns[-1] and eos_token_id is not None:
            ids.append(eos_token_id)
        row.ids += ids
        row.loss_mask += [1] * len(ids)
        if i == turns[-1]:
            break
        history, new = messages[: i + 1], messages[i + 1 : turns[n + 1]]
        more = renderer.extend(row.prompt_ids + row.ids, history, new)
        if more is None:
            rows.append(TraceRow(renderer.start(history + new)))
        else:
            row.ids += more
            row.loss_mask += [0] * len(more)
    return rows
