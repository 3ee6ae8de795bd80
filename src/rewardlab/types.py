"""The records that travel between layers: a sampled completion (`Rollout`) and its score (`RewardOutput`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol


#: Why an episode ended (`Rollout.termination`), and the reasons that count as truncated (`Rollout.truncated`).
TERMINATIONS = ("stop", "env_done", "max_turns", "max_new_tokens", "max_episode_tokens", "context")
TRUNCATIONS = ("max_new_tokens", "max_episode_tokens", "context")


@dataclass
class Rollout:
    """One sampled completion of one prompt.

    Attributes:
        prompt: the prompt text exactly as fed to the model (after chat-template formatting, if any).
        prompt_ids: token ids of `prompt` (special tokens included), length P.
        completion: decoded completion text, special tokens removed.
        completion_ids: sampled token ids, length T, up to and including the end-of-sequence token when one was
            sampled (no padding).
        logprobs: behaviour log-probs of `completion_ids` under the sampling policy, length T, natural log, of the
            temperature-scaled distribution softmax(logits / temperature) (before top-p truncation).
        row: the task row the prompt came from: `prompt`, `answer` and any other task field.
        group: prompt-group id; rollouts of the same prompt in one batch share it.
        steps: token spans `(start, end)` (end exclusive, indices into `completion_ids`) of the reasoning steps;
            empty when the completion is not split into steps.
        step_text: the text of each step in `steps` (same length), for rewards that read steps.
        truncated: True when the rollout did not end on its own: its `termination` is one of `TRUNCATIONS`
            (`max_new_tokens`, `max_episode_tokens`, `context`). Derived from `termination` when that is given;
            for a single-turn rollout made without it, True means "stopped at the token limit before an
            end-of-sequence token" and sets `termination` to `max_new_tokens` (else `stop`).

    Episode fields (a multi-turn episode, `rewardlab.envs`; a single-turn rollout is an episode of one turn and
    gets the defaults below):
        loss_mask: one int per `completion_ids` entry: 1 exactly on tokens the policy sampled, 0 on tokens the
            environment, a tool or the chat template inserted. Default: all 1 (every completion token sampled).
            `logprobs` are behaviour log-probs on sampled tokens and 0.0 elsewhere.
        turns: the span `(start, end)` (end exclusive) in `completion_ids` of each model turn of this row.
            Default: one turn covering the completion.
        turn_rewards: the environment's reward for each turn in `turns` (0.0 where it gave none). Default: [].
        turn_keys: per turn in `turns`, the key of the state the model acted in (GiGPO's anchor state,
            `Environment.state_key`; default a hash of the whole history), as a string. Default: [].
        first_turn: the episode-wide index of this row's first turn (an episode split into several rows counts
            its turns across them, from 0).
        episode_id: shared by the rows of one episode when it is split into several rows (a chat template that is
            not append-only); None for a rollout that is its own episode.
        termination: why the episode ended: `stop` (the model answered without a tool call), `env_done`,
            `max_turns`, `max_new_tokens` (a model turn hit rl.sampling.max_new_tokens), `max_episode_tokens`, `context`
            (the model's context window is full); None on a row that is not its episode's last.
        tool_calls: per turn in `turns`, the parsed tool calls, each a dict with `name`, `arguments`, `status`
            (`ok`, `malformed`, `unknown_tool`, `bad_arguments`, `error`, `timeout`) and `seconds`. Default: [].
        messages: the whole transcript as chat messages ([{"role", "content", ...}]), prompt included; [] for a
            single-turn rollout.
        policy_version: the policy version that sampled it: the number of RL steps whose weights it was sampled
            with, i.e. the step whose update produced them (0: the initial weights; a synchronous step s samples
            with version s - 1). Set by the trainer's rollout engine (`rewardlab.rl.engines`); None elsewhere.
    In an episode, `completion` is the text of the final model turn (what answer extractors read, so a tool's
    output is never scored as the answer).
    """

    prompt: str
    prompt_ids: list[int]
    completion: str
    completion_ids: list[int]
    logprobs: list[float]
    row: dict[str, Any] = field(default_factory=dict)
    group: int = 0
    steps: list[tuple[int, int]] = field(default_factory=list)
    step_text: list[str] = field(default_factory=list)
    truncated: bool = False
    loss_mask: list[int] | None = None
    turns: list[tuple[int, int]] | None = None
    turn_rewards: list[float] = field(default_factory=list)
    turn_keys: list[str] = field(default_factory=list)
    first_turn: int = 0
    episode_id: int | None = None
    termination: str | None = None
    tool_calls: list[list[dict[str, Any]]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    policy_version: int | None = None

    def __post_init__(self) -> None:
        T = len(self.completion_ids)
        if len(self.logprobs) != T:
            raise ValueError(
                f"Rollout.logprobs has {len(self.logprobs)} entries but completion_ids has {len(self.completion_ids)}"
            )
        if self.loss_mask is None:
            self.loss_mask = [1] * T
        elif len(self.loss_mask) != T:
            raise ValueError(f"Rollout.loss_mask has {len(self.loss_mask)} entries but completion_ids has {T}")
        if self.turns is None:
            self.turns = [(0, T)]
        if self.termination is None and self.episode_id is None:
            self.termination = "max_new_tokens" if self.truncated else "stop"
        if self.termination is not None:
            if self.termination not in TERMINATIONS:
                raise ValueError(f"Rollout.termination: {self.termination!r} is not one of {', '.join(TERMINATIONS)}")
            self.truncated = self.termination in TRUNCATIONS

        if self.step_text and len(self.step_text) != len(self.steps):
            raise ValueError(f"Rollout.step_text has {len(self.step_text)} entries but steps has {len(self.steps)}")

    @property
    def sampled_tokens(self) -> int:
        """The number of tokens the policy sampled in this row (the ones of `loss_mask`)."""
        return sum(self.loss_mask)

    @property
    def answer(self) -> Any:
        """The task row's reference answer (None when the row has none)."""
        return self.row.get("answer")


@dataclass
class RewardOutput:
    """The score of one rollout.

    Attributes:
        score: the scalar reward used for credit assignment (unitless).
        components: named parts of the score, logged as `reward/<name>/mean` (e.g. `correct`, `format`); a
            component need not contribute to `score`.
        step_scores: one score per entry of `Rollout.steps` for process rewards, else None.
        error: None on success; otherwise a one-line text naming the reward and the cause, "<reward>: <cause>",
            several joined by "; " when several members of a composite fail (read them as `errors`). A failed
            reward is never silently a 0: the caller decides what `score` means for it.
    """

    score: float
    components: dict[str, float] = field(default_factory=dict)
    step_scores: list[float] | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is None and (self.score is None or math.isnan(float(self.score))):
            raise ValueError("RewardOutput.score is NaN without an error; set `error` to say why")

    @property
    def correct(self) -> bool:
        """Exact-match correctness: no error, and the `correct` component >= 1 when the reward has one, else
        score >= 1 (the accuracy metric of training, evaluation and search)."""
        return self.error is None and self.components.get("correct", float(self.score >= 1.0)) >= 1.0

    @property
    def errors(self) -> list[tuple[str, str]]:
        """`error` as (reward, cause) pairs, one per failed reward: "judge: HTTP 500; math: timed out" ->
        [("judge", "HTTP 500"), ("math", "timed out")]; [] without an error (see `parse_errors`)."""
        return parse_errors(self.error)


def parse_errors(error: str | None) -> list[tuple[str, str]]:
    """Split an error text into (reward, cause) pairs: the parts joined by "; ", each "<reward>: <cause>" (both
    stripped); a part without a ":" names no reward and is left out. [] for None or ""."""
    if not error:
        return []
    return [(name.strip(), cause.strip()) for name, _, cause in
            (part.partition(":") for part in error.split("; ") if ":" in part)]


def split_steps(text: str, separator: str = "\n") -> list[tuple[int, int]]:
    """Character spans `(start, end)` (end exclusive) of the reasoning steps of `text`.

    A step runs up to and including the next `separator`; the text after the last separator is the last step.
    Whitespace-only pieces are merged into the step before them (or the next one at the start), so no step is
    blank and the spans cover `text` exactly. `""` has no steps.

    Example: split_steps("a\nb\n\nc", "\n") -> [(0, 2), (2, 5), (5, 6)], i.e. "a\n", "b\n\n", "c".

    Raises:
        ValueError: if `separator` is empty.
    """
    if not separator:
        raise ValueError("step separator must be a non-empty string")
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(text):
        cut = text.find(separator, start)
        end = len(text) if cut < 0 else cut + len(separator)
        if spans and not text[start:end].strip():
            spans[-1] = (spans[-1][0], end)
        elif spans and not text[spans[-1][0]:spans[-1][1]].strip():  # a blank first piece joins this step
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
        start = end
    return spans


class ProgressBar(Protocol):
    """What a library loop reports its progress to (the CLI passes a rich bar, `rewardlab.progress.stage`)."""

    def advance(self, n: int = 1, **fields: float) -> None:
        """`n` more units done; `fields` (e.g. acc=0.5) are shown next to the bar."""


@dataclass
class Sampled:
    """One sampled continuation of a token prefix (`TokenSampler.sample_ids`).

    Attributes:
        ids: the sampled token ids, up to and including the end-of-sequence token, or the token that completed a
            stop string (that whole token is kept), when one ended the turn.
        logprobs: behaviour log-probs of `ids` (same length), natural log, of softmax(logits / temperature)
            before top-p truncation (temperature 1 when greedy).
        finish: "eos" (ended with the end-of-sequence token), "stop" (ended at a stop string) or "length" (hit
            its max_new_tokens).
    """

    ids: list[int]
    logprobs: list[float]
    finish: str


class TokenSampler(Protocol):
    """The token-level sampling interface the episode loop runs on: ids in, ids and log-probs out. Nothing is
    decoded and re-tokenized between calls (`rewardlab.policy.Policy` implements it).

    Attributes:
        eos_token_id: the end-of-sequence token id.
        context_window: the most tokens (prompt + completion) the model can attend to, or None if unbounded.
    """

    eos_token_id: int
    context_window: int | None

    def sample_ids(self, prompts: list[list[int]], *, max_new_tokens: int | list[int], temperature: float = 1.0,
                   top_p: float = 1.0, greedy: bool = False, stop: list[str] | None = None,
                   streams: list[tuple[int, ...]] | None = None) -> list[Sampled]:
        """Continue each prefix in `prompts` (token ids, given to the model exactly as they are) by one sample.

        Args:
            max_new_tokens: the token budget of each continuation (one int for all, or one per prompt).
            stop: strings that end a continuation (besides EOS) once the decoded new text contains one; the
                token that completes the string is kept whole.
            streams: each prompt's random stream key (a tuple of ints, e.g. (seed, step, episode, round, turn));
                the draw for the t-th new token of prompt i depends only on (streams[i], t), never on the batch
                it is sampled in. None: draws from torch's global generator.
        Returns:
            one `Sampled` per prompt, in order.
        """
        ...
