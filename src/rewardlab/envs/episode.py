"""The episode loop: one per-episode state machine over a `TokenSampler`, a `Renderer` and an `Environment`.

An `Episode` is a state machine that never samples by itself: `next_request()` says what the model must continue
next (the row's ids so far, the turn's token budget, the random stream), `feed(sampled)` gives it what the model
sampled, and it runs the environment, renders the observation and keeps the budgets. `run_episodes` is the local
driver: it batches the pending requests of all live episodes into one `sample_ids` call per round, and steps the
environment of all of them at once (`step_all`: the environment's `step_batch` when it has one, which a `ToolEnv`
uses to run every episode's tool calls of the round concurrently in its pool), in two halves of `feed`:
`feed_sample(sampled)` then `feed_step(result)`. Other drivers (remote workers, engines' agent loops) run the same
`Episode` objects with their own sampler.

Token exactness: a row's ids only ever grow by appending. A model turn appends the ids the sampler returned
(loss mask 1, their behaviour log-probs); an environment turn appends `renderer.extend(...)` (loss mask 0,
log-prob 0.0). Nothing is decoded and re-tokenized: the text of a model turn (`renderer.turn_text`) goes to the
environment and into the transcript, never back into the row. When the renderer cannot append (a chat template
that rewrites earlier turns: `extend` returns None), the row is closed and the episode continues in a new row whose
prompt is `renderer.start(transcript)`; both rows share the episode's `episode_id`.

Budgets and termination (one contract):
- `max_new_tokens` is per model turn. A turn's budget is min(max_new_tokens, max_episode_tokens - episode tokens
  used, context_window - row length). A turn that samples its whole budget without ending (finish "length") ends
  the episode as `max_new_tokens`, `max_episode_tokens` or `context`, whichever cap it hit (that order when
  several are equal); it is kept, and the environment does not see it. A turn that ends (EOS or a stop string)
  on exactly its last budget token is kept whole and is not truncated.
- Episode tokens (what `max_episode_tokens` counts): every token after the episode's first prompt, i.e. the
  `completion_ids` of all its rows (model turns and appended environment turns); when an observation starts a new
  row, it counts len(new prompt) - len(old row's ids), at least 0 (what the re-rendered history grew by). The first
  prompt never counts.
- An observation is appended only if the episode tokens stay <= max_episode_tokens (else it is dropped and the
  episode ends `max_episode_tokens`) and the row stays <= the context window (else `context`). If it fits exactly,
  it is appended and the next turn has no budget: the episode ends with that cap's reason.
- `max_turns` counts model turns: after the environment answered turn `max_turns` without ending the episode, the
  episode ends `max_turns` (the observation is not appended).
- A `StepResult` with done=True ends the episode with its info["termination"]: "stop" (the model answered without
  a tool call), "max_turns" (an environment's own turn limit) or, when info has none, `env_done`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewardlab.envs.base import Environment, StepResult, env_stop
from rewardlab.envs.multiturn import initial_messages
from rewardlab.types import Rollout, Sampled

if TYPE_CHECKING:
    from rewardlab.policy.settings import SamplingSettings

#: How `Renderer.clip` may keep a tool output that is too long: its start or its end.
TOOL_KEEP = ("start", "end")
#: The terminations a done `StepResult` may give in info["termination"] (the token budgets are the loop's).
ENV_TERMINATIONS = ("stop", "env_done", "max_turns")
#: What a `Sampled.finish` may be.
FINISHES = ("eos", "stop", "length")


@dataclass(frozen=True)
class EpisodeLimits:
    """The budgets of an episode, validated together.

    Attributes:
        max_turns: the most model turns (>= 1).
        max_new_tokens: the most tokens of one model turn (>= 1).
        max_episode_tokens: the most episode tokens (see the module doc: completion tokens of all rows, model and
            environment turns), >= max_new_tokens.
        context_window: the most tokens of one row (prompt + completion), or None for unbounded.
        max_tool_tokens: role "tool" observation contents are clipped to this many tokens (`Renderer.clip`,
            marker included) before rendering; None: not clipped.
        tool_keep: "start" keeps the beginning of a clipped tool output, "end" its end.
    Raises:
        ValueError: one line naming the field: a value < 1, max_new_tokens > max_episode_tokens, an unknown
            tool_keep, or tool_keep "end" without max_tool_tokens (a setting that would do nothing).
    """

    max_turns: int
    max_new_tokens: int
    max_episode_tokens: int
    context_window: int | None = None
    max_tool_tokens: int | None = None
    tool_keep: str = "start"

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_episode_tokens", "context_window", "max_tool_tokens"):
            value = getattr(self, name)
            if value is None and name in ("context_window", "max_tool_tokens"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"episode.{name}: must be an int >= 1, got {value!r}")
        if self.max_new_tokens > self.max_episode_tokens:
            raise ValueError(f"episode.max_new_tokens ({self.max_new_tokens}) is larger than max_episode_tokens "
                             f"({self.max_episode_tokens}): a model turn is part of its episode")
        if self.tool_keep not in TOOL_KEEP:
            raise ValueError(f"episode.tool_keep: expected one of {', '.join(TOOL_KEEP)}, got {self.tool_keep!r}")
        if self.tool_keep != "start" and self.max_tool_tokens is None:
            raise ValueError(f"episode.tool_keep: {self.tool_keep!r} has no effect without max_tool_tokens (tool "
                             "output is not clipped)")


@dataclass(frozen=True)
class EpisodeSettings:
    """The episodes of an environment task: the environment and the budgets of the `env` config section.

    Attributes:
        env: the environment (`rewardlab.envs.make_env`).
        max_turns: model turns per episode at most.
        max_episode_tokens: tokens after the first prompt at most (all rows, model and environment turns).
        max_tool_tokens: tool outputs are clipped to this many tokens (marker included); None: not clipped.
        tool_keep: "start" or "end", the part of a clipped tool output that is kept.
        name: the environment's registered name (`ENVIRONMENTS`), for messages; None when unknown.
    The per-turn budget (max_new_tokens) is the sampling settings' and the context window the model's, so the
    episode's `EpisodeLimits` are made at sampling time (`limits`), where all three are known.
    """

    env: Environment
    max_turns: int
    max_episode_tokens: int
    max_tool_tokens: int | None = None
    tool_keep: str = "start"
    name: str | None = None

    def limits(self, max_new_tokens: int, context_window: int | None) -> EpisodeLimits:
        """The `EpisodeLimits` of an episode under these budgets, `max_new_tokens` per model turn (the sampling
        settings') and the model's `context_window` (None: unbounded).

        Raises:
            ValueError: what `EpisodeLimits` raises (one line naming the field).
        """
        return EpisodeLimits(max_turns=self.max_turns, max_new_tokens=max_new_tokens,
                             max_episode_tokens=self.max_episode_tokens, context_window=context_window,
                             max_tool_tokens=self.max_tool_tokens, tool_keep=self.tool_keep)


@dataclass(frozen=True)
class Request:
    """What an episode asks the sampler for: continue `ids` by one model turn.

    Attributes:
        ids: the row's ids so far (its prompt ids + completion ids), exactly as the model must see them.
        max_new_tokens: the turn's token budget (>= 1), the per-turn, episode and context caps applied.
        stream: the turn's random stream key, the episode's stream key + (turn,) with turn counted across rows.
    """

    ids: list[int]
    max_new_tokens: int
    stream: tuple[int, ...]


class _Row:
    """The ids of one row of an episode under construction."""

    def __init__(self, prompt_ids: list[int], first_turn: int) -> None:
        self.prompt_ids = list(prompt_ids)
        self.completion_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turns: list[tuple[int, int]] = []
        self.turn_rewards: list[float] = []
        self.turn_keys: list[str] = []
        self.tool_calls: list[list[dict[str, Any]]] = []
        self.first_turn = first_turn
        self.n_messages = 0  # transcript length at the row's end
        self.final_text = ""  # the text of its last model turn

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


def history_key(rows: Sequence[_Row]) -> str:
    """The default anchor-state key: a hash (BLAKE2b, 16 hex digits) of every id of the episode so far, all rows'
    prompts and completions in order, so different histories never share a key."""
    h = hashlib.blake2b(digest_size=8)
    for row in rows:
        h.update(b"|" + ",".join(map(str, row.prompt_ids)).encode() + b"|" + ",".join(map(str, row.completion_ids))
                 .encode())
    return h.hexdigest()


def prompt_text(renderer: Any, ids: list[int]) -> str:
    """A row's prompt as text, as the model reads it: the renderer's tokenizer's decoding of `ids` with special
    tokens kept (a chat template's markers), without the BOS token that the tokenizer itself prepends to a raw
    prompt (a leading bos_token_id when the tokenizer has no chat template), so a raw row's prompt is the
    single-turn path's prompt text. A renderer without a `tokenizer`: `renderer.turn_text(ids)`."""
    tok = getattr(renderer, "tokenizer", None)
    if tok is None:
        return renderer.turn_text(ids)
    ids = list(ids)
    if ids and ids[0] == tok.bos_token_id and not getattr(tok, "chat_template", None):
        ids = ids[1:]
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class Episode:
    """One episode as a state machine: `next_request()` / `feed(sampled)` until `done`, then `rollouts()`.

    States: "sample" (a model turn is due: `next_request()` returns it, the same one until it is fed) and "done"
    (`next_request()` returns None; `termination` says why). The constructor resets the environment and renders the
    first prompt: `renderer.start` of the row's chat `messages`, else of one user message holding its `prompt`.

    Args:
        env: the `Environment` (reset, step; optional state_key).
        row: the task row (`prompt` or `messages`, `answer`, ...); stored on every rollout.
        renderer: the `Renderer` (start, extend, turn_text, clip; an optional decode(ids) gives the rows' prompt
            text, else `prompt_text`).
        limits: the budgets (`EpisodeLimits`).
        stream: the episode's random stream key, e.g. (seed, step, episode index, round); each turn samples from
            stream + (turn,).
        episode_id: stored as `Rollout.episode_id` on every row (always set, also for an episode of one row).
        group: stored as `Rollout.group` (the row's group).
    A dict state (what `MultiTurnEnv.reset` returns) gets `state["max_turns"] = limits.max_turns` after reset (unless
    the environment set that key itself), so the environment can tell the episode's last turn: a `ToolEnv` does not
    run the calls of that turn (status "skipped_last_turn"), since the episode ends after it.

    Raises:
        ValueError: the row's first prompt leaves no room in the context window (names the lengths); the errors of
            `rewardlab.envs.multiturn.initial_messages`.
    """

    def __init__(self, env: Environment, row: dict[str, Any], renderer: Any, limits: EpisodeLimits, *,
                 stream: tuple[int, ...] = (), episode_id: int = 0, group: int = 0) -> None:
        self.env = env
        self.row = dict(row)
        self.renderer = renderer
        self.limits = limits
        self.stream = tuple(stream)
        self.episode_id = episode_id
        self.group = group
        self.messages = initial_messages(self.row, f"episode {episode_id}: row")
        self.state = env.reset(self.row)
        if isinstance(self.state, dict):  # the loop's turn limit, so an environment can tell the last turn
            self.state.setdefault("max_turns", limits.max_turns)
        prompt = list(renderer.start(self.messages))
        ctx = limits.context_window
        if ctx is not None and len(prompt) >= ctx:
            raise ValueError(f"episode {episode_id}: the prompt has {len(prompt)} tokens and the model's context "
                             f"window is {ctx}: no room for a model turn")
        self.rows: list[_Row] = [_Row(prompt, 0)]
        self.turn = 0  # model turns so far, across rows
        self.tokens = 0  # episode tokens so far (see the module doc)
        self.termination: str | None = None
        self._pending: Request | None = None
        self._stepping = False  # between feed_sample (which returned the action) and feed_step
        self._caps: tuple[int, int, int | None] = (0, 0, None)

    @property
    def done(self) -> bool:
        return self.termination is not None

    @property
    def row_ids(self) -> list[int]:
        """The current row's ids (prompt + completion so far)."""
        return self.rows[-1].ids()

    def next_request(self) -> Request | None:
        """The model turn due now, or None when the episode is done. A turn with no budget left (the episode or
        the context window is full) ends the episode here (`max_episode_tokens`, else `context`)."""
        if self.done:
            return None
        if self._stepping:
            raise ValueError(f"episode {self.episode_id}: next_request() while the environment step of the last "
                             "turn is due (call feed_step(result))")
        if self._pending is not None:
            return self._pending
        lim, row = self.limits, self.rows[-1]
        left_episode = lim.max_episode_tokens - self.tokens
        left_ctx = None if lim.context_window is None else lim.context_window - row.length
        if left_episode <= 0:
            self._end("max_episode_tokens")
            return None
        if left_ctx is not None and left_ctx <= 0:
            self._end("context")
            return None
        budget = min(lim.max_new_tokens, left_episode, left_ctx if left_ctx is not None else left_episode)
        self._caps = (lim.max_new_tokens, left_episode, left_ctx)
        key_fn = getattr(self.env, "state_key", None)
        row.turn_keys.append(str(key_fn(self.state)) if callable(key_fn) else history_key(self.rows))
        self._pending = Request(row.ids(), budget, self.stream + (self.turn,))
        return self._pending

    def feed(self, sampled: Sampled) -> None:
        """Append the model's turn, step the environment on its text, append the observation (or end the episode):
        `feed_sample(sampled)`, then, when it returns an action, `feed_step(env.step(state, action))`.

        Raises:
            ValueError: what `feed_sample` and `feed_step` raise.
        """
        action = self.feed_sample(sampled)
        if action is not None:
            self.feed_step(self.env.step(self.state, action))

    def feed_sample(self, sampled: Sampled) -> str | None:
        """The first half of `feed`: append the model's turn. Returns the text the environment must now be stepped
        on (`env.step(self.state, text)`, whose result goes to `feed_step`), or None when the turn ended the episode
        without an environment step (it used its whole budget: `max_new_tokens`, `max_episode_tokens` or `context`).

        Raises:
            ValueError: no request pending; a `Sampled` whose ids and log-probs differ in length, longer than the
                budget, with an unknown finish, or "length" with fewer tokens than the budget.
        """
        req = self._pending
        if req is None:
            raise ValueError(f"episode {self.episode_id}: feed() without a pending request (call next_request())")
        ids, logprobs = list(sampled.ids), [float(x) for x in sampled.logprobs]
        if len(ids) != len(logprobs):
            raise ValueError(f"episode {self.episode_id}: Sampled has {len(ids)} ids and {len(logprobs)} logprobs")
        if len(ids) > req.max_new_tokens:
            raise ValueError(f"episode {self.episode_id}: Sampled has {len(ids)} ids, over the turn's budget "
                             f"{req.max_new_tokens}")
        if sampled.finish not in FINISHES:
            raise ValueError(f"episode {self.episode_id}: Sampled.finish {sampled.finish!r} is not one of "
                             f"{', '.join(FINISHES)}")
        if sampled.finish == "length" and len(ids) != req.max_new_tokens:
            raise ValueError(f"episode {self.episode_id}: Sampled.finish 'length' after {len(ids)} of "
                             f"{req.max_new_tokens} tokens")
        self._pending = None
        row = self.rows[-1]
        start = len(row.completion_ids)
        row.completion_ids += ids
        row.loss_mask += [1] * len(ids)
        row.logprobs += logprobs
        row.turns.append((start, len(row.completion_ids)))
        self.tokens += len(ids)
        self.turn += 1
        text = self.renderer.turn_text(ids)
        row.final_text = text
        self.messages.append({"role": "assistant", "content": text})
        if sampled.finish == "length":  # truncated: the environment does not see a cut turn
            row.turn_rewards.append(0.0)
            row.tool_calls.append([])
            max_new, left_episode, _ = self._caps
            self._end("max_new_tokens" if req.max_new_tokens == max_new else
                      "max_episode_tokens" if req.max_new_tokens == left_episode else "context")
            return None
        self._stepping = True
        return text

    def feed_step(self, result: StepResult) -> None:
        """The second half of `feed`: the environment's answer to the turn `feed_sample` returned; append the
        observation or end the episode.

        Raises:
            ValueError: no step due (feed_sample did not return an action); a result that is not a StepResult; a
                done step whose info "termination" is not one of ENV_TERMINATIONS; a malformed observation.
        """
        if not self._stepping:
            raise ValueError(f"episode {self.episode_id}: feed_step() without a turn to step (call feed_sample())")
        self._stepping = False
        row = self.rows[-1]
        if not isinstance(result, StepResult):
            raise ValueError(f"episode {self.episode_id}: env.step returned {type(result).__name__}, not a StepResult")
        row.turn_rewards.append(0.0 if result.reward is None else float(result.reward))
        row.tool_calls.append([dict(c) for c in (result.info or {}).get("tool_calls", [])])
        if result.done:
            reason = (result.info or {}).get("termination", "env_done")
            if reason not in ENV_TERMINATIONS:
                raise ValueError(f"episode {self.episode_id}: env step info termination {reason!r}: expected one of "
                                 f"{', '.join(ENV_TERMINATIONS)}")
            self._end(reason)
            return
        if self.turn >= self.limits.max_turns:
            self._end("max_turns")
            return
        self._observe(self._observation(result.observation))

    def _observation(self, obs: list[dict[str, Any]] | str | None) -> list[dict[str, Any]]:
        """The observation as chat messages (a str becomes one user message; None none), tool contents clipped."""
        if obs is None:
            return []
        if isinstance(obs, str):
            return [{"role": "user", "content": obs}]
        if not isinstance(obs, list) or not all(isinstance(m, dict) and "role" in m for m in obs):
            raise ValueError(f"episode {self.episode_id}: env step observation must be a str, None or a list of "
                             "{'role', 'content'} dicts")
        new = [dict(m) for m in obs]
        lim = self.limits
        if lim.max_tool_tokens is not None:
            for m in new:
                if m["role"] == "tool" and isinstance(m.get("content"), str):
                    m["content"] = self.renderer.clip(m["content"], lim.max_tool_tokens, lim.tool_keep)
        return new

    def _observe(self, new: list[dict[str, Any]]) -> None:
        """Append the observation `new` to the row (or start a new row) if it fits, else end the episode."""
        lim, row = self.limits, self.rows[-1]
        ids = self.renderer.extend(row.ids(), self.messages, new)
        if ids is not None:
            ids = list(ids)
            grows, row_length = len(ids), row.length + len(ids)
        else:
            prompt = list(self.renderer.start(self.messages + new))
            grows, row_length = max(0, len(prompt) - row.length), len(prompt)
        if self.tokens + grows > lim.max_episode_tokens:
            self._end("max_episode_tokens")
            return
        if lim.context_window is not None and row_length > lim.context_window:
            self._end("context")
            return
        self.messages.extend(new)
        self.tokens += grows
        if ids is not None:
            row.completion_ids += ids
            row.loss_mask += [0] * len(ids)
            row.logprobs += [0.0] * len(ids)
        else:
            row.n_messages = len(self.messages) - len(new)
            self.rows.append(_Row(prompt, self.turn))

    def _end(self, reason: str) -> None:
        self.termination = reason
        self.rows[-1].n_messages = len(self.messages)

    def rollouts(self) -> list[Rollout]:
        """The episode's rows as rollouts, in order (see `run_episodes` for the fields).

        Raises:
            ValueError: the episode is not done.
        """
        if not self.done:
            raise ValueError(f"episode {self.episode_id}: rollouts() before the episode is done")
        decode = getattr(self.renderer, "decode", None) or (lambda ids: prompt_text(self.renderer, ids))
        out = []
        for k, row in enumerate(self.rows):
            last = k == len(self.rows) - 1
            out.append(Rollout(
                prompt=decode(row.prompt_ids), prompt_ids=list(row.prompt_ids), completion=row.final_text,
                completion_ids=list(row.completion_ids), logprobs=list(row.logprobs), row=dict(self.row),
                group=self.group, loss_mask=list(row.loss_mask), turns=list(row.turns),
                turn_rewards=list(row.turn_rewards), turn_keys=list(row.turn_keys), first_turn=row.first_turn,
                episode_id=self.episode_id, termination=self.termination if last else None,
                tool_calls=[list(c) for c in row.tool_calls], messages=[dict(m) for m in
                                                                        self.messages[:row.n_messages]],
            ))
        return out


def step_all(env: Environment, states: Sequence[Any], actions: Sequence[str]) -> list[StepResult]:
    """Step the environment of several episodes on their turns, results in order: `env.step_batch(states, actions)`
    when the environment has one (a `ToolEnv` runs all their tool calls at once in its pool), else `env.step(state,
    action)` of each, one after another. Either way the results are those of the serial steps.

    Raises:
        ValueError: a step_batch that returns a different number of results than it was given turns.
    """
    batch = getattr(env, "step_batch", None)
    if not callable(batch) or len(states) < 2:
        return [env.step(state, action) for state, action in zip(states, actions)]
    results = list(batch(list(states), list(actions)))
    if len(results) != len(states):
        raise ValueError(f"{type(env).__name__}.step_batch returned {len(results)} results for {len(states)} turns")
    return results


def check_stop_strings(renderer: Any, stop: Sequence[str] | None) -> None:
    """Refuse stop strings that could never end a turn on this renderer's tokenizer.

    A model turn's text (`renderer.turn_text`, what a tool-call parser reads) and the text that `sample_ids` matches
    stop strings against are decoded with special tokens removed. When the tokenizer encodes a stop string with a
    special token (some tokenizers mark `<tool_call>` and `</tool_call>` special; Qwen2.5's and Qwen3's do not),
    that text never appears: the turn runs on to its token budget and the tool call is never parsed, silently. A
    renderer without a `tokenizer` is not checked.

    Raises:
        ValueError: one line naming the stop string and its special tokens.
    """
    tok = getattr(renderer, "tokenizer", None)
    if tok is None or not stop:
        return
    special = set(getattr(tok, "all_special_ids", None) or ())
    added = getattr(tok, "added_tokens_decoder", None) or {}
    special |= {i for i, t in added.items() if getattr(t, "special", False)}
    for s in stop:
        ids = list(tok(s, add_special_tokens=False)["input_ids"])
        hits = [i for i in ids if i in special]
        if hits:
            names = ", ".join(str(t) for t in tok.convert_ids_to_tokens(hits))
            raise ValueError(f"env stop string {s!r}: the tokenizer encodes it with special tokens ({names}), which "
                             "are removed from the model's decoded text, so no turn would end at it and no parser "
                             "would read it; mark those tokens as not special in the tokenizer")


def run_episodes(policy: Any, episodes: EpisodeSettings, rows: Sequence[dict[str, Any]], sampling: SamplingSettings,
                 *, n: int, stream: tuple[int, int, int] = (0, 0, 0), episode_offset: int = 0,
                 renderer: Any = None) -> list[Rollout]:
    """Run `n` episodes of each task row in `env` with `policy`, batching every live episode's turn into one
    `policy.sample_ids` call per round and their environment steps into one `step_all` call (a `ToolEnv` runs the
    round's tool calls of all episodes concurrently, up to its pool's workers; the results are those of stepping
    the episodes one after another), and return their rows as rollouts.

    Args:
        policy: a `TokenSampler` (`sample_ids`, `eos_token_id`, `context_window`): `rewardlab.policy.Policy` or any
            object with them.
        episodes: the environment (`episodes.env`; its optional `stop` strings end a model turn besides EOS) and the
            episode budgets (`EpisodeSettings`: max_turns, max_episode_tokens, max_tool_tokens, tool_keep), which
            with the sampling's max_new_tokens and the policy's `context_window` make the `EpisodeLimits`
            (`EpisodeSettings.limits`).
        rows: the task rows (`prompt` or chat `messages`, `answer`, ...).
        sampling: `rewardlab.policy.SamplingSettings`: max_new_tokens (the most tokens of one model turn, >= 1,
            <= max_episode_tokens), temperature (> 0; ignored when greedy), top_p (in (0, 1]), greedy (argmax
            decoding, e.g. ReMax's greedy baseline episode); chunk and max_prompt_length are not read.
        n: episodes per row (the group size), >= 1 (1 when greedy).
        stream: (seed, step, round): the first, second and fourth entries of each turn's random stream
            (seed, step, episode index, round, turn); `round` is the refill round of a step.
        episode_offset: added to the episode index k (0..len(rows)*n - 1) for the streams and `episode_id`, so
            several calls of one step can keep both distinct.
        renderer: the `Renderer`; None: `rewardlab.envs.render.make_renderer(policy.tokenizer,
            policy.prompt_format, tools=episodes.env.tools, raw_text=episodes.env.raw_text)`.
    Returns:
        The rows of every episode, episode-major and prompt-major: episode k = row k // n, j-th sample k % n; an
        episode gives one rollout per row (more than one when the renderer had to start a new row). Each rollout:
        `prompt_ids`/`prompt` (the row's prompt; its text from renderer.decode if it has one, else `prompt_text`),
        `completion_ids` (model and environment turns interleaved), `loss_mask` (1 exactly on sampled ids),
        `logprobs` (behaviour log-probs on sampled ids, 0.0 elsewhere), `turns` (spans of model turns in
        completion_ids), `turn_rewards` (StepResult.reward, 0.0 for none or for a turn that ended the episode
        without an environment step), `turn_keys` (env.state_key(state) as str, else a hash of the episode's ids
        so far), `tool_calls` (per turn, StepResult.info["tool_calls"]), `first_turn` (episode-wide index of the
        row's first turn), `episode_id` (episode_offset + k, on every row), `group` (the row's index in `rows`),
        `termination` (on the last row; None on earlier rows), `truncated` (termination is max_new_tokens,
        max_episode_tokens or context), `completion` (the text of the row's last model turn: on the last row the
        episode's final answer), `messages` (the transcript up to the row's end), `row` (the task row).
    Raises:
        ValueError: one line naming the option: n < 1, greedy with n > 1, temperature <= 0 (not greedy), top_p
            outside (0, 1], the `EpisodeLimits` errors (max_new_tokens > max_episode_tokens, ...), a policy
            without `sample_ids`, a prompt that fills the context window, a sampler that returns the wrong number
            of samples or a malformed one (`Episode.feed`), an env `stop` that is a str or holds a non-string
            (`rewardlab.envs.base.env_stop`), an env stop string that the tokenizer encodes with special tokens
            (`check_stop_strings`).
    """
    greedy, env = sampling.greedy, episodes.env
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (greedy and n != 1):
        raise ValueError(f"run_episodes: n must be an int >= 1 (1 when greedy), got {n!r}")
    if not greedy and not sampling.temperature > 0:
        raise ValueError(f"run_episodes: temperature must be > 0, got {sampling.temperature!r}")
    if not 0 < sampling.top_p <= 1:
        raise ValueError(f"run_episodes: top_p must be in (0, 1], got {sampling.top_p!r}")
    if not callable(getattr(policy, "sample_ids", None)):
        raise ValueError(f"run_episodes: the policy ({type(policy).__name__}) has no sample_ids (a TokenSampler)")
    limits = episodes.limits(sampling.max_new_tokens, getattr(policy, "context_window", None))
    if renderer is None:
        from rewardlab.envs.render import make_renderer

        renderer = make_renderer(policy.tokenizer, policy.prompt_format, tools=getattr(env, "tools", None),
                                 raw_text=getattr(env, "raw_text", None))
    stop = list(env_stop(env)) or None
    check_stop_strings(renderer, stop)
    seed, step, round_ = stream
    running = [Episode(env, row, renderer, limits, stream=(seed, step, episode_offset + k, round_),
                       episode_id=episode_offset + k, group=k // n)
               for k, row in enumerate(r for r in rows for _ in range(n))]
    while True:
        live = [(ep, req) for ep in running if (req := ep.next_request()) is not None]
        if not live:
            break
        sampled = policy.sample_ids([req.ids for _, req in live],
                                    max_new_tokens=[req.max_new_tokens for _, req in live],
                                    temperature=sampling.temperature, top_p=sampling.top_p, greedy=greedy, stop=stop,
                                    streams=[req.stream for _, req in live])
        if len(sampled) != len(live):
            raise ValueError(f"run_episodes: sample_ids returned {len(sampled)} samples for {len(live)} prompts")
        due = [(ep, action) for (ep, _), s in zip(live, sampled) if (action := ep.feed_sample(s)) is not None]
        results = step_all(env, [ep.state for ep, _ in due], [action for _, action in due])
        for (ep, _), result in zip(due, results):
            ep.feed_step(result)
    return [r for ep in running for r in ep.rollouts()]
