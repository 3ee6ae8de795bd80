"""Model rewards: an outcome reward model (`reward_model`) and a process reward model (`process_reward_model`).

Both load a Hugging Face checkpoint from a directory, score batches under `torch.inference_mode`, and define the
model's input format in one function each, shared with the trainers in `rewardlab.rm`:

- `encode_outcome`: prompt + completion for a sequence-classification model with one label (the Bradley–Terry
  reward model): the tokenizer's chat template (user turn = prompt, assistant turn = completion) when it has one,
  else the text pair (prompt, completion).
- `encode_process`: the PRM format: the prompt, then each step on its own line followed by the step tag,
  `prompt + "\\n" + step_1 + tag + "\\n" + step_2 + tag ...` (steps stripped of surrounding whitespace); a
  token-classification model with one label is read at the last token of each tag (Math-Shepherd's tag-token
  format, Wang et al. 2024). The tag and the step separator are stored in the model's config (`step_tag`,
  `step_separator`), so a saved PRM carries its own format.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch

from rewardlab.modeldir import check_model_dir, load_pretrained
from rewardlab.rewards.base import register_reward
from rewardlab.rewards.steps import STEP_AGGREGATIONS, aggregate_steps
from rewardlab.types import Rollout, RewardOutput, split_steps

#: Default PRM step tag: plain ASCII, so every tokenizer (the tiny character one included) gives it tokens.
DEFAULT_STEP_TAG = " <step>"
#: Default step separator of completions (one step per line), as in `split_steps`.
DEFAULT_SEPARATOR = "\n"


# ---------------------------------------------------------------------------------------------- input formats
def encode_outcome(tokenizer, prompts: Sequence[str], completions: Sequence[str], max_length: int) -> dict:
    """Tokenize prompt/completion pairs for a one-label sequence-classification reward model.

    With a chat template: [user: prompt, assistant: completion] rendered by the template (no generation prompt),
    tokenized without adding special tokens again. Without one: the tokenizer's text-pair encoding
    (`[CLS] prompt [SEP] completion [SEP]` for BERT-style tokenizers). Longer inputs are truncated to `max_length`
    tokens (longest part first).

    Returns:
        {"input_ids": [N, L] int64, "attention_mask": [N, L] int64, ...} padded to the longest row (the
        tokenizer's own padding side), as torch tensors.
    """
    if getattr(tokenizer, "chat_template", None):
        texts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}, {"role": "assistant", "content": c}], tokenize=False
            )
            for p, c in zip(prompts, completions)
        ]
        return tokenizer(texts, add_special_tokens=False, padding=True, truncation=True, max_length=max_length,
                         return_tensors="pt")
    return tokenizer(list(prompts), list(completions), padding=True, truncation=True, max_length=max_length,
                     return_tensors="pt")


def check_step_tag(step_tag: str) -> str:
    """Return `step_tag`, or raise ValueError when it is empty or whitespace only (no token would mark it)."""
    if not isinstance(step_tag, str) or not step_tag.strip():
        raise ValueError(f"step_tag: must contain a non-whitespace character, got {step_tag!r}")
    return step_tag


def encode_process(tokenizer, prompt: str, steps: Sequence[str], step_tag: str,
                   max_length: int | None = None) -> tuple[list[int], list[int]]:
    """The PRM input of one solution: token ids and the index of the token read for each step.

    Text: `prompt + "".join("\\n" + step.strip() + step_tag for step in steps)`, tokenized with the tokenizer's
    special tokens (e.g. `[CLS] ... [SEP]` or `<s> ...`). Step i is read at the token that holds the last character
    of its tag (found through the tokenizer's offset mapping, so any fast tokenizer works).

    Returns:
        (input_ids, positions): len(positions) == len(steps), strictly increasing.
    Raises:
        ValueError: a whitespace-only tag, a tag character that no token holds, or more than `max_length` tokens
            (the message gives the count).
    """
    check_step_tag(step_tag)
    text, ends = prompt, []
    for step in steps:
        text += "\n" + step.strip() + step_tag
        ends.append(len(text) - 1)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    if max_length is not None and len(ids) > max_length:
        raise ValueError(f"PRM input has {len(ids)} tokens, more than max_length={max_length}")
    positions, t = [], 0
    for end in ends:
        while t < len(offsets) and not (offsets[t][0] <= end < offsets[t][1]):
            t += 1
        if t == len(offsets):
            raise ValueError(f"step tag {step_tag!r}: its last character has no token of its own in this tokenizer")
        positions.append(t)
        t += 1
    return ids, positions


def pad_batch(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists: ([N, L] int64 ids, [N, L] int64 attention mask)."""
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), pad_id, dtype=torch.long)
    att = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        att[i, : len(r)] = 1
    return ids, att


# ---------------------------------------------------------------------------------------------- loading
def _load(path: str | Path, kind: str, device: str, reward: str):
    """(model in eval mode, tokenizer) from the checkpoint directory `path`, the `path` option of reward `reward`.
    Raises ValueError: one line naming the option for a missing, non-model or unloadable directory, or a model with
    more than one label."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    key = f"{reward}.path"  # a reward option, named like judge.model
    path = check_model_dir(path, key)
    cls = AutoModelForSequenceClassification if kind == "outcome" else AutoModelForTokenClassification
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a load report of a correctly saved model is noise here
    try:
        tokenizer = load_pretrained(AutoTokenizer, path, key)
        model = load_pretrained(cls, path, key).to(device).eval()
    finally:
        hf_logging.set_verbosity(verbosity)
    if model.config.num_labels != 1:
        raise ValueError(f"{path}: expected a model with one label (a scalar score), it has {model.config.num_labels}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def is_process_model(path: str | Path) -> bool:
    """True when the checkpoint at `path` is a rewardlab PRM (its config.json has a `step_tag`)."""
    import json

    cfg = Path(path) / "config.json"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8")) if cfg.is_file() else None
    except ValueError:  # unreadable: not a PRM; loading it then fails with an error naming the path
        return False
    return isinstance(data, dict) and "step_tag" in data


def _task_prompt(r: Rollout) -> str:
    return r.row.get("prompt", r.prompt)


def _fail(rollouts: Sequence[Rollout], name: str, exc: Exception) -> list[RewardOutput]:
    msg = f"{name}: {type(exc).__name__}: {exc}".splitlines()[0]
    return [RewardOutput(score=0.0, error=msg) for _ in rollouts]


# ---------------------------------------------------------------------------------------------- rewards
class RewardModel:
    """Outcome reward model: the scalar head of a one-label `AutoModelForSequenceClassification` on prompt + completion.

    Score = the model's logit (unitless; a Bradley–Terry model's scores differ by log-odds of preference,
    P(a > b) = sigmoid(r_a - r_b), Bradley & Terry 1952). The prompt is the task row's `prompt`.

    Args:
        path: directory of the checkpoint (e.g. `rewardlab rm train`'s `checkpoints/step-K`).
        batch_size: rollouts per forward pass.
        max_length: token limit per input (longer inputs are truncated, see `encode_outcome`).
        device: torch device.
    Raises:
        ValueError: `path` does not exist, holds no model (no config.json) or does not load (one line naming the
            `path` option; nothing is downloaded), or the model has more than one label.
    """

    #: The row fields it cannot score without (read by the TRL adapter's column check): none.
    row_fields: tuple = ()

    def __init__(self, path: str, batch_size: int = 32, max_length: int = 512, device: str = "cpu",
                 name: str = "reward_model") -> None:
        self.name = name
        self.model, self.tokenizer = _load(path, "outcome", device, name)
        self.batch_size, self.max_length = int(batch_size), int(max_length)

    @torch.inference_mode()
    def scores(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        """[N] scores of prompt/completion pairs (float, unitless)."""
        out: list[float] = []
        dev = self.model.device
        for s in range(0, len(prompts), self.batch_size):
            enc = encode_outcome(self.tokenizer, prompts[s : s + self.batch_size],
                                 completions[s : s + self.batch_size], self.max_length)
            logits = self.model(**{k: v.to(dev) for k, v in enc.items()}).logits
            out.extend(logits[:, 0].float().tolist())
        return out

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        try:
            values = self.scores([_task_prompt(r) for r in rollouts], [r.completion for r in rollouts])
        except Exception as exc:  # noqa: BLE001 - a failed batch is an explicit error on each rollout
            return _fail(rollouts, self.name, exc)
        return [RewardOutput(score=v) if math.isfinite(v) else RewardOutput(score=0.0, error=f"{self.name}: score is {v}")
                for v in values]


class ProcessRewardModel:
    """Process reward model: P(step is correct) = sigmoid(logit) at each step's tag, and an aggregate score.

    Steps are `Rollout.step_text` when the trainer marked them, else `split_steps(completion, separator)`.
    `step_scores` has one value in (0, 1) per step; `score` aggregates them with `aggregate`: `min` (Lightman et
    al. 2023, Wang et al. 2024), `last`, `prod` (product) or `mean`. A completion without steps or too long for the
    model is an error on that rollout.

    Args:
        path: directory of the checkpoint (`rewardlab prm train`'s `checkpoints/step-K`).
        aggregate: min | last | prod | mean.
        separator: step separator of completions (default: the one stored in the model's config, else "\\n").
        step_tag: override the tag stored in the model's config (for PRMs not trained here).
        batch_size, max_length, device: as for `RewardModel`.
    Raises:
        ValueError: no model at `path`, not one label, an unknown aggregate, or no step tag (neither in the
            config nor given).
    """

    #: The row fields it cannot score without (read by the TRL adapter's column check): none.
    row_fields: tuple = ()

    def __init__(self, path: str, aggregate: str = "min", separator: str | None = None, step_tag: str | None = None,
                 batch_size: int = 32, max_length: int = 512, device: str = "cpu",
                 name: str = "process_reward_model") -> None:
        if aggregate not in STEP_AGGREGATIONS:
            raise ValueError(f"aggregate: expected one of {tuple(STEP_AGGREGATIONS)}, got {aggregate!r}")
        self.name, self.aggregate = name, aggregate
        self.model, self.tokenizer = _load(path, "process", device, name)
        tag = step_tag or getattr(self.model.config, "step_tag", None)
        if tag is None:
            raise ValueError(f"{name}: {path} has no step_tag in its config; pass step_tag=")
        self.step_tag = check_step_tag(tag)
        self.separator = separator or getattr(self.model.config, "step_separator", None) or DEFAULT_SEPARATOR
        self.batch_size = int(batch_size)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = min(int(max_length), int(limit)) if limit else int(max_length)

    def steps_of(self, rollout: Rollout) -> list[str]:
        """The step texts of a rollout (see the class docstring); one per entry of `rollout.steps` when marked."""
        if rollout.step_text:
            return list(rollout.step_text)
        return [rollout.completion[a:b] for a, b in split_steps(rollout.completion, self.separator)]

    @torch.inference_mode()
    def step_probabilities(self, encoded: Sequence[tuple[list[int], list[int]]]) -> list[list[float]]:
        """P(correct) per step for `encode_process` outputs, batched: one list of floats in (0, 1) per input."""
        out: list[list[float]] = []
        dev = self.model.device
        for s in range(0, len(encoded), self.batch_size):
            chunk = encoded[s : s + self.batch_size]
            ids, att = pad_batch([c[0] for c in chunk], self.tokenizer.pad_token_id)
            logits = self.model(input_ids=ids.to(dev), attention_mask=att.to(dev)).logits[..., 0].float()
            probs = torch.sigmoid(logits).cpu()
            out.extend(probs[i, c[1]].tolist() for i, c in enumerate(chunk))
        return out

    def score_steps(self, prompt: str, steps: Sequence[str]) -> list[float]:
        """P(correct) of each step of one solution (list of floats in (0, 1)); raises ValueError as `encode_process`."""
        return self.step_probabilities([encode_process(self.tokenizer, prompt, steps, self.step_tag, self.max_length)])[0]

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        outputs: list[RewardOutput | None] = [None] * len(rollouts)
        todo, encoded = [], []
        for i, r in enumerate(rollouts):
            steps = self.steps_of(r)
            if not steps:
                outputs[i] = RewardOutput(score=0.0, error=f"{self.name}: the completion has no steps")
                continue
            try:
                encoded.append(encode_process(self.tokenizer, _task_prompt(r), steps, self.step_tag, self.max_length))
                todo.append(i)
            except ValueError as exc:
                outputs[i] = RewardOutput(score=0.0, error=f"{self.name}: {exc}")
        try:
            probs = self.step_probabilities(encoded)
        except Exception as exc:  # noqa: BLE001 - a failed batch is an explicit error on each rollout
            failed = _fail([rollouts[i] for i in todo], self.name, exc)
            for i, o in zip(todo, failed):
                outputs[i] = o
            return outputs  # type: ignore[return-value]
        for i, p in zip(todo, probs):
            outputs[i] = RewardOutput(score=aggregate_steps(p, self.aggregate), step_scores=p,
                                      components={"steps": float(len(p))})
        return outputs  # type: ignore[return-value]


# The classes are the factories: their __init__ parameters are the options `REWARDS.check` reads.
register_reward("reward_model")(RewardModel)
register_reward("process_reward_model")(ProcessRewardModel)
