"""Any Hugging Face causal LM as a policy: loading, prompt formatting, sampling with behaviour log-probs, token
log-probs. Packing and step marking are in `rewardlab.policy.batch`, the samplers and the shared-prefix scorer in
`rewardlab.policy.sampling`."""

from __future__ import annotations

import contextlib
import copy
import numbers
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rewardlab.modeldir import check_model_dir, load_pretrained
from rewardlab.policy.batch import Batch, collate, mark_steps, micro_batches
from rewardlab.policy.logprobs import chunk_positions, lm_head_split, selective_logprobs
from rewardlab.policy.lora import BASE_DIR, adapter_parameters, is_peft_model, load_adapter_parameters, save_adapter
from rewardlab.policy.sampling import (
    Draw,
    SampleRows,
    StopWatch,
    cache_kwarg,
    expandable_cache,
    group_rows,
    output_cache,
    sample_prefix_tree,
    sample_with_generate,
    shared_prefix_features,
    stop_end,
)
from rewardlab.policy.streams import stream_words
from rewardlab.types import Rollout, Sampled

PROMPT_FORMATS = ("auto", "raw", "chat")
#: `model.dtype` names.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: `model.autocast` names: the dtype the forward passes compute in over float32 master weights.
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16}


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a `model.dtype` name.

    Raises:
        ValueError: an unknown name (one line naming model.dtype).
    """
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype: expected float32, bfloat16 or float16, got {dtype!r}")
    return DTYPES[dtype]


def load_model_dir(path: str | Path, *, dtype: str = "float32", device: str = "cpu",
                   key: str = "model.path") -> tuple[Any, Any]:
    """(causal LM, tokenizer) of a local Hugging Face model directory, the weights in `dtype` on `device`.

    Raises:
        ValueError: see `Policy.load`.
    """
    weights_dtype = torch_dtype(dtype)
    where = check_model_dir(path, key)
    tokenizer = load_pretrained(AutoTokenizer, where, key)
    model = load_pretrained(AutoModelForCausalLM, where, key, dtype=weights_dtype).to(device)
    return model, tokenizer


class Policy:
    """A causal LM and its tokenizer.

    Args:
        model: a transformers causal LM, or a peft model (a LoRA adapter on one: `rewardlab.policy.lora`).
        tokenizer: its tokenizer; needs an end-of-sequence token (a pad token is set to it when missing).
        prompt_format: "raw" (prompt text as is), "chat" (the tokenizer's chat template with one user turn and
            the generation prompt), or "auto" (chat when the tokenizer has a chat template).
        autocast: "bfloat16" runs every forward pass (sampling, scoring, training) under `torch.autocast` in that
            dtype, the weights (the optimizer's master copy) staying float32; None: the weights' dtype throughout.
        gradient_checkpointing: recompute each decoder layer's activations in the backward pass instead of storing
            them (transformers' `gradient_checkpointing_enable`, non-reentrant): less memory, about a third more
            compute per training forward.
        logprob_chunk_tokens: completion positions whose vocabulary-wide logits exist at once when log-probs and
            entropies are computed (`rewardlab.policy.logprobs`); None: as many as fit in 2^24 float32 logits.
    Raises:
        ValueError: unknown prompt format, "chat" without a chat template, or a tokenizer without an EOS token;
            an unknown autocast dtype, autocast over weights that are not float32, a chunk < 1.
    """

    def __init__(self, model, tokenizer, prompt_format: str = "auto", *, autocast: str | None = None,
                 gradient_checkpointing: bool = False, logprob_chunk_tokens: int | None = None) -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"model.prompt_format: expected one of {PROMPT_FORMATS}, got {prompt_format!r}")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if prompt_format == "auto":
            prompt_format = "chat" if has_template else "raw"
        if prompt_format == "chat" and not has_template:
            raise ValueError("model.prompt_format: 'chat' but the tokenizer has no chat template")
        if tokenizer.eos_token_id is None:
            raise ValueError("model: the tokenizer has no end-of-sequence token")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if autocast is not None and autocast not in AUTOCAST_DTYPES:
            raise ValueError(f"model.autocast: expected one of {sorted(AUTOCAST_DTYPES)} or null, got {autocast!r}")
        if autocast is not None:
            low = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                          if p.is_floating_point() and p.dtype != torch.float32})
            if low:
                raise ValueError(f"model.autocast: computes in {autocast} over float32 master weights, and the "
                                 f"weights are {', '.join(low)}; set model.dtype=float32 (or drop model.autocast)")
        if logprob_chunk_tokens is not None:
            chunk_positions(1, logprob_chunk_tokens)  # >= 1
        self.model = model
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        self.autocast = autocast
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.gradient_checkpointing = bool(gradient_checkpointing)
        if self.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.2x's name (the old one warns)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._head_split: Any = None  # (body, LM head) once checked (`lm_head_split`), False when there is none
        self._adapter_off = False  # `without_adapter`'s view: every forward pass with the LoRA adapter disabled
        #: Use the shared-prefix sampler and scorer (see `sampling.sample_prefix_tree`, `completion_logits`). None:
        #: decided by the first call (True when the model's key/value cache can be repeated per row); False forces
        #: the plain paths (transformers' `generate`, one forward pass over every row).
        self.shared_prefix: bool | None = None

    @classmethod
    def load(cls, path: str | Path, *, prompt_format: str = "auto", dtype: str = "float32", device: str = "cpu",
             key: str = "model.path", **options: Any):
        """Load a causal LM and tokenizer from a local Hugging Face model directory (nothing is downloaded: a hub id
        must be downloaded first and passed as its directory).

        Args:
            key: the config key that gave `path`, named in the errors.
            options: `autocast`, `gradient_checkpointing`, `logprob_chunk_tokens` (see `Policy`).
        Raises:
            ValueError: unknown dtype; one line naming `key` when `path` does not exist, is not a model directory
                (no config.json) or does not load (see `rewardlab.modeldir`); the errors of `Policy.__init__`.
        """
        model, tokenizer = load_model_dir(path, dtype=dtype, device=device, key=key)
        return cls(model, tokenizer, prompt_format, **options)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """The precision of this policy's forward passes: `torch.autocast` in the `autocast` dtype when set, else
        nothing (the weights' dtype). In a `without_adapter` view, also the base model alone: peft's
        `disable_adapter()`, in eval mode (as a separately loaded reference runs), the mode restored after."""
        with contextlib.ExitStack() as stack:
            if self._adapter_off:
                stack.enter_context(self.model.disable_adapter())
                was_training = self.model.training
                self.model.eval()
                stack.callback(self.model.train, was_training)
            if self.autocast is not None:
                stack.enter_context(torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.autocast]))
            yield

    # ------------------------------------------------------------------ LoRA (rewardlab.policy.lora)
    @property
    def has_adapter(self) -> bool:
        """Whether the model is a peft model: a LoRA adapter (the only trainable weights) on a frozen base."""
        return is_peft_model(self.model)

    def without_adapter(self) -> Policy:
        """The base model of a LoRA policy as a policy of its own: the same model object, tokenizer and settings,
        every forward pass (scoring and sampling) run with the adapter disabled (`compute`). Nothing is copied, so it
        costs no memory and always sees the base weights (which training never changes): the KL reference of a LoRA
        run.

        Raises:
            ValueError: the policy has no adapter.
        """
        if not self.has_adapter:
            raise ValueError("Policy.without_adapter: the policy has no LoRA adapter (model.lora is not set)")
        view = copy.copy(self)
        view._adapter_off = True
        return view

    def save(self, path: str | Path) -> None:
        """Save the model and tokenizer in HF format under `path`: the full weights (model.safetensors); for a LoRA
        policy, the adapter only (adapter_config.json, adapter_model.safetensors), plus the base in `path`/base/
        when the base is not on disk (`rewardlab.policy.lora.save_adapter`).

        Raises:
            OSError: a write failed.
        """
        if self.has_adapter:
            base = self.model.peft_config["default"].base_model_name_or_path
            save_adapter(self.model, self.tokenizer, path, base_on_disk=base != BASE_DIR)
            return
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The weights training changes, by name, as the model's own tensors (detached, not copied): the full
        `state_dict()`, or for a LoRA policy the adapter's parameters only (`lora.adapter_parameters`). What a
        rollout engine publishes to its replicas (`load_trained_weights`)."""
        if self.has_adapter:
            return {k: v.detach() for k, v in adapter_parameters(self.model).items()}
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def load_trained_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load what `trained_weights` of a replica of this policy (built from the same config) returned, in place.

        Raises:
            RuntimeError: the names do not match this model's (`load_state_dict`, `lora.load_adapter_parameters`).
        """
        if self.has_adapter:
            load_adapter_parameters(self.model, state)
        else:
            self.model.load_state_dict(state)

    # ------------------------------------------------------------------ text <-> ids
    def format_prompt(self, text: str, messages: Sequence[dict[str, str]] | None = None) -> str:
        """The text fed to the model for a task prompt (chat template applied when prompt_format is "chat").

        Args:
            text: the prompt (the last user turn of a chat row).
            messages: a chat row's conversation up to and including its last user turn ([{"role", "content"}],
                system prompt and earlier turns included), formatted whole when its last turn is the user turn
                `text`; otherwise the prompt is one user turn of `text`.
        Raises:
            ValueError: `messages` for a policy whose prompt format is "raw" (chat rows need a chat template).
        """
        if messages is not None and self.prompt_format != "chat":
            raise ValueError("model.prompt_format: chat rows ('messages') need the model's chat template; this "
                             "policy formats prompts as raw text")
        if self.prompt_format == "chat":
            turns = [{"role": "user", "content": text}]
            if messages and messages[-1].get("role") == "user" and messages[-1].get("content") == text:
                turns = [dict(m) for m in messages]
            return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return text

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of an already formatted prompt. Special tokens (BOS) are added unless a chat template did."""
        add_special = self.prompt_format != "chat"
        return self.tokenizer(text, add_special_tokens=add_special)["input_ids"]

    def encode_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode_prompt` of each of `texts` (already formatted prompts), in one tokenizer call."""
        if not texts:
            return []
        return self.tokenizer(list(texts), add_special_tokens=self.prompt_format != "chat", verbose=False)["input_ids"]

    def encode_target(self, text: str) -> list[int]:
        """Token ids of a target completion followed by the end-of-sequence token (for supervised training)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode_target` of each of `texts`, in one tokenizer call."""
        if not texts:
            return []
        eos = self.tokenizer.eos_token_id
        encoded = self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        return [ids + [eos] for ids in encoded]

    def collate(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> Batch:
        """Pack prompts (left-padded) and completions (right-padded) into a `Batch` on this policy's device
        (`rewardlab.policy.batch.collate` with the tokenizer's pad token)."""
        return collate(prompt_ids, completion_ids, pad_id=self.tokenizer.pad_token_id, device=self.device)

    def mark_steps(self, rollout: Rollout, separator: str = "\n") -> Rollout:
        """Fill `rollout.steps` (token spans) and `rollout.step_text` with this tokenizer
        (`rewardlab.policy.batch.mark_steps`)."""
        return mark_steps(self.tokenizer, rollout, separator)

    # ------------------------------------------------------------------ sampling
    @property
    def eos_token_id(self) -> int:
        """The tokenizer's end-of-sequence token id (`TokenSampler`)."""
        return self.tokenizer.eos_token_id

    @property
    def context_window(self) -> int | None:
        """The most tokens (prompt + completion) the model attends to: its config's `max_position_embeddings`, or
        None when the config has none (`TokenSampler`)."""
        value = getattr(self.model.config, "max_position_embeddings", None)
        return int(value) if value else None

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 32,
        greedy: bool = False,
        rows: Sequence[dict[str, Any]] | None = None,
        batch_size: int | None = None,
        prefixes: Sequence[str] | None = None,
        stop: str | None = None,
        streams: Sequence[tuple[int, ...]] | None = None,
        max_prompt_length: int | None = None,
    ) -> list[Rollout]:
        """Sample `n` completions of each task prompt.

        Its keywords are Hugging Face `generate`'s (n, temperature, top_p, max_new_tokens, stop), one each, as a
        user of transformers passes them; the library's own samplers pass a `SamplingSettings` whole.

        Prompts are checked against the model's context window (`context_window`, tokens) as `sample_ids` checks
        them: a prompt (formatted, with its prefix) that fills the window is a ValueError; a completion budget that
        would run past it is clamped to the room left (window - prompt tokens), and such a completion may end there
        with `truncated` True. The verbs refuse, at set-up, any task row whose prompt + max_new_tokens does not fit
        (`rewardlab.tasks.check_prompt_lengths`), so a run never relies on the clamp.

        Args:
            prompts: task prompt texts (formatted with `format_prompt` here, with the row's `messages` when its
                row is a chat row).
            n: completions per prompt (the group size).
            temperature: sampling temperature (> 0); ignored when `greedy`.
            top_p: nucleus sampling mass in (0, 1].
            max_new_tokens: token limit of each completion.
            greedy: argmax decoding (then n must be 1).
            rows: the task row of each prompt, stored on its rollouts.
            batch_size: prompts per `generate` call (default all at once).
            prefixes: text appended to each formatted prompt, one per prompt: a partial completion to continue
                (step-level search). The rollout's `prompt` is then formatted prompt + prefix, and its `completion`
                only the new text.
            stop: a stop string: each completion ends right after the first occurrence of `stop` in the text it
                adds to prompt + prefix (a stop string that starts in the prompt's tail and ends in the new text
                counts), e.g. "\n" to sample one reasoning step.
            streams: one random stream key (a tuple of ints) per rollout, prompt-major (len(prompts) * n): rollout
                k's t-th token is drawn by inverse CDF at a uniform hashed from (streams[k], t)
                (`rewardlab.policy.streams`), so it does not depend on the batch, `batch_size`, the other rollouts or
                torch's global generator. None: draws from torch's global generator.
            max_prompt_length: cut every prompt (formatted, with its prefix) longer than this many tokens to its last
                `max_prompt_length` tokens (left truncation, TRL's `max_prompt_length`); such a rollout's
                `prompt_ids` are the kept tokens and its `prompt` their decoded text. None: prompts are never cut.
        Returns:
            len(prompts) * n rollouts, prompt-major: rollout k belongs to prompt k // n and has group k // n.
            `logprobs` are log softmax(logits / temperature) of the sampled tokens (temperature 1 when greedy).
            `truncated` is True when a completion ended at its token budget (`max_new_tokens`, or the room left in
            the context window), with neither EOS nor `stop`.
        Raises:
            ValueError: one line: temperature <= 0, top_p outside (0, 1], n < 1, greedy with n > 1, max_new_tokens
                < 1, max_prompt_length < 1, an empty `stop`, `prefixes` of another length than `prompts`, `streams`
                of another length than len(prompts) * n or with a key that is not a tuple of ints, or a prompt whose
                tokens (after `max_prompt_length`) fill the context window ("generation.prompts[3]: 5002 prompt
                tokens leave no room in the model's context window of 256 tokens; ...").
        """
        if n < 1 or (greedy and n != 1):
            raise ValueError(f"generation: n must be >= 1 (and 1 when greedy), got {n}")
        self._check_sampling(temperature, top_p, greedy)
        if max_new_tokens < 1:
            raise ValueError(f"generation.max_new_tokens: must be >= 1, got {max_new_tokens}")
        if max_prompt_length is not None and (isinstance(max_prompt_length, bool)
                                              or not isinstance(max_prompt_length, numbers.Integral)
                                              or max_prompt_length < 1):
            raise ValueError(f"generation.max_prompt_length: must be an integer >= 1 or None, got "
                             f"{max_prompt_length!r}")
        if stop is not None and not stop:
            raise ValueError("generation.stop: must be a non-empty string or None")
        if prefixes is not None and len(prefixes) != len(prompts):
            raise ValueError(f"generation: {len(prefixes)} prefixes for {len(prompts)} prompts")
        if streams is not None and len(streams) != len(prompts) * n:
            raise ValueError(f"generation.streams: expected one per rollout ({len(prompts)} prompts x {n}), "
                             f"got {len(streams)}")
        words = stream_words(streams) if streams is not None and not greedy else None
        tok = self.tokenizer
        convs = [rows[i].get("messages") if rows is not None else None for i in range(len(prompts))]
        texts = [self.format_prompt(p, convs[i]) + (prefixes[i] if prefixes is not None else "")
                 for i, p in enumerate(prompts)]
        ids = [self.encode_prompt(t) for t in texts]
        cut = [max_prompt_length is not None and len(p) > max_prompt_length for p in ids]
        ids = [p[-max_prompt_length:] if c else p for p, c in zip(ids, cut)]  # type: ignore[operator]
        budgets = self._prompt_budgets(ids, max_new_tokens, "generation.prompts")
        step = batch_size or len(prompts) or 1
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), step):
            chunk = ids[start : start + step]
            B = len(chunk)
            befores = [texts[start + k // n][max(0, len(texts[start + k // n]) - len(stop) + 1) :] if stop else ""
                       for k in range(B * n)]
            sampled = self._sample(chunk, Draw(temperature, top_p, greedy), node=[k // n for k in range(B * n)],
                                   budgets=[budgets[start + k // n] for k in range(B * n)],
                                   stops=[stop] if stop is not None else None, befores=befores,
                                   words=None if words is None else words[start * n : (start + B) * n])
            for k, s in enumerate(sampled):
                p_idx = start + k // n
                rollouts.append(
                    Rollout(
                        prompt=tok.decode(ids[p_idx], skip_special_tokens=False) if cut[p_idx] else texts[p_idx],
                        prompt_ids=ids[p_idx],
                        completion=tok.decode(s.ids, skip_special_tokens=True),
                        completion_ids=s.ids,
                        logprobs=s.logprobs,
                        row=dict(rows[p_idx]) if rows is not None else {},
                        group=p_idx,
                        truncated=s.finish == "length",
                    )
                )
        return rollouts

    @torch.no_grad()
    def sample_ids(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int | Sequence[int],
                   temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                   stop: Sequence[str] | None = None,
                   streams: Sequence[tuple[int, ...]] | None = None) -> list[Sampled]:
        """Continue each prefix in `prompts` by one sample: token ids in, ids and behaviour log-probs out
        (`rewardlab.types.TokenSampler`). The ids are given to the model exactly as they are (never decoded and
        re-encoded); identical prompts share their forward passes (prefix-tree sampler).

        Args:
            prompts: N token-id prefixes (each non-empty, ids in the model's vocabulary).
            max_new_tokens: each continuation's token budget (>= 1), one int for all or one per prompt. A budget
                that would run past `context_window` is clamped to the room left (context_window - len(prompt)),
                so a continuation that fills the window ends with finish "length" (the caller can tell it by
                len(prompt) + len(ids) == context_window).
            temperature: sampling temperature (> 0); ignored when `greedy`.
            top_p: nucleus sampling mass in (0, 1].
            greedy: argmax decoding (no draws; `streams` is then not used).
            stop: a list or tuple of strings that end a continuation once the decoded new text (special tokens
                skipped) contains one: it ends with the token that completes the earliest-ending stop string, that
                whole token kept (`sampling.stop_end`). Text of the prompt does not count. A str is refused (its
                characters would each be a stop string).
            streams: one key (a tuple of ints) per prompt: the t-th new token of prompt i is drawn by inverse CDF
                from softmax(logits / temperature) after top-p filtering, at the uniform u = H(streams[i], t) (a
                counter-based hash, `rewardlab.policy.streams.hashed_uniform`), so it depends only on (streams[i],
                t) and the model's logits, never on the batch, the other rows or torch's global generator. None:
                draws from torch's global generator (`torch.multinomial`).
        Returns:
            N `Sampled` in the order of `prompts`: `ids` (int token ids, up to and including EOS or the token that
            completed a stop string), `logprobs` (float, same length: log softmax(logits / temperature) of each
            sampled token before top-p filtering, natural log; temperature 1 when greedy) and `finish`: "eos",
            "stop" (also when the last budget token completes a stop string) or "length".
        Raises:
            ValueError: one line for an empty prompt, an id outside the vocabulary, a prompt that fills the context
                window, a budget < 1 or a budget list of the wrong length, temperature <= 0, top_p outside (0, 1],
                a str `stop` or an empty stop string, or `streams` of the wrong length or with a key that is not a
                tuple of ints.
        """
        self._check_sampling(temperature, top_p, greedy)
        N = len(prompts)
        budgets, stops = self._ids_request(prompts, max_new_tokens, stop, streams)
        words = stream_words(streams) if streams is not None and not greedy else None
        if N == 0:
            return []
        distinct: dict[tuple[int, ...], int] = {}
        node = [distinct.setdefault(tuple(int(x) for x in p), len(distinct)) for p in prompts]
        return self._sample([list(p) for p in distinct], Draw(temperature, top_p, greedy), node=node,
                            budgets=budgets, stops=stops, befores=[""] * N, words=words)

    def _ids_request(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                     stop: Sequence[str] | None,
                     streams: Sequence[tuple[int, ...]] | None) -> tuple[list[int], list[str] | None]:
        """`sample_ids`'s request checked: (each prompt's budget, clamped to the room its context window leaves;
        the stop strings as a list or None). Raises the one-line ValueErrors `sample_ids` lists (but temperature
        and top_p)."""
        N = len(prompts)
        if isinstance(max_new_tokens, numbers.Integral) and not isinstance(max_new_tokens, bool):
            budgets = [int(max_new_tokens)] * N
        else:
            budgets = [int(b) for b in max_new_tokens]
            if len(budgets) != N:
                raise ValueError(f"sample_ids.max_new_tokens: {len(budgets)} budgets for {N} prompts")
        if any(b < 1 for b in budgets):
            raise ValueError(f"sample_ids.max_new_tokens: every budget must be >= 1, got {min(budgets)}")
        if isinstance(stop, (str, bytes)):
            raise ValueError(f"sample_ids.stop: expected a list of strings, got the {type(stop).__name__} {stop!r}, "
                             f"whose characters would each end a continuation; write [{stop!r}]")
        stops = list(stop) if stop is not None else None
        if stops is not None and (not stops or not all(isinstance(s, str) and s for s in stops)):
            raise ValueError(f"sample_ids.stop: expected non-empty strings, got {stop!r}")
        if streams is not None and len(streams) != N:
            raise ValueError(f"sample_ids.streams: {len(streams)} streams for {N} prompts")
        vocab = self.model.get_input_embeddings().num_embeddings
        window = self.context_window
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"sample_ids.prompts[{i}]: empty prompt (no token ids)")
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"sample_ids.prompts[{i}]: token id outside the vocabulary [0, {vocab})")
            if window is not None:
                if len(p) >= window:
                    raise ValueError(f"sample_ids.prompts[{i}]: {len(p)} tokens leave no room in the context "
                                     f"window of {window}")
                budgets[i] = min(budgets[i], window - len(p))
        return budgets, stops

    def _prompt_budgets(self, ids: Sequence[Sequence[int]], max_new_tokens: int, field: str) -> list[int]:
        """The token budget of a completion of each prompt: `max_new_tokens`, clamped to the room the context window
        leaves (window - len(prompt)). Raises a one-line ValueError naming `field`[i] for a prompt that fills it."""
        window = self.context_window
        if window is None:
            return [max_new_tokens] * len(ids)
        for i, p in enumerate(ids):
            if len(p) >= window:
                raise ValueError(f"{field}[{i}]: {len(p)} prompt tokens leave no room in the model's context window "
                                 f"of {window} tokens; shorten the prompt, or cut prompts from the left with "
                                 f"max_prompt_length (below {window})")
        return [min(max_new_tokens, window - len(p)) for p in ids]

    @staticmethod
    def _check_sampling(temperature: float, top_p: float, greedy: bool) -> None:
        if not greedy and temperature <= 0:
            raise ValueError(f"generation.temperature: must be > 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"generation.top_p: must be in (0, 1], got {top_p}")

    def _stop_end(self, ids: list[int], stop: str | Sequence[str], before: str) -> int | None:
        """Tokens of `ids` up to the one that completes the first stop string in `before` + decoded text, or None
        (`sampling.stop_end`). `before` is the tail of the prompt, so a stop string that starts in the prompt and
        ends in the first new token counts."""
        return stop_end(self.tokenizer, ids, [stop] if isinstance(stop, str) else stop, before)

    def _sample(self, prompt_ids: list[list[int]], draw: Draw, *, node: list[int], budgets: list[int],
                stops: list[str] | None, befores: list[str], words: torch.Tensor | None) -> list[Sampled]:
        """The one sampling path of `generate` and `sample_ids`: N rows, row r continuing prompt `node[r]` of
        `prompt_ids` for at most `budgets[r]` tokens, drawn as `draw` says (temperature, top_p, greedy) from stream
        `words[r]` (or torch's generator when None), ending at EOS, the budget or a stop string (`befores[r]`: text
        before its new tokens, see `sampling.stop_end`). The shared-prefix sampler when the model's cache allows
        it, else transformers' `generate`; both run a row no further than its end, and the exact stop cut is made
        here."""
        rows = SampleRows(torch.tensor(node, dtype=torch.long), torch.tensor(budgets, dtype=torch.long), words,
                          StopWatch(self.tokenizer, stops, befores) if stops else None)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.compute():
                result = self._sample_ids(prompt_ids, rows, draw)
        finally:
            self.model.train(was_training)
        tokens, logps, lengths = result
        eos = self.tokenizer.eos_token_id
        out = []
        for r, (row, lp, length) in enumerate(zip(tokens.tolist(), logps.tolist(), lengths.tolist())):
            ids, finish = row[:length], "length"
            if ids and ids[-1] == eos:
                finish = "eos"
            if stops:
                cut = stop_end(self.tokenizer, ids, stops, befores[r])
                if cut is not None:
                    ids, finish = ids[:cut], "stop"
            out.append(Sampled(ids, lp[: len(ids)], finish))
        return out

    def _sample_ids(self, prompt_ids: list[list[int]], rows: SampleRows,
                    draw: Draw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_sample`'s model work: (tokens [N, L], behaviour log-probs [N, L], lengths [N]) from the shared-prefix
        sampler, or from transformers' `generate` when the model's cache cannot be repeated."""
        N = rows.node.shape[0]
        batch = self.collate(prompt_ids, [[] for _ in prompt_ids])
        P = batch.prompt_len
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        result = None
        if self.shared_prefix is not False:
            prefill = self.model(input_ids=batch.input_ids[:, :P], attention_mask=batch.attention_mask[:, :P],
                                 position_ids=batch.position_ids[:, :P], use_cache=True, logits_to_keep=1)
            self.shared_prefix = expandable_cache(output_cache(prefill))
            if self.shared_prefix:
                result = sample_prefix_tree(self.model, batch, prefill, rows, draw, eos_id=eos, pad_id=pad)
        if result is None:
            n = N // len(prompt_ids)
            node = rows.node.tolist()
            # one row per prompt unless n rows per prompt in order and transformers samples (its greedy search,
            # which stream draws run through, takes one sequence per prompt)
            if rows.words is not None or n * len(prompt_ids) != N or node != [k // n for k in range(N)]:
                batch, n = self.collate([prompt_ids[j] for j in node], [[] for _ in node]), 1
            result = sample_with_generate(self.model, self.tokenizer, batch, rows, draw, n=n)
        return result

    # ------------------------------------------------------------------ scoring
    def token_logprobs(
        self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the completion tokens under the current weights (differentiable), without a [N, T, V]
        tensor: the LM head and the float32 softmax run on `logprob_chunk_tokens` completion positions at a time
        (`rewardlab.policy.logprobs.selective_logprobs`), in the forward and again in the backward pass; only the
        positions with `batch.mask` 1 are computed. Runs under this policy's autocast (`compute`).

        log p(y_t) = z_t[y_t] - logsumexp(z_t), H_t = -sum_v p_t[v] log p_t[v], z_t = logits_t / temperature.

        Args:
            batch: packed rollouts (see `Batch`).
            temperature: logits are divided by it, as in sampling, so values match the behaviour log-probs.
            with_entropy: also return the entropy of each position's distribution.
            entropy_grad: let gradients flow through the entropy (for an entropy bonus); else it is detached.
        Returns:
            logprobs [N, T] float32 (natural log, 0 where mask is 0), entropy [N, T] float32 in nats (0 where mask
            is 0) or None.
        """
        on = batch.mask > 0
        narrow = batch.trim()  # the same masked entries, in the same (row-major) order
        with self.compute():
            features, head = self.completion_features(narrow)
        picked = features[narrow.mask > 0]  # [M, H] hidden states (or [M, V] logits) of the completion tokens
        logp, entropy = selective_logprobs(
            picked, narrow.completion_ids[narrow.mask > 0], head=head, temperature=temperature,
            chunk=self.logprob_chunk_tokens, with_entropy=with_entropy, entropy_grad=entropy_grad,
            dtype=AUTOCAST_DTYPES[self.autocast] if self.autocast is not None else None)
        zeros = torch.zeros(on.shape, dtype=torch.float32, device=on.device)
        logprobs = zeros.masked_scatter(on, logp)
        return logprobs, zeros.masked_scatter(on, entropy) if entropy is not None else None

    @torch.no_grad()
    def scored_logprobs(self, batch: Batch, *, temperature: float = 1.0, micro_batch_size: int | None = None,
                        group: torch.Tensor | None = None) -> torch.Tensor:
        """`token_logprobs` without gradient, `micro_batch_size` rows at a time (the reference's and the info-gain
        passes), so memory is set by the micro-batch, not by N.

        Args:
            batch: packed rollouts, N rows.
            temperature: as for `token_logprobs`.
            micro_batch_size: rows per forward pass (None: all N at once).
            group: [N] int64 prompt group of each row: a micro-batch takes a group's rows together
                (`batch.micro_batches`), so its prompt runs once; None: rows in order.
        Returns:
            [N, T] float32 log-probs, 0 where `batch.mask` is 0.
        Raises:
            ValueError: micro_batch_size < 1.
        """
        N = batch.input_ids.shape[0]
        key = group if group is not None else torch.zeros(N, dtype=torch.long)
        out = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.mask.device)
        for part in micro_batches(key, micro_batch_size):
            rows = part.to(batch.mask.device)
            out[rows] = self.token_logprobs(batch.select(rows), temperature=temperature)[0]
        return out

    def lm_head(self) -> torch.nn.Linear | None:
        """The LM head applied outside the model (`lm_head_split`, checked once), or None when log-probs come from
        the model's full logits."""
        if self._head_split is None:
            self._head_split = lm_head_split(self.model) or False
        return self._head_split[1] if self._head_split else None

    def completion_features(self, batch: Batch) -> tuple[torch.Tensor, torch.nn.Linear | None]:
        """The features at the positions that predict each completion token (differentiable, model or autocast
        dtype), and the head that turns them into logits: ([N, T, H] last hidden states, the LM head) when the
        model splits (`lm_head`), else ([N, T, V] logits, None).

        With `shared_prefix` (the default), computation is shared between rows: identical rows (the same prompt
        and completion, common when a group's samples coincide) are computed once, and when at least half of the
        rows repeat another row's prompt (GRPO groups), each distinct prompt is run once, its key/value cache is
        repeated to its rows, and only the completion tokens are run on top of it. The values are those of one
        forward pass over every row (up to float rounding), and so are the gradients: a shared computation receives
        the sum of its rows' gradients. (A model with active dropout would also share its dropout masks between
        such rows.) Otherwise (for models whose cache cannot be repeated, and while gradient checkpointing
        recomputes layers, which drops the cache) it is one forward pass over `[prompt | completion]`.
        """
        P, T = batch.prompt_len, batch.completion_ids.shape[1]
        N = batch.input_ids.shape[0]
        head = self.lm_head()
        body = self._head_split[0] if head is not None else None

        cache_key = cache_kwarg(body if body is not None else self.model)

        def forward(past_key_values: Any = None, **inputs: torch.Tensor) -> tuple[torch.Tensor, Any]:
            if body is not None:
                out = body(**inputs, use_cache=True, **{cache_key: past_key_values})
                return out.last_hidden_state, output_cache(out)
            keep = {"logits_to_keep": 1} if past_key_values is None else {}  # the prompt's pass: its last position
            out = self.model(**inputs, use_cache=True, **{cache_key: past_key_values}, **keep)
            return out.logits, output_cache(out)

        checkpointing = self.gradient_checkpointing and self.model.training and torch.is_grad_enabled()
        if self.shared_prefix is not False and not checkpointing:
            seq_first, seq_of_row = group_rows(torch.cat([batch.input_ids, batch.attention_mask], dim=1))
            rows = batch if len(seq_first) == N else batch.select(seq_first)
            first, prompt_of_seq = group_rows(torch.cat([rows.input_ids[:, :P], rows.attention_mask[:, :P]], dim=1))
            if 2 * len(first) <= N:
                features = shared_prefix_features(forward, rows, first, prompt_of_seq)
                self.shared_prefix = features is not None
                if features is not None:
                    return (features if len(seq_first) == N else features.index_select(0, seq_of_row)), head
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "position_ids": batch.position_ids}
        if body is not None:
            hidden = body(**inputs, use_cache=False).last_hidden_state
            return hidden[:, P - 1 : P - 1 + T], head
        out = self.model(**inputs, logits_to_keep=T + 1, use_cache=False)
        return out.logits[:, :-1], None  # position P-1+t predicts completion token t
