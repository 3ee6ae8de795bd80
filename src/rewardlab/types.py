"""The records that travel between layers: a sampled completion (`Rollout`) and its score (`RewardOutput`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol


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
        truncated: True when generation stopped at the token limit before an end-of-sequence token.
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

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_ids):
            raise ValueError(
                f"Rollout.logprobs has {len(self.logprobs)} entries but completion_ids has {len(self.completion_ids)}"
            )

        if self.step_text and len(self.step_text) != len(self.steps):
            raise ValueError(f"Rollout.step_text has {len(self.step_text)} entries but steps has {len(self.steps)}")

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
