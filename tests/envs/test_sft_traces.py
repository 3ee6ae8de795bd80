"""Multi-turn traces as supervised rows (`rewardlab.envs.trace_rollouts`, `rewardlab.sft.sft_loss` with a loss mask)
and the built-in environments' trace generators.

Ids are those of the tiny char tokenizer: one token per character (id = ord(c) - 28), <s> = 1, </s> = 2."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_ARCH
from episode_fakes import BOS, EOS, THINK_STRIP, RecordedChat, ScriptedSampler, enc, run_episodes_flat

from rewardlab.envs import make_env, make_renderer, run_episodes, trace_rollouts
from rewardlab.policy import load_policy
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.sft import sft_loss

#: ChatML-style and append-only, with the tiny tokenizer's <s> and </s> as its markers.
CHAT = ("{% for m in messages %}<s>{{ m.role }}\n{{ m.content }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}")

CALC_ROW = {"prompt": "12+34=", "answer": "46", "metadata": {"expression": "12 + 34"}}


@pytest.fixture(scope="module")
def calculator():
    with make_env("calculator", size=300, test_size=30, workers=1) as env:
        yield env


def test_calculator_traces_by_hand(calculator):
    assert calculator.trace(CALC_ROW) == [
        {"role": "user", "content": "12+34="}, {"role": "assistant", "content": "<c>12+34</c>"},
        {"role": "tool", "name": "calc", "content": "46"}, {"role": "assistant", "content": "46"}]
    assert calculator.trace(CALC_ROW, tool=False) == [{"role": "user", "content": "12+34="},
                                                      {"role": "assistant", "content": "46"}]
    with pytest.raises(ValueError, match="answer is '47'"):
        calculator.trace(dict(CALC_ROW, answer="47"))
    rows = calculator.rows("train", n=40)
    for frac, k in ((0.0, 0), (0.25, 10), (1.0, 40)):
        traces = calculator.traces(rows, seed=0, tool_frac=frac)
        assert sum(len(t) == 4 for t in traces) == k and sum(len(t) == 2 for t in traces) == 40 - k
    assert calculator.traces(rows, seed=0, tool_frac=0.5) == calculator.traces(rows, seed=0, tool_frac=0.5)
    assert calculator.traces(rows, seed=0, tool_frac=0.5) != calculator.traces(rows, seed=1, tool_frac=0.5)
    for trace in calculator.traces(rows, tool_frac=0.5):
        assert all(m["content"].isascii() and m["content"].isprintable() for m in trace)
    with pytest.raises(ValueError, match="tool_frac"):
        calculator.traces(rows, tool_frac=1.5)


def test_calculator_hermes_trace_calls_calc_in_json():
    with make_env("calculator", parser="hermes", size=300, test_size=30, workers=1) as env:
        row = env.rows("train", n=1)[0]
        trace = env.trace(row)
        expr = row["metadata"]["expression"].replace(" ", "")
        assert trace[1]["content"] == ('<tool_call>\n{"name": "calc", "arguments": {"expression": "' + expr
                                       + '"}}\n</tool_call>')
        assert env.parser.parse(trace[1]["content"], env.tools)[0]["status"] == "ok"
        assert trace[-1]["content"] == f"<answer>{row['answer']}</answer>"


def test_guess_number_trace_is_binary_search_by_hand():
    env = make_env("guess_number", n=64)
    trace = env.trace({"prompt": "Guess my number from 1 to 64. Write <g>K</g>.\n", "answer": "10", "n": 64})
    # [1,64] -> 32 lower -> [1,31] -> 16 lower -> [1,15] -> 8 higher -> [9,15] -> 12 lower -> [9,11] -> 10
    assert [m["content"] for m in trace[1:]] == ["<g>32</g>", "<o>lower</o>", "<g>16</g>", "<o>lower</o>",
                                                 "<g>8</g>", "<o>higher</o>", "<g>12</g>", "<o>lower</o>", "<g>10</g>"]
    assert [m["role"] for m in trace] == ["user"] + ["assistant", "user"] * 4 + ["assistant"]
    for secret in range(1, 65):
        guesses = [m for m in env.trace({"prompt": env.prompt(), "answer": str(secret), "n": 64}) if m["role"] == "assistant"]
        assert len(guesses) <= 7 and guesses[-1]["content"] == f"<g>{secret}</g>"


def test_trace_ids_and_loss_mask_by_hand(calculator):
    renderer = make_renderer(build_tokenizer(), "raw", raw_text=calculator.raw_text)
    (ro,) = trace_rollouts(renderer, calculator.trace(CALC_ROW), eos_id=EOS, stop=calculator.stop)
    assert ro.prompt_ids == [BOS] + enc("12+34=")
    assert ro.completion_ids == enc("<c>12+34</c>") + enc("<o>46</o>") + enc("46") + [EOS]
    assert ro.loss_mask == [1] * 12 + [0] * 9 + [1] * 3
    assert ro.turns == [(0, 12), (21, 24)] and ro.completion == "46" and ro.termination == "stop"
    (direct,) = trace_rollouts(renderer, calculator.trace(CALC_ROW, tool=False), eos_id=EOS,
                               stop=calculator.stop)
    assert direct.completion_ids == enc("46") + [EOS] and direct.loss_mask == [1, 1, 1]


@pytest.mark.parametrize("bad, match", [
    ([{"role": "user", "content": "q"}], "no assistant message"),
    ([{"role": "assistant", "content": "a"}], "message 0 is an assistant turn"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<c>1</c>"},
      {"role": "tool", "content": "1"}], "message 2 .tool. ends the trace"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<c>1</c>x"},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "1"}], "goes on after the stop string"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
      {"role": "assistant", "content": "b"}], "right after another"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
      {"role": "system", "content": "s"}, {"role": "assistant", "content": "b"}], "role 'system'"),
    ([{"role": "user", "content": 3}], "message 0 must be a dict"),
])
def test_malformed_traces_are_one_line_errors(bad, match):
    renderer = make_renderer(build_tokenizer(), "raw")
    with pytest.raises(ValueError, match=match):
        trace_rollouts(renderer, bad, eos_id=EOS, stop=("</c>",), where="row 7")


def _script(trace):
    """The assistant turns of `trace` as ScriptedSampler texts ("$" = EOS) for turns that do not end at a stop."""
    return [m["content"] + ("" if m["content"].endswith(("</c>", "</g>", "</tool_call>")) else "$")
            for m in trace if m["role"] == "assistant"]


@pytest.mark.parametrize("fmt", ["raw", "chat"])
def test_trace_ids_equal_the_episode_a_sampler_of_the_same_turns_makes(calculator, fmt):
    """Token exactness between SFT and RL: for tool traces, direct answers and binary-search traces, the rollout of
    the trace has the ids, loss mask and turns of the episode `run_episodes` runs when the model samples its turns."""
    tok = build_tokenizer()
    if fmt == "chat":
        tok.chat_template = CHAT
    guess = make_env("guess_number", n=64)
    cases = [(calculator, r, calculator.trace(r, tool=t)) for r, t in zip(calculator.rows("train", n=4),
                                                                           (True, False, True, False))]
    cases += [(guess, r, guess.trace(r)) for r in guess.rows("train", n=3)]
    for env, row, trace in cases:
        renderer = make_renderer(tok, fmt, tools=getattr(env, "tools", None), raw_text=env.raw_text)
        sampler = ScriptedSampler({0: _script(trace)})
        sampler.tokenizer, sampler.prompt_format = tok, fmt
        (episode,) = run_episodes_flat(sampler, env, [row], n=1, max_turns=8, max_new_tokens=40, max_episode_tokens=400,
                                       renderer=renderer)
        (ro,) = trace_rollouts(renderer, trace, eos_id=EOS, stop=getattr(env, "stop", None))
        assert ro.prompt_ids == episode.prompt_ids
        assert ro.completion_ids == episode.completion_ids
        assert ro.loss_mask == episode.loss_mask
        assert ro.turns == episode.turns
        assert ro.completion == episode.completion
        assert ro.termination == episode.termination
        assert [m["content"] for m in ro.messages] == [m["content"] for m in episode.messages]


def test_a_trace_under_a_template_that_rewrites_earlier_turns_gives_the_episodes_rows():
    """Where the template re-lays an earlier turn, the trace goes on in a new row exactly as the episode does: the
    same rows (prompt ids, completion ids, loss masks, turns, first turn, termination), by hand and against the
    episode a scripted sampler of the same turns runs."""
    env = make_env("guess_number", n=64)
    renderer = RecordedChat(THINK_STRIP, raw_text=env.raw_text)
    tok = renderer.tokenizer
    row = {"prompt": env.prompt(), "answer": "48", "n": 64}
    # [1,64] -> 32 higher -> [33,64] -> 48
    trace = [{"role": "user", "content": env.prompt()},
             {"role": "assistant", "content": "<think>mid</think><g>32</g>"},
             {"role": "user", "content": "<o>higher</o>"},
             {"role": "assistant", "content": "<think>up</think><g>48</g>"}]
    first, second = trace_rollouts(renderer, trace, eos_id=EOS, stop=env.stop)
    assert first.completion_ids == enc("<think>mid</think><g>32</g>") and first.loss_mask == [1] * 27
    assert first.termination is None and first.turns == [(0, 27)] and first.first_turn == 0
    assert second.prompt_ids == enc(f"<s>user\n{env.prompt()}</s>\n<s>assistant\n<g>32</g></s>\n"
                                    "<s>user\n<o>higher</o></s>\n<s>assistant\n")
    assert second.completion_ids == enc("<think>up</think><g>48</g>") and second.loss_mask == [1] * 26
    assert second.first_turn == 1 and second.termination == "env_done" and second.completion.endswith("<g>48</g>")
    assert first.messages == trace[:2] and second.messages == trace
    sampler = ScriptedSampler({0: _script(trace)}, renderer=renderer)
    sampler.tokenizer, sampler.prompt_format = tok, "chat"
    episode = run_episodes_flat(sampler, env, [row], n=1, max_turns=8, max_new_tokens=40, max_episode_tokens=400,
                                renderer=renderer)
    assert len(episode) == 2
    for ro, ep in zip((first, second), episode):
        assert (ro.prompt_ids, ro.completion_ids, ro.loss_mask, ro.turns, ro.first_turn, ro.termination) == (
            ep.prompt_ids, ep.completion_ids, ep.loss_mask, ep.turns, ep.first_turn, ep.termination)


def test_sft_loss_ignores_observation_tokens():
    """The last hidden states at observation positions (all the LM head turns into their logits) get exactly zero
    gradient and changing them leaves the loss unchanged; the loss is the mean NLL over the 15 assistant tokens."""
    env = make_env("calculator", size=300, test_size=30, workers=1)
    policy = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    renderer = make_renderer(policy.tokenizer, "raw", raw_text=env.raw_text)
    (ro,) = trace_rollouts(renderer, env.trace(CALC_ROW), eos_id=policy.tokenizer.eos_token_id, stop=env.stop)
    T = len(ro.completion_ids)
    captured, noise = {}, {}

    def hook(module, inputs, output):
        hidden = output
        if "delta" in noise:
            hidden = hidden + noise["delta"]
        if hidden.requires_grad:
            hidden.retain_grad()
        captured["hidden"] = hidden
        return hidden

    final_norm = policy.model.get_decoder().norm  # its output is all the LM head reads
    handle = final_norm.register_forward_hook(hook)
    try:
        loss, n = sft_loss(policy, [ro.prompt_ids], [ro.completion_ids], [ro.loss_mask])
        loss.backward()
        grad = captured["hidden"].grad[0]  # [L, H], the L positions; completion token t is predicted at the
        first = grad.shape[0] - T - 1  # position P - 1 + t of the row, here index first + t
        assert first >= 0
        obs = [first + t for t in range(T) if ro.loss_mask[t] == 0]
        own = [first + t for t in range(T) if ro.loss_mask[t] == 1]
        assert n == 15
        assert torch.count_nonzero(grad[obs]) == 0
        assert all(torch.count_nonzero(grad[p]) > 0 for p in own)
        delta = torch.zeros_like(captured["hidden"])
        delta[0, obs] = torch.randn(len(obs), delta.shape[-1]) * 5
        noise["delta"] = delta.detach()
        with torch.no_grad():
            perturbed, _ = sft_loss(policy, [ro.prompt_ids], [ro.completion_ids], [ro.loss_mask])
        assert torch.equal(perturbed, loss.detach())
        with torch.no_grad():  # unmasked, the observation tokens count: a different loss over 24 tokens
            unmasked, n_all = sft_loss(policy, [ro.prompt_ids], [ro.completion_ids])
        assert n_all == 24 and not torch.equal(unmasked, loss.detach())
    finally:
        handle.remove()
        env.close()


def test_sft_loss_mask_length_is_checked():
    policy = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    with pytest.raises(ValueError, match="row 0's loss mask has 2 entries for 3 target ids"):
        sft_loss(policy, [[1, 20]], [[21, 22, 2]], [[1, 0]])


def test_encode_rows_generates_the_environment_traces_with_the_tool_mix():
    from dataclasses import replace

    from rewardlab.sft import encode_rows
    from rewardlab.tasks import Task

    policy = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    env = make_env("calculator", size=300, test_size=30, workers=1)
    task = replace(env.task(0), env={"name": "calculator", "options": {"size": 300, "test_size": 30}})
    encoded = encode_rows(task, policy, "answer", seed=0, tool_frac=0.25)
    with_tool = [m for _, _, m in encoded if 0 in m]
    assert len(encoded) == len(task.train) and len(with_tool) == round(0.25 * len(task.train))
    assert all(m == [1] * len(t) for _, t, m in encoded if 0 not in m)  # a direct answer: all trained
    plain = Task(name="t", train=[{"prompt": "1+1=", "answer": "2"}], test=[])
    assert encode_rows(plain, policy, "answer") == [(policy.encode_prompt("1+1="), policy.encode_target("2"), None)]
    with pytest.raises(ValueError, match="sft.tool_frac: applies to environment tasks"):
        encode_rows(plain, policy, "answer", tool_frac=0.5)
    guess = make_env("guess_number", n=8, size=4, test_size=1)
    gtask = replace(guess.task(0), env={"name": "guess_number", "options": {"n": 8, "size": 4, "test_size": 1}})
    with pytest.raises(ValueError, match="sft.tool_frac: environment 'guess_number' has no tool choice"):
        encode_rows(gtask, policy, "answer", tool_frac=0.5)
    assert all(m.count(1) >= 6 for _, _, m in encode_rows(gtask, policy, "answer"))  # "<g>K</g>" per guess


@pytest.mark.parametrize("budgets", [
    {"max_turns": 3, "max_episode_tokens": 400},   # cut after the third guess (termination max_turns)
    {"max_turns": 8, "max_episode_tokens": 30},    # cut inside a turn (max_episode_tokens, truncated)
    {"max_turns": 8, "max_episode_tokens": 18},    # an observation that does not fit is dropped
    {"max_turns": 8, "max_episode_tokens": 400},   # nothing binds: the whole trace
])
def test_a_trace_under_budgets_holds_what_the_episode_under_them_holds(budgets):
    """`trace_rollouts(limits=...)` (what `sft` does with env.max_turns and env.max_episode_tokens): the trace's
    rows are those of the episode a sampler of the same turns runs under the same budgets - cut at the same place,
    with the same termination."""
    from rewardlab.envs.episode import EpisodeLimits

    tok = build_tokenizer()
    env = make_env("guess_number", n=64)
    row = {"prompt": env.prompt(), "answer": "10", "n": 64}  # 32, 16, 8, 12, 10: five guesses
    trace = env.trace(row)
    renderer = make_renderer(tok, "raw", raw_text=env.raw_text)
    sampler = ScriptedSampler({0: _script(trace)})
    sampler.tokenizer, sampler.prompt_format = tok, "raw"
    (episode,) = run_episodes_flat(sampler, env, [row], n=1, max_new_tokens=budgets["max_episode_tokens"],
                                   renderer=renderer, **budgets)
    limits = EpisodeLimits(max_new_tokens=budgets["max_episode_tokens"], **budgets)
    (ro,) = trace_rollouts(renderer, trace, eos_id=EOS, stop=env.stop, limits=limits)
    assert (ro.prompt_ids, ro.completion_ids, ro.loss_mask, ro.turns, ro.termination) == (
        episode.prompt_ids, episode.completion_ids, episode.loss_mask, episode.turns, episode.termination)
    whole = budgets == {"max_turns": 8, "max_episode_tokens": 400}
    assert (ro.termination == "env_done") == whole
    (unbounded,) = trace_rollouts(renderer, trace, eos_id=EOS, stop=env.stop)
    assert (unbounded.completion_ids == ro.completion_ids) == whole


def test_sft_applies_the_env_budgets_to_traces(tmp_path, capsys):
    """`sft` on an environment task reads env.max_turns and env.max_episode_tokens (they were accepted and ignored:
    the same final loss): a budget that cuts the traces changes what is trained and says how many were cut."""
    from rewardlab.commands import sft as sft_command
    from rewardlab.config import SFTConfig

    def run(name, env):
        cfg = SFTConfig(model={"path": "tiny", "tiny": TINY_ARCH}, out=str(tmp_path / name), seed=0,
                        task={"spec": "env:guess_number", "options": {"n": 64, "size": 8, "test_size": 2}},
                        sft={"steps": 2, "batch_size": 4}, env=env)
        return sft_command.run(cfg, show_progress=False)

    whole = run("whole", {"max_turns": 8})
    assert "do not fit the episode budgets" not in capsys.readouterr().err
    cut = run("cut", {"max_turns": 2})
    assert "env: 8 of 8 training traces of task" in capsys.readouterr().err  # these 8 secrets each take 3+ guesses
    assert cut["final_loss"] != whole["final_loss"]
