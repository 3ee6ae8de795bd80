"""rewardlab environments inside verl (0.9.1) rollouts: an agent loop for verl's `AgentLoopBase`.

verl's agent-loop workers run one `AgentLoopBase.run(sampling_params, **columns)` coroutine per sample; a loop talks
to the inference servers through `server_manager.generate(request_id, prompt_ids=, sampling_params=)` (token ids
in, `TokenOutput(token_ids, log_probs, stop_reason)` out) and returns an `AgentLoopOutput`: `prompt_ids`,
`response_ids` (model and environment tokens interleaved), `response_mask` (1 on sampled tokens, 0 on the
environment's) and `response_logprobs`. `RewardlabAgentLoop` drives rewardlab's episode state machine
(`rewardlab.envs.episode.Episode`: `next_request()` / `feed(sampled)`) over that client, so an episode in verl is
the episode rewardlab's own loop (`run_episodes`) would run with the same sampler: the ids the server sampled, its
log-probs, the environment's observations rendered by rewardlab's renderer and appended, nothing re-tokenized.

Importing this module (it needs verl) registers the loop in verl's agent-loop registry as `rewardlab_env`
(`AGENT_NAME`); a dataset row selects it with `agent_name: rewardlab_env`, or the config with
`actor_rollout_ref.rollout.agent.default_agent_loop=rewardlab_env`. verl's workers import it through
`VERL_USE_EXTERNAL_MODULES=rewardlab.integrations.verl_agent`, or through an agent-loop config file
(`actor_rollout_ref.rollout.agent.agent_loop_config_path`) whose entry names this class as `_target_` and sets the
loop's options (`env`, `env_options`, `max_turns`, `max_new_tokens`, `prompt_format`, `max_tool_tokens`,
`tool_keep`, `reward`); docs/integrations.md shows both.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from rewardlab.envs.base import env_stop
from rewardlab.envs.episode import Episode, EpisodeLimits, check_stop_strings
from rewardlab.envs.render import make_renderer
from rewardlab.types import Rollout, Sampled

#: The name verl's config and datasets select the loop by (`agent_name`).
AGENT_NAME = "rewardlab_env"
#: `extra_info` keys the loop reads itself (not row fields): the environment, its options, and compute_score's
#: reward spec plus what verl's reward loop adds.
LOOP_EXTRA_INFO = ("env", "env_options", "reward", "rollout_reward_scores", "num_turns")

_ENVS: dict[str, Any] = {}
_ENVS_LOCK = threading.Lock()


def _plain(value: Any) -> Any:
    """An OmegaConf container (what hydra hands a loop option) as plain dicts and lists; anything else as is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl depends on omegaconf
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _environment(name: str, options: Mapping[str, Any]) -> Any:
    """The environment `make_env(name, **options)`, built once per (name, options) in this process and kept (a tool
    environment's worker pool is not rebuilt per episode)."""
    from rewardlab.envs import make_env

    key = json.dumps([name, options], sort_keys=True, default=str)
    with _ENVS_LOCK:
        if key not in _ENVS:
            _ENVS[key] = make_env(name, **options)
        return _ENVS[key]


def _finish(ids: list[int], budget: int, eos: int | None, text: str, stop: list[str] | None) -> str:
    """`Sampled.finish` of a server turn: "eos" when its last id is EOS, "stop" when its text holds a stop string or
    it ended before its budget (a stop token of the server's), else "length" (it used its whole budget)."""
    if ids and eos is not None and ids[-1] == eos:
        return "eos"
    if stop and any(s in text for s in stop):
        return "stop"
    return "length" if len(ids) >= budget else "stop"


@register(AGENT_NAME)
class RewardlabAgentLoop(AgentLoopBase):
    """A rewardlab environment as a verl agent loop (see the module docstring).

    verl builds one instance per sample (hydra `instantiate` of the registry entry) with its own arguments, then
    awaits `run`. The loop's options come from an agent-loop config entry; the registry entry made by `register`
    has none, and the episode budgets then come from verl's rollout config.

    Args (verl's):
        trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type: as
            `AgentLoopBase` takes them.
        tools: verl's configured tools (`multi_turn.tool_config_path`); must be empty: a rewardlab environment brings
            its own tools and runs them itself.
        name: the agent-loop config entry's name (verl passes it with the entry).
    Args (the loop's options, set in an agent-loop config entry):
        env: the environment name (`rewardlab.envs.ENVIRONMENTS`), or an environment instance when the loop is
            built in Python; None: each sample names it in `extra_info["env"]` (options in
            `extra_info["env_options"]`).
        env_options: the environment's options (`make_env(env, **env_options)`).
        max_turns: the most model turns of an episode; None: `rollout.multi_turn.max_assistant_turns`, else 1.
        max_new_tokens: the most tokens of one model turn; None: `rollout.response_length`.
        prompt_format: "auto" (chat when the tokenizer has a chat template), "chat" or "raw", as rewardlab's renderer
            takes it.
        max_tool_tokens: tool outputs are clipped to this many tokens; None: `rollout.multi_turn.
            max_tool_response_length` when set, else not clipped.
        tool_keep: "start" or "end", which end of a clipped tool output is kept.
        reward: a rewardlab reward (a name or a spec, as in `rewards:`) that scores the finished episode (its final
            model turn, turns and turn rewards: `Rollout` as rewardlab's trainer scores it) into
            `AgentLoopOutput.reward_score`, with its components and `error` (1.0 when the reward failed, which then
            scores 0.0) in `extra_fields["reward_extra_info"]`; verl then skips its reward function for the sample. None: verl's reward function scores the decoded response.
    Episode budgets: `max_episode_tokens` = `rollout.response_length` (model and environment tokens after the first
    prompt, so the response fits verl's padding); the first prompt must fit `rollout.prompt_length`.

    Raises:
        ValueError: non-empty verl `tools`; an unknown environment or option (one line from `make_env`, listing the
            valid names); bad budgets (`EpisodeLimits`), prompt format or reward spec; an environment stop string the
            tokenizer encodes with special tokens.

    The constructor's parameters are many because verl dictates them: verl builds the loop with
    `AgentLoopBase.__init__`'s arguments (trainer_config ... name), and hydra's `instantiate` passes each key of
    the agent-loop config entry as its own keyword (env, env_options, max_turns, ...).
    """

    def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any, dataset_cls: Any,
                 data_config: Any, hf_model_type: str | None = None, tools: Any = None, name: str = AGENT_NAME, *,
                 env: Any = None, env_options: Mapping[str, Any] | None = None, max_turns: int | None = None,
                 max_new_tokens: int | None = None, prompt_format: str = "auto", max_tool_tokens: int | None = None,
                 tool_keep: str = "start", reward: Any = None) -> None:
        super().__init__(trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config,
                         hf_model_type=hf_model_type)
        listed = getattr(tools, "tools", tools) or []
        if listed:
            names = ", ".join(str(getattr(t, "name", t)) for t in listed)
            raise ValueError(f"{name}: verl's tools ({names}) cannot be added to a rewardlab environment, which "
                             "brings and runs its own; leave rollout.multi_turn.tool_config_path unset")
        rollout = self.rollout_config
        multi_turn = rollout.get("multi_turn", None) or {}
        self.name = name
        self.prompt_length = int(rollout.prompt_length)
        self.response_length = int(rollout.response_length)
        turns = max_turns if max_turns is not None else (multi_turn.get("max_assistant_turns", None) or 1)
        clip = max_tool_tokens if max_tool_tokens is not None else multi_turn.get("max_tool_response_length", None)
        self.limits = EpisodeLimits(max_turns=int(turns),
                                    max_new_tokens=int(max_new_tokens if max_new_tokens is not None
                                                       else self.response_length),
                                    max_episode_tokens=self.response_length, context_window=None,
                                    max_tool_tokens=None if clip is None else int(clip), tool_keep=tool_keep)
        self.env_name, self.env_options = env, dict(_plain(env_options) or {})
        self.prompt_format = prompt_format
        self._env_setup = None
        if env is not None:  # a bad name, option or format fails here, once, not per sample
            self._env_setup = self._setup(env, self.env_options)
        self.reward = None
        if reward is not None:
            from rewardlab.integrations.common import as_reward, component_keys

            try:
                self.reward = as_reward(_plain(reward), on_error="zero")
            except ValueError as exc:
                raise ValueError(f"{name}.reward: {exc}") from None
            self.reward_keys = component_keys(self.reward)

    def _setup(self, env: Any, options: Mapping[str, Any]) -> tuple[Any, Any, list[str] | None]:
        """(environment, renderer, stop strings) for `env` (a name, built with `options`, or an instance)."""
        if isinstance(env, str):
            try:
                env = _environment(env, dict(options))
            except ValueError as exc:
                raise ValueError(f"{self.name}.env: {exc}") from None
        elif options:
            raise ValueError(f"{self.name}.env_options: options {sorted(options)} are for an environment name, not "
                             "an instance")
        renderer = make_renderer(self.tokenizer, self.prompt_format, tools=getattr(env, "tools", None),
                                 raw_text=getattr(env, "raw_text", None))
        stop = list(env_stop(env)) or None
        check_stop_strings(renderer, stop)
        return env, renderer, stop

    def episode_row(self, raw_prompt: Any, extra_info: Mapping[str, Any] | None,
                    reward_model: Mapping[str, Any] | None, columns: Mapping[str, Any]) -> dict[str, Any]:
        """The rewardlab task row of one verl sample: the dataset's other columns, then the `extra_info` entries (but
        `LOOP_EXTRA_INFO`) as row fields; `answer` from `reward_model["ground_truth"]` when no field gives one; when
        no field gives `prompt` or `messages`, verl's `raw_prompt` (chat messages) as `messages`."""
        row = {k: _plain(v) for k, v in columns.items()}
        row.update({k: _plain(v) for k, v in (extra_info or {}).items() if k not in LOOP_EXTRA_INFO})
        truth = (reward_model or {}).get("ground_truth")
        if "answer" not in row and truth is not None:
            row["answer"] = truth
        if "prompt" not in row and "messages" not in row:
            row["messages"] = [dict(m) for m in _plain(raw_prompt)]
        return row

    async def run(self, sampling_params: dict[str, Any], *, raw_prompt: Any = None,
                  extra_info: Mapping[str, Any] | None = None, reward_model: Mapping[str, Any] | None = None,
                  priority: int = 0, **columns: Any) -> AgentLoopOutput:
        """Run one episode of the sample's row and return it token-exact.

        Args:
            sampling_params: verl's (temperature, top_p, top_k, repetition_penalty, logprobs); passed to the server
                with each turn's `max_tokens` (the episode's budget for the turn, tokens), the environment's `stop`
                strings and `logprobs=True` (the episode keeps the behaviour log-probs).
            raw_prompt: the sample's chat messages (verl's `raw_prompt`).
            extra_info: the sample's `extra_info`: row fields (`prompt`, `answer`, an environment's own fields such as
                guess_number's `n`), and `env` / `env_options` when the loop has no `env`.
            reward_model: verl's `reward_model` column; its `ground_truth` is the row's `answer` when none is given.
            priority: verl's request priority, passed to the server.
            columns: the dataset's other columns (`data_source`, `index`, ...): row fields.
        Returns:
            AgentLoopOutput: `prompt_ids` (the first prompt as rewardlab renders it), `response_ids` (model turns and
            rendered observations, in order), `response_mask` (1 on sampled ids, 0 on the environment's),
            `response_logprobs` (the server's log-probs of sampled ids, 0.0 on the environment's), `num_turns` (1 +
            the messages the episode added: model turns and observations), `metrics` (seconds in the server and in
            the environment), `extra_fields` (`turn_scores`: each model turn's environment reward;
            `tool_rewards`: []; `rewardlab_termination`; `rewardlab_tool_calls`: calls per turn;
            `reward_extra_info` with `reward`), and `reward_score` when the loop has a `reward`.
        Raises:
            ValueError: one line: no environment (neither the loop's `env` nor `extra_info["env"]`); a first prompt
                longer than `rollout.prompt_length`; an episode the chat template would split into several rows (it
                rewrites earlier turns: verl takes one sequence per sample); a server turn without log-probs or
                aborted; the errors of `Episode`.
        """
        env, renderer, stop = self._sample_setup(extra_info)
        row = self.episode_row(raw_prompt, extra_info, reward_model, columns)
        episode = await self._start_episode(env, row, renderer)
        opening = len(episode.messages)  # the prompt's messages; the episode appends turns and observations
        timing = await self._play(episode, renderer, stop, sampling_params, priority)
        (rollout,) = episode.rollouts()
        extra: dict[str, Any] = {"turn_scores": list(rollout.turn_rewards), "tool_rewards": [],
                                 "rewardlab_termination": rollout.termination,
                                 "rewardlab_tool_calls": [len(c) for c in rollout.tool_calls]}
        score = None
        if self.reward is not None:
            score, extra["reward_extra_info"] = await self._score(rollout)
        return AgentLoopOutput(prompt_ids=list(rollout.prompt_ids), response_ids=list(rollout.completion_ids),
                               response_mask=list(rollout.loss_mask), response_logprobs=list(rollout.logprobs),
                               reward_score=score, num_turns=1 + len(episode.messages) - opening,
                               metrics=timing, extra_fields=extra)

    def _sample_setup(self, extra_info: Mapping[str, Any] | None) -> tuple[Any, Any, list[str] | None]:
        """(environment, renderer, stop strings) of one sample: the loop's own when it has an `env`, else those of
        the sample's `extra_info["env"]` with its `extra_info["env_options"]` (see `_setup`).

        Raises:
            ValueError: neither the loop's `env` nor `extra_info["env"]`; the errors of `_setup`.
        """
        name = self.env_name if self.env_name is not None else (extra_info or {}).get("env")
        if name is None:
            raise ValueError(f"{self.name}: no environment: set the loop's env option or the sample's "
                             "extra_info['env']")
        if self._env_setup is not None:
            return self._env_setup
        return self._setup(name, dict(_plain((extra_info or {}).get("env_options")) or {}))

    async def _start_episode(self, env: Any, row: dict[str, Any], renderer: Any) -> Episode:
        """The episode of `row` in `env` (built in an executor thread: resetting a tool environment may block).

        Raises:
            ValueError: the errors of `Episode`; a first prompt longer than `rollout.prompt_length` (tokens).
        """
        loop = asyncio.get_running_loop()
        episode = await loop.run_in_executor(None, lambda: Episode(env, row, renderer, self.limits))
        first = len(episode.row_ids)
        if first > self.prompt_length:
            raise ValueError(f"{self.name}: the episode's first prompt has {first} tokens, over "
                             f"rollout.prompt_length {self.prompt_length} (verl would cut it)")
        return episode

    async def _play(self, episode: Episode, renderer: Any, stop: list[str] | None, sampling_params: dict[str, Any],
                    priority: int) -> dict[str, float]:
        """Run `episode` to its end: each model turn sampled by verl's server (one request id for the episode), fed
        to the episode (environment steps in an executor thread). Returns the seconds spent in each:
        {"generate_sequences", "tool_calls"}.

        Raises:
            ValueError: a server turn aborted or without one log-prob per token (see `_sampled`); an episode the chat
                template would split into several rows; the errors of `Episode.feed`.
        """
        loop = asyncio.get_running_loop()
        request_id = uuid4().hex
        timing = {"generate_sequences": 0.0, "tool_calls": 0.0}
        eos = getattr(self.tokenizer, "eos_token_id", None)
        while (req := episode.next_request()) is not None:
            params = _turn_params(sampling_params, req.max_new_tokens, stop)
            started = time.perf_counter()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=list(req.ids),
                                                     sampling_params=params, priority=int(priority))
            timing["generate_sequences"] += time.perf_counter() - started
            sampled = self._sampled(out, req.max_new_tokens, eos, renderer, stop)
            started = time.perf_counter()
            await loop.run_in_executor(None, episode.feed, sampled)
            timing["tool_calls"] += time.perf_counter() - started
            if len(episode.rows) > 1:
                raise ValueError(f"{self.name}: the chat template rewrites earlier turns, so this episode would go on "
                                 "in a new row; verl takes one sequence per sample: use a template that only appends")
        return timing

    def _sampled(self, out: Any, budget: int, eos: int | None, renderer: Any, stop: list[str] | None) -> Sampled:
        """The server's answer to one turn (`TokenOutput`) as the episode's `Sampled`: its ids, log-probs and finish
        (`_finish` over the turn's `budget` of tokens).

        Raises:
            ValueError: the server aborted the turn, or gave no log-probs or not one per token.
        """
        if getattr(out, "stop_reason", None) == "aborted":
            raise ValueError(f"{self.name}: the server aborted a turn (stop_reason 'aborted')")
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None or len(out.log_probs) != len(ids):
            got = "none" if out.log_probs is None else len(out.log_probs)
            raise ValueError(f"{self.name}: the server returned {len(ids)} token ids and {got} log-probs; the "
                             "episode needs one log-prob per sampled token")
        return Sampled(ids=ids, logprobs=[float(x) for x in out.log_probs],
                       finish=_finish(ids, budget, eos, renderer.turn_text(ids), stop))

    async def _score(self, rollout: Rollout) -> tuple[float, dict[str, float]]:
        """The loop's `reward` of the finished episode (in an executor thread): its score (0.0 when the reward failed)
        and `reward_extra_info`: each component's value and `error` (1.0 when the reward failed)."""
        loop = asyncio.get_running_loop()
        out = (await loop.run_in_executor(None, self.reward, [rollout]))[0]
        score = 0.0 if out.error is not None else float(out.score)
        info = {k: float(out.components.get(k, 0.0)) for k in self.reward_keys}
        info["error"] = float(out.error is not None)
        return score, info


def _turn_params(sampling_params: dict[str, Any], max_tokens: int, stop: list[str] | None) -> dict[str, Any]:
    """The sampling parameters of one server turn: verl's, with the turn's `max_tokens` budget, `logprobs=True` and
    the environment's `stop` strings (when it has any)."""
    params = {**sampling_params, "max_tokens": max_tokens, "logprobs": True}
    if stop:
        params["stop"] = list(stop)
    return params
