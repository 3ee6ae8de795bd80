"""Checks of a loaded task against the policy that will read it: characters its tokenizer cannot represent, chat rows
for a model without a chat template. Verbs call `check_task_for_policy(task, policy)` once both are loaded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rewardlab.tasks.base import Row, Task


def _file_order(task: Task) -> list[Row]:
    """The task's rows, those read from a file in line order (so "the first" row named in an error is the first
    in the file); a `test_path` task's training rows come before its held-out rows."""
    rows = task.split("all")
    if task.all_rows is not None or not task.origins:
        return rows

    def line(row: Row) -> int:
        origin = task.where(row)
        tail = origin.rpartition(":")[2]
        return int(tail) if tail.isdigit() else 0

    n_train = len(task.train)
    order = sorted(range(len(rows)), key=lambda i: (i >= n_train, line(rows[i])))
    return [rows[i] for i in order]


def _texts(row: Row) -> Iterator[tuple[str, str]]:
    """(field, text) of every text of a row that the model reads or is trained to write: `prompt`, `answer`, a
    string `target`, and a chat row's earlier turns (`messages[i].content`; the last is the prompt)."""
    for name in ("prompt", "answer", "target"):
        if isinstance(row.get(name), str):
            yield name, row[name]
    messages = row.get("messages")
    if isinstance(messages, list):
        for i, turn in enumerate(messages[:-1]):
            if isinstance(turn, dict) and isinstance(turn.get("content"), str):
                yield f"messages[{i}].content", turn["content"]


def _char(c: str) -> str:
    return f"{c!r} (U+{ord(c):04X})" if len(c) == 1 else repr(c)


def check_task_vocabulary(task: Task, tokenizer: Any) -> None:
    """Refuse a task whose texts (prompt, answer, target, chat turns) hold characters the tokenizer cannot
    represent: they encode as its unknown token, so the model can neither read nor write them and a verifier that
    compares answers scores 0 without saying why (e.g. the tiny model's character vocabulary and "°F").

    Detection: a text is encoded (no special tokens added) with every occurrence of the unknown token's own
    spelling removed first; it holds an unknown character when the unknown token's id appears in the encoding. A
    tokenizer without an unknown token, or with byte fallback (every character becomes byte tokens), never
    triggers it. The offending characters are those that, encoded alone, give the unknown id.

    Args:
        task: a loaded task (every row of `task.split("all")` is checked).
        tokenizer: a Hugging Face tokenizer (`unk_token`, `unk_token_id`, callable on a list of strings).
    Raises:
        ValueError: one line: "task NAME: K of N rows hold characters outside the model's vocabulary ...: first at
            PATH:LINE field 'answer': '°' (U+00B0); unknown characters: ...", the location being the row's file
            line for a file task (`Task.where`).
    """
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is None:
        return
    unk = getattr(tokenizer, "unk_token", None) or ""
    rows = _file_order(task)
    items = [(i, name, text) for i, row in enumerate(rows) for name, text in _texts(row)]
    if not items:
        return
    texts = [text.replace(unk, "") if unk else text for _, _, text in items]
    distinct = list(dict.fromkeys(texts))  # answers repeat: encode each text once
    encoded = tokenizer(distinct, add_special_tokens=False, verbose=False)["input_ids"]
    unknown_in = {text for text, ids in zip(distinct, encoded) if unk_id in ids}
    bad = [k for k, text in enumerate(texts) if text in unknown_in]
    if not bad:
        return
    chars = list(dict.fromkeys(c for k in bad for c in texts[k]))
    alone = tokenizer(chars, add_special_tokens=False, verbose=False)["input_ids"]
    unknown = [c for c, ids in zip(chars, alone) if unk_id in ids]
    first_k = bad[0]
    i, name, _ = items[first_k]
    first_char = next((c for c in texts[first_k] if c in unknown), None)
    shown = _char(first_char) if first_char is not None else "a piece of text that encodes as the unknown token"
    bad_rows = len({items[k][0] for k in bad})
    listed = ", ".join(_char(c) for c in unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
    raise ValueError(
        f"task {task.name}: {bad_rows} of {len(rows)} rows hold characters outside the model's vocabulary (its "
        f"tokenizer encodes them as {unk!r}, so the model can neither read nor write them): first at "
        f"{task.where(rows[i], i)} field {name!r}: {shown}"
        + (f"; unknown characters: {listed}" if unknown else "")
        + "; replace them in the data, or use a model whose tokenizer covers them"
    )


def check_chat_format(task: Task, prompt_format: str, *, has_template: bool = False) -> None:
    """Refuse chat rows (rows with `messages`) for a policy that does not format prompts with a chat template.

    Args:
        task: a loaded task.
        prompt_format: the policy's resolved prompt format ("raw" or "chat", `Policy.prompt_format`).
        has_template: whether the tokenizer has a chat template (says which fix applies).
    Raises:
        ValueError: one line naming the first chat row's `PATH:LINE` and why: "... needs a model whose tokenizer
            has a chat template; this model's has none (the tiny model has none: give rows with 'prompt' and
            'answer')", or, with a template, that `model.prompt_format` is 'raw'.
    """
    if prompt_format == "chat":
        return
    rows = _file_order(task)
    i = next((i for i, row in enumerate(rows) if "messages" in row), None)
    if i is None:
        return
    head = (f"task {task.name}: {task.where(rows[i], i)} is a chat row ('messages'), which needs the model's chat "
            "template")
    if has_template:
        raise ValueError(f"{head}; model.prompt_format is {prompt_format!r}: set it to chat (or auto)")
    raise ValueError(f"{head}, and this model's tokenizer has none (the tiny model has none): use a chat model, or "
                     "write the rows as {\"prompt\": ..., \"answer\": ...}")


def check_task_for_policy(task: Task, policy: Any) -> None:
    """Both checks for a policy (`rewardlab.policy.Policy`: `tokenizer`, `prompt_format`): chat rows need a chat
    template (`check_chat_format`), every character must be in its vocabulary (`check_task_vocabulary`). A policy
    without a tokenizer attribute is not checked.

    Raises:
        ValueError: see the two checks.
    """
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is None:  # a stand-in without a tokenizer (a scripted or remote policy): nothing to check against
        return
    check_chat_format(task, policy.prompt_format, has_template=bool(getattr(tokenizer, "chat_template", None)))
    check_task_vocabulary(task, tokenizer)
