"""rewardlab inside TRL (1.16): rewards as `GRPOTrainer` reward functions, datasets in TRL's formats, rewardlab's
token-exact episode loop as a `rollout_func`, and environments as an `environment_factory`.

Reward functions. TRL's GRPOTrainer calls each reward function as

    func(prompts=[...], completions=[...], completion_ids=[[int, ...], ...], **kwargs) -> list[float | None]

with one entry per completion (the G completions of a prompt are consecutive). `kwargs` holds every dataset column
except `prompt` (one value per completion), plus TRL's own `trainer_state`, `log_extra`, `log_metric` and, with an
environment factory, `environments`. The adapters here take those four out by name (`PEER_KWARGS`) and turn every
other keyword into a task-row field, so an unknown column still reaches rewardlab's own option and field checks. A
`None` reward is "not applicable": TRL leaves it out of that function's mean and, weighted, out of the sum.

`as_trl_reward_funcs(reward)` gives TRL one function for the composed score (weight 1) and one per component
(weight 0, so TRL logs it as `rewards/<name>/mean` without adding it); the reward is scored once per batch, the
component functions read the same outputs.

Datasets. `pairs_to_trl` / `step_rows_to_trl` write rewardlab preference pairs and PRM step labels as TRL's
preference and stepwise-supervision datasets; `trl_to_rows` / `trl_to_pairs` read TRL prompt and preference datasets
back as rewardlab task rows and pairs.

Episodes. `as_trl_rollout_func(env, rows)` generates with rewardlab's episode loop (ids exactly as sampled,
environment tokens masked by `env_mask`) on a dataset made by `env_dataset(rows)`, and hands the episodes to the
reward functions; `as_trl_environment(name)` exposes an environment's tools to TRL's own tool loop.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewardlab.integrations.common import as_reward, component_keys, needed_fields, row_field_names
from rewardlab.rewards.base import Reward, RewardError
from rewardlab.rewards.compose import error_sources
from rewardlab.types import Rollout, RewardOutput

#: The keywords GRPOTrainer adds to the dataset columns; the adapters take them out by name.
PEER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")
#: The column through which `as_trl_rollout_func` hands each episode (a `Rollout`) to the reward functions, which
#: then score that episode (token-exact, its final model turn as the completion) instead of the decoded text.
ROLLOUT_COLUMN = "rewardlab_rollout"


def _text(content: Any) -> str:
    """A message's content as text: a string as is; a list of content blocks, its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, Mapping) and b.get("type") == "text")
    return "" if content is None else str(content)


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m for m in value)


class _Scorer:
    """Scores one TRL batch once and keeps the outputs for the component functions of the same batch."""

    def __init__(self, reward: Reward, on_error: str, name: str) -> None:
        self.reward, self.on_error, self.name = reward, on_error, name
        self.needed = [row_field_names(f) for f in needed_fields(reward)]  # each: its alternatives
        self.checked = False
        self.failed = 0  # rows whose reward failed, over this scorer's life
        self.batches = 0  # batches scored so far (a composed function counts a batch's failures once)
        self._last: tuple[Any, Any, Any, list[RewardOutput | None]] | None = None

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] | None,
              kwargs: Mapping[str, Any]) -> tuple[list[RewardOutput | None], bool]:
        """The outputs of this batch (None: not applicable) and whether they were computed now (False: cached)."""
        last = self._last
        if last is not None and last[0] is prompts and last[1] is completions and last[2] is completion_ids:
            return last[3], False
        columns = {k: v for k, v in kwargs.items() if k not in PEER_KWARGS}
        episodes = columns.pop(ROLLOUT_COLUMN, None)  # from as_trl_rollout_func: score the episodes themselves
        n = len(prompts)
        if len(completions) != n:
            raise ValueError(f"{self.name}: {len(completions)} completions for {n} prompts")
        if completion_ids is not None and len(completion_ids) != n:
            raise ValueError(f"{self.name}: {len(completion_ids)} completion_ids for {n} prompts")
        for key, values in columns.items():
            if not isinstance(values, (list, tuple)) or len(values) != n:
                got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
                raise ValueError(f"{self.name}: keyword {key!r} is not a dataset column of one value per completion "
                                 f"({got} for {n} completions)")
        if episodes is not None:
            if not isinstance(episodes, (list, tuple)) or len(episodes) != n or \
                    not all(isinstance(r, Rollout) for r in episodes):
                raise ValueError(f"{self.name}: column {ROLLOUT_COLUMN!r} must hold one rewardlab Rollout per "
                                 "completion (as as_trl_rollout_func returns)")
        if not self.checked:
            have = (set(episodes[0].row) if episodes else set(columns)) | {"prompt"}  # TRL's prompts: the row's
            missing = [f for f in self.needed if not any(a in have for a in f)]
            if missing:
                listed = ", ".join(sorted(have - {"prompt"})) or "none"
                raise ValueError(f"{self.name}: the reward needs dataset column {' or '.join(map(repr, missing[0]))}"
                                 f", which this dataset lacks (columns: {listed})")
            self.checked = True
        outputs: list[RewardOutput | None] = [None] * n
        todo, rollouts = [], []
        group, previous = -1, object()
        for i in range(n):
            if prompts[i] != previous:
                group, previous = group + 1, prompts[i]
            row = episodes[i].row if episodes else {k: v[i] for k, v in columns.items()}
            if any(all(row.get(a) is None for a in f) for f in self.needed):
                continue  # a None in a field the reward needs: not applicable to this row
            todo.append(i)
            if episodes:
                rollouts.append(dataclasses.replace(episodes[i], group=group))
            else:
                rollouts.append(_rollout(prompts[i], completions[i],
                                         None if completion_ids is None else completion_ids[i], row, group))
        if rollouts:
            for i, out in zip(todo, self.reward(rollouts)):
                outputs[i] = out
        self._last = (prompts, completions, completion_ids, outputs)
        self.batches += 1
        return outputs, True


def _rollout(prompt: Any, completion: Any, ids: Sequence[int] | None, row: dict[str, Any], group: int) -> Rollout:
    """A TRL (prompt, completion) as a rewardlab rollout. Conversational: the prompt text is the last user turn
    (the row keeps the prompt turns as `messages`, as a rewardlab chat row does) and the completion text is the last
    assistant turn's content."""
    chat_prompt, chat_completion = _is_messages(prompt), _is_messages(completion)
    messages: list[dict[str, Any]] = []
    if chat_prompt:
        users = [m for m in prompt if m.get("role") == "user"]
        prompt_text = _text((users or prompt)[-1].get("content")) if prompt else ""
        row.setdefault("messages", list(prompt))
        messages = list(prompt)
    else:
        prompt_text = str(prompt)
    if chat_completion:
        said = [m for m in completion if m.get("role") == "assistant"]
        completion_text = _text(said[-1].get("content")) if said else ""
        messages = messages + list(completion)
    else:
        completion_text = str(completion)
    row.setdefault("prompt", prompt_text)
    if ids is None:
        ids = []
    elif type(ids) is not list or (ids and type(ids[0]) is not int):  # noqa: E721 - TRL's lists of ints pass as is
        ids = [int(t) for t in ids]
    return Rollout(prompt=prompt_text, prompt_ids=[], completion=completion_text, completion_ids=ids,
                   logprobs=[0.0] * len(ids), row=row, group=group, messages=messages if chat_completion else [])


class TRLRewardFunc:
    """A rewardlab reward as a TRL reward function (see the module docstring for the call).

    Calling it returns a list of N floats or None. The composed function (`key=None`) gives each rollout's score,
    None where a field the reward needs is None in that row, and for a failed rollout what `on_error` says: "raise"
    raises `RewardError` ("<name>: <reward>: <cause>"), "skip" gives None, "zero" gives 0.0; with "skip" and "zero"
    it reports through TRL's `log_metric` the failures of the batch, `<name>/errors` (rows) and
    `<name>/errors/<reward>` (per failing reward). A component function (`key` given) gives that component of each
    output, None where the rollout has no such component, is not applicable, or failed.

    Attributes:
        __name__: what TRL logs it under (`rewards/<__name__>/mean`).
        failed: rows that failed so far (all functions of one `as_trl_reward_funcs` share the count).

    Raises (at a call):
        ValueError: a needed column the dataset lacks (first call only), a keyword that is not one value per
            completion, or lists of different lengths; one line each.
        RewardError: a failed rollout with on_error="raise".
    """

    def __init__(self, scorer: _Scorer, name: str, key: str | None = None) -> None:
        self._scorer, self.key = scorer, key
        self.__name__ = name
        self._counted = 0  # the last batch (scorer.batches) whose failures this function counted

    @property
    def failed(self) -> int:
        return self._scorer.failed

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[float | None]:
        outputs, _ = self._scorer.score(prompts, completions, completion_ids, kwargs)
        if self.key is not None:
            return [None if o is None or o.error is not None or self.key not in o.components
                    else float(o.components[self.key]) for o in outputs]
        failed = [o for o in outputs if o is not None and o.error is not None]
        on_error = self._scorer.on_error
        if failed and on_error == "raise":
            raise RewardError(f"{self.__name__}: {failed[0].error}")
        if self._counted != self._scorer.batches:  # once per batch, whichever function scored it
            self._counted = self._scorer.batches
            self._scorer.failed += len(failed)
            log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
            if log_metric is not None and on_error != "raise":
                log_metric(f"{self.__name__}/errors", float(len(failed)))
                sources: dict[str, int] = {}
                for o in failed:
                    for src in dict.fromkeys(error_sources(o.error)):
                        sources[src] = sources.get(src, 0) + 1
                for src, count in sorted(sources.items()):
                    log_metric(f"{self.__name__}/errors/{src}", float(count))
        return [None if o is None or (o.error is not None and on_error == "skip")
                else 0.0 if o.error is not None else float(o.score) for o in outputs]

    def __repr__(self) -> str:
        return f"TRLRewardFunc({self.__name__!r})"


def as_trl_reward_func(reward: Reward | str | Mapping[str, Any] | Sequence[Any], *, on_error: str = "skip",
                       name: str = "rewardlab") -> TRLRewardFunc:
    """One TRL reward function giving `reward`'s composed score (see `TRLRewardFunc`).

    Args:
        reward: a rewardlab `Reward`, or a reward config as in `rewards:` (a registered name, a mapping, or a list;
            built with `build_reward`).
        on_error: "raise", "skip" (default; None for TRL, which leaves the row out of the mean) or "zero".
        name: the function's `__name__`, what TRL logs it under.
    Returns:
        a callable `(prompts, completions, completion_ids, **kwargs) -> list[float | None]`, one value per
        completion.
    Raises:
        ValueError: an unknown `on_error`, or a bad reward config (one line naming the field).
    """
    return TRLRewardFunc(_Scorer(as_reward(reward, on_error=on_error), on_error, name), name)


def as_trl_reward_funcs(reward: Reward | str | Mapping[str, Any] | Sequence[Any], *, on_error: str = "skip",
                        name: str = "rewardlab", components: Sequence[str] | None = None
                        ) -> tuple[list[TRLRewardFunc], list[float]]:
    """The composed score (weight 1) and each component (weight 0), for `GRPOTrainer(reward_funcs=funcs,
    args=GRPOConfig(reward_weights=weights))`.

    TRL sums weight x value over the functions, so the reward it trains on is exactly rewardlab's composed score,
    also for compositions that are not sums (gated, tiered, penalty, shaping); the weight-0 functions only log. The
    reward is scored once per batch: every function reads the same outputs.

    Args:
        reward: as in `as_trl_reward_func`.
        on_error: as in `as_trl_reward_func`.
        name: the composed function's `__name__`; component k's is "<name>/<k>".
        components: the component keys to log; default `integrations.common.component_keys(reward)` (the labels
            of the composition's members and nodes, fixed before anything is scored). A leaf's own components (e.g.
            `correct`) are named here.
    Returns:
        (funcs, weights): 1 + K callables with distinct `__name__`s, and [1.0, 0.0, ..., 0.0].
    Raises:
        ValueError: an unknown `on_error`, a bad reward config, or `components` with a repeated key.
    """
    built = as_reward(reward, on_error=on_error)
    keys = list(components) if components is not None else component_keys(built)
    if len(set(keys)) != len(keys):
        raise ValueError(f"components: repeated key(s) {sorted({k for k in keys if keys.count(k) > 1})}")
    scorer = _Scorer(built, on_error, name)
    funcs = [TRLRewardFunc(scorer, name)] + [TRLRewardFunc(scorer, f"{name}/{k}", k) for k in keys]
    return funcs, [1.0] + [0.0] * len(keys)


# ---------------------------------------------------------------------------------------------- datasets
def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def pairs_to_trl(pairs: Any, *, conversational: bool = False, implicit_prompt: bool = False) -> Any:
    """rewardlab preference pairs (`rm pairs` files, `rm.data.Pair`) as a TRL preference dataset, the input of
    `RewardTrainer` and `DPOTrainer`.

    Columns: `prompt`, `chosen`, `rejected` (explicit prompt), or `chosen`, `rejected` with the prompt in front of
    each (`implicit_prompt=True`; TRL's `extract_prompt` takes it back out), plus `margin` (float) when any pair has
    a non-zero margin (RewardTrainer's margin loss reads it). Standard rows hold strings (implicit: prompt + response
    concatenated); conversational rows hold message lists: prompt [{"role": "user", ...}], responses
    [{"role": "assistant", ...}] (implicit: user turn + assistant turn).

    An implicit prompt is only as good as TRL's split: `extract_prompt` takes the longest common prefix of `chosen`
    and `rejected` (for strings: characters, less a trailing space). Conversational pairs always split at the
    assistant turn. String pairs split at the prompt only when the two responses differ in their first character,
    neither is empty and the prompt does not end in a space; `rm pairs` files often hold answers that share a first
    character ("14" / "15"), for which TRL would recover a longer prompt ("4+4+6=1"). So every implicit row is split
    here with TRL's own `extract_prompt`, and a pair it would not give back exactly is refused.

    Args:
        pairs: a JSONL path of pair rows, or a sequence of `Pair`.
        conversational: message lists instead of strings.
        implicit_prompt: the prompt inside `chosen` and `rejected` instead of its own column.
    Returns:
        a `datasets.Dataset`, one row per pair, in order.
    Raises:
        ValueError: `PATH:LINE: ...` for a bad row of a file (`rm.data.load_pairs`); with `implicit_prompt=True`, one
            line naming the first pair whose prompt TRL's `extract_prompt` would not recover exactly.
    """
    from datasets import Dataset

    from rewardlab.rm.data import load_pairs

    items = load_pairs(pairs) if isinstance(pairs, (str, bytes)) or hasattr(pairs, "__fspath__") else list(pairs)
    cols: dict[str, list[Any]] = {"prompt": [], "chosen": [], "rejected": []}
    for p in items:
        if conversational:
            prompt, chosen, rejected = _user(p.prompt), _assistant(p.chosen), _assistant(p.rejected)
        else:
            prompt, chosen, rejected = p.prompt, p.chosen, p.rejected
        if implicit_prompt:
            chosen, rejected = prompt + chosen, prompt + rejected
        cols["prompt"].append(prompt)
        cols["chosen"].append(chosen)
        cols["rejected"].append(rejected)
    if implicit_prompt:
        from trl.data_utils import extract_prompt

        for i, (prompt, chosen, rejected) in enumerate(zip(*cols.values())):
            got = extract_prompt({"chosen": chosen, "rejected": rejected})["prompt"]
            if got != prompt:
                raise ValueError(f"pairs_to_trl: pair {i}: implicit_prompt=True would lose its prompt: TRL's "
                                 f"extract_prompt (the common prefix of chosen and rejected) gives {got!r}, not "
                                 f"{prompt!r}; keep the prompt explicit (implicit_prompt=False) or use "
                                 "conversational=True")
        del cols["prompt"]
    if any(p.margin for p in items):
        cols["margin"] = [float(p.margin) for p in items]
    return Dataset.from_dict(cols)


def step_rows_to_trl(rows: Any, *, threshold: float = 0.5) -> Any:
    """rewardlab PRM step labels (`rm.data.StepRow`, rows `{prompt, steps, labels}`) as TRL's stepwise-supervision
    dataset: columns `prompt` (str), `completions` (list of step texts) and `labels` (list of bool, one per step).

    rewardlab's labels are numbers in [0, 1] (soft labels from Monte Carlo estimates allowed); TRL's are booleans:
    a step is labelled True when its label >= `threshold`.

    Args:
        rows: a JSONL path of step rows, or a sequence of `StepRow`.
        threshold: the label a step needs to count as correct, in (0, 1] (default 0.5).
    Returns:
        a `datasets.Dataset`, one row per solution, in order.
    Raises:
        ValueError: a threshold outside (0, 1], or `PATH:LINE: ...` for a bad row of a file.
    """
    from datasets import Dataset

    from rewardlab.rm.data import load_step_rows

    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold: expected a number in (0, 1], got {threshold!r}")
    items = load_step_rows(rows) if isinstance(rows, (str, bytes)) or hasattr(rows, "__fspath__") else list(rows)
    return Dataset.from_dict({"prompt": [r.prompt for r in items], "completions": [list(r.steps) for r in items],
                              "labels": [[y >= threshold for y in r.labels] for r in items]})


def _prompt_fields(prompt: Any, where: str) -> dict[str, Any]:
    """A TRL prompt as rewardlab row fields: a string is `prompt`; a message list gives `prompt` = the last user
    turn's text and `messages` = the turns up to it (what rewardlab's chat rows hold)."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if _is_messages(prompt):
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        if not users:
            raise ValueError(f"{where}: the prompt's messages have no user turn")
        last = users[-1]
        return {"prompt": _text(prompt[last].get("content")), "messages": [dict(m) for m in prompt[: last + 1]]}
    raise ValueError(f"{where}: 'prompt' must be a string or a list of {{role, content}} messages, got "
                     f"{type(prompt).__name__}")


def _response(value: Any, where: str, key: str) -> str:
    """A TRL completion (string, or messages: the last assistant turn's text)."""
    if isinstance(value, str):
        return value
    if _is_messages(value):
        said = [m for m in value if m.get("role") == "assistant"]
        if not said:
            raise ValueError(f"{where}: {key!r} has no assistant turn")
        return _text(said[-1].get("content"))
    raise ValueError(f"{where}: {key!r} must be a string or a list of messages, got {type(value).__name__}")


def trl_to_rows(dataset: Any, *, answer: str = "answer") -> list[dict[str, Any]]:
    """A TRL prompt-only or prompt-completion dataset (standard or conversational) as rewardlab task rows.

    Each row: `prompt` (and `messages` for a conversational prompt, see `_prompt_fields`), `answer` from the column
    named `answer`, else from the `completion` column (the last assistant turn's text); a `completion` next to an
    answer column becomes the row's `target` (the SFT target); every other column is kept as a row field, which
    rewards read by name.

    Args:
        dataset: a `datasets.Dataset` or any sequence of mappings.
        answer: the column that holds the reference answer (default "answer").
    Returns:
        one dict per dataset row, in order.
    Raises:
        ValueError: one line naming the row: no `prompt`, no answer column and no `completion`, or a prompt or
            completion that is neither a string nor messages.
    """
    out = []
    for i, example in enumerate(dataset):
        where = f"dataset row {i}"
        if "prompt" not in example:
            raise ValueError(f"{where}: no 'prompt' column (columns: {', '.join(sorted(example))})")
        row = {k: v for k, v in example.items() if k not in ("prompt", "completion", answer)}
        row.update(_prompt_fields(example["prompt"], where))
        completion = (_response(example["completion"], where, "completion")
                      if example.get("completion") is not None else None)
        if example.get(answer) is not None:
            row["answer"] = example[answer]
            if completion is not None:
                row["target"] = completion
        elif completion is not None:
            row["answer"] = completion
        else:
            raise ValueError(f"{where}: no reference answer: neither an {answer!r} column nor a 'completion' "
                             f"(columns: {', '.join(sorted(example))}); name the answer column with answer=")
        out.append(row)
    return out


def trl_to_task(dataset: Any, *, name: str = "trl", answer: str = "answer", test_size: int | float = 0.1,
                seed: int = 0, reward: str | dict[str, Any] = "exact_match") -> Any:
    """A TRL prompt or prompt-completion dataset as a rewardlab `Task` (`trl_to_rows`, duplicates by prompt
    dropped, `test_size` of the unique prompts held out with split seed `seed`; `evaluate` scores it whole).

    Raises:
        ValueError: see `trl_to_rows`, and `tasks.dedup_and_split` for `test_size` and `seed`.
    """
    from rewardlab.tasks.base import Task, dedup_and_split, row_key

    rows = trl_to_rows(dataset, answer=answer)
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        first.setdefault(row_key(r), r)
    unique = list(first.values())
    train, test = dedup_and_split(unique, key=row_key, test_size=test_size, seed=seed)
    return Task(name=name, train=train, test=test, reward=reward, eval_split="all", all_rows=unique,
                source=f"a TRL dataset ({len(rows)} rows; {len(test)} of its unique prompts held out, split seed "
                       f"{seed})")


def trl_to_pairs(dataset: Any) -> list[Any]:
    """A TRL preference dataset (explicit or implicit prompt, standard or conversational) as rewardlab `Pair`s.

    An implicit prompt is taken out of `chosen` and `rejected` by TRL's own `maybe_extract_prompt` (their common
    leading turns, or for strings their common prefix), so the split is TRL's. A conversational prompt gives the
    pair's `prompt` = the last user turn's text and `row["messages"]` = the prompt turns; a response is the last
    assistant turn's text. `margin` is read when present; other columns go to the pair's `row`.

    Raises:
        ValueError: one line naming the row: no `chosen`/`rejected`, or values that are neither strings nor messages.
    """
    from trl.data_utils import maybe_extract_prompt

    from rewardlab.rm.data import Pair

    out = []
    for i, example in enumerate(dataset):
        where = f"dataset row {i}"
        missing = [k for k in ("chosen", "rejected") if k not in example]
        if missing:
            raise ValueError(f"{where}: not a preference row: no {missing[0]!r} column "
                             f"(columns: {', '.join(sorted(example))})")
        example = dict(example)
        example.update(maybe_extract_prompt(example))
        fields = _prompt_fields(example["prompt"], where)
        row = {k: v for k, v in example.items() if k not in ("prompt", "chosen", "rejected", "margin")}
        row.update(fields)
        margin = example.get("margin")
        out.append(Pair(prompt=fields["prompt"], chosen=_response(example["chosen"], where, "chosen"),
                        rejected=_response(example["rejected"], where, "rejected"),
                        margin=0.0 if margin is None else float(margin), row=row))
    return out


# ---------------------------------------------------------------------------------------------- episodes
_ROW_TAG = re.compile(r"^<rewardlab-row (\d+)>")


def env_dataset(rows: Sequence[Mapping[str, Any]]) -> Any:
    """An environment task's rows as the `train_dataset` of a GRPOTrainer that runs `as_trl_rollout_func`.

    TRL hands a `rollout_func` the prompts alone, and an environment's rows may share a prompt (guess_number's differ
    only in their secret), so each prompt starts with the row's index, `<rewardlab-row I>`, which the rollout
    function reads and removes: the model is given the row's own prompt, never the tag. The other columns are the
    rows' fields (`answer`, ...), for the reward functions.

    Args:
        rows: the task rows, e.g. `rewardlab.envs.make_env("guess_number").rows("train", 64)`; each with a string
            `prompt`.
    Returns:
        a `datasets.Dataset` with `prompt` (tagged) and the rows' other fields (a field some rows lack is None).
    Raises:
        ValueError: no rows, or a row without a string `prompt` (naming its index).
    """
    from datasets import Dataset

    if not rows:
        raise ValueError("env_dataset: no rows")
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "prompt"))
    for i, r in enumerate(rows):
        if not isinstance(r.get("prompt"), str):
            raise ValueError(f"env_dataset: row {i} has no string 'prompt'")
    cols: dict[str, list[Any]] = {"prompt": [f"<rewardlab-row {i}>{r['prompt']}" for i, r in enumerate(rows)]}
    for k in keys:
        cols[k] = [r.get(k) for r in rows]
    return Dataset.from_dict(cols)


def as_trl_rollout_func(env: Any, rows: Sequence[Mapping[str, Any]], *, max_turns: int, max_new_tokens: int,
                        max_episode_tokens: int, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0
                        ) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """A TRL `rollout_func` that runs rewardlab episodes (`rewardlab.envs.run_episodes`) with the trainer's model:
    token in, token out, the ids exactly as sampled, environment tokens masked.

    TRL 1.16 calls `rollout_func(prompts, trainer)` with the prompts of its batch (each repeated num_generations
    times, consecutively) and expects per completion `prompt_ids`, `completion_ids` and `logprobs` (behaviour
    log-probs of the sampled tokens, natural log, 0.0 on environment tokens), plus `env_mask` (1 on sampled tokens,
    0 on tokens the environment or the template inserted; TRL's tool mask). The episode itself goes to the reward
    functions as the column `rewardlab_rollout` (`ROLLOUT_COLUMN`): `as_trl_reward_funcs` then scores that
    `Rollout` (its final model turn, its turns and turn rewards), not a re-tokenized text.

    Truncation. TRL counts a completion as truncated when its last id is not an EOS or pad token
    (`completions/clipped_ratio`; `GRPOConfig(mask_truncated_completions=True)` leaves it out of the loss). An
    episode that ended on its own (`termination` stop, env_done or max_turns) whose last id is not one gets the
    tokenizer's EOS appended in what TRL is given, with env_mask 0 and log-prob 0.0 (never trained); a truncated
    episode (`Rollout.truncated`: max_new_tokens, max_episode_tokens, context) ends as sampled, so TRL counts it
    truncated. The `rewardlab_rollout` episodes are unchanged.

    Args:
        env: a rewardlab environment (`rewardlab.envs.make_env(name)`).
        rows: the rows the dataset was made from by `env_dataset` (the prompts carry their index into `rows`).
        max_turns, max_new_tokens, max_episode_tokens, temperature, top_p: as in `run_episodes` (tokens, turns).
        seed: the episodes' random streams are (seed, trainer.state.global_step, episode, call, turn).
    Returns:
        rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", "env_mask",
        "rewardlab_rollout"}, lists of one entry per prompt.
    Raises (at a call):
        ValueError: a prompt without its `<rewardlab-row I>` tag or with an index outside `rows`; an episode that
            the chat template split into several rows (TRL takes one sequence per completion); a tokenizer without
            an EOS id (TRL could not tell a finished episode from a truncated one); one line each.
    """
    from rewardlab.envs import EpisodeSettings, run_episodes
    from rewardlab.policy.settings import SamplingSettings

    episode_settings = EpisodeSettings(env, max_turns=max_turns, max_episode_tokens=max_episode_tokens)
    sampling = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    table = [dict(r) for r in rows]
    calls = [0]

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        index = _row_indices(prompts, len(table))
        policy, step = _trainer_policy(trainer)
        episodes: list[Rollout] = []
        with _no_grad():
            for start, size in _groups(index):
                row = table[index[start]]
                got = run_episodes(policy, episode_settings, [row], sampling, n=size, stream=(seed, step, calls[0]),
                                   episode_offset=start)
                _check_one_row_each(got, size, index[start])
                episodes += got
        calls[0] += 1
        return _trl_completions(episodes, trainer)

    return rollout_func


def _row_indices(prompts: list[Any], rows: int) -> list[int]:
    """The row index each prompt's `<rewardlab-row I>` tag gives (see `env_dataset`).

    Raises:
        ValueError: a prompt without the tag, or with an index outside the `rows` rows.
    """
    index = []
    for p in prompts:
        m = _ROW_TAG.match(p) if isinstance(p, str) else None
        if m is None or int(m.group(1)) >= rows:
            raise ValueError(f"as_trl_rollout_func: prompt {str(p)[:60]!r} does not start with a "
                             f"<rewardlab-row I> tag of one of the {rows} rows; build the dataset with "
                             "env_dataset(rows)")
        index.append(int(m.group(1)))
    return index


def _groups(index: list[int]) -> list[tuple[int, int]]:
    """(start, size) of each run of one repeated row in `index`: a group of episodes of that row (TRL repeats each
    prompt num_generations times, consecutively)."""
    groups: list[tuple[int, int]] = []
    for k, i in enumerate(index):
        if k > 0 and index[k - 1] == i:
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        else:
            groups.append((k, 1))
    return groups


def _trainer_policy(trainer: Any) -> tuple[Any, int]:
    """The trainer's model (unwrapped from its accelerator) and tokenizer as a rewardlab `Policy`, and the trainer's
    global step (0 before the first)."""
    from rewardlab.policy.hf import Policy

    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = Policy(model, trainer.processing_class)
    return policy, int(getattr(trainer.state, "global_step", 0))


def _check_one_row_each(got: Sequence[Rollout], size: int, row: int) -> None:
    """Check that the `size` episodes of row `row` came back as `size` rollouts, one sequence each.

    Raises:
        ValueError: an episode the chat template split into several rows (TRL takes one sequence per completion).
    """
    if len(got) != size:
        raise ValueError(f"as_trl_rollout_func: an episode of row {row} became several rows "
                         "(the chat template rewrites earlier turns); TRL takes one sequence per "
                         "completion, so use a template that only appends")


def _trl_completions(episodes: list[Rollout], trainer: Any) -> dict[str, list[Any]]:
    """What a TRL `rollout_func` returns for `episodes`: per episode `prompt_ids`, `completion_ids`, `logprobs` and
    `env_mask`, an episode that ended on its own without an end token getting the EOS appended (env_mask 0, log-prob
    0.0); and the episodes themselves, unchanged, as `ROLLOUT_COLUMN`.

    Raises:
        ValueError: a tokenizer without an EOS id (see `_end_tokens`).
    """
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    eos, ends = _end_tokens(trainer)
    for r in episodes:
        ids, logps, mask = list(r.completion_ids), list(r.logprobs), list(r.loss_mask)
        if not r.truncated and (not ids or ids[-1] not in ends):
            ids, logps, mask = ids + [eos], logps + [0.0], mask + [0]  # ended on its own: not truncated to TRL
        out["prompt_ids"].append(list(r.prompt_ids))
        out["completion_ids"].append(ids)
        out["logprobs"].append(logps)
        out["env_mask"].append(mask)
    out[ROLLOUT_COLUMN] = episodes
    return out


def _end_tokens(trainer: Any) -> tuple[int, set[int]]:
    """The EOS id appended to an episode that ended on its own, and the ids after which TRL does not count a
    completion as truncated: GRPOTrainer's `eos_token_ids` (the generation config's and the tokenizer's EOS) and the
    pad id; TRL's test is `completion_ids[-1] not in eos_and_pad`."""
    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    eos_ids = [int(t) for t in (getattr(trainer, "eos_token_ids", None) or [tok.eos_token_id]) if t is not None]
    if not eos_ids:
        raise ValueError("as_trl_rollout_func: the tokenizer has no eos_token_id, which TRL needs to tell a finished "
                         "episode from a truncated one")
    return eos_ids[0], {*eos_ids, *([tok.pad_token_id] if tok.pad_token_id is not None else [])}


def _no_grad():
    import torch  # here, so that importing the reward adapters does not need torch's import time

    return torch.no_grad()


# ---------------------------------------------------------------------------------------------- environments
def _tool_method(env: Any, name: str, fn: Callable[..., Any]) -> Callable[..., str]:
    """A method named like the tool `fn`, with its parameters, type hints and docstring (what TRL and transformers'
    `get_json_schema` read), that runs the call in `env`'s tool pool with its checks and timeout."""
    import inspect

    schema = next(s for s in env.tools if s["function"]["name"] == name)

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        from rewardlab.envs import check_arguments

        params = list(inspect.signature(fn).parameters)
        arguments = {**dict(zip(params, args)), **kwargs}
        why = check_arguments(schema, arguments)
        call = {"name": name, "arguments": arguments, "status": "ok" if why is None else "bad_arguments",
                "error": why}
        content = env.run_calls([call])[0]
        self.tool_calls.append({"name": name, "arguments": arguments, "status": call["status"],
                                "seconds": call.get("seconds", 0.0)})
        return content

    sig = inspect.signature(fn)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])  # type: ignore[attr-defined]
    method.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    method.__name__ = method.__qualname__ = name
    method.__doc__ = fn.__doc__
    return method


def as_trl_environment(env: Any, **options: Any) -> type:
    """A class for `GRPOTrainer(environment_factory=...)` backed by a rewardlab environment.

    TRL's loop acts only through tools: it renders the conversation with the model's chat template (re-templating it
    between turns, so its token ids are not the sampled ones: use `as_trl_rollout_func` for token-exact episodes),
    parses the tool calls of each turn and calls the environment instance's public methods with their arguments.

        calculator, python (a `ToolEnv`): one method per tool, the tool's own name, parameters and docstring; the
            call runs in the environment's tool pool (its argument checks, worker processes and timeout), and a bad
            call returns the environment's one-line "error: ..." text, as rewardlab's own loop would.
        guess_number: `guess(n: int)`: the turn `<g>n</g>`, answered "higher", "lower" or, when found, "found";
            `get_reward()` is rewardlab's outcome `guess_found` (1.0 once the secret was guessed).

    `reset(**example)` (TRL passes the whole dataset example) starts the environment on that row (a conversational
    `prompt`, a list of messages, becomes the row's `messages`); the instance keeps
    `state` (rewardlab's episode state), `tool_calls` (each call's name, arguments, status, seconds) and
    `turn_rewards` (guess_number's per-guess rewards).

    Args:
        env: an environment name of `rewardlab.envs.ENVIRONMENTS` (with `options`), or an environment instance.
    Returns:
        a class whose instances TRL creates, one per completion slot; they share the one rewardlab environment.
    Raises:
        ValueError: an unknown environment name (listing the valid ones), options with an instance, or an
            environment TRL's tool loop cannot drive (one line saying which are supported).
    """
    from rewardlab.envs import GuessNumberEnv, ToolEnv

    built = _built_env(env, options)
    label = env if isinstance(env, str) else type(env).__name__
    namespace: dict[str, Any] = {"reset": _reset_method(built), "env": built,
                                 "__doc__": f"rewardlab environment {label} for TRL."}
    if isinstance(built, ToolEnv):
        namespace.update(_tool_methods(built))
    elif isinstance(built, GuessNumberEnv):
        namespace.update(_guess_methods(built))
    else:
        raise ValueError(f"as_trl_environment: TRL's loop acts only through tools, and {label} has none it can call; "
                         "supported: ToolEnv environments (calculator, python) and guess_number")
    return type(f"TRL_{label}", (), namespace)


def _built_env(env: Any, options: Mapping[str, Any]) -> Any:
    """The environment `as_trl_environment` is given: `make_env(env, **options)` for a name, else the instance.

    Raises:
        ValueError: an unknown environment name or option (from `make_env`), or options with an instance.
    """
    from rewardlab.envs import make_env

    if isinstance(env, str):
        return make_env(env, **options)
    if options:
        raise ValueError(f"as_trl_environment: options {sorted(options)} are for an environment name, not an instance")
    return env


def _reset_method(built: Any) -> Callable[..., None]:
    """The `reset(**example)` method of an `as_trl_environment` class: starts `built` on the dataset example (a
    conversational `prompt`, a list of messages, becomes the row's `messages`) and clears the instance's
    `tool_calls` and `turn_rewards`."""

    def reset(self: Any, **example: Any) -> None:
        row = dict(example)
        if _is_messages(row.get("prompt")):  # a conversational dataset: the prompt turns are the row's messages
            row["messages"] = row.pop("prompt")
        self.state = built.reset(row)
        self.tool_calls, self.turn_rewards = [], []

    return reset


def _tool_methods(built: Any) -> dict[str, Callable[..., str]]:
    """Tool name -> its method (`_tool_method`), for each tool of the `ToolEnv` `built`, in the order it lists them."""
    methods = {}
    for schema in built.tools:
        name = schema["function"]["name"]
        methods[name] = _tool_method(built, name, built._functions[name])
    return methods


def _guess_methods(built: Any) -> dict[str, Callable[..., Any]]:
    """The `guess` and `get_reward` methods of an `as_trl_environment` class backed by the guess_number
    environment `built` (see `as_trl_environment`)."""

    def guess(self, n: int) -> str:  # noqa: ANN001 - no hint on self: transformers' schema reads every hint
        """Guess the secret number.

        Args:
            n: the guess, an integer in the range the prompt gives.
        """
        if self.state.get("found"):
            return "found: the game is over"
        step = built.step(self.state, f"<g>{n}</g>")
        self.turn_rewards.append(0.0 if step.reward is None else float(step.reward))
        if self.state.get("found"):
            return "found"
        return built.raw_text({"content": step.observation}) if isinstance(step.observation, str) \
            else str(step.observation)

    def get_reward(self) -> float:  # noqa: ANN001
        """rewardlab's guess_found: 1.0 when the secret was guessed, else 0.0."""
        return float(bool(self.state.get("found")))

    return {"guess": guess, "get_reward": get_reward}
