"""What every verb needs: its inputs loaded from the config, and its run directory opened."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from rewardlab.config import dump_config, renamed_keys
from rewardlab.policy import Policy, load_policy
from rewardlab.runs import RunDir, RunMode, warn
from rewardlab.tasks import Task, check_prompt_lengths, check_task_for_policy, describe_task
from rewardlab.tasks import load as load_task
from rewardlab.threads import apply_threads


def load_model(cfg: Any, path: str | None = None) -> Policy:
    """The policy that `cfg.model` names (or the model at `path`, with `cfg.model`'s other settings), seeded with
    `cfg.seed`.

    Raises:
        what `rewardlab.policy.load_policy` raises (a bad model directory: one line naming it).
    """
    return load_policy(path or cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())


def load_inputs(cfg: Any, *, model: bool = True) -> tuple[Task, Policy | None]:
    """Apply `cfg.threads` (`rewardlab.threads.apply_threads`), seed torch with `cfg.seed`, then load `cfg.task` and (with `model`) the policy `cfg.model` names, and check
    that the policy can read the task (`check_task_for_policy`).

    Raises:
        what `rewardlab.tasks.load`, `load_model` and `check_task_for_policy` raise (one line naming the bad field,
        file or line).
    """
    apply_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    task = load_task(cfg.task.spec, **cfg.task.options)
    policy = load_model(cfg) if model else None
    if policy is not None:
        check_task_for_policy(task, policy)
    return task, policy


def check_prompts(task: Task, policy: Policy, *, max_new_tokens: int, key: str, max_prompt_length: int | None = None,
                  prompt_key: str | None = None) -> None:
    """Every prompt of `task` fits the model's context window with `max_new_tokens` (the verb's `key`), or is cut by
    `max_prompt_length` (`prompt_key`), which is then said in one warning (`tasks.check_prompt_lengths`). Call it
    before the run directory is opened.

    Raises:
        ValueError: one line naming the first prompt that does not fit by its FILE:LINE, or the keys.
    """
    note = check_prompt_lengths(task, policy, max_new_tokens=max_new_tokens, key=key,
                                max_prompt_length=max_prompt_length, prompt_key=prompt_key)
    if note:
        warn(note)


def announce_task(task: Task, enabled: bool = True) -> None:
    """One line on stderr: how many rows `task` trains on and holds out, and from which file (`describe_task`).
    Verbs call it once their inputs are checked, just before they open the run directory."""
    if enabled:
        note(describe_task(task))


def open_run(cfg: Any, *, mode: RunMode = "new", may_change: Iterable[str] = ()) -> RunDir:
    """Open `cfg.out` with `RunDir.start` and record `cfg` in its config.yaml (a resume checks it instead: only the
    dotted keys in `may_change` may differ). Call it once the inputs load, so that bad input creates or deletes
    nothing. Use the result as a context manager; it is closed again if recording the config fails.

    Raises:
        RunDirError (a ValueError): `cfg.out` holds a run and `mode` is "new", is in use, or "resume" with
            other settings.
    """
    run = RunDir.start(cfg.out, mode=mode)
    try:
        run.record_config(dump_config(cfg), resume=mode == "resume", may_change=may_change,
                          renamed=renamed_keys(type(cfg)))
    except BaseException:
        run.close()
        raise
    return run


#: The task options that name a reward (a registered name is data; MODULE:FUNCTION is code, never adopted).
REWARD_OPTIONS = ("reward",)


def trained_task(model_path: str) -> tuple[Path, dict[str, Any]] | None:
    """The task a rewardlab checkpoint was trained on: for `RUN/checkpoints/step-K` whose run `RUN` has a
    config.yaml with a `task` section, (RUN/config.yaml, {"spec": ..., "options": {...}}); None for any other
    model path (an HF directory, "tiny", a run without config.yaml or without a task section). The file is read
    as data (`read_config_file`: YAML, no Python objects); nothing in it is imported here.

    Raises:
        ConfigError: one line naming RUN/config.yaml: it is not UTF-8, not YAML (or nested too deeply), its top
            level is not a mapping, its `task` is not a mapping with a string `spec`, or `task.options` is not a
            mapping.
    """
    from rewardlab.config import ConfigError, read_config_file

    path = Path(model_path)
    if path.parent.name != "checkpoints":
        return None
    config = path.parent.parent / "config.yaml"
    if not config.is_file():
        return None
    task = read_config_file(config).get("task")
    if task is None:
        return None
    if not isinstance(task, dict) or not isinstance(task.get("spec"), str):
        raise ConfigError(f"config file {config}: task: expected a mapping with a string spec (spec: KIND:ARGUMENT), "
                          f"got {_short(task)}")
    options = task.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"config file {config}: task.options: expected a mapping, got {_short(options)}")
    return config, {"spec": task["spec"], "options": dict(options)}


def _short(value: Any, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters (a value read from a file may be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def with_trained_task(cfg: Any) -> tuple[Any, dict[str, Any]]:
    """`cfg` with its task defaulting to the one its model was trained on, and what to report about it.

    When `cfg.model.path` is a checkpoint of a rewardlab run (`trained_task`) and the config sets no task, the task
    and its options become the run's (a line on stderr says so). When the config sets a task that differs, a
    warning says so. Returns (cfg, {"trained_on": the run's task or None, "task_differs": bool, "task_from":
    "config" | "model's run"}), for the verb's summary.

    A run directory is data, never code: a task is adopted only when building it imports nothing, i.e. its reward
    options (`REWARD_OPTIONS`) name registered rewards, not MODULE:FUNCTION (`rewards.importing.import_names`), and
    its spec names no environment class of the user's (env:MODULE:CLASS, env:PATH.py:CLASS). A malformed
    config.yaml is ignored, with a warning, when the config sets the task.

    Raises:
        ConfigError: (one line, naming RUN/config.yaml and saying to pass --task) the config sets no task and the
            run's config.yaml is malformed (`trained_task`), its task's reward is MODULE:FUNCTION code, or its spec
            is env:MODULE:CLASS code.
    """
    from rewardlab.config import ConfigError
    from rewardlab.rewards.importing import import_names, is_import_name

    given = "task" in cfg.model_fields_set
    info: dict[str, Any] = {"trained_on": None, "task_differs": False, "task_from": "config"}
    try:
        found = trained_task(cfg.model.path)
    except ConfigError as exc:
        if given:
            warn(f"{exc}; ignored: the task is given ({cfg.task.spec})")
            return cfg, info
        raise ConfigError(f"{exc}; it is the run of model.path {cfg.model.path}: pass --task to name the task") \
            from None
    if found is None:
        return cfg, info
    config, task = found
    info["trained_on"] = task
    if not given:
        kind, _, argument = task["spec"].partition(":")
        if kind == "env" and is_import_name(argument):
            raise ConfigError(
                f"config file {config}: task.spec {task['spec']!r} names an environment class by MODULE:CLASS, i.e. "
                f"code, and a run directory is never trusted to run code; to run it, name the task on the command "
                f"line (--task {task['spec']}), or pass --task to choose another")
        for key in REWARD_OPTIONS:
            code = import_names(task["options"].get(key))
            if code:
                raise ConfigError(
                    f"config file {config}: task.options.{key} {code[0]!r} is a MODULE:FUNCTION reference, i.e. code, "
                    f"and a run directory is never trusted to run code; to run it, name the task on the command line "
                    f"(--task {task['spec']} task.options.{key}={code[0]}), or pass --task to choose another")
        cfg = cfg.model_copy(update={"task": type(cfg.task)(**task)})
        info["task_from"] = "model's run"
        note(f"task {task['spec']} (options {task['options']}): the task {cfg.model.path} was trained on "
             f"({config}); pass --task to choose another")
    elif {"spec": cfg.task.spec, "options": dict(cfg.task.options)} != task:
        info["task_differs"] = True
        warn(f"task {cfg.task.spec} (options {dict(cfg.task.options)}) differs from the task {cfg.model.path} was "
             f"trained on: {task['spec']} (options {task['options']}, {config})")
    return cfg, info


def note(message: str) -> None:
    """A one-line note on stderr."""
    import sys

    print(f"rewardlab: {message}", file=sys.stderr, flush=True)
