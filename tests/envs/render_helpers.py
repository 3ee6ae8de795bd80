"""Helpers of the renderer tests: a character-level HF tokenizer with a chat template, built offline, and an episode
player that drives a renderer the way the episode loop does and checks the token-exactness contract at each turn."""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

#: Printable ASCII, newline and tab: the characters of every hand-written template and conversation here.
ASCII = tuple(chr(i) for i in range(32, 127)) + ("\n", "\t")

#: ChatML, append-only: every message renders as `<|im_start|>role\ncontent<|im_end|>\n`, content verbatim.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: ChatML that drops the reasoning of assistant turns before the last user message (what Qwen3-style templates do):
#: the text up to and including the last `</think>` is removed. Not append-only once a user message follows a turn
#: that reasoned.
THINK_STRIP = (
    "{% set ns = namespace(last=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% set c = m.content %}"
    "{% if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ c }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: ChatML whose consecutive tool messages share one block, joined by a separator (as Qwen2.5 wraps tool responses):
#: the block opens at the first tool message of a run and closes after the last one.
TOOL_SEP = "\n---\n"
TOOL_JOIN = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>tool\n"
    "{% else %}{{ '\\n---\\n' }}{% endif %}"  # an expression: a newline right after a block tag is trimmed
    "{{ m.content }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(template: str | None = None, *, specials: tuple[str, ...] = ("<|im_start|>",),
                   eos: str | None = "<|im_end|>", chars: str = "") -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII, newline, tab, and the characters of `chars`), plus `specials` and
    `eos` as special tokens (one id each); decoding is exact concatenation. `template` becomes its chat template."""
    alphabet = list(dict.fromkeys(ASCII + tuple(chars)))
    vocab = {tok: i for i, tok in enumerate(["<|unk|>"] + alphabet)}  # no "|" in model text
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<|unk|>", clean_up_tokenization_spaces=False)
    extra = {"additional_special_tokens": [s for s in specials if s != eos]}
    if eos is not None:
        extra["eos_token"] = eos
    out.add_special_tokens(extra)
    if template is not None:
        out.chat_template = template
    return out


def decode(tok, ids: list[int]) -> str:
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def render(tok, messages: list[dict], tools=None) -> str:
    """The template's text of `messages` with the generation prompt, straight from transformers."""
    return tok.apply_chat_template([dict(m) for m in messages], tools=tools, add_generation_prompt=True,
                                   tokenize=False)


def play(renderer, tok, prompt: list[dict], turns: list[tuple[str, bool, list[dict]]], tools=None) -> list[dict]:
    """Run an episode through `renderer` as the episode loop does, checking the contract at every step.

    Each turn is (the model's raw text, whether it ended with EOS, the observation messages that follow). The model
    "samples" the ids of its raw text (and the EOS id). At each turn: the row's ids are only ever appended to; when
    `extend` gives ids, the row then decodes to exactly the template's rendering W of the whole conversation; it
    gives None exactly when W does not continue the row's text, and then the new row's `start` decodes to W.
    Returns one record per turn: {"appended": decoded ids or None, "rows": rows so far}.
    """
    history = [dict(m) for m in prompt]
    row = renderer.start(history)
    assert decode(tok, row) == render(tok, history, tools)
    rows, log = 1, []
    for raw, eos, new in turns:
        sampled = tok(raw, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
        row = row + sampled
        content = renderer.turn_text(sampled)
        assert content == raw  # the raw sampled text, the EOS removed
        history.append({"role": "assistant", "content": content})
        done, whole = decode(tok, row), render(tok, history + new, tools)
        before = list(row)
        ids = renderer.extend(row, history, new)
        assert row == before  # extend never touches the row
        if ids is None:
            assert not whole.startswith(done), "extend gave None on an append-only step"
            row = renderer.start(history + new)
            rows += 1
        else:
            assert whole.startswith(done), "extend gave ids where the template rewrote the row's text"
            row = row + ids
        assert decode(tok, row) == whole
        history.extend(dict(m) for m in new)
        log.append({"appended": None if ids is None else decode(tok, ids), "rows": rows})
    return log


#: Pieces of model text: tool calls, reasoning blocks, JSON, whitespace, and short random ASCII.
PIECES = ("<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "calc", "arguments": {"expression": '
          '"12*34"}}', "\n", "\n\n", " ", "The answer is 408.", "calc", "{", "}")
RANDOM_CHARS = string.ascii_letters + string.digits + " \n.,:;!?'\"()[]{}+-*/=<>_"
