"""Renderers (`rewardlab.envs.render`): the first row's prompt ids are the single-turn path's, raw and chat `extend`
append only the new messages' ids (template tokens after a stop string included), `extend` refuses (None) whenever
the row would not render the conversation exactly, and `clip` cuts in tokens with the marker inside the budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from render_helpers import CHATML, THINK_STRIP, TOOL_JOIN, TOOL_SEP, char_tokenizer, decode, render
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rewardlab.envs import ChatRenderer, RawRenderer, Renderer, make_renderer
from rewardlab.envs.render import DEFAULT_MARKER
from rewardlab.policy.hf import Policy
from rewardlab.policy.tiny import build_tokenizer

USER = {"role": "user", "content": "What is 12*34?"}


def compact(message: dict) -> str:
    return f"<o>{message['content']}</o>"


# ---------------------------------------------------------------------------------------------------- first row
def test_raw_first_row_is_the_single_turn_prompt():
    tok = build_tokenizer()
    text = "Q: 12+34=?\nA:"
    policy = Policy(None, tok, "raw")
    ids = make_renderer(tok, "raw").start([{"role": "user", "content": text}])
    assert ids == policy.encode_prompt(policy.format_prompt(text))
    assert ids[0] == tok.bos_token_id == 1 and len(ids) == len(text) + 1  # BOS + one id per character
    assert tok.decode(ids[1:]) == text


@pytest.mark.parametrize("system", [False, True])
def test_chat_first_row_is_the_single_turn_prompt(system):
    tok = char_tokenizer(CHATML)
    messages = ([{"role": "system", "content": "Be brief."}] if system else []) + [USER]
    policy = Policy(None, tok, "chat")
    ids = make_renderer(tok, "chat").start(messages)
    assert ids == policy.encode_prompt(policy.format_prompt(USER["content"], messages if system else None))
    head = "<|im_start|>system\nBe brief.<|im_end|>\n" if system else ""
    assert decode(tok, ids) == head + "<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # one special id, no BOS added


def test_make_renderer_resolves_and_refuses():
    tiny, chat = build_tokenizer(), char_tokenizer(CHATML)
    assert isinstance(make_renderer(tiny, "auto"), RawRenderer)
    assert isinstance(make_renderer(chat, "auto"), ChatRenderer)
    assert isinstance(make_renderer(chat, "raw"), RawRenderer)
    assert isinstance(make_renderer(chat, "chat"), Renderer)
    with pytest.raises(ValueError, match=r"model.prompt_format: expected one of \('auto', 'raw', 'chat'\), got 'xml'"):
        make_renderer(tiny, "xml")
    with pytest.raises(ValueError, match="'chat' but the tokenizer has no chat template"):
        make_renderer(tiny, "chat")


# ---------------------------------------------------------------------------------------------------- raw
def test_raw_extend_appends_the_new_messages_text_only():
    tok = build_tokenizer()
    r = make_renderer(tok, "raw", raw_text=compact)
    row = r.start([{"role": "user", "content": "12*34="}]) + tok("<c>12*34</c>", add_special_tokens=False)["input_ids"]
    new = [{"role": "tool", "name": "calc", "content": "408"}, {"role": "user", "content": "\nA:"}]
    ids = r.extend(row, [], new)
    assert tok.decode(ids) == "<o>408</o>\nA:"  # tool via raw_text, user verbatim, no BOS, no separator
    assert len(ids) == len("<o>408</o>\nA:") and tok.bos_token_id not in ids
    assert r.extend(row, [], [{"role": "tool", "content": ""}]) == tok("<o></o>", add_special_tokens=False)["input_ids"]
    assert make_renderer(tok, "raw").extend(row, [], [{"role": "tool", "content": ""}]) == []  # default: content
    assert r.turn_text(tok("<c>1+1</c>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]) == "<c>1+1</c>"


def test_raw_refuses_a_message_without_str_content():
    r = make_renderer(build_tokenizer(), "raw")
    with pytest.raises(ValueError, match=r"messages\[1\]: expected a dict with a str 'content'"):
        r.extend([1], [], [{"role": "user", "content": "a"}, {"role": "tool", "content": None}])
    with pytest.raises(ValueError, match=r"messages\[0\]: raw_text returned int"):
        RawRenderer(build_tokenizer(), raw_text=lambda m: 3).start([{"role": "tool", "content": "x"}])


# ---------------------------------------------------------------------------------------------------- chat
def _turn(tok, r, row, history, text, eos):
    sampled = tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
    history.append({"role": "assistant", "content": r.turn_text(sampled)})
    return row + sampled


def test_chat_extend_after_a_stop_string_appends_the_turn_closing():
    tok = char_tokenizer(CHATML)
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, '<tool_call>{"name": "calc"}</tool_call>', eos=False)
    new = [{"role": "tool", "name": "calc", "content": "408"}]
    ids = r.extend(row, history, new)
    # the template closes the assistant turn after the stop string: those tokens are appended, not sampled
    assert decode(tok, ids) == "<|im_end|>\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    assert decode(tok, row + ids) == render(tok, history + new)


def test_chat_extend_after_eos_does_not_repeat_the_end_of_turn():
    tok = char_tokenizer(CHATML)  # EOS is <|im_end|>, the template's end of turn
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "408", eos=True)
    assert history[-1]["content"] == "408" and row[-1] == tok.eos_token_id
    new = [{"role": "user", "content": "Sure?"}]
    ids = r.extend(row, history, new)
    assert decode(tok, ids) == "\n<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n"
    assert decode(tok, row + ids) == render(tok, history + new)


def test_chat_extend_after_a_foreign_eos_needs_a_new_row():
    # the model's EOS is <|endoftext|> but the template closes turns with <|im_end|>: the row holds text the
    # template never renders, so nothing can be appended to it
    tok = char_tokenizer(CHATML, specials=("<|im_start|>", "<|im_end|>"), eos="<|endoftext|>")
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "408", eos=True)
    new = [{"role": "user", "content": "Sure?"}]
    assert r.extend(row, history, new) is None
    assert decode(tok, r.start(history + new)) == render(tok, history + new)
    assert "<|endoftext|>" not in decode(tok, r.start(history + new))


def test_chat_extend_when_the_template_trims_the_turn():
    tok = char_tokenizer(CHATML.replace("{{ m.content }}", "{{ m.content | trim }}"))
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "408 \n", eos=False)
    assert r.extend(row, history, [{"role": "user", "content": "ok"}]) is None  # rendered "408", sampled "408 \n"
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "408", eos=False)
    assert decode(tok, r.extend(row, history, [{"role": "user", "content": "ok"}])).startswith("<|im_end|>\n")


def test_chat_think_strip_template_starts_a_new_row_with_the_stripped_history():
    tok = char_tokenizer(THINK_STRIP)
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "<think>12*34=408</think>guess 408", eos=True)
    tool = [{"role": "tool", "content": "ok"}]
    ids = r.extend(row, history, tool)  # no user message yet: the reasoning stays, append-only
    assert decode(tok, ids) == "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"
    history += tool
    row = _turn(tok, r, row + ids, history, "<think>sure</think>408", eos=True)
    user = [{"role": "user", "content": "higher"}]
    assert r.extend(row, history, user) is None  # both earlier turns lose their reasoning
    assert decode(tok, r.start(history + user)) == (
        "<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\nguess 408<|im_end|>\n"
        "<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n408<|im_end|>\n"
        "<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n")


def test_chat_tool_join_template_joins_within_a_turn_only():
    tok = char_tokenizer(TOOL_JOIN)
    r = make_renderer(tok, "chat")
    history = [USER]
    row = _turn(tok, r, r.start(history), history, "<tool_call>a</tool_call><tool_call>b</tool_call>", eos=False)
    two = [{"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}]
    ids = r.extend(row, history, two)
    assert decode(tok, ids) == f"<|im_end|>\n<|im_start|>tool\nA{TOOL_SEP}B<|im_end|>\n<|im_start|>assistant\n"
    history += two
    row = _turn(tok, r, row + ids, history, "<tool_call>c</tool_call>", eos=False)
    # a later turn's tool message follows an assistant turn, so it opens its own block: still append-only
    ids = r.extend(row, history, [{"role": "tool", "content": "C"}])
    assert decode(tok, ids) == "<|im_end|>\n<|im_start|>tool\nC<|im_end|>\n<|im_start|>assistant\n"
    # were a tool message appended right after another one (no model turn between), the first block's closing
    # would become a separator: the template rewrote the row, and extend says so
    ended = history + [{"role": "tool", "content": "C"}]
    row2 = r.start(ended)
    assert r.extend(row2, ended, [{"role": "tool", "content": "D"}]) is None


class _SpacePrefixTokenizer:
    """A chat tokenizer whose encoding of any text starts with a space token, which decoding drops at the start of a
    sequence only (as SentencePiece tokenizers that prepend a word-boundary space do): the ids of a text's tail,
    encoded alone, decode to an extra space after other ids."""

    chat_template = "x"
    is_fast = False

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(" ")] + [ord(c) for c in text] if text else []}

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        text = "".join(map(chr, ids))
        return text[1:] if text.startswith(" ") else text

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        return "".join(f"[{m['role']}]{m['content']}" for m in messages) + ("[assistant]" if add_generation_prompt
                                                                           else "")


def test_chat_extend_refuses_ids_that_do_not_decode_back():
    tok = _SpacePrefixTokenizer()
    r = make_renderer(tok, "chat")
    history = [USER]
    row = r.start(history) + [ord(c) for c in "408"]
    history.append({"role": "assistant", "content": "408"})
    assert r.render(history + [USER]).startswith(decode(tok, row))  # the text prefix holds ...
    assert r.extend(row, history, [USER]) is None  # ... but its ids would decode to an extra space


def test_chat_template_errors_are_one_line_value_errors():
    tok = char_tokenizer("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    with pytest.raises(ValueError, match=r"^chat template: cannot render the conversation \(Conversation roles"):
        make_renderer(tok, "chat").start([USER])


def test_chat_tools_reach_the_template():
    tok = char_tokenizer("{% for t in tools %}[{{ t.function.name }}]{% endfor %}" + CHATML)
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    r = make_renderer(tok, "chat", tools=tools)
    assert decode(tok, r.start([USER])).startswith("[calc]<|im_start|>user\n")
    history = [USER, {"role": "assistant", "content": "x"}]
    ids = r.extend(r.start([USER]) + tok("x", add_special_tokens=False)["input_ids"], history, [USER])
    assert "[calc]" not in decode(tok, ids)  # the tools section is the row's, never appended again


# ---------------------------------------------------------------------------------------------------- clip
def test_clip_exact_fit_one_more_and_keep():
    r = make_renderer(build_tokenizer(), "raw")  # one token per character
    assert DEFAULT_MARKER == "...[truncated]" and r.marker_tokens == 14
    text = "abcdefghijklmnopqrst"  # 20 tokens
    assert r.clip(text, 20) == text  # an exact fit is kept whole
    assert r.clip(text + "u", 20) == "abcdef...[truncated]"  # one token more: 6 kept + 14 of marker = 20
    assert r.clip(text + "u", 20, keep="end") == "...[truncated]pqrstu"
    assert r.clip("", 14) == "" and r.clip("", 20, keep="end") == ""
    assert r.clip(text + "u", 14) == "...[truncated]"  # a budget of exactly the marker keeps no text


def test_clip_refuses_a_budget_below_the_marker_and_a_bad_keep():
    r = make_renderer(build_tokenizer(), "raw")
    with pytest.raises(ValueError, match=r"max_tool_tokens: must be an int >= 14 .* got 13"):
        r.clip("short", 13)  # refused even when the text would fit: a bad budget fails on the first call
    with pytest.raises(ValueError, match=r"keep: expected one of \('start', 'end'\), got 'middle'"):
        r.clip("short", 20, keep="middle")
    small = make_renderer(build_tokenizer(), "raw", marker="~")
    assert small.clip("abcdef", 3) == "ab~" and small.clip("abcdef", 1) == "~"


def _word_tokenizer() -> PreTrainedTokenizerFast:
    words = ["[UNK]", "[cut]"] + [f"w{i}" for i in range(10)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_clip_counts_tokens_not_characters():
    r = make_renderer(_word_tokenizer(), "raw", marker="[cut]")
    text = " ".join(f"w{i}" for i in range(10))  # 10 tokens, 29 characters
    assert r.marker_tokens == 1
    assert r.clip(text, 10) == text
    assert r.clip(text, 4) == "w0 w1 w2 [cut]"  # 3 words + the marker: 4 tokens
    assert r.clip(text, 4, keep="end") == "[cut]w7 w8 w9"


def _byte_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained here on a few lines (multi-byte characters split across tokens)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the tool returned 408 and 12*34", "naïve café 日本語 – résumé", "error: division by zero"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel
                                                        .alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


BPE = _byte_bpe()


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("the tool 408 café 日本語 –éï\n*")), max_size=40),
       budget=st.integers(14, 40), keep=st.sampled_from(["start", "end"]))
def test_clip_property_on_byte_level_bpe(text, budget, keep):
    r = make_renderer(BPE, "raw")
    count = lambda s: len(BPE(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    out = r.clip(text, budget, keep=keep)
    assert count(out) <= budget
    if count(text) <= budget:
        assert out == text
    elif keep == "start":
        assert out.endswith(DEFAULT_MARKER) and text.startswith(out[: -len(DEFAULT_MARKER)])
    else:
        assert out.startswith(DEFAULT_MARKER) and text.endswith(out[len(DEFAULT_MARKER) :])


def test_chat_extend_keeps_the_sampled_ids_of_a_subword_tokenizer():
    # a byte-level BPE merges "408" into fewer tokens than the model sampled (one per character): the row keeps the
    # sampled ids, and only the new text is tokenized, so the row still decodes to the template's rendering
    tok = _byte_bpe()
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = CHATML
    r = make_renderer(tok, "chat")
    history = [USER]
    sampled = [i for c in "408" for i in tok(c, add_special_tokens=False)["input_ids"]]
    assert sampled != tok("408", add_special_tokens=False)["input_ids"]  # not the canonical tokenization
    row = r.start(history) + sampled
    history.append({"role": "assistant", "content": r.turn_text(sampled)})
    new = [{"role": "tool", "content": "ok"}]
    ids = r.extend(row, history, new)
    whole = render(tok, history + new)
    assert decode(tok, row + ids) == whole
    assert ids == tok("<|im_end|>\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)["input_ids"]
    assert tok(whole, add_special_tokens=False)["input_ids"] != row + ids  # re-tokenizing would have changed the row


class _PairTokenizer:
    """A slow tokenizer (no offsets) with one token per two characters; `broken` pieces decode to U+FFFD, as a piece
    holding part of a multi-byte character does."""

    is_fast = False

    def __init__(self, broken=()):
        self.pieces, self.broken = [], set(broken)

    def __call__(self, text, add_special_tokens=False):
        parts = [text[i : i + 2] for i in range(0, len(text), 2)]
        for p in parts:
            if p not in self.pieces:
                self.pieces.append(p)
        return {"input_ids": [self.pieces.index(p) for p in parts]}

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return "".join("\ufffd" if self.pieces[i] in self.broken else self.pieces[i] for i in ids)


def test_clip_with_a_slow_tokenizer():
    r = RawRenderer(_PairTokenizer(), marker="~")
    assert r.clip("abcdefgh", 4) == "abcdefgh"  # 4 tokens: fits exactly
    assert r.clip("abcdefghi", 4) == "abcdef~"  # 5 tokens: 3 kept + the marker
    assert r.clip("abcdefghi", 4, keep="end") == "~efghi"
    # a kept piece that does not decode to the text's own characters is given up, never shown as U+FFFD
    r = RawRenderer(_PairTokenizer(broken={"ef"}), marker="~")
    assert r.clip("abcdefghi", 4) == "abcd~"


# ---------------------------------------------------------------------------------------------------- large outputs
def test_a_10_mb_tool_output_is_cut_in_characters_before_it_is_tokenized():
    # tokenizing a 10 MB output whole took 32 s and 4.5 GB (issue 32, item 7); only clip_chars(budget) are read now
    import time

    r = make_renderer(build_tokenizer(), "raw")
    assert r.token_chars == 5  # "<pad>", its longest vocabulary entry; its text tokens are one character each
    big = "0123456789" * 1_000_000
    start = time.perf_counter()
    head, tail = r.clip(big, 64), r.clip(big, 64, keep="end")
    assert time.perf_counter() - start < 0.5
    keep = 64 - r.marker_tokens
    assert head == big[:keep] + DEFAULT_MARKER and tail == DEFAULT_MARKER + big[-keep:]
    assert r.clip(big[:64], 64) == big[:64]  # an output that fits is kept whole, as before


def _unbounded(renderer):
    renderer.clip_chars = lambda max_tokens: None  # tokenize the whole output, as clip did before the bound
    return renderer


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("the tool 408 café 日本語 –éï\n*")), min_size=1,
                   max_size=200), budget=st.integers(1, 12), keep=st.sampled_from(["start", "end"]))
def test_clip_cut_in_characters_first_is_the_clip_of_the_whole_output(text, budget, keep):
    # byte-level BPE (several characters a token, several tokens a character) and a one-token marker, so small
    # budgets make outputs longer than clip_chars(budget) and the character cut happens
    for tok in (BPE, build_tokenizer()):
        fast, whole = make_renderer(tok, "raw", marker="~"), _unbounded(make_renderer(tok, "raw", marker="~"))
        assert fast.clip(text, budget, keep=keep) == whole.clip(text, budget, keep=keep)


def test_an_episode_with_a_10_mb_tool_output_takes_well_under_a_second():
    import time

    from episode_fakes import CalcEnv, ScriptedSampler, run_episodes_flat

    from rewardlab.envs import run_episodes

    renderer = make_renderer(build_tokenizer(), "raw")
    env = CalcEnv(results=[[{"role": "tool", "name": "calc", "content": "7" * 10_000_000}]])
    start = time.perf_counter()
    (r,) = run_episodes_flat(ScriptedSampler({0: ["<c>1+1</c>", "2$"]}), env, [{"prompt": "q"}], n=1, max_turns=2,
                             max_new_tokens=16, max_episode_tokens=200, max_tool_tokens=20, renderer=renderer)
    assert time.perf_counter() - start < 0.5
    assert r.termination == "stop" and "7" * 6 + DEFAULT_MARKER in renderer.tokenizer.decode(r.completion_ids)
