"""Renderers: how an episode's messages become token ids, without ever re-tokenizing what a row already holds.

A *row* is one sequence the policy conditions on: a prompt, then model turns and environment turns interleaved. The
episode loop (`rewardlab.envs.episode`) keeps a row's ids and appends to them; a renderer says what to append:

- `RawRenderer` (prompt format "raw", e.g. the embedded character-level model): the row is plain concatenated text.
  An observation's ids are its raw text tokenized alone, so a raw row never needs a new row.
- `ChatRenderer` (prompt format "chat"): the row is the chat template's rendering of the conversation. An
  observation's ids are the template's rendering of the new messages only: the difference between the rendering of
  the conversation with them (and the next generation prompt) and the text the row already decodes to. The prefix
  property is checked on that text; when the template rewrote earlier text (e.g. it strips `<think>` blocks from
  earlier assistant turns) there is no such difference, `extend` says so (None), and the caller starts a new row.

`clip` cuts a tool's output to a token budget of the renderer's tokenizer, the truncation marker included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

#: Appended (keep="start") or prepended (keep="end") to a clipped tool output. Plain ASCII, so the embedded
#: character-level tokenizer (printable ASCII only) encodes it: 14 of its tokens.
DEFAULT_MARKER = "...[truncated]"

#: Prompt formats `make_renderer` accepts ("auto": chat when the tokenizer has a chat template, as `Policy` does).
RENDER_FORMATS = ("auto", "raw", "chat")

KEEP = ("start", "end")


@runtime_checkable
class Renderer(Protocol):
    """How messages become token ids for one tokenizer and prompt format (`make_renderer` builds one).

    Messages are chat messages: dicts with "role" ("system", "user", "assistant", "tool", ...) and a str "content"
    (tool messages may carry "name"). An assistant message's content is the raw text the model sampled (see
    `turn_text`).
    """

    def start(self, messages: list[dict]) -> list[int]:
        """Prompt ids of a row whose history is `messages` (ending with the message the model answers), the
        generation prompt included. These equal what the single-turn path (`Policy.format_prompt` then
        `Policy.encode_prompt`) feeds the model for a row with the same messages (and no tools)."""
        ...

    def turn_text(self, ids: list[int]) -> str:
        """The raw text of a model turn's sampled ids, special tokens removed (the assistant message content)."""
        ...

    def extend(self, row_ids: list[int], history: list[dict], new: list[dict]) -> list[int] | None:
        """The ids to append to a row whose ids so far (prompt included) are `row_ids` and which renders `history`
        (its last message is the model's latest turn), for the observation messages `new` and the next
        generation prompt; None when they cannot be appended (the caller then starts a new row with
        `start(history + new)`)."""
        ...

    def clip(self, text: str, max_tokens: int, keep: str = "start") -> str:
        """A tool output cut to at most `max_tokens` tokens of this tokenizer, the truncation marker included;
        unchanged when it fits."""
        ...


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` alone: no special tokens added (BOS, EOS), whatever the tokenizer's post-processor does."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class _Base:
    """What both renderers share: the tokenizer, the truncation marker and `clip`."""

    def __init__(self, tokenizer: Any, *, marker: str = DEFAULT_MARKER) -> None:
        if not isinstance(marker, str):
            raise ValueError(f"marker: expected a str, got {type(marker).__name__}")
        self.tokenizer = tokenizer
        self.marker = marker
        #: Tokens the marker takes: the smallest `max_tokens` that `clip` accepts.
        self.marker_tokens = len(_encode(tokenizer, marker))
        self._token_chars: int | None = None  # `token_chars`, computed on first use

    @property
    def token_chars(self) -> int:
        """The most characters one token of this tokenizer stands for: the length of its longest vocabulary entry
        (`tokenizer.get_vocab()`, added tokens included), as the vocabulary spells it. A vocabulary spells a token
        with at least as many characters as the text it stands for (byte-level BPE one character per byte,
        SentencePiece a space as one "▁", WordPiece a "##" more), so `clip` can cut an output to
        `clip_chars(max_tokens)` characters before tokenizing it. 0 when the tokenizer has no `get_vocab` (then
        `clip` tokenizes the whole output)."""
        if self._token_chars is None:
            get_vocab = getattr(self.tokenizer, "get_vocab", None)
            vocab = get_vocab() if callable(get_vocab) else None
            self._token_chars = max((len(t) for t in vocab), default=0) if vocab else 0
        return self._token_chars

    def clip_chars(self, max_tokens: int) -> int | None:
        """The characters of a tool output that `clip(text, max_tokens)` tokenizes: 2 * (max_tokens + 1) *
        `token_chars`, or None (all of them) when `token_chars` is unknown.

        Why it is enough: each token stands for at most `token_chars` characters, so (max_tokens + 1) *
        token_chars characters take more than max_tokens tokens. Text longer than the bound does not fit, and its
        first (keep="start") or last (keep="end") bound characters hold every token `clip` keeps, with as many
        again as a margin before the cut (where a token of the cut text may differ from the whole text's). The
        bound assumes the tokenizer keeps every character in some token: one whose pre-tokenizer or normalizer
        drops characters (BERT's WordPiece drops whitespace) can take more characters per token, and there an
        output longer than the bound is clipped even if its tokens would have fit (still within the budget).
        """
        return 2 * (max_tokens + 1) * self.token_chars if self.token_chars else None

    def turn_text(self, ids: list[int]) -> str:
        """The raw text of a model turn's sampled ids (`list[int]`), special tokens (e.g. a final EOS) removed and
        no clean-up of spaces: the assistant message content, and the text a tool-call parser reads."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def clip(self, text: str, max_tokens: int, keep: str = "start") -> str:
        """A tool output cut to at most `max_tokens` tokens of this tokenizer, the truncation marker included.

        Counts tokens of `text` encoded alone without special tokens (`tokenizer(text, add_special_tokens=False)`),
        never characters. Text that fits (`<= max_tokens` tokens, an exact fit included) is returned unchanged, the
        empty text too. Only the first (keep="start") or last (keep="end") `clip_chars(max_tokens)` characters are
        tokenized (a bound in characters that holds more than max_tokens tokens; see `clip_chars`), so the time
        and memory of a clip do not grow with the output: a 10 MB output costs what a few hundred characters do.
        Otherwise the result is a prefix of `text` followed by the marker (keep="start") or the marker followed by
        a suffix of `text` (keep="end"), with as many whole tokens of `text` as fit: the cut falls on a token
        boundary (a character boundary when a token holds part of a character), and the result, encoded alone,
        takes at most `max_tokens` tokens. (Inside a chat template the same text may take a token more or
        less, since tokenization at its edges depends on the neighbouring text.)

        Args:
            text: the tool output.
            max_tokens: the budget in tokens (int >= 0), the marker included.
            keep: "start" keeps the beginning of `text`, "end" its end.
        Raises:
            ValueError: `keep` not "start" or "end"; `max_tokens` not an int >= `marker_tokens` (the marker's own
                tokens: a budget that cannot hold the marker is refused whatever `text` is, so a bad budget fails
                on the first call, not on the first long output).
        """
        if keep not in KEEP:
            raise ValueError(f"keep: expected one of {KEEP}, got {keep!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < self.marker_tokens:
            raise ValueError(f"max_tool_tokens: must be an int >= {self.marker_tokens} (the truncation marker "
                             f"{self.marker!r} takes {self.marker_tokens} tokens), got {max_tokens!r}")
        if not text:
            return text
        limit = self.clip_chars(max_tokens)
        cut = limit is not None and len(text) > limit  # then it does not fit (see clip_chars)
        if cut:
            text = text[:limit] if keep == "start" else text[len(text) - limit :]
        fast = bool(getattr(self.tokenizer, "is_fast", False))
        enc = self.tokenizer(text, add_special_tokens=False, **({"return_offsets_mapping": True} if fast else {}))
        ids = list(enc["input_ids"])
        if len(ids) <= max_tokens and not cut:
            return text
        offsets = enc.get("offset_mapping") if fast else None
        if offsets is not None and len(offsets) != len(ids):
            offsets = None
        n = min(max_tokens - self.marker_tokens, len(ids))
        while True:
            out = self._cut(text, ids, offsets, n, keep)
            if n <= 0 or len(_encode(self.tokenizer, out)) <= max_tokens:
                return out
            n -= 1

    def _cut(self, text: str, ids: list[int], offsets: list[tuple[int, int]] | None, n: int, keep: str) -> str:
        """`text`'s first (keep="start") or last n tokens' text with the marker, cut on a character boundary: at the
        character offsets of a fast tokenizer, else where the decoded kept ids are a true prefix (suffix) of
        `text` (fewer ids until they are)."""
        while n > 0:
            if offsets is not None:
                if keep == "start":
                    piece = text[: offsets[n][0]] if n < len(ids) else text
                else:
                    piece = text[offsets[len(ids) - n][0] :]
                break
            piece = self.tokenizer.decode(ids[:n] if keep == "start" else ids[-n:], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
            if text.startswith(piece) if keep == "start" else text.endswith(piece):
                break
            n -= 1
        else:
            return self.marker
        return piece + self.marker if keep == "start" else self.marker + piece


class RawRenderer(_Base):
    """Plain-text rows (prompt format "raw", e.g. the embedded character-level model).

    A message renders as its content verbatim, except a "tool" message, which renders as `raw_text(message)`
    (default: its content; the compact tool form renders `<o>{content}</o>`). A row is BOS + the rendered prompt
    messages, then sampled turns and rendered observations, each tokenized alone: nothing is ever re-tokenized, so
    `extend` never returns None. Tool schemas are not rendered in a raw row (there is no template to put them in):
    an environment for raw models describes its tools in the task prompt.

    Args:
        tokenizer: a Hugging Face tokenizer.
        raw_text: how a tool message (dict) becomes raw text; default its "content".
        marker: the truncation marker of `clip`.
    """

    def __init__(self, tokenizer: Any, *, raw_text: Callable[[dict], str] | None = None,
                 marker: str = DEFAULT_MARKER) -> None:
        super().__init__(tokenizer, marker=marker)
        self.raw_text = raw_text

    def text(self, messages: list[dict]) -> str:
        """The raw text of `messages`, concatenated with no separator (an environment puts its own newlines in).

        Raises:
            ValueError: a message that is not a dict with a str "content" (or whose `raw_text` is not a str),
                naming its index.
        """
        parts = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}]: expected a dict with a str 'content', got {m!r:.80}")
            part = self.raw_text(m) if m.get("role") == "tool" and self.raw_text is not None else m["content"]
            if not isinstance(part, str):
                raise ValueError(f"messages[{i}]: raw_text returned {type(part).__name__}, expected str")
            parts.append(part)
        return "".join(parts)

    def start(self, messages: list[dict]) -> list[int]:
        """`tokenizer(text(messages))` with the tokenizer's special tokens (BOS): exactly `Policy.encode_prompt` of
        the raw prompt, so a one-message row's prompt ids are the single-turn path's.

        Raises:
            ValueError: see `text`.
        """
        return list(self.tokenizer(self.text(messages), add_special_tokens=True)["input_ids"])

    def extend(self, row_ids: list[int], history: list[dict], new: list[dict]) -> list[int]:
        """`tokenizer(text(new), add_special_tokens=False)`: the new messages' raw text alone (`row_ids` and
        `history` are not read); [] for empty text. Never None.

        Raises:
            ValueError: see `text`.
        """
        return _encode(self.tokenizer, self.text(new))


class ChatRenderer(_Base):
    """Chat-template rows (prompt format "chat"): the template renders the conversation, tools included.

    `extend` finds the ids of the new messages by the text prefix property: with
    D = decode(row_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) (what the row holds) and
    W = apply_chat_template(history + new, tools=tools, add_generation_prompt=True, tokenize=False) (what the
    template would render now), when W starts with D the ids to append are tokenizer(W[len(D):],
    add_special_tokens=False); otherwise None (the template is not append-only here; the caller starts a new row
    with `start(history + new)`, whose ids render W). The ids of the row so far are never re-tokenized.

    What follows from that, with no template treated specially:
    - A turn that ended at a stop string (e.g. "</tool_call>"): the template's closing of the assistant turn
      (`<|im_end|>\\n` in ChatML) is part of W[len(D):], so it is appended with the observation and gets loss mask 0.
    - A turn that ended with EOS: `turn_text` drops the EOS from the content, D ends with the EOS's text; when that
      text is the template's end-of-turn (e.g. `<|im_end|>` for Qwen), W continues D and only what follows it is
      appended. When the EOS is another token (e.g. `<|endoftext|>` where the template closes with `<|im_end|>`),
      the row holds text the template would not render, and `extend` returns None: a new row.
    - A template that renders an assistant message otherwise than generation prompt + raw content (it trims the
      content, moves a `<think>` block, adds an empty reasoning block, drops the reasoning of earlier turns,
      ...) makes W differ from D, and `extend` returns None. Special tokens the model sampled inside a turn are
      not in its content (see `turn_text`), so they too lead to None.
    - After tokenizing W[len(D):], `extend` checks that decode(row_ids + ids) == W (tokenizers whose decoding
      of a sequence is not the concatenation of its parts, e.g. ones that strip a leading space, would break it)
      and returns None if not. So whenever `extend` returns ids, the row renders exactly the conversation.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tools: JSON schemas of the tools, given to every `apply_chat_template` call (None: no tools).
        marker: the truncation marker of `clip`.
    Raises:
        ValueError: the tokenizer has no chat template.
    """

    def __init__(self, tokenizer: Any, *, tools: list[dict] | None = None, marker: str = DEFAULT_MARKER) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("model.prompt_format: 'chat' but the tokenizer has no chat template")
        super().__init__(tokenizer, marker=marker)
        self.tools = tools

    def render(self, messages: list[dict]) -> str:
        """The chat template's text of `messages` with the tools and the generation prompt.

        Raises:
            ValueError: one line when the template refuses the conversation (e.g. roles that must alternate).
        """
        try:
            return self.tokenizer.apply_chat_template([dict(m) for m in messages], tools=self.tools,
                                                      add_generation_prompt=True, tokenize=False)
        except Exception as e:  # jinja2's TemplateError and the template's raise_exception, both user-facing
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"chat template: cannot render the conversation ({first})") from e

    def start(self, messages: list[dict]) -> list[int]:
        """tokenizer(render(messages), add_special_tokens=False): exactly `Policy.format_prompt` then
        `Policy.encode_prompt` of a chat row with these messages (when there are no tools).

        Raises:
            ValueError: see `render`.
        """
        return _encode(self.tokenizer, self.render(messages))

    def extend(self, row_ids: list[int], history: list[dict], new: list[dict]) -> list[int] | None:
        """The ids of W[len(D):] (see the class docstring), or None when W does not start with D or those ids do not
        decode back to W after the row's ids.

        Raises:
            ValueError: see `render`.
        """
        done = self._decode(row_ids)
        whole = self.render(list(history) + list(new))
        if not whole.startswith(done):
            return None
        ids = _encode(self.tokenizer, whole[len(done) :])
        if self._decode(list(row_ids) + ids) != whole:
            return None
        return ids

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def make_renderer(tokenizer: Any, prompt_format: str, *, tools: list[dict] | None = None,
                  raw_text: Callable[[dict], str] | None = None, marker: str = DEFAULT_MARKER) -> Renderer:
    """The renderer of a tokenizer and prompt format (pass a policy's `tokenizer` and `prompt_format`).

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompt_format: "raw", "chat", or "auto" (chat when the tokenizer has a chat template, as `Policy` resolves
            it).
        tools: the environment's tool JSON schemas; rendered by the chat template (a raw row has no place for
            them: a raw environment describes its tools in its prompt).
        raw_text: how a raw row renders a tool message (the environment's `raw_text`); a chat row renders tool
            messages through the template.
        marker: the truncation marker of `clip` (default "...[truncated]").
    Raises:
        ValueError: an unknown prompt format (listing the valid ones); "chat" for a tokenizer without a chat
            template; a marker that is not a str.
    """
    if prompt_format not in RENDER_FORMATS:
        raise ValueError(f"model.prompt_format: expected one of {RENDER_FORMATS}, got {prompt_format!r}")
    if prompt_format == "auto":
        prompt_format = "chat" if getattr(tokenizer, "chat_template", None) else "raw"
    if prompt_format == "chat":
        return ChatRenderer(tokenizer, tools=tools, marker=marker)
    return RawRenderer(tokenizer, raw_text=raw_text, marker=marker)
