"""Tasks from reasoning-gym's procedural generators, scored by each dataset's own `score_answer`."""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from typing import Any

from rewardlab.registry import unknown_options
from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task, dedup_and_split
from rewardlab.tasks.steps import worked_steps

TEMPLATES = ("question", "compact")
#: Row `target` options: "answer" (no extra field) or "steps" (a worked solution, see `worked_steps`).
TARGETS = ("answer", "steps")


#: The loader's own options; every other option is a field of the dataset's config.
LOADER_OPTIONS = ("size", "seed", "test_size", "template", "target")


def check_config(name: str, config: dict[str, Any]) -> None:
    """Check that every key of `config` is a field of reasoning-gym dataset `name`'s config dataclass.

    Raises:
        ValueError: one line, "task reasoning_gym:NAME: unknown option 'x' for reasoning-gym dataset 'NAME'; valid:
            ..." listing the dataset's fields and the loader's own options. An unknown dataset name is left to
            `create_dataset`, which reports it.
    """
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS or not dataclasses.is_dataclass(DATASETS[name][1]):
        return
    fields = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in LOADER_OPTIONS]
    unknown = [k for k in config if k not in fields]
    if unknown:
        raise ValueError(unknown_options(unknown, f"reasoning-gym dataset {name!r}", [*LOADER_OPTIONS, *fields],
                                         f"task reasoning_gym:{name}"))


def create_dataset(name: str, config: dict[str, Any]):
    """reasoning-gym's dataset `name` made with `config` (`reasoning_gym.create_dataset(name, **config)`).

    Raises:
        ValueError: one line, "task reasoning_gym:NAME: ..." for an unknown dataset name, or "task
            reasoning_gym:NAME: bad dataset option: ..." for an unknown or invalid config field.
    """
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(name, **config)
    except ValueError as exc:  # unknown dataset name
        raise ValueError(f"task reasoning_gym:{name}: {exc}") from None
    except (TypeError, AssertionError) as exc:  # unknown or invalid config field
        raise ValueError(f"task reasoning_gym:{name}: bad dataset option: {exc}") from None


@lru_cache(maxsize=64)
def _scorer(name: str, config_json: str):
    return create_dataset(name, json.loads(config_json))


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


def _entry_row(entry: dict[str, Any], name: str, template: str, target: str, dataset_config: dict[str, Any]) -> Row:
    """A reasoning-gym entry of dataset `name` as a task row: `prompt` (`format_prompt` with `template`), `answer`
    (as text), `question`, `metadata`, `dataset`, `dataset_config` (what `score_answer` rebuilds the dataset from),
    and `target` (`_steps_target`) when `target` is "steps".

    Raises:
        ValueError: see `_steps_target` (checked first) and `format_prompt`.
    """
    worked = _steps_target(entry, name) if target == "steps" else None  # before the prompt: the clearer error
    row = {
        "prompt": format_prompt(entry, template, name),
        "answer": str(entry["answer"]),
        "question": entry["question"],
        "metadata": entry.get("metadata", {}),
        "dataset": name,
        "dataset_config": dataset_config,
    }
    if worked is not None:
        row["target"] = worked
    return row


@register_loader("reasoning_gym", example="reasoning_gym:NAME (e.g. reasoning_gym:chain_sum)")
def load_reasoning_gym(
    name: str,
    /,
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
        **config: the dataset's own config fields (e.g. `min_terms=2, max_digits=1` for chain_sum), checked against
            its config dataclass (`check_config`).
    Returns:
        Task whose rows hold `prompt`, `answer`, `question`, `metadata`, `dataset`, `dataset_config`;
        de-duplicated by question text, train and test disjoint by question.
    Raises:
        ValueError: unknown dataset, an option that is not a field of the dataset's config (the message lists the
            valid ones), a bad dataset option value, a template the dataset cannot fill, or an unknown `target` /
            one the dataset cannot give.
    """
    check_config(name, config)
    if target not in TARGETS:
        raise ValueError(f"task reasoning_gym:{name}: target must be one of {TARGETS}, got {target!r}")
    ds_config = dict(config, size=size, seed=seed)
    dataset = create_dataset(name, ds_config)
    scorer_config = {k: v for k, v in ds_config.items() if k not in ("size", "seed")}
    rows = [_entry_row(entry, name, template, target, scorer_config) for entry in dataset]
    train, test = dedup_and_split(rows, key=lambda r: r["question"], test_size=test_size, seed=seed)
    unique = len(train) + len(test)
    return Task(
        name=f"reasoning_gym:{name}",
        train=train,
        test=test,
        reward="arithmetic_steps" if target == "steps" else "reasoning_gym",
        source=f"generated by reasoning-gym (task.options.size={size} draws, seed {seed}: {unique} unique questions; "
               f"the {len(test)} held out are task.options.test_size={test_size!r} of them)",
    )
