"""Tasks from reasoning-gym's procedural generators, scored by each dataset's own `score_answer`."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task, dedup_and_split
from rewardlab.tasks.steps import worked_steps

TEMPLATES = ("question", "compact")
#: Row `target` options: "answer" (no extra field) or "steps" (a worked solution, see `worked_steps`).
TARGETS = ("answer", "steps")


def _dataset(name: str, config: dict[str, Any]):
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, **config)
    except ValueError as exc:  # unknown dataset name
        raise ValueError(f"task reasoning_gym:{name}: {exc}") from None
    except (TypeError, AssertionError) as exc:  # unknown or invalid config field
        raise ValueError(f"task reasoning_gym:{name}: bad dataset option: {exc}") from None


@lru_cache(maxsize=64)
def _scorer(name: str, config_json: str):
    return _dataset(name, json.loads(config_json))


def format_prompt(entry: dict[str, Any], template: str, name: str) -> str:
    """The prompt text of a reasoning-gym entry.

    `template` is "question" (the dataset's own question text), "compact" (the entry's `metadata.expression`
    with spaces removed followed by "=", e.g. `3+4-2=`), or a `str.format` template over `question` and the
    metadata fields (e.g. "Q: {expression}\\nA:").

    Raises:
        ValueError: when "compact" is asked of a dataset without `metadata.expression`, or a template names a
            field the entry does not have.
    """
    meta = entry.get("metadata", {})
    if template == "question":
        return entry["question"]
    if template == "compact":
        if "expression" not in meta:
            raise ValueError(
                f"task reasoning_gym:{name}: template 'compact' needs metadata['expression'], which this dataset "
                "does not provide; use template 'question' or a format string"
            )
        return str(meta["expression"]).replace(" ", "") + "="
    try:
        return template.format(question=entry["question"], **meta)
    except KeyError as exc:
        raise ValueError(f"task reasoning_gym:{name}: template field {exc} not in the entry") from None


def _steps_target(entry: dict[str, Any], name: str) -> str:
    """The `target="steps"` field of a reasoning-gym entry: its `metadata.expression` worked as partial sums
    (`worked_steps`, e.g. "3+4=7\\n7-2=5").

    Raises:
        ValueError: (one line, naming the task) when the entry has no `metadata.expression` or it is not an integer
            `+`/`-` chain.
    """
    meta = entry.get("metadata", {})
    if "expression" not in meta:
        raise ValueError(f"task reasoning_gym:{name}: target 'steps' needs an integer +/- chain in "
                         "metadata['expression'] (as chain_sum has), which this dataset does not provide")
    try:
        return worked_steps(str(meta["expression"]))
    except ValueError as exc:
        raise ValueError(f"task reasoning_gym:{name}: target 'steps' needs an integer +/- chain: {exc}") from None


def score_answer(row: Row, answer: str | None) -> float:
    """Score `answer` for a row made by this loader with the dataset's own `score_answer` (0..1).

    The dataset is rebuilt (and cached) from the row's `dataset` and `dataset_config`, so config-dependent
    scorers see the config the row was generated with.
    """
    ds = _scorer(row["dataset"], json.dumps(row.get("dataset_config", {}), sort_keys=True))
    entry = {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}
    return float(ds.score_answer(answer=answer, entry=entry))


@register_loader("reasoning_gym")
def load_reasoning_gym(
    name: str,
    *,
    size: int = 20000,
    seed: int = 0,
    test_size: int | float = 500,
    template: str = "question",
    target: str = "answer",
    **config: Any,
) -> Task:
    """Load reasoning-gym dataset `name` as a Task.

    Args:
        name: a registered reasoning-gym dataset, e.g. `chain_sum`.
        size: number of entries drawn from the generator before de-duplication.
        seed: generator seed and split seed (fixed seed: the same call gives the same rows).
        test_size: held-out questions (int count, or a float fraction of unique questions).
        template: prompt format, see `format_prompt`.
        target: "answer" (default), or "steps": each row also gets `target`, the worked solution of its
            `metadata.expression` (`worked_steps`, e.g. "3+4=7\\n7-2=5"), for SFT with `sft.target=target`, and the
            task's verifier becomes `arithmetic_steps` (checks each step; `correct` = the final result). `answer`
            stays the final number. Needs a dataset whose expression is an integer `+`/`-` chain (chain_sum).
        **config: the dataset's own config fields (e.g. `min_terms=2, max_digits=1` for chain_sum).
    Returns:
        Task whose rows hold `prompt`, `answer`, `question`, `metadata`, `dataset`, `dataset_config`;
        de-duplicated by question text, train and test disjoint by question.
    Raises:
        ValueError: unknown dataset, bad dataset option, a template the dataset cannot fill, or an unknown
            `target` / one the dataset cannot give.
    """
    if target not in TARGETS:
        raise ValueError(f"task reasoning_gym:{name}: target must be one of {TARGETS}, got {target!r}")
    ds_config = dict(config, size=size, seed=seed)
    dataset = _dataset(name, ds_config)
    scorer_config = {k: v for k, v in ds_config.items() if k not in ("size", "seed")}
    rows = []
    for entry in dataset:
        worked = _steps_target(entry, name) if target == "steps" else None  # before the prompt: the clearer error
        rows.append(
            {
                "prompt": format_prompt(entry, template, name),
                "answer": str(entry["answer"]),
                "question": entry["question"],
                "metadata": entry.get("metadata", {}),
                "dataset": name,
                "dataset_config": scorer_config,
            }
        )
        if worked is not None:
            rows[-1]["target"] = worked
    train, test = dedup_and_split(rows, key=lambda r: r["question"], test_size=test_size, seed=seed)
    return Task(
        name=f"reasoning_gym:{name}",
        train=train,
        test=test,
        reward="arithmetic_steps" if target == "steps" else "reasoning_gym",
        info={"drawn": len(rows), "unique": len(train) + len(test), "template": template, "target": target},
    )
