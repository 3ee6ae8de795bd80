"""Checks of a loaded task against the policy that will read it: characters its tokenizer cannot represent, chat rows
for a model without a chat template, prompts too long for its context window. Verbs call
`check_task_for_policy(task, policy)` and `check_prompt_lengths(task, policy, ...)` once both are loaded."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


def _prompt_tokens(rows: list[Row], policy: Any) -> list[int]:
    """How many tokens each row's prompt is when `Policy.generate` feeds it (formatted, encoded with its special
    tokens), encoded in one tokenizer call where the policy has `encode_prompts`."""
    texts = [policy.format_prompt(row["prompt"], row.get("messages")) for row in rows]
    encode_all = getattr(policy, "encode_prompts", None)
    ids = encode_all(texts) if encode_all is not None else [policy.encode_prompt(t) for t in texts]
    return [len(p) for p in ids]


def check_prompt_lengths(task: Task, policy: Any, *, max_new_tokens: int, key: str,
                         max_prompt_length: int | None = None, prompt_key: str | None = None) -> str | None:
    """Refuse, before anything runs, a single-turn task whose prompts leave no room for `max_new_tokens` in the
    model's context window: past the window a model reads positions it was never trained on (the tiny model's 256
    positions, silently; a 10**6-character prompt asked for a terabyte), and `Policy.generate` would refuse or cut
    the completion short mid-run.

    A prompt is counted in tokens as `Policy.generate` feeds it: formatted (`format_prompt`, a chat row with its
    conversation) and encoded with its special tokens. An environment task (`task.env`) is not checked here: its
    episodes meet the window turn by turn (`Policy.sample_ids`, termination "context").

    Args:
        task: a loaded task; every row of `task.split("all")` is checked, in file order.
        policy: a `rewardlab.policy.Policy` (`context_window`, `format_prompt`, `encode_prompt`); a policy whose
            context window is unknown (None, or a stand-in without one) is not checked.
        max_new_tokens: the verb's completion token limit. key: its dotted config name, e.g.
            "rl.sampling.max_new_tokens".
        max_prompt_length: the verb's left-truncation length in tokens (TRL's `max_prompt_length`: a longer prompt
            keeps its last max_prompt_length tokens), or None: prompts are never cut. prompt_key: its dotted name.
    Returns:
        None, or, when `max_prompt_length` cuts some prompts, one line for the verb to print as a warning:
        "rl.sampling.max_prompt_length: 1 of 11 rows of task jsonl:data.jsonl have prompts longer than 64 tokens; they
        are cut from the left to their last 64 tokens (first at data.jsonl:1, 5002 tokens)".
    Raises:
        ValueError: one line. Without `max_prompt_length`, naming the first row that does not fit by its
            `PATH:LINE` (`Task.where`; "NAME row I" for a generated task): "data.jsonl:1: a prompt of 5002 tokens +
            rl.sampling.max_new_tokens=4 is more than the model's context window of 256 tokens (1 of 11 rows of task
            jsonl:data.jsonl); shorten it, lower rl.sampling.max_new_tokens, or set rl.sampling.max_prompt_length to cut
            long prompts from the left (at most 252)". With it: "rl.sampling.max_prompt_length: 300 +
            rl.sampling.max_new_tokens=4 is more than the model's context window of 256 tokens; ...", and
            "rl.sampling.max_new_tokens: 300 tokens leave no room for a prompt ..." when `max_new_tokens` alone fills
            the window.
    """
    window = getattr(policy, "context_window", None)
    if task.env is not None or not isinstance(window, int) or getattr(policy, "tokenizer", None) is None:
        return None
    room = window - max_new_tokens
    if room < 1:
        raise ValueError(f"{key}: {max_new_tokens} tokens leave no room for a prompt in the model's context window "
                         f"of {window} tokens; lower it")
    if max_prompt_length is not None and max_prompt_length > room:
        raise ValueError(f"{prompt_key}: {max_prompt_length} + {key}={max_new_tokens} is more than the model's "
                         f"context window of {window} tokens; lower {prompt_key} to at most {room} (or {key})")
    rows = _file_order(task)
    lengths = _prompt_tokens(rows, policy)
    limit = room if max_prompt_length is None else max_prompt_length
    over = [i for i, n in enumerate(lengths) if n > limit]
    if not over:
        return None
    first = over[0]
    where, tokens = task.where(rows[first], first), lengths[first]
    share = f"{len(over)} of {len(rows)} rows of task {task.name}"
    if max_prompt_length is not None:
        return (f"{prompt_key}: {share} have prompts longer than {max_prompt_length} tokens; they are cut from the "
                f"left to their last {max_prompt_length} tokens (first at {where}, {tokens} tokens)")
    fix = (f"set {prompt_key} to cut long prompts from the left (at most {room})" if prompt_key
           else "use a model with a longer context window")
    raise ValueError(f"{where}: a prompt of {tokens} tokens + {key}={max_new_tokens} is more than the model's "
                     f"context window of {window} tokens ({share}); shorten that prompt, lower {key}, or {fix}")


def check_target_lengths(task: Task, policy: Any, *, target: str, eval_rows: Sequence[Row] = ()) -> None:
    """For supervised training (`sft`): refuse, before anything runs, a training row whose prompt + target does not
    fit the model's context window (past it the model would be trained on positions it was never built for), and,
    with held-out evaluation, an evaluated row whose prompt leaves no room for the longest training target (the
    evaluation's completion limit, `rewardlab.sft.train_sft`).

    Tokens are counted as `rewardlab.sft.encode_rows` encodes a row: the formatted prompt with its special tokens,
    then row[`target`] followed by EOS. Rows with a `trace` and environment tasks (`task.env`) are not checked here
    (their traces are rendered turn by turn); nor is a policy whose context window is unknown.

    Args:
        task: a loaded task; its training rows are checked in file order.
        policy: a `rewardlab.policy.Policy` (`context_window`, `format_prompt`, `encode_prompt`, `encode_target`).
        target: the row field trained as the completion (`sft.target`).
        eval_rows: the held-out rows evaluated during training (`heldout_rows`); () when evaluation is off.
    Raises:
        ValueError: one line naming the first row that does not fit by its FILE:LINE (`Task.where`), e.g.
            "data.jsonl:3: a prompt of 200 tokens + target 'answer' of 80 tokens (EOS included) is more than the
            model's context window of 256 tokens (2 of 300 training rows of task jsonl:data.jsonl); shorten them or
            use a model with a longer context window", or "sft.eval_every: held-out row data.jsonl:9: a prompt of
            250 tokens + 30 tokens (the longest training target, the held-out completion limit) ...".
    """
    window = getattr(policy, "context_window", None)
    if task.env is not None or not isinstance(window, int) or getattr(policy, "tokenizer", None) is None:
        return
    train = {id(r) for r in task.train}
    rows = [r for r in _file_order(task) if id(r) in train and "trace" not in r and target in r]
    if not rows:
        return
    prompts = _prompt_tokens(rows, policy)
    encode_all = getattr(policy, "encode_targets", None)
    texts = [str(r[target]) for r in rows]
    targets = [len(t) for t in (encode_all(texts) if encode_all is not None else map(policy.encode_target, texts))]
    over = [i for i, (p, t) in enumerate(zip(prompts, targets)) if p + t > window]
    if over:
        i = over[0]
        raise ValueError(f"{task.where(rows[i])}: a prompt of {prompts[i]} tokens + target {target!r} of {targets[i]} "
                         f"tokens (EOS included) is more than the model's context window of {window} tokens "
                         f"({len(over)} of {len(task.train)} training rows of task {task.name}); shorten them or use "
                         "a model with a longer context window")
    if not eval_rows:
        return
    longest = max(targets)
    held = _prompt_tokens(list(eval_rows), policy)
    i = next((i for i, n in enumerate(held) if n + longest > window), None)
    if i is not None:
        raise ValueError(f"sft.eval_every: held-out row {task.where(eval_rows[i])}: a prompt of {held[i]} tokens + "
                         f"{longest} tokens (the longest training target, the held-out completion limit) is more "
                         f"than the model's context window of {window} tokens; shorten the held-out prompts, or set "
                         "sft.eval_every=0")
