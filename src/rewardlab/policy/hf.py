"""Any Hugging Face causal LM as a policy: prompt formatting, sampling with behaviour log-probs, token log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.cache_utils import DynamicCache, DynamicLayer

from rewardlab.modeldir import check_model_dir, load_pretrained
from rewardlab.types import Rollout, split_steps

PROMPT_FORMATS = ("auto", "raw", "chat")


@dataclass
class Batch:
    """Rollouts packed as tensors: `[left-padded prompt | right-padded completion]`.

    Attributes:
        input_ids: [N, P + T] int64.
        attention_mask: [N, P + T] int64, 1 on real tokens.
        position_ids: [N, P + T] int64, positions counted from each row's first real token.
        completion_ids: [N, T] int64, the completion part of `input_ids` (pad after the end).
        mask: [N, T] float32, 1 on completion tokens (end-of-sequence token included).
        prompt_len: P, the padded prompt length.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    mask: torch.Tensor
    prompt_len: int

    def select(self, idx: torch.Tensor) -> Batch:
        """The rows `idx` ([M] int64) of this batch."""
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.position_ids[idx],
            self.completion_ids[idx],
            self.mask[idx],
            self.prompt_len,
        )


class _BehaviourLogprobs(LogitsProcessor):
    """Records log softmax(scores / temperature) of each sampled token during `generate`, one step behind.

    At step t the token sampled at step t-1 is the last column of `input_ids`, so only one step of [B, V]
    log-probs is kept (memory O(B V), not O(B T V) as with `output_logits`).
    """

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.prev: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, tokens[:, None]).squeeze(1))
            self.prev = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, T_generated] float32 log-probs of the generated tokens."""
        self._take(sequences[:, -1])
        return torch.stack(self.picked, dim=1) if self.picked else sequences.new_zeros((sequences.shape[0], 0)).float()


def _expandable_cache(cache: Any) -> bool:
    """True for a key/value cache whose rows can be repeated and selected (`DynamicCache` of `DynamicLayer`s).

    The shared-prefix paths below need exactly that; models with other caches (linear-attention or recurrent state,
    encoder-decoder) take the plain paths.
    """
    return isinstance(cache, DynamicCache) and all(isinstance(layer, DynamicLayer) for layer in cache.layers)


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020) of [B, V] scores: keep the smallest set of top tokens whose
    probability mass reaches `top_p` (at least one token); the rest get -inf. Same rule as transformers'
    `TopPLogitsWarper`: drop tokens whose ascending cumulative probability is <= 1 - top_p."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
    drop_sorted = sorted_scores.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


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
        #: Use the shared-prefix sampler and scorer (see `_sample_shared`, `completion_logits`). None: decided by the
        #: first call (True when the model's key/value cache can be repeated per row); False forces the plain paths
        #: (transformers' `generate`, one forward pass over every row).
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
    def format_prompt(self, text: str) -> str:
        """The text fed to the model for a task prompt (chat template applied when prompt_format is "chat")."""
        if self.prompt_format == "chat":
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
        return text

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of an already formatted prompt. Special tokens (BOS) are added unless a chat template did."""
        add_special = self.prompt_format != "chat"
        return self.tokenizer(text, add_special_tokens=add_special)["input_ids"]

    def encode_target(self, text: str) -> list[int]:
        """Token ids of a target completion followed by the end-of-sequence token (for supervised training)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]

    def collate(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> Batch:
        """Pack prompts (left-padded) and completions (right-padded) into a `Batch`."""
        n = len(prompt_ids)
        pad = self.tokenizer.pad_token_id
        P = max(len(p) for p in prompt_ids)
        T = max(1, max(len(c) for c in completion_ids))
        rows = [[pad] * (P - len(p)) + list(p) + list(c) + [pad] * (T - len(c))
                for p, c in zip(prompt_ids, completion_ids)]
        input_ids = torch.tensor(rows, dtype=torch.long).view(n, P + T)  # one tensor call, not 2 per row
        spans = torch.tensor([[P - len(p), P + len(c)] for p, c in zip(prompt_ids, completion_ids)]).view(n, 2)
        cols = torch.arange(P + T)
        attention = ((cols >= spans[:, :1]) & (cols < spans[:, 1:])).long()
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        return Batch(
            input_ids.to(dev),
            attention.to(dev),
            position_ids.to(dev),
            input_ids[:, P:].to(dev),
            attention[:, P:].float().to(dev),
            P,
        )

    def mark_steps(self, rollout: Rollout, separator: str = "\n") -> Rollout:
        """Fill `rollout.steps` (token spans) and `rollout.step_text` from `split_steps(completion, separator)`.

        A step's token span runs to the first token whose decoded prefix covers the step's last character; the last
        step also takes any trailing special tokens (EOS), so the spans tile `completion_ids`. Cost: one decode per
        completion token (O(T^2) characters), fine for the completion lengths used on a CPU.
        """
        text = rollout.completion
        spans = split_steps(text, separator)
        ids = rollout.completion_ids
        ends = [len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(1, len(ids) + 1)]
        steps, step_text, start = [], [], 0
        for j, (a, b) in enumerate(spans):
            stop = next((k + 1 for k in range(start, len(ids)) if ends[k] >= b), len(ids))
            if j == len(spans) - 1:
                stop = len(ids)
            if stop > start:
                steps.append((start, stop))
                step_text.append(text[a:b])
            elif step_text:  # a step that shares its token with the previous one joins it
                step_text[-1] += text[a:b]
            start = stop
        rollout.steps, rollout.step_text = steps, step_text
        return rollout

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
            prompts: task prompt texts (formatted with `format_prompt` here).
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
        texts = [self.format_prompt(p) + (prefixes[i] if prefixes is not None else "") for i, p in enumerate(prompts)]
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
            self.shared_prefix = _expandable_cache(prefill.past_key_values)
            if self.shared_prefix:
                return self._sample_shared(batch, prefill, n=n, temperature=temperature, top_p=top_p,
                                           max_new_tokens=max_new_tokens, greedy=greedy)
        return self._sample_hf(batch, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                               greedy=greedy, stop=stop)

    def _sample_shared(self, batch: Batch, prefill: Any, *, n: int, temperature: float, top_p: float,
                       max_new_tokens: int, greedy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Autoregressive sampling over a prefix tree: rows that share a prefix share its forward pass.

        The model runs once per distinct (prompt, tokens so far), not once per row: the n samples of a prompt start
        as one node (the prompt is prefilled once), and after each step the rows still generating are regrouped by
        (parent node, sampled token); the key/value cache keeps one row per node (`batch_select_indices` with each
        child's parent). Rows that sampled EOS leave. This is exact: rows with the same prefix have the same
        next-token distribution. Each row still draws its own token, one `torch.multinomial` draw per row from
        softmax(logits / temperature) after nucleus filtering (`top_p_filter`) - the distribution of `generate`;
        greedy takes the argmax. The behaviour log-prob is log softmax(logits / temperature) of the drawn token,
        before nucleus filtering (temperature 1 when greedy).
        """
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        P = batch.prompt_len
        cache = prefill.past_key_values  # one row per node
        logits = prefill.logits[:, -1]  # [nodes, V]: next-token logits of each node
        attention = batch.attention_mask[:, :P]  # [nodes, P + t]
        position = batch.position_ids[:, P - 1]  # [nodes]: position of each node's last token
        B, V = logits.shape
        dev = logits.device
        N = B * n
        tokens = torch.full((N, max_new_tokens), pad, dtype=torch.long, device=dev)
        logps = torch.zeros((N, max_new_tokens), dtype=torch.float32, device=dev)
        rows = torch.arange(N, device=dev)  # the rows still generating ...
        node = torch.arange(B, device=dev).repeat_interleave(n)  # ... and the node each one is at
        temp = 1.0 if greedy else temperature
        length = 0
        for t in range(max_new_tokens):
            scaled = logits.float() / temp
            logp_all = torch.log_softmax(scaled, dim=-1)
            if greedy:
                nxt = logits.argmax(dim=-1)[node]
            else:
                probs = logp_all.exp() if top_p >= 1.0 else top_p_filter(scaled, top_p).softmax(dim=-1)
                nxt = torch.multinomial(probs.index_select(0, node), num_samples=1).squeeze(1)
            tokens[rows, t] = nxt
            logps[rows, t] = logp_all[node, nxt]
            length = t + 1
            going = nxt != eos
            if t == max_new_tokens - 1 or not bool(going.any()):
                break
            rows, node, nxt = rows[going], node[going], nxt[going]
            children, node = torch.unique(node * V + nxt, return_inverse=True)  # distinct (parent, token)
            parent, token = children // V, children % V
            if parent.shape[0] != attention.shape[0] or not torch.equal(parent, torch.arange(len(parent), device=dev)):
                cache.batch_select_indices(parent)
                attention, position = attention[parent], position[parent]
            attention = torch.cat([attention, attention.new_ones((attention.shape[0], 1))], dim=1)
            position = position + 1
            out = self.model(input_ids=token[:, None], attention_mask=attention, position_ids=position[:, None],
                             past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
        return tokens[:, :length].cpu(), logps[:, :length].cpu()

    def _sample_hf(self, batch: Batch, *, n: int, temperature: float, top_p: float, max_new_tokens: int,
                   greedy: bool, stop: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `generate` with the behaviour log-probs recorded by a logits processor (any model)."""
        tok = self.tokenizer
        P = batch.prompt_len
        recorder = _BehaviourLogprobs(1.0 if greedy else temperature)
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else temperature,
            top_p=None if greedy or top_p >= 1.0 else top_p,
            top_k=0,  # no top-k (None would mean transformers' default of 50)
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
            return_dict_in_generate=True,
            stop_strings=[stop] if stop is not None else None,
        )
        out = self.model.generate(
            input_ids=batch.input_ids[:, :P],
            attention_mask=batch.attention_mask[:, :P],
            generation_config=config,
            logits_processor=LogitsProcessorList([recorder]),
            tokenizer=tok if stop is not None else None,
        )
        return out.sequences[:, P:].cpu(), recorder.finish(out.sequences).cpu()

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
            seq_first, seq_of_row = _group_rows(torch.cat([batch.input_ids, batch.attention_mask], dim=1))
            rows = batch if len(seq_first) == N else batch.select(seq_first)
            first, prompt_of_seq = _group_rows(torch.cat([rows.input_ids[:, :P], rows.attention_mask[:, :P]], dim=1))
            if 2 * len(first) <= N:
                logits = self._shared_prefix_logits(rows, first, prompt_of_seq)
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

    def _shared_prefix_logits(self, batch: Batch, first: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor | None:
        """`completion_logits` with each distinct prompt run once: `first` [U] is a row of each prompt, `inverse`
        [N] the prompt of each row (numbered by first appearance). None when the model's cache cannot be repeated."""
        P, T = batch.prompt_len, batch.completion_ids.shape[1]
        N, U = inverse.shape[0], first.shape[0]
        dev = inverse.device
        head = self.model(input_ids=batch.input_ids[first, :P], attention_mask=batch.attention_mask[first, :P],
                          position_ids=batch.position_ids[first, :P], use_cache=True, logits_to_keep=1)
        cache = head.past_key_values
        self.shared_prefix = _expandable_cache(cache)
        if not self.shared_prefix:
            return None
        ids, attention, position = batch.input_ids, batch.attention_mask, batch.position_ids
        G = N // U
        perm = torch.argsort(inverse, stable=True)  # rows grouped by prompt
        grouped = G * U == N and torch.equal(inverse[perm], torch.arange(U, device=dev).repeat_interleave(G))
        unsort = None
        if grouped:
            # G rows per prompt (a GRPO batch, in any row order): work on the rows sorted by prompt and repeat the
            # prompt's cache by broadcasting, whose backward is a sum; the logits go back to the batch's row order
            if not torch.equal(perm, torch.arange(N, device=dev)):
                ids, attention, position = (x.index_select(0, perm) for x in (ids, attention, position))
                unsort = torch.argsort(perm)

            def spread(x: torch.Tensor) -> torch.Tensor:
                return x.unsqueeze(1).expand(U, G, *x.shape[1:]).reshape(N, *x.shape[1:])
        else:
            # unequal groups: index_select, whose backward (index_add) is faster on CPU than the accumulating
            # index_put of x[inverse]
            def spread(x: torch.Tensor) -> torch.Tensor:
                return x.index_select(0, inverse)

        logits = spread(head.logits[:, -1:])  # position P-1 predicts completion token 0
        if T > 1:
            for layer in cache.layers:
                layer.keys, layer.values = spread(layer.keys), spread(layer.values)
            tail = self.model(input_ids=ids[:, P : P + T - 1], attention_mask=attention[:, : P + T - 1],
                              position_ids=position[:, P : P + T - 1], past_key_values=cache, use_cache=True)
            logits = torch.cat([logits, tail.logits], dim=1)
        return logits if unsort is None else logits.index_select(0, unsort)


def _group_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct rows of `x` [N, K], numbered by first appearance: (first [U] int64, the first row index of each;
    inverse [N] int64, the number of each row's distinct value)."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    N = x.shape[0]
    U = int(inverse.max()) + 1 if N else 0
    first = torch.full((U,), N, dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, inverse, torch.arange(N, device=x.device), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(U, device=x.device)
    return first[order], rank[inverse]


def rollout_batch(policy: Policy, rollouts: Sequence[Rollout]) -> tuple[Batch, torch.Tensor]:
    """Pack rollouts into a `Batch` and their behaviour log-probs into [N, T] float32 (0 past each end)."""
    batch = policy.collate([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts])
    T = batch.mask.shape[1]
    old = torch.tensor([list(r.logprobs) + [0.0] * (T - len(r.logprobs)) for r in rollouts], dtype=torch.float32)
    return batch, old.view(len(rollouts), T).to(batch.mask.device)
