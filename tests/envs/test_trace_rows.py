"""`trace_rows`: a written multi-turn trace as training rows, laid out as an episode lays out the same turns, with the
loss mask on the assistant turns only; a template that rewrites earlier turns continues in a new row."""

import pytest
from render_helpers import CHATML, THINK_STRIP, char_tokenizer, decode

from rewardlab.envs import make_env
from rewardlab.envs.render import make_renderer
from rewardlab.envs.traces import trace_rows
from rewardlab.policy.tiny import build_tokenizer

TOK = build_tokenizer()
TRACE = [{"role": "user", "content": "12*34="}, {"role": "assistant", "content": "<c>12*34</c>"},
         {"role": "tool", "name": "calc", "content": "408"}, {"role": "assistant", "content": "408"}]


def _enc(text):
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_raw_trace_by_hand():
    env = make_env("calculator", size=10, test_size=1)
    renderer = make_renderer(TOK, "raw", raw_text=env.raw_text)
    (row,) = trace_rows(renderer, TRACE, eos_token_id=TOK.eos_token_id)
    assert row.prompt_ids == [TOK.bos_token_id] + _enc("12*34=")
    assert row.ids == _enc("<c>12*34</c>") + _enc("<o>408</o>") + _enc("408") + [TOK.eos_token_id]
    assert row.loss_mask == [1] * 12 + [0] * 10 + [1] * 4
    trained = [i for i, m in zip(row.ids, row.loss_mask) if m]
    assert TOK.decode(trained, skip_special_tokens=True) == "<c>12*34</c>408"  # never the tool's output


def test_a_trace_equals_the_episode_that_samples_its_turns():
    # the same turns sampled in the calculator environment give the same ids and the same loss mask
    from rewardlab.envs import run_episodes
    from rewardlab.types import Sampled

    class Say:
        tokenizer, prompt_format, context_window, eos_token_id = TOK, "raw", 512, TOK.eos_token_id

        def sample_ids(self, prompts, *, streams, **_kw):
            turn = streams[0][4]
            ids = _enc("<c>12*34</c>") if turn == 0 else _enc("408") + [TOK.eos_token_id]
            return [Sampled(ids, [0.0] * len(ids), "stop" if turn == 0 else "eos")]

    with make_env("calculator", workers=1, size=10, test_size=1) as env:
        (episode,) = run_episodes(Say(), env, [{"prompt": "12*34=", "answer": "408"}], n=1, max_turns=3,
                                  max_new_tokens=16, max_episode_tokens=64, greedy=True)
        (row,) = trace_rows(make_renderer(TOK, "raw", raw_text=env.raw_text), episode.messages,
                            eos_token_id=TOK.eos_token_id)
    assert episode.messages == TRACE
    assert (row.prompt_ids, row.ids, row.loss_mask) == (episode.prompt_ids, episode.completion_ids,
                                                        episode.loss_mask)


def test_chat_template_rows_and_a_template_that_rewrites_earlier_turns():
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>a</think>b"},
                {"role": "user", "content": "more"}, {"role": "assistant", "content": "c"}]
    tok = char_tokenizer(CHATML, specials=("<|im_start|>",))
    (row,) = trace_rows(make_renderer(tok, "chat"), messages, eos_token_id=tok.eos_token_id)
    assert decode(tok, row.prompt_ids + row.ids) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>a</think>b<|im_end|>\n"
        "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\nc<|im_end|>")
    assert decode(tok, [i for i, m in zip(row.ids, row.loss_mask) if m]) == "<think>a</think>bc<|im_end|>"
    tok = char_tokenizer(THINK_STRIP, specials=("<|im_start|>",))
    first, second = trace_rows(make_renderer(tok, "chat"), messages, eos_token_id=tok.eos_token_id)
    assert decode(tok, [i for i, m in zip(first.ids, first.loss_mask) if m]) == "<think>a</think>b"
    assert first.loss_mask == [1] * len(first.ids)  # the row ends with the turn the template later rewrites
    assert decode(tok, second.prompt_ids) == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                                              "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")
    assert decode(tok, second.ids) == "c<|im_end|>" and second.loss_mask == [1, 1]


@pytest.mark.parametrize("messages,message", [
    ([{"role": "user", "content": "q"}], r"trace\[0\]: a trace ends with an assistant turn"),
    ([{"role": "assistant", "content": "a"}], r"trace\[0\]: an assistant turn needs a prompt before it"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     r"trace\[2\]: two assistant turns in a row"),
    ([{"role": "user"}], r"trace\[0\]: expected a message"),
])
def test_bad_traces_are_one_line_errors_naming_the_message(messages, message):
    renderer = make_renderer(TOK, "raw")
    with pytest.raises(ValueError, match=message):
        trace_rows(renderer, messages, eos_token_id=None)
