"""Property tests of `ChatRenderer.extend` over chat templates: on random tool-use conversations, a row's ids only
grow, and after every environment turn the row decodes to exactly the template's rendering of the whole conversation
(the text prefix property), either by appending `extend`'s ids or, exactly when the template rewrote earlier text,
through a new row (`extend` -> None, then `start`).

Templates: three written here (ChatML append-only, one that strips earlier `<think>` blocks, one that joins
consecutive tool messages) and the Jinja templates that ship inside TRL (`trl/chat_templates/*.jinja`), read from the
installed package at test time; those tests are skipped when TRL is not installed. REWARDLAB_CHAT_TEMPLATES=DIR points
them at another folder of `*.jinja` files instead, and RENDER_EXAMPLES=N sets their examples per template.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from render_helpers import CHATML, PIECES, RANDOM_CHARS, THINK_STRIP, TOOL_JOIN, char_tokenizer, play, render

from rewardlab.envs import make_renderer

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate an arithmetic expression.",
                                            "parameters": {"type": "object", "properties": {
                                                "expression": {"type": "string", "description": "e.g. 12*34"}},
                                                "required": ["expression"]}}}]

text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(alphabet=RANDOM_CHARS, max_size=6)), max_size=6).map(
    "".join)
observation = st.one_of(
    st.builds(lambda c: {"role": "tool", "name": "calc", "content": c}, text),
    st.builds(lambda c: {"role": "user", "content": c}, text.filter(bool)),
)


@st.composite
def conversations(draw):
    """(prompt messages, turns): an optional system message and a user message, then 1-3 model turns, each (raw
    text, ended with EOS?, 1-3 observation messages: tool results or user messages)."""
    prompt = [{"role": "system", "content": draw(text)}] if draw(st.booleans()) else []
    prompt.append({"role": "user", "content": draw(text.filter(bool))})
    turns = [(draw(text), draw(st.booleans()), draw(st.lists(observation, min_size=1, max_size=3)))
             for _ in range(draw(st.integers(1, 3)))]
    return prompt, turns


def think_rewrites(history: list[dict], new: list[dict]) -> bool:
    """THINK_STRIP rewrites the row exactly when a user message arrives after a model turn (since the last user
    message) whose text holds a `</think>`: that turn's reasoning, rendered so far, is now dropped."""
    if not any(m["role"] == "user" for m in new):
        return False
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    return any(m["role"] == "assistant" and "</think>" in m["content"] for m in history[last_user + 1 :])


def _rows_expected(prompt, turns, rewrites) -> list[int]:
    """Rows after each turn when the row is rewritten exactly where `rewrites(history, new)` says."""
    history, rows, out = list(prompt), 1, []
    for raw, _, new in turns:
        history.append({"role": "assistant", "content": raw})
        rows += bool(rewrites(history, new))
        history.extend(new)
        out.append(rows)
    return out


HAND = {"chatml": (CHATML, lambda h, n: False), "think_strip": (THINK_STRIP, think_rewrites),
        "tool_join": (TOOL_JOIN, lambda h, n: False)}


@pytest.mark.parametrize("name", sorted(HAND))
@pytest.mark.parametrize("with_tools", [False, True])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations())
def test_hand_written_templates(name, with_tools, conv):
    template, rewrites = HAND[name]
    if with_tools:  # a tools section in the system block, as real templates have
        template = "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}" + template
    tok = char_tokenizer(template)
    tools = TOOLS if with_tools else None
    prompt, turns = conv
    log = play(make_renderer(tok, "chat", tools=tools), tok, prompt, turns, tools=tools)
    assert [t["rows"] for t in log] == _rows_expected(prompt, turns, rewrites)
    event(f"new rows: {log[-1]['rows'] - 1}")


# ---------------------------------------------------------------------------------------------------- TRL's templates
def _template_dir() -> Path | None:
    if os.environ.get("REWARDLAB_CHAT_TEMPLATES"):
        return Path(os.environ["REWARDLAB_CHAT_TEMPLATES"])
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "chat_templates"


TEMPLATE_DIR = _template_dir()
#: Examples per shipped template (about 70 of them): few, to keep the suite fast; RENDER_EXAMPLES=200 for a deeper run.
SHIPPED_EXAMPLES = int(os.environ.get("RENDER_EXAMPLES", 8))
SHIPPED = sorted(TEMPLATE_DIR.glob("*.jinja")) if TEMPLATE_DIR is not None and TEMPLATE_DIR.is_dir() else []
#: A template's end-of-turn marker: the tag right after an assistant message's content.
END_TAG = re.compile(r"^\s*(<[^<>\s]{2,40}>)")


@functools.lru_cache(maxsize=None)
def _shipped_tokenizer(path: Path):
    """A character tokenizer for a shipped template: every character of the template is in its vocabulary, and the
    tag that closes an assistant turn (if the template has one) is a special token and the EOS, so a model turn can
    end with EOS as a real model's does."""
    source = path.read_text(encoding="utf-8")
    probe = char_tokenizer(source, specials=(), eos=None, chars=source)
    eos = None
    try:
        shown = render(probe, [{"role": "user", "content": "u"}, {"role": "assistant", "content": "ZQZ"},
                               {"role": "user", "content": "v"}])
        found = END_TAG.match(shown.split("ZQZ", 1)[1]) if "ZQZ" in shown else None
        eos = found.group(1) if found else None
    except Exception:  # the template refuses even this conversation: its examples below all raise
        pass
    return char_tokenizer(source, specials=(), eos=eos, chars=source), eos


@pytest.mark.skipif(not SHIPPED, reason="no shipped chat templates: TRL is not installed")
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
@settings(max_examples=SHIPPED_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), with_tools=st.booleans())
def test_shipped_templates(path, conv, with_tools):
    tok, eos = _shipped_tokenizer(path)
    prompt, turns = conv
    turns = [(raw, ended and eos is not None, new) for raw, ended, new in turns]
    tools = TOOLS if with_tools else None
    renderer = make_renderer(tok, "chat", tools=tools)
    full = prompt + [m for raw, _, new in turns for m in [{"role": "assistant", "content": raw}, *new]]
    try:
        render(tok, full, tools)
        render(tok, prompt, tools)
    except Exception:  # the template refuses this conversation (roles, tool messages, ...): so must the renderer
        with pytest.raises(ValueError, match="^chat template: cannot render the conversation"):
            renderer.start(full)
            renderer.start(prompt)
        event("refused by the template")
        return
    log = play(renderer, tok, prompt, turns, tools=tools)
    event(f"new rows: {log[-1]['rows'] - 1}")


@pytest.mark.skipif(not any(p.name == "qwen2_5.jinja" for p in SHIPPED), reason="TRL's qwen2_5.jinja not installed")
@settings(max_examples=40, deadline=None)
@given(conv=conversations())
def test_qwen2_5_template_is_append_only(conv):
    """Qwen2.5's template renders assistant content verbatim and closes every turn with <|im_end|>\\n (its EOS):
    no episode needs a second row, and consecutive tool results share one `user` block."""
    tok, eos = _shipped_tokenizer(TEMPLATE_DIR / "qwen2_5.jinja")
    assert eos == "<|im_end|>"
    prompt, turns = conv
    log = play(make_renderer(tok, "chat", tools=TOOLS), tok, prompt, turns, tools=TOOLS)
    assert [t["rows"] for t in log] == [1] * len(turns)
    for (raw, ended, new), t in zip(turns, log):
        tail = "\n<|im_start|>assistant\n"
        assert t["appended"].endswith(tail) and t["appended"].startswith("\n" if ended else "<|im_end|>\n")
