"""One call for every verb that samples a task: single completions (`Policy.generate`) or, for an environment task,
episodes (`run_episodes`), and the bookkeeping between an episode's rows and the episode.

    rows_out = sample_rollouts(policy, rows, SamplingSettings(max_new_tokens=16), episodes=settings_or_None, n=8,
                               stream=(seed, step, 1))
    ends = episode_ends(rows_out)          # one rollout per episode (its last row): what rewards and counts see
    by_episode = episode_rows(rows_out)    # id(end) -> the episode's rows, in order

A single-turn rollout is an episode of one row: `episode_ends` returns it and `episode_rows` maps it to [itself].
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from rewardlab.envs.episode import EpisodeSettings, run_episodes
from rewardlab.types import Rollout

if TYPE_CHECKING:
    from rewardlab.policy.settings import SamplingSettings


def episode_settings(task: Any, section: Any) -> EpisodeSettings | None:
    """The episodes of `task` (a `rewardlab.tasks.Task`): None for a single-turn task (`task.env` is None), else its
    environment (`make_env(task.env["name"], **task.env["options"])`, with `timeout_s=section.tool_timeout_s` and
    `max_calls_per_turn=section.max_tool_calls_per_turn` for an environment that declares them; None leaves its own)
    and the budgets of `section`.

    Args:
        task: a `rewardlab.tasks.Task`.
        section: the `env` config section (`rewardlab.config.EnvConfig`, or any object with its attributes):
            max_turns, max_episode_tokens, max_tool_tokens, tool_keep, tool_timeout_s, max_tool_calls_per_turn.
    Raises:
        ValueError: what `make_env` raises.
    """
    if getattr(task, "env", None) is None:
        return None
    from rewardlab.envs.builtin import ENVIRONMENTS, make_env

    name, options = task.env["name"], dict(task.env.get("options") or {})
    declared = ENVIRONMENTS.options(name) or ()
    if section.tool_timeout_s is not None and "timeout_s" in declared:
        options.setdefault("timeout_s", section.tool_timeout_s)
    if section.max_tool_calls_per_turn is not None and "max_calls_per_turn" in declared:
        options.setdefault("max_calls_per_turn", section.max_tool_calls_per_turn)
    return EpisodeSettings(make_env(name, **options), max_turns=section.max_turns,
                           max_episode_tokens=section.max_episode_tokens, max_tool_tokens=section.max_tool_tokens,
                           tool_keep=section.tool_keep, name=name)


#: The env keys that only environments running tools read.
TOOL_KEYS = ("tool_timeout_s", "max_tool_tokens", "tool_keep", "max_tool_calls_per_turn")


def check_episode_keys(settings: EpisodeSettings | None, policy: Any, *, changed: Collection[str] = ()) -> None:
    """The env keys checked against the environment and the model, at set-up before anything is written: every key
    is consumed or refused by name.

    Args:
        settings: `episode_settings(...)`; None (a single-turn task) checks nothing (the config already refuses an
            env key set on one).
        policy: the policy (its `tokenizer` and `prompt_format` make the renderer whose truncation marker a tool
            output must have room for); a policy without a tokenizer skips the marker check.
        changed: names of the env keys the config sets to other than their defaults (e.g. {"tool_keep"}).
    Raises:
        ValueError: one line: "env.tool_timeout_s, env.tool_keep: environment 'guess_number' runs no tools, ..."
            for a tool key in `changed` on an environment without tools (no `tools`); "env.max_tool_tokens: 4 tokens
            cannot hold the truncation marker ..." when settings.max_tool_tokens is below the renderer's
            `marker_tokens`.
    """
    if settings is None:
        return
    env = settings.env
    name = settings.name or type(env).__name__
    if not getattr(env, "tools", None):
        given = [f"env.{k}" for k in TOOL_KEYS if k in changed]
        if given:
            raise ValueError(f"{', '.join(given)}: environment {name!r} runs no tools, so nothing reads "
                             f"{'it' if len(given) == 1 else 'them'}; drop the setting")
        return
    tokenizer = getattr(policy, "tokenizer", None)
    if settings.max_tool_tokens is None or tokenizer is None:
        return
    from rewardlab.envs.render import make_renderer

    renderer = make_renderer(tokenizer, getattr(policy, "prompt_format", "auto"), tools=env.tools,
                             raw_text=getattr(env, "raw_text", None))
    if settings.max_tool_tokens < renderer.marker_tokens:
        raise ValueError(f"env.max_tool_tokens: {settings.max_tool_tokens} tokens cannot hold the truncation marker "
                         f"{renderer.marker!r} ({renderer.marker_tokens} tokens of this model's tokenizer) that ends "
                         f"a cut tool output; set it to at least {renderer.marker_tokens}")


def turn_budget_warning(settings: EpisodeSettings | None, policy: Any, max_new_tokens: int, *,
                        key: str = "max_new_tokens") -> str | None:
    """A one-line warning when the per-turn token budget `max_new_tokens` (the verb's `key`, e.g.
    "rl.sampling.max_new_tokens") is below what a model turn of the environment's own format needs with the policy's
    tokenizer (`env.min_turn_tokens(tokenizer)`, which each built-in environment declares), else None: a turn cut there
    ends its episode `max_new_tokens` before the environment sees it. None too for a single-turn task, an environment
    that declares no `min_turn_tokens`, or a policy without a tokenizer.

    Example: "rl.sampling.max_new_tokens=8 is below the 9 tokens a model turn of environment 'guess_number' needs for
    its own format with this model's tokenizer (min_turn_tokens): such turns are cut and end their episode
    max_new_tokens; set rl.sampling.max_new_tokens to at least 9".
    """
    if settings is None:
        return None
    need_of = getattr(settings.env, "min_turn_tokens", None)
    tokenizer = getattr(policy, "tokenizer", None)
    if not callable(need_of) or tokenizer is None:
        return None
    need = int(need_of(tokenizer))
    if max_new_tokens >= need:
        return None
    name = settings.name or type(settings.env).__name__
    return (f"{key}={max_new_tokens} is below the {need} tokens a model turn of environment {name!r} needs for its "
            f"own format with this model's tokenizer (min_turn_tokens): such turns are cut and end their episode "
            f"max_new_tokens; set {key} to at least {need}")


def load_episodes(task: Any, section: Any, policy: Any) -> EpisodeSettings | None:
    """The episodes of an environment task (`task.env`; None for a single-turn task): its environment and the budgets
    of the `env` config section (`episode_settings`), the section's keys checked against the environment and the
    model (`check_episode_keys`). `env.tool_timeout_s` (null by default: the environment's own timeout) becomes the
    `timeout_s` of an environment that runs tools, `env.max_tool_calls_per_turn` its `max_calls_per_turn`. Call it
    at set-up, before a run directory is opened.

    Args:
        task: a `rewardlab.tasks.Task`.
        section: the `env` config section (`rewardlab.config.EnvConfig`: max_turns, max_episode_tokens,
            max_tool_tokens, tool_keep, tool_timeout_s, max_tool_calls_per_turn and `changed()`, the keys set to other
            than their defaults).
        policy: the policy whose renderer must fit the truncation marker in max_tool_tokens; None skips that check.
    Raises:
        ValueError: one line naming the key: what `episode_settings` (`make_env`) and `check_episode_keys` raise;
            env.max_tool_calls_per_turn set on an environment that runs tools but does not take `max_calls_per_turn`.
    """
    if getattr(task, "env", None) is None:
        return None
    settings = episode_settings(task, section)
    changed = section.changed()
    check_episode_keys(settings, policy, changed=changed)
    env = settings.env
    if "max_tool_calls_per_turn" in changed and getattr(env, "max_calls_per_turn", None) != \
            section.max_tool_calls_per_turn:
        raise ValueError(f"env.max_tool_calls_per_turn: environment {settings.name or type(env).__name__!r} does "
                         "not take max_calls_per_turn, so nothing reads it; drop the setting")
    return settings


def close_env(episodes: EpisodeSettings | None) -> None:
    """Stop an environment's tool workers (a no-op for single completions and for environments without tools)."""
    close = getattr(episodes.env, "close", None) if episodes is not None else None
    if close is not None:
        close()


def sample_rollouts(policy: Any, rows: Sequence[dict[str, Any]], sampling: SamplingSettings, *,
                    episodes: EpisodeSettings | None, n: int = 1, stream: tuple[int, int, int] | None = None,
                    batch_size: int | None = None, first_row: int = 0) -> list[Rollout]:
    """Sample `n` rollouts of each row: single completions, or with `episodes` whole episodes.

    Args:
        policy: a `rewardlab.policy.Policy` (or any object with `generate` and, for episodes, `sample_ids`).
        rows: task rows (`prompt`, or chat `messages`; `answer`, ...).
        sampling: `rewardlab.policy.SamplingSettings`: max_new_tokens (the token limit of a completion, or of one
            model turn of an episode), temperature, top_p and greedy (as in `Policy.generate`), max_prompt_length
            (single completions only: each prompt is cut to its last this many tokens, `Policy.generate`'s left
            truncation, TRL's max_prompt_length; None: never cut); chunk is not read.
        episodes: the environment and its budgets (`EpisodeSettings`); None for a single-turn task.
        n: samples (episodes) per row, prompt-major; 1 when greedy.
        stream: (seed, step, round): sample k of the call (k = row index * n + j) draws from its own random stream,
            (seed, step, k, round) for a single completion and (seed, step, k, round, turn) for each turn of an
            episode, so what it samples depends neither on the rows it is batched with nor on torch's global
            generator. None: torch's global generator (single completions) or stream (0, 0, k, 0, turn) (episodes).
        batch_size: rows per sampling call (default all at once); results do not depend on it when `stream` is set.
        first_row: the index of rows[0] in the batch these rows are a chunk of (a rollout engine's chunk,
            `rewardlab.rl.engines`): sample k of the call is sample first_row * n + k of that batch (its stream,
            group and episode id), so sampling a batch chunk by chunk gives the rollouts of sampling it at once with
            batch_size = the chunk's rows.
    Returns:
        Single-turn: len(rows) * n rollouts, rollout k of row k // n with group first_row + k // n. Episodes: the
        rows of each episode in episode order (episode k of row k // n), one rollout per row, every row with its
        `episode_id` (first_row * n + k) and group first_row + k // n; read them per episode with `episode_ends` /
        `episode_rows`.
    Raises:
        ValueError: what `Policy.generate` or `run_episodes` raise for bad settings (a prompt that fills the context
            window included); `max_prompt_length` with `episodes`.
    """
    greedy, max_prompt_length = sampling.greedy, sampling.max_prompt_length
    if episodes is not None and max_prompt_length is not None:
        raise ValueError("max_prompt_length: cuts single-turn prompts; episodes end at the context window instead")
    cut = {} if max_prompt_length is None else {"max_prompt_length": max_prompt_length}  # stand-ins may lack it
    step = batch_size or len(rows) or 1
    out: list[Rollout] = []
    for start in range(0, len(rows), step):
        chunk = list(rows[start:start + step])
        offset = (first_row + start) * n
        if episodes is None:
            streams = ([(stream[0], stream[1], offset + k, stream[2]) for k in range(len(chunk) * n)]
                       if stream is not None and not greedy else None)
            new = policy.generate([r["prompt"] for r in chunk], n=n, temperature=sampling.temperature,
                                  top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens, greedy=greedy,
                                  rows=chunk, streams=streams, **cut)
        else:
            new = run_episodes(policy, episodes, chunk, sampling, n=n,
                               stream=stream if stream is not None else (0, 0, 0), episode_offset=offset)
        for r in new:
            r.group += first_row + start
        out += new
    return out


def episode_ends(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The last row of each episode, in episode order: the rollout its outcome reward reads (its `completion` is the
    episode's final model turn) and that counts it once. A rollout without `episode_id` is its own episode."""
    return [r for r in rollouts if r.episode_id is None or r.termination is not None]


def split_episodes(rollouts: Sequence[Rollout]) -> list[list[Rollout]]:
    """The rows of each episode, in episode order (the order of `episode_ends`); rows of one episode are consecutive,
    as `run_episodes` returns them; a rollout without `episode_id` is an episode of one row.

    Raises:
        ValueError: an episode whose rows are not consecutive or that has no last row (termination unset).
    """
    out: list[list[Rollout]] = []
    pending: list[Rollout] = []
    for r in rollouts:
        if r.episode_id is None:
            if pending:
                raise ValueError(f"episode {pending[0].episode_id}: its rows are not followed by its last row")
            out.append([r])
            continue
        if pending and pending[0].episode_id != r.episode_id:
            raise ValueError(f"episode {pending[0].episode_id}: no last row (termination unset) before episode "
                             f"{r.episode_id} begins")
        pending.append(r)
        if r.termination is not None:
            out.append(pending)
            pending = []
    if pending:
        raise ValueError(f"episode {pending[0].episode_id}: no last row (termination unset)")
    return out


def episode_rows(rollouts: Sequence[Rollout]) -> dict[int, list[Rollout]]:
    """id(last row) -> the rows of its episode, in order (`split_episodes`; a rollout without `episode_id` maps to
    [itself]).

    Raises:
        ValueError: as `split_episodes`.
    """
    return {id(rows[-1]): rows for rows in split_episodes(rollouts)}


def _episode_tokens(rows: Sequence[Rollout]) -> int:
    """The tokens of an episode after its first prompt, as the episode loop counts them (see `episode_metrics`)."""
    grown = sum(max(0, len(b.prompt_ids) - len(a.prompt_ids) - len(a.completion_ids)) for a, b in zip(rows, rows[1:]))
    return sum(len(r.completion_ids) for r in rows) + grown


def episode_counts(rows: Sequence[Rollout]) -> dict[str, Any]:
    """The counts of one episode (its rows, in order) that `count_metrics` averages; JSON-serialisable, so a
    resumable evaluation can keep them per batch.

    Returns:
        {"turns": model turns, all rows; "tokens": tokens after the first prompt, counted as `max_episode_tokens`
        counts them (each row's completion ids, plus for each row after the first what its prompt grew by over the
        row before it, len(prompt) - len(previous prompt + completion), at least 0: the observation a re-rendered
        history carries into the new row's prompt); "sampled_tokens"; "rows"; "termination" (of the last row;
        "stop" when unset); "tool_calls": calls made; "turns_with_call": turns with at least one call;
        "tool_errors": {status: calls whose status is an error, i.e. not in `rewardlab.envs.tools.NOT_ERRORS` (ok,
        skipped_last_turn)}; "tool_skipped": calls not run because they came on the episode's last turn
        (skipped_last_turn)}.
    """
    from rewardlab.envs.tools import NOT_ERRORS

    calls = [c for r in rows for per_turn in r.tool_calls for c in per_turn]
    errors: dict[str, int] = {}
    for c in calls:
        if c.get("status") not in NOT_ERRORS:
            errors[str(c.get("status"))] = errors.get(str(c.get("status")), 0) + 1
    return {"turns": sum(len(r.turns) for r in rows), "tokens": _episode_tokens(rows),
            "sampled_tokens": sum(r.sampled_tokens for r in rows), "rows": len(rows),
            "termination": rows[-1].termination or "stop", "tool_calls": len(calls),
            "turns_with_call": sum(1 for r in rows for per_turn in r.tool_calls if per_turn), "tool_errors": errors,
            "tool_skipped": sum(1 for c in calls if c.get("status") == "skipped_last_turn")}


def count_metrics(counts: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Shape, termination and tool-use figures of E episodes from their `episode_counts`.

    Returns:
        episode/turns_mean: model turns per episode. episode/tokens_mean: tokens after the first prompt per episode
        (as `max_episode_tokens` counts them, see `episode_counts`). episode/sampled_tokens_mean: tokens the policy
        sampled per episode. episode/rows_mean: rows per episode (> 1 when a chat template was not append-only).
        episode/termination/<reason>: the fraction of episodes that ended for each reason of
        `rewardlab.types.TERMINATIONS` (all of them, 0.0 included). tool/calls_mean: tool calls per episode.
        tool/errors_mean: calls per episode whose status is an error (not ok or skipped_last_turn);
        tool/errors/<status>: the same, for each status that occurred. tool/skipped_last_turn_mean: calls per
        episode not run because they came on the episode's last turn. tool/call_rate: the fraction of model turns
        with at least one call (a falling call rate is how tool-use collapse shows; 0.0 without turns). {} for no
        episodes.
    """
    from rewardlab.types import TERMINATIONS

    if not counts:
        return {}
    E = len(counts)
    turns = sum(c["turns"] for c in counts)
    ends = [c["termination"] for c in counts]
    statuses = sorted({s for c in counts for s in c["tool_errors"]})
    m = {
        "episode/turns_mean": turns / E,
        "episode/tokens_mean": sum(c["tokens"] for c in counts) / E,
        "episode/sampled_tokens_mean": sum(c["sampled_tokens"] for c in counts) / E,
        "episode/rows_mean": sum(c["rows"] for c in counts) / E,
        **{f"episode/termination/{reason}": ends.count(reason) / E for reason in TERMINATIONS},
        "tool/calls_mean": sum(c["tool_calls"] for c in counts) / E,
        "tool/errors_mean": sum(sum(c["tool_errors"].values()) for c in counts) / E,
        "tool/skipped_last_turn_mean": sum(c.get("tool_skipped", 0) for c in counts) / E,  # older logs lack it
        "tool/call_rate": sum(c["turns_with_call"] for c in counts) / max(turns, 1),
    }
    for status in statuses:
        m[f"tool/errors/{status}"] = sum(c["tool_errors"].get(status, 0) for c in counts) / E
    return m


def episode_metrics(episodes: Sequence[Sequence[Rollout]]) -> dict[str, float]:
    """The figures of a batch of episodes (each a list of its rows) as logged per training step:
    `count_metrics` of their `episode_counts`. {} for no episodes."""
    return count_metrics([episode_counts(rows) for rows in episodes])
