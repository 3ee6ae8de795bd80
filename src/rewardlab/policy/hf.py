"""Any Hugging Face causal LM as a policy: loading, prompt formatting, sampling with behaviour log-probs, token
log-probs. Packing and step marking are in `rewardlab.policy.batch`, the samplers and the shared-prefix scorer in
`rewardlab.policy.sampling`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rewardlab.modeldir import check_model_dir, load_pretrained
from rewardlab.policy.batch import Batch, collate, mark_steps
from rewardlab.policy.sampling import (
    expandable_cache,
    group_rows,
    sample_prefix_tree,
    sample_with_generate,
    shared_prefix_logits,
)
from rewardlab.types import Rollout

PROMPT_FORMATS = ("auto", "raw", "chat")


class Policy:
    """A causal LM and its tokenizer.

    Args:
        model: a transformers causal LM.
        tokenizer: its tokenizer; needs an end-of-sequence token (a pad token is set to it when missing).
        prompt_format: "raw" (prompt text as is), "chat" (the tokenizer's chat template with one user turn and
            the generation prompt), or "auto" (chat when the tokenizer has a chat template).
    Raises:
        ValueError: unknown prompt format, "chat" without a chat template, or a tokenizer without an EOS token.
    """

    def __init__(self, model, tokenizer, prompt_format: str = "auto") -> None:
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
        self.model = model
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        #: Use the shared-prefix sampler and scorer (see `sampling.sample_prefix_tree`, `completion_logits`). None:
        #: decided by the first call (True when the model's key/value cache can be repeated per row); False forces
        #: the plain paths (transformers' `generate`, one forward pass over every row).
        self.shared_prefix: bool | None = None

    @classmethod
    def load(cls, path: str | Path, *, prompt_format: str = "auto", dtype: str = "float32", device: str = "cpu",
             key: str = "model.path"):
        """Load a causal LM and tokenizer from a local Hugging Face model directory (nothing is downloaded: a hub id
        must be downloaded first and passed as its directory).

        Args:
            key: the config key that gave `path`, named in the errors.
        Raises:
            ValueError: unknown dtype; one line naming `key` when `path` does not exist, is not a model directory
                (no config.json) or does not load (see `rewardlab.modeldir`); the errors of `Policy.__init__`.
        """
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
        if torch_dtype is None:
            raise ValueError(f"model.dtype: expected float32, bfloat16 or float16, got {dtype!r}")
        where = check_model_dir(path, key)
        tokenizer = load_pretrained(AutoTokenizer, where, key)
        model = load_pretrained(AutoModelForCausalLM, where, key, dtype=torch_dtype).to(device)
        return cls(model, tokenizer, prompt_format)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def save(self, path: str | Path) -> None:
        """Save model (safetensors) and tokenizer in HF format under `path`."""
        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))

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

    def encode_target(self, text: str) -> list[int]:
        """Token ids of a target completion followed by the end-of-sequence token (for supervised training)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def collate(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> Batch:
        """Pack prompts (left-padded) and completions (right-padded) into a `Batch` on this policy's device
        (`rewardlab.policy.batch.collate` with the tokenizer's pad token)."""
        return collate(prompt_ids, completion_ids, pad_id=self.tokenizer.pad_token_id, device=self.device)

    def mark_steps(self, rollout: Rollout, separator: str = "\n") -> Rollout:
        """Fill `rollout.steps` (token spans) and `rollout.step_text` with this tokenizer
        (`rewardlab.policy.batch.mark_steps`)."""
        return mark_steps(self.tokenizer, rollout, separator)

    # ------------------------------------------------------------------ sampling
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
    ) -> list[Rollout]:
        """Sample `n` completions of each task prompt.

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
                adds to prompt + prefix (transformers `stop_strings`), e.g. "\n" to sample one reasoning step.
        Returns:
            len(prompts) * n rollouts, prompt-major: rollout k belongs to prompt k // n and has group k // n.
            `logprobs` are log softmax(logits / temperature) of the sampled tokens (temperature 1 when greedy).
            `truncated` is True when a completion ended at `max_new_tokens`, with neither EOS nor `stop`.
        Raises:
            ValueError: temperature <= 0, top_p outside (0, 1], n < 1, greedy with n > 1, an empty `stop`, or
                `prefixes` of another length than `prompts`.
        """
        if n < 1 or (greedy and n != 1):
            raise ValueError(f"generation: n must be >= 1 (and 1 when greedy), got {n}")
        if not greedy and temperature <= 0:
            raise ValueError(f"generation.temperature: must be > 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"generation.top_p: must be in (0, 1], got {top_p}")
        if stop is not None and not stop:
            raise ValueError("generation.stop: must be a non-empty string or None")
        if prefixes is not None and len(prefixes) != len(prompts):
            raise ValueError(f"generation: {len(prefixes)} prefixes for {len(prompts)} prompts")
        tok = self.tokenizer
        convs = [rows[i].get("messages") if rows is not None else None for i in range(len(prompts))]
        texts = [self.format_prompt(p, convs[i]) + (prefixes[i] if prefixes is not None else "")
                 for i, p in enumerate(prompts)]
        ids = [self.encode_prompt(t) for t in texts]
        step = batch_size or len(prompts) or 1
        was_training = self.model.training
        self.model.eval()
        rollouts: list[Rollout] = []
        eos = tok.eos_token_id
        for start in range(0, len(prompts), step):
            chunk = ids[start : start + step]
            gen, logps = self._sample(chunk, n=n, temperature=temperature, top_p=top_p,
                                      max_new_tokens=max_new_tokens, greedy=greedy, stop=stop)
            for k, row_ids in enumerate(gen.tolist()):
                p_idx = start + k // n
                end = row_ids.index(eos) + 1 if eos in row_ids else len(row_ids)
                stopped = False
                if stop is not None:
                    cut = self._stop_end(row_ids[:end], stop, texts[p_idx][-(len(stop) - 1) :] if len(stop) > 1 else "")
                    if cut is not None:
                        end, stopped = cut, True
                comp = row_ids[:end]
                rollouts.append(
                    Rollout(
                        prompt=texts[p_idx],
                        prompt_ids=ids[p_idx],
                        completion=tok.decode(comp, skip_special_tokens=True),
                        completion_ids=comp,
                        logprobs=logps[k, :end].tolist(),
                        row=dict(rows[p_idx]) if rows is not None else {},
                        group=p_idx,
                        truncated=not stopped and eos not in comp,
                    )
                )
        self.model.train(was_training)
        return rollouts

    def _stop_end(self, ids: list[int], stop: str, before: str) -> int | None:
        """Tokens of `ids` up to the one that completes the first `stop` in `before` + decoded text, or None.

        `before` is the tail of the prompt (len(stop) - 1 characters), so a stop string that starts in the prompt
        and ends in the first new token counts, as it does for transformers' `stop_strings`.
        """
        text = before + self.tokenizer.decode(ids, skip_special_tokens=True)
        at = text.find(stop)
        if at < 0:
            return None
        need = at + len(stop) - len(before)  # characters of new text up to the end of the stop string
        for k in range(1, len(ids) + 1):
            if len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)) >= need:
                return k
        return len(ids)

    def _sample(self, prompt_ids: list[list[int]], *, n: int, temperature: float, top_p: float, max_new_tokens: int,
                greedy: bool, stop: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample `n` completions of each prompt: [B*n, L] int64 token ids (pad after EOS, L <= max_new_tokens) and
        [B*n, L] float32 behaviour log-probs, prompt-major. The shared-prefix sampler when the model's cache allows
        it, else transformers' `generate`. With `stop`, `generate` ends a row at the stop string (`stop_strings`); the
        shared-prefix sampler runs on to the limit and the caller cuts at the stop string, which gives the same
        distribution."""
        batch = self.collate(prompt_ids, [[] for _ in prompt_ids])
        P = batch.prompt_len
        if self.shared_prefix is not False:
            prefill = self.model(input_ids=batch.input_ids[:, :P], attention_mask=batch.attention_mask[:, :P],
                                 position_ids=batch.position_ids[:, :P], use_cache=True, logits_to_keep=1)
            self.shared_prefix = expandable_cache(prefill.past_key_values)
            if self.shared_prefix:
                return sample_prefix_tree(self.model, batch, prefill, eos_id=self.tokenizer.eos_token_id,
                                          pad_id=self.tokenizer.pad_token_id, n=n, temperature=temperature,
                                          top_p=top_p, max_new_tokens=max_new_tokens, greedy=greedy)
        return sample_with_generate(self.model, self.tokenizer, batch, n=n, temperature=temperature, top_p=top_p,
                                    max_new_tokens=max_new_tokens, greedy=greedy, stop=stop)

    # ------------------------------------------------------------------ scoring
    def token_logprobs(
        self, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the completion tokens under the current weights (differentiable).

        Args:
            batch: packed rollouts (see `Batch`).
            temperature: logits are divided by it, as in sampling, so values match the behaviour log-probs.
            with_entropy: also return the entropy of each position's distribution.
            entropy_grad: let gradients flow through the entropy (for an entropy bonus); else it is detached.
        Returns:
            logprobs [N, T] float32 (natural log, 0 where mask is 0), entropy [N, T] float32 in nats or None.
        """
        logits = self.completion_logits(batch).float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        logprobs = logp_all.gather(-1, batch.completion_ids[..., None]).squeeze(-1) * batch.mask
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = -(logp_all.exp() * logp_all).sum(-1) * batch.mask
        return logprobs, entropy

    def completion_logits(self, batch: Batch) -> torch.Tensor:
        """[N, T, V] logits (model dtype) at the positions that predict each completion token (differentiable).

        With `shared_prefix` (the default), computation is shared between rows: identical rows (the same prompt
        and completion, common when a group's samples coincide) are computed once, and when at least half of the
        rows repeat another row's prompt (GRPO groups), each distinct prompt is run once, its key/value cache is
        repeated to its rows, and only the completion tokens are run on top of it. The values are those of one
        forward pass over every row (up to float rounding), and so are the gradients: a shared computation receives
        the sum of its rows' gradients. (A model with active dropout would also share its dropout masks between
        such rows.) Otherwise (or for models whose cache cannot be repeated) it is one forward pass over
        `[prompt | completion]`.
        """
        P, T = batch.prompt_len, batch.completion_ids.shape[1]
        N = batch.input_ids.shape[0]
        if self.shared_prefix is not False:
            seq_first, seq_of_row = group_rows(torch.cat([batch.input_ids, batch.attention_mask], dim=1))
            rows = batch if len(seq_first) == N else batch.select(seq_first)
            first, prompt_of_seq = group_rows(torch.cat([rows.input_ids[:, :P], rows.attention_mask[:, :P]], dim=1))
            if 2 * len(first) <= N:
                logits = shared_prefix_logits(self.model, rows, first, prompt_of_seq)
                self.shared_prefix = logits is not None
                if logits is not None:
                    return logits if len(seq_first) == N else logits.index_select(0, seq_of_row)
        out = self.model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=T + 1,
            use_cache=False,
        )
        return out.logits[:, :-1]  # position P-1+t predicts completion token t
