"""`env:NAME`: the rows of an environment (`rewardlab.envs.ENVIRONMENTS`: a built-in one, or a class of the user's
named `env:MODULE:CLASS` or `env:PATH.py:CLASS`) as a task whose rollouts are episodes in that environment.

    task = load("env:guess_number", n=16, seed=0)
    task.env        # {"name": "guess_number", "options": {"n": 16}}: the verbs build it (envs.episode_settings)
    task.reward     # the environment's outcome reward: a name, or {"name": ..., **options} ("code", fenced: true)
    load("env:./my_envs.py:UnitGame")   # the user's class (envs.resolve_env); task.env["name"] is its absolute path

Options (`task.options`): `seed` (the rows' seed, default 0) and the environment's own declared options (e.g. n,
size, test_size for guess_number). The tool timeout and the calls run per turn are not task options: they are
`env.tool_timeout_s` and `env.max_tool_calls_per_turn`.

What a class needs to be an environment task (docs/agents.md, "Your own environment as a task"): keyword options in
`__init__`; `task(seed) -> Task` (its train and test rows and its outcome `reward`); `reset(row)` and
`step(state, action)` (`MultiTurnEnv` has them); optionally `reward` and `reward_options` attributes, which take the
place of the Task's reward (the built-in environments have them), and `close()`.

The loader lives here, in the layer above tasks/, and registers itself into `rewardlab.tasks.LOADERS` when this
module is imported (`import rewardlab.envs` imports it); `rewardlab.tasks.load("env:...")` imports it on first use
of the kind (`rewardlab.tasks.KIND_PROVIDERS`), so `import rewardlab.tasks` never loads envs/ (which pulls torch).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rewardlab.envs.builtin import ENVIRONMENTS, resolve_env
from rewardlab.registry import unknown_options
from rewardlab.tasks import register_loader
from rewardlab.tasks.base import Row, Task, row_key

#: Environment options set by the `env` config section instead of task.options: option -> its config key.
FROM_ENV_SECTION = {"timeout_s": "env.tool_timeout_s", "max_calls_per_turn": "env.max_tool_calls_per_turn"}


def reward_spec(env: Any, task: Task | None = None) -> str | dict[str, Any]:
    """An environment's outcome reward as a spec `build_reward` reads: its name (`env.reward`), or with options
    (`env.reward_options`, e.g. python's {"fenced": True}) the mapping {"name": env.reward, **options}; for an
    environment without a `reward` attribute, the reward of its `task` (`env.task(seed)`)."""
    if getattr(env, "reward", None) is None and task is not None:
        return task.reward
    options = dict(getattr(env, "reward_options", None) or {})
    return {"name": env.reward, **options} if options else env.reward


def _with_ids(rows: list[Row], name: str, split: str) -> list[Row]:
    """Copies of `rows` with `row_id` "env:NAME/SPLIT/INDEX": the rows of an environment may share their prompt
    (guess_number's differ only by their secret), so `row_key` identifies them by this id."""
    return [dict(row, row_id=f"env:{name}/{split}/{i}") for i, row in enumerate(rows)]


@register_loader("env", example="env:NAME")
def load_environment(name: str, /, **options: Any) -> Task:
    """The rows of environment `name` (`ENVIRONMENTS`, or a class of the user's, `resolve_env`): `env.task(seed)`
    with `Task.env` = {"name": its registered name (a user's class: its canonical MODULE:CLASS or
    /abs/path.py:CLASS), "options": the environment's options (seed excluded)}, `name` "env:NAME", `reward` =
    `reward_spec(env, task)` and every row stamped with a `row_id` (see `_with_ids`).

    Args:
        name: a registered environment (calculator, guess_number, python, ...), or MODULE:CLASS or PATH.py:CLASS.
        options: `seed` (int, default 0) and the options the environment declares (`make_env` checks their types).
    Raises:
        ValueError: one line: an unknown environment (listing the valid ones), or a user's class that does not
            import or lacks a method (`resolve_env`), prefixed "task spec 'env:NAME'"; an option neither `seed` nor
            one the environment declares ("task.options: unknown option 'x' for environment 'guess_number'; valid:
            n, seed, size, test_size"); an option the env config section sets (timeout_s: env.tool_timeout_s); a
            value of the wrong type or one the environment refuses, prefixed "task.options"; `task(seed)` that
            returns no `Task`.
    """
    try:
        key = resolve_env(name)
        declared_all = ENVIRONMENTS.options(key) or ()
    except ValueError as exc:  # an unknown environment (the message lists the valid ones), or one that won't import
        raise ValueError(f"task spec 'env:{name}': {exc}") from None
    seed = options.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"task.options.seed: expected an integer, got {seed!r}")
    moved = [k for k in options if k in FROM_ENV_SECTION and k in declared_all]
    if moved:
        raise ValueError(f"task.options.{moved[0]}: set {FROM_ENV_SECTION[moved[0]]} instead (the env section holds "
                         f"the episode settings of env:{name})")
    declared = [k for k in declared_all if k not in FROM_ENV_SECTION]
    unknown = [k for k in options if k not in declared]
    if unknown:
        raise ValueError(unknown_options(unknown, f"environment {name!r}", [*declared, "seed"], "task.options"))
    options = ENVIRONMENTS.validate(key, options, field="task.options")
    try:
        env = ENVIRONMENTS.get(key)(**options)
    except ValueError as exc:
        raise ValueError(f"task.options: {exc}") from None
    try:
        task = env.task(seed)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    if not isinstance(task, Task):
        raise ValueError(f"task spec 'env:{name}': {type(env).__name__}.task(seed) returned a "
                         f"{type(task).__name__}, expected a rewardlab.tasks.Task(name, train, test, reward)")
    train, test = _with_ids(task.train, name, "train"), _with_ids(task.test, name, "test")
    all_rows = None if task.all_rows is None else _with_ids(task.all_rows, name, "all")
    origins = {}
    for old, new in zip(task.train + task.test, train + test):  # re-keyed by the rows' ids
        if row_key(old) in task.origins:
            origins[row_key(new)] = task.origins[row_key(old)]
    return replace(task, name=f"env:{name}", train=train, test=test, all_rows=all_rows,
                   reward=reward_spec(env, task), origins=origins, env={"name": key, "options": options})
