"""rewardlab inside TRL (1.16): rewards as `GRPOTrainer` reward functions, and datasets in TRL's formats.

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewardlab.integrations.common import as_reward, component_keys, needed_fields
from rewardlab.rewards.base import Reward, RewardError
from rewardlab.rewards.compose import error_sources
from rewardlab.types import Rollout, RewardOutput

#: The keywords GRPOTrainer adds to the dataset columns; the adapters take them out by name.
PEER_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


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
        self.needed = needed_fields(reward)
        self.checked = False
        self.failed = 0  # rows whose reward failed, over this scorer's life
        self._last: tuple[Any, Any, Any, list[RewardOutput | None]] | None = None

    def score(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] | None,
              kwargs: Mapping[str, Any]) -> tuple[list[RewardOutput | None], bool]:
        """The outputs of this batch (None: not applicable) and whether they were computed now (False: cached)."""
        last = self._last
        if last is not None and last[0] is prompts and last[1] is completions and last[2] is completion_ids:
            return last[3], False
        columns = {k: v for k, v in kwargs.items() if k not in PEER_KWARGS}
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
        if not self.checked:
            missing = [f for f in self.needed if f != "prompt" and f not in columns]
            if missing:
                raise ValueError(f"{self.name}: the reward needs dataset column {missing[0]!r}, which this dataset "
                                 f"lacks (columns: {', '.join(sorted(columns)) or 'none'})")
            self.checked = True
        outputs: list[RewardOutput | None] = [None] * n
        todo, rollouts = [], []
        group, previous = -1, object()
        for i in range(n):
            if prompts[i] != previous:
                group, previous = group + 1, prompts[i]
            row = {k: v[i] for k, v in columns.items()}
            if any(row.get(f) is None for f in self.needed if f != "prompt"):
                continue  # a None in a field the reward needs: not applicable to this row
            todo.append(i)
            rollouts.append(_rollout(prompts[i], completions[i], None if completion_ids is None else completion_ids[i],
                                     row, group))
        if rollouts:
            for i, out in zip(todo, self.reward(rollouts)):
                outputs[i] = out
        self._last = (prompts, completions, completion_ids, outputs)
        return outputs, True


def _rollout(prompt: Any, completion: Any, ids: Sequence[int] | None, row: dict[str, Any], group: int) -> Rollout:
    """A TRL (prompt, completion) as a rewardlab rollout. Conversational: the prompt text is the last user turn
    (the row keeps the prompt turns as `messages`, as a rewardlab chat row does) and the completion text is the last
    assistant turn's content."""
    messages: list[dict[str, Any]] = []
    if _is_messages(prompt):
        users = [m for m in prompt if m.get("role") == "user"]
        prompt_text = _text((users or prompt)[-1].get("content")) if prompt else ""
        row.setdefault("messages", list(prompt))
        messages = list(prompt)
    else:
        prompt_text = str(prompt)
    if _is_messages(completion):
        said = [m for m in completion if m.get("role") == "assistant"]
        completion_text = _text(said[-1].get("content")) if said else ""
        messages = messages + list(completion)
    else:
        completion_text = str(completion)
    row.setdefault("prompt", prompt_text)
    ids = [int(t) for t in ids] if ids is not None else []
    return Rollout(prompt=prompt_text, prompt_ids=[], completion=completion_text, completion_ids=ids,
                   logprobs=[0.0] * len(ids), row=row, group=group,
                   messages=messages if _is_messages(completion) else [])


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

    @property
    def failed(self) -> int:
        return self._scorer.failed

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                 completion_ids: Sequence[Sequence[int]] | None = None, **kwargs: Any) -> list[float | None]:
        outputs, fresh = self._scorer.score(prompts, completions, completion_ids, kwargs)
        if self.key is not None:
            return [None if o is None or o.error is not None or self.key not in o.components
                    else float(o.components[self.key]) for o in outputs]
        failed = [o for o in outputs if o is not None and o.error is not None]
        on_error = self._scorer.on_error
        if failed and on_error == "raise":
            raise RewardError(f"{self.__name__}: {failed[0].error}")
        if fresh:
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
