"""The episode loop (`rewardlab.envs.episode`): token-exact rows, budgets and termination, row splitting, streams.

Ids are those of the tiny char tokenizer: one token per character, id = ord(c) - 28 ("Q" = 53, ":" = 30), <s> = 1,
</s> = 2, <unk> = 3 (see episode_fakes)."""

from __future__ import annotations

import pytest
from episode_fakes import BOS, EOS, UNK, CalcEnv, RawRenderer, ScriptedSampler, assert_prefixes, enc, episode_args

from rewardlab.envs import Episode, EpisodeLimits, EpisodeSettings, StepResult, run_episodes
from rewardlab.policy.settings import SamplingSettings
from rewardlab.envs.episode import prompt_text
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.types import Sampled

ROW = {"prompt": "Q:", "answer": "5"}


def run(scripts, *, env=None, renderer=None, rows=(ROW,), n=1, context_window=None, **kw):
    renderer = renderer or RawRenderer()
    sampler = ScriptedSampler(scripts, context_window=context_window, renderer=renderer)
    opts = dict(max_turns=4, max_new_tokens=16, max_episode_tokens=64, temperature=1.0)
    opts.update(kw)
    episodes, sampling, rest = episode_args(env or CalcEnv(), **opts)
    out = run_episodes(sampler, episodes, list(rows), sampling, n=n, renderer=renderer, **rest)
    assert_prefixes(sampler, out)
    return out, sampler


def lp(e, t, k):
    """The fake sampler's log-probs of episode e's turn t, k tokens."""
    return [-(e + 1) - t / 4 - j / 64 for j in range(k)]


def test_a_tool_episode_is_one_row_of_model_and_environment_ids_with_the_loss_mask_on_sampled_ids_only():
    # "#" samples <unk>, which decodes to nothing: a loop that re-rendered the history would lose it
    (r,), sampler = run({0: ["#<c>2+3</c>", "#5$"]}, seed=7, step=3, round=2)
    call, obs, answer = [UNK] + enc("<c>2+3</c>"), enc("<o>5</o>"), [UNK, 25, EOS]
    assert r.prompt_ids == [BOS, 53, 30] and r.prompt == "Q:"
    assert r.completion_ids == call + obs + answer
    assert r.loss_mask == [1] * 11 + [0] * 8 + [1] * 3
    assert r.logprobs == lp(0, 0, 11) + [0.0] * 8 + lp(0, 1, 3)
    assert r.turns == [(0, 11), (19, 22)]
    assert r.turn_rewards == [0.5, 0.0]
    assert r.tool_calls == [[{"name": "calc", "arguments": {"expression": "2+3"}, "status": "ok", "seconds": 0.0}],
                            []]
    assert r.termination == "stop" and not r.truncated and r.episode_id == 0 and r.first_turn == 0
    assert r.completion == "5"  # the final model turn, never the tool's output
    assert r.messages == [{"role": "user", "content": "Q:"}, {"role": "assistant", "content": "<c>2+3</c>"},
                          {"role": "tool", "name": "calc", "content": "5"}, {"role": "assistant", "content": "5"}]
    assert r.row == ROW and r.group == 0 and r.sampled_tokens == 14
    # one sample_ids call per turn, streams (seed, step, episode, round, turn), the env's stop strings passed
    assert [c["streams"] for c in sampler.calls] == [[(7, 3, 0, 2, 0)], [(7, 3, 0, 2, 1)]]
    assert [c["budgets"] for c in sampler.calls] == [[16], [16]]
    assert sampler.calls[0]["stop"] == ["</c>"]


def test_a_turn_that_fits_max_new_tokens_exactly_is_kept_whole_and_one_token_more_is_cut():
    env = CalcEnv()
    (r,), _ = run({0: ["ab$"]}, env=env, max_new_tokens=3)  # 3 tokens, EOS the last: fits
    assert r.completion_ids == enc("ab") + [EOS] and r.termination == "stop" and not r.truncated
    assert env.steps == 1
    env = CalcEnv()
    (r,), _ = run({0: ["abc$"]}, env=env, max_new_tokens=3)  # 4 tokens: cut after 3
    assert r.completion_ids == enc("abc") and r.loss_mask == [1, 1, 1]
    assert r.termination == "max_new_tokens" and r.truncated
    assert r.turn_rewards == [0.0] and r.tool_calls == [[]] and r.completion == "abc"
    assert env.steps == 0  # the environment never sees a cut turn


def test_a_stop_string_that_ends_exactly_on_the_budget_is_a_stop_not_a_truncation():
    (r,), sampler = run({0: ["<c>1+1</c>", "2$"]}, max_new_tokens=10, max_episode_tokens=40)
    assert sampler.calls[0]["outs"][0].finish == "stop"
    assert r.turns[0] == (0, 10) and r.termination == "stop"


def test_an_observation_that_overflows_max_episode_tokens_is_not_appended():
    # turn 1: 10 tokens, observation <o>2</o>: 8 tokens -> 18 episode tokens
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, max_new_tokens=10, max_episode_tokens=17)
    assert r.completion_ids == enc("<c>1+1</c>") and r.loss_mask == [1] * 10
    assert r.termination == "max_episode_tokens" and r.truncated
    assert r.turn_rewards == [0.5]  # the environment answered the turn; only its observation is dropped
    assert r.messages[-1] == {"role": "assistant", "content": "<c>1+1</c>"}


def test_an_observation_that_fills_max_episode_tokens_exactly_is_appended_and_the_episode_ends_there():
    (r,), sampler = run({0: ["<c>1+1</c>", "2$"]}, max_new_tokens=10, max_episode_tokens=18)
    assert r.completion_ids == enc("<c>1+1</c>") + enc("<o>2</o>")
    assert r.loss_mask == [1] * 10 + [0] * 8 and r.termination == "max_episode_tokens"
    assert len(sampler.calls) == 1  # no budget left for a second turn
    assert [m["role"] for m in r.messages] == ["user", "assistant", "tool"]  # the transcript has the observation


def test_a_turn_is_capped_by_what_is_left_of_the_episode():
    # 18 tokens used, 2 left: "2$" fits exactly (kept, stop); "22$" is cut at 2 (max_episode_tokens)
    (r,), sampler = run({0: ["<c>1+1</c>", "2$"]}, max_new_tokens=10, max_episode_tokens=20)
    assert sampler.calls[1]["budgets"] == [2]
    assert r.completion_ids[18:] == [22, EOS] and r.termination == "stop"
    (r,), _ = run({0: ["<c>1+1</c>", "22$"]}, max_new_tokens=10, max_episode_tokens=20)
    assert r.completion_ids[18:] == [22, 22] and r.termination == "max_episode_tokens" and r.truncated


def test_the_context_window_caps_a_turn_and_an_observation():
    # prompt 3 + turn 10 + observation 8 = 21; a window of 23 leaves 2 tokens for turn 2
    (r,), sampler = run({0: ["<c>1+1</c>", "2$"]}, context_window=23)
    assert sampler.calls[1]["budgets"] == [2] and r.termination == "stop"
    (r,), _ = run({0: ["<c>1+1</c>", "22$"]}, context_window=23)
    assert r.completion_ids[18:] == [22, 22] and r.termination == "context" and r.truncated
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, context_window=20)  # the observation would make the row 21 long
    assert r.completion_ids == enc("<c>1+1</c>") and r.termination == "context"
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, context_window=21)  # fits exactly: appended, then no room
    assert len(r.completion_ids) == 18 and r.termination == "context" and len(r.messages) == 3
    # a turn that hits the window before max_new_tokens ends as context
    (r,), _ = run({0: ["abcdef$"]}, context_window=6)
    assert r.completion_ids == enc("abc") and r.termination == "context"


def test_a_prompt_that_fills_the_context_window_is_refused_naming_the_lengths():
    with pytest.raises(ValueError, match="prompt has 3 tokens and the model's context window is 3"):
        run({0: ["a$"]}, context_window=3)


def test_max_turns_counts_model_turns_and_drops_the_last_observation():
    (r,), _ = run({0: ["<c>1+1</c>", "<c>2+2</c>", "4$"]}, max_turns=2)
    assert r.completion_ids == enc("<c>1+1</c>") + enc("<o>2</o>") + enc("<c>2+2</c>")
    assert r.turns == [(0, 10), (18, 28)] and r.turn_rewards == [0.5, 0.5]
    assert r.termination == "max_turns" and not r.truncated
    assert r.completion == "<c>2+2</c>"


def test_an_env_done_step_ends_the_episode_as_env_done_with_its_reward():
    class Guess:
        def reset(self, row):
            return {}

        def step(self, state, action):
            if action == "7":
                return StepResult(None, True, 1.0, {})
            return StepResult("higher", False, 0.25, {})

    (r,), _ = run({0: ["5$", "7$"]}, env=Guess())
    assert r.completion_ids == enc("5") + [EOS] + enc("higher") + enc("7") + [EOS]
    assert r.loss_mask == [1, 1] + [0] * 6 + [1, 1]
    assert r.messages[2] == {"role": "user", "content": "higher"}  # a str observation is one user message
    assert r.termination == "env_done" and r.turn_rewards == [0.25, 1.0] and r.completion == "7"


@pytest.mark.parametrize("info, termination", [({"termination": "max_turns"}, "max_turns"),
                                                ({"termination": "stop"}, "stop"), ({}, "env_done")])
def test_a_done_step_ends_the_episode_with_the_termination_its_info_gives(info, termination):
    class Done:
        def reset(self, row):
            return {}

        def step(self, state, action):
            return StepResult(None, True, None, info)

    (r,), _ = run({0: ["a$"]}, env=Done())
    assert r.termination == termination and not r.truncated


def test_a_done_step_cannot_claim_a_token_budget_termination():
    class Liar(CalcEnv):
        def step(self, state, action):
            return StepResult(None, True, None, {"termination": "context"})

    with pytest.raises(ValueError, match="env step info termination 'context': expected one of stop, env_done"):
        run({0: ["a$"]}, env=Liar())


def test_empty_observations_work():
    # an empty tool output still renders its tags; an empty message list appends nothing
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, env=CalcEnv([[{"role": "tool", "name": "calc", "content": ""}]]))
    assert r.completion_ids[10:17] == enc("<o></o>") and r.loss_mask[10:17] == [0] * 7
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, env=CalcEnv([[]]))
    assert r.completion_ids == enc("<c>1+1</c>") + [22, EOS] and r.loss_mask == [1] * 12
    assert r.turns == [(0, 10), (10, 12)]


def test_tool_output_is_clipped_in_tokens_before_it_is_rendered():
    renderer = RawRenderer()
    env = CalcEnv([[{"role": "tool", "name": "calc", "content": "123456789"}]])
    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, env=env, renderer=renderer, max_tool_tokens=4, tool_keep="end")
    assert renderer.clips == [("123456789", 4, "end")]
    assert r.messages[2]["content"] == "~789"
    assert r.completion_ids[10:21] == enc("<o>~789</o>")


def test_a_renderer_that_cannot_append_splits_the_episode_into_rows_of_one_episode():
    renderer = RawRenderer(split_at=(2,))  # the second observation cannot be appended
    rows, sampler = run({5: ["<c>1+1</c>", "<c>2+2</c>", "4$"]}, renderer=renderer, episode_offset=5)
    first, second = rows
    assert first.episode_id == second.episode_id == 5
    assert first.completion_ids == enc("<c>1+1</c>") + enc("<o>2</o>") + enc("<c>2+2</c>")
    assert first.loss_mask == [1] * 10 + [0] * 8 + [1] * 10
    assert first.logprobs == lp(5, 0, 10) + [0.0] * 8 + lp(5, 1, 10)
    assert first.turns == [(0, 10), (18, 28)] and first.first_turn == 0
    assert first.termination is None and not first.truncated and first.turn_rewards == [0.5, 0.5]
    assert first.completion == "<c>2+2</c>" and len(first.messages) == 4
    # the new row's prompt is the re-rendered history, observation included
    assert second.prompt_ids == [BOS] + enc("Q:<c>1+1</c><o>2</o><c>2+2</c><o>4</o>")
    assert second.prompt_ids == renderer.starts[-1]
    assert sampler.calls[2]["prompts"] == [second.prompt_ids]
    assert second.completion_ids == [24, EOS] and second.loss_mask == [1, 1]
    assert second.logprobs == lp(5, 2, 2)
    assert second.turns == [(0, 2)] and second.first_turn == 2 and second.turn_rewards == [0.0]
    assert second.termination == "stop" and second.completion == "4" and len(second.messages) == 6
    assert [c["streams"][0][4] for c in sampler.calls] == [0, 1, 2]  # turns counted across rows


def test_an_observation_that_starts_a_new_row_counts_what_the_history_grew_by():
    # row 1 ends at 3 + 28 tokens; the new prompt is 3 + 36: the observation counts 8 -> 36 episode tokens
    renderer = RawRenderer(split_at=(2,))
    rows, _ = run({0: ["<c>1+1</c>", "<c>2+2</c>", "4$"]}, renderer=renderer, max_episode_tokens=35)
    assert len(rows) == 1 and rows[0].termination == "max_episode_tokens"
    rows, _ = run({0: ["<c>1+1</c>", "<c>2+2</c>", "4$"]}, renderer=RawRenderer(split_at=(2,)),
                  max_episode_tokens=38)
    assert len(rows) == 2 and rows[1].termination == "stop"


def test_n_episodes_per_row_are_prompt_major_and_batched_in_one_call_per_round():
    rows = [{"prompt": "A", "answer": "1"}, {"prompt": "B", "answer": "2"}]
    scripts = {0: ["1$"], 1: ["<c>0+1</c>", "1$"], 2: ["<c>1+1</c>", "2$"], 3: ["x$"]}
    out, sampler = run(scripts, rows=rows, n=2, seed=1, step=2)
    assert [r.group for r in out] == [0, 0, 1, 1] and [r.episode_id for r in out] == [0, 1, 2, 3]
    assert [r.row["prompt"] for r in out] == ["A", "A", "B", "B"]
    assert [r.completion for r in out] == ["1", "1", "2", "x"]
    assert [len(r.turns) for r in out] == [1, 2, 2, 1]
    assert [c["streams"] for c in sampler.calls] == [
        [(1, 2, 0, 0, 0), (1, 2, 1, 0, 0), (1, 2, 2, 0, 0), (1, 2, 3, 0, 0)], [(1, 2, 1, 0, 1), (1, 2, 2, 0, 1)]]
    assert out[1].logprobs[:10] == lp(1, 0, 10) and out[2].logprobs[:10] == lp(2, 0, 10)


def test_turn_keys_come_from_state_key_or_hash_the_history():
    class Keyed(CalcEnv):
        def state_key(self, state):
            return ("calls", state["calls"])

    (r,), _ = run({0: ["<c>1+1</c>", "2$"]}, env=Keyed())
    assert r.turn_keys == ["('calls', 0)", "('calls', 1)"]
    # default: a hash of the ids so far; equal histories share it, any difference separates them
    out, _ = run({0: ["<c>1+1</c>", "2$"], 1: ["<c>1+1</c>", "3$"], 2: ["<c>1+2</c>", "3$"]}, n=3)
    keys = [r.turn_keys for r in out]
    assert all(isinstance(k, str) for ks in keys for k in ks)
    assert keys[0] == keys[1]  # same prompt, same first turn and observation
    assert keys[0][0] == keys[2][0] and keys[0][1] != keys[2][1] and keys[0][0] != keys[0][1]


def test_an_episode_is_a_state_machine_that_can_be_driven_by_hand():
    renderer = RawRenderer()
    ep = Episode(CalcEnv(), ROW, renderer, EpisodeLimits(max_turns=3, max_new_tokens=8, max_episode_tokens=30),
                 stream=(4, 5, 6, 7), episode_id=9, group=2)
    with pytest.raises(ValueError, match="feed\\(\\) without a pending request"):
        ep.feed(Sampled([EOS], [0.0], "eos"))
    req = ep.next_request()
    assert req.ids == [BOS, 53, 30] and req.max_new_tokens == 8 and req.stream == (4, 5, 6, 7, 0)
    assert ep.next_request() == req  # asked again before it is fed: the same request
    with pytest.raises(ValueError, match="over the turn's budget 8"):
        ep.feed(Sampled([5] * 9, [0.0] * 9, "length"))
    with pytest.raises(ValueError, match="rollouts\\(\\) before the episode is done"):
        ep.rollouts()
    ep.feed(Sampled(enc("ok") + [EOS], [-0.5, -0.25, -0.125], "eos"))
    assert ep.done and ep.termination == "stop" and ep.next_request() is None
    (r,) = ep.rollouts()
    assert r.episode_id == 9 and r.group == 2 and r.logprobs == [-0.5, -0.25, -0.125] and r.completion == "ok"


@pytest.mark.parametrize("kw, match", [
    ({"max_new_tokens": 65}, "max_new_tokens \\(65\\) is larger than max_episode_tokens \\(64\\)"),
    ({"n": 0}, "n must be an int >= 1"),
    ({"n": 2, "greedy": True}, "n must be an int >= 1 \\(1 when greedy\\)"),
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"top_p": 1.5}, "top_p must be in"),
    ({"max_turns": 0}, "episode.max_turns: must be an int >= 1"),
    ({"max_tool_tokens": 0}, "episode.max_tool_tokens: must be an int >= 1"),
    ({"tool_keep": "middle"}, "tool_keep: expected one of start, end"),
    ({"tool_keep": "end"}, "tool_keep: 'end' has no effect without max_tool_tokens"),
])
def test_bad_options_are_refused_in_one_line_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        run({0: ["a$"]}, **kw)


def test_a_policy_without_sample_ids_and_a_row_without_a_prompt_are_refused():
    with pytest.raises(ValueError, match="has no sample_ids"):
        run_episodes(object(), EpisodeSettings(CalcEnv(), max_turns=1, max_episode_tokens=4), [ROW],
                     SamplingSettings(max_new_tokens=4), n=1, renderer=RawRenderer())
    with pytest.raises(ValueError, match="row: expected a str 'prompt' or a list 'messages'"):
        run({0: ["a$"]}, rows=[{"answer": "1"}])


def test_a_chat_row_starts_from_its_messages():
    rows = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "prompt": "Q"}]
    (r,), _ = run({0: ["a$"]}, rows=rows)
    assert r.prompt_ids == [BOS] + enc("SQ") and r.messages[:2] == rows[0]["messages"]


def test_prompt_text_keeps_a_templates_special_tokens_but_not_a_raw_prompts_bos():
    class WithTokenizer:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

    raw = build_tokenizer()
    assert prompt_text(WithTokenizer(raw), [BOS, 53, 30]) == "Q:"  # as the single-turn path's prompt text
    chat = build_tokenizer()
    chat.chat_template = "{{ messages[0].content }}"
    assert prompt_text(WithTokenizer(chat), [BOS, 53, 30, EOS]) == "<s>Q:</s>"  # a template's markers are text
