"""Real episodes end to end with a small randomly initialised Hugging Face causal LM (Qwen2 architecture) through the
Hermes tool-call parser and the `calculator` environment, with the chat templates that ship inside TRL (Qwen2.5's
and Qwen3's, read from the installed package at test time).

Everything is built here, offline: a `Qwen2Tokenizer` over a byte-level BPE vocabulary trained in a few milliseconds
on the templates' text, with `<|im_start|>` and `<|im_end|>` (EOS) as special tokens and the tool tags
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`, `<think>`, `</think>` as added tokens that are
*not* special, as in Qwen2.5's own tokenizer; and a 2-layer, 64-wide Qwen2ForCausalLM. The model's turns are forced
by a few seconds of SFT (plain AdamW) on four fixed sequences, until greedy decoding reproduces every trained token
with a margin:
- under Qwen2.5's template, a calculator question -> a `calc` call -> the tool's result -> `<answer>N</answer>`;
- under Qwen2.5's template, "Call calc with bad JSON." -> `<tool_call>{bad json</tool_call>` -> the error -> "sorry";
- under Qwen3's template, the same question -> `<think>add</think>` + the call (the template re-renders that turn's
  reasoning as `<think>\\nadd\\n</think>\\n\\n`, so the episode continues in a new row) -> the answer.
The SFT sequences are built from hand-written text pieces, so the episode loop must render exactly these ids for the
model to follow them: a rendering that drifted would show as other ids, or as a model that no longer calls.
"""

from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import json
import types

import pytest
import torch

from episode_fakes import run_episodes_flat

from rewardlab.envs import episode_metrics, episode_record, make_env, make_renderer, replay, run_episodes
from rewardlab.policy import Policy, rollout_batch
from rewardlab.rewards import REWARDS
from rewardlab.rl.episodes import episode_tensors

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs TRL's chat templates")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
BAD = "<tool_call>{bad json</tool_call>"
BAD_PROMPT = "Call calc with bad JSON."
#: The hermes parser's error observation for BAD (json's own message; "char 1" is the "b" after "{").
ERR = ("error: malformed tool call: not JSON (Expecting property name enclosed in double quotes at char 1): "
       "'{bad json'")


def template(name: str) -> str:
    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


def observation(content: str) -> str:
    """What Qwen2.5's (and Qwen3's) template writes after an assistant turn that stopped at `</tool_call>`, for one
    tool message and the next generation prompt: it closes the turn, wraps the result in a user turn, opens the
    next assistant turn."""
    return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")


def build_tokenizer(corpus: list[str], *, special_tags: bool = False):
    """A `Qwen2Tokenizer` (Qwen's own pre-tokenizer: digits one by one, byte-level BPE) over a 1000-entry BPE
    vocabulary trained on `corpus`; the tool and reasoning tags are added tokens, special only when `special_tags`
    (the same ids either way). Saved and reloaded with `AutoTokenizer`, it encodes the same."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=1000, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    trained = json.loads(bpe.to_str())["model"]
    tok = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]], unk_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"] + (TAGS if special_tags else [])})
    if not special_tags:
        tok.add_tokens(TAGS)
    tok.chat_template = template("qwen2_5")
    return tok


class Recording:
    """A TokenSampler proxy recording each `sample_ids` call: (prompts, what was sampled), and its streams (seed,
    step, episode, round, turn)."""

    def __init__(self, policy):
        self.policy, self.calls, self.streams = policy, [], []
        self.eos_token_id, self.context_window = policy.eos_token_id, policy.context_window
        self.tokenizer, self.prompt_format = policy.tokenizer, policy.prompt_format

    def sample_ids(self, prompts, **kw):
        out = self.policy.sample_ids(prompts, **kw)
        self.calls.append(([list(p) for p in prompts], out))
        self.streams.append(list(kw["streams"]))
        return out


def sft(model, data: list[tuple[list[int], list[int]]], *, pad: int, margin: float = 1.0, max_steps: int = 400):
    """Plain AdamW on the tokens with mask 1 of the sequences `data` [(ids, mask)], until at every such token the
    target's logit beats every other by `margin` (greedy decoding then reproduces them). Returns the steps taken."""
    width = max(len(ids) for ids, _ in data)
    x = torch.full((len(data), width), pad)
    att = torch.zeros((len(data), width), dtype=torch.long)
    labels = torch.full((len(data), width), -100)
    for k, (ids, mask) in enumerate(data):
        x[k, : len(ids)], att[k, : len(ids)] = torch.tensor(ids), 1
        labels[k, : len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tgt = labels[:, 1:]
    trained = tgt != -100
    for step in range(max_steps):
        out = model(input_ids=x, attention_mask=att, labels=labels)
        logits = out.logits[:, :-1].detach()
        own = logits.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        other = logits.scatter(-1, tgt.clamp(min=0).unsqueeze(-1), float("-inf")).amax(-1)
        if bool(((own - other)[trained] > margin).all()):
            return step
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    raise AssertionError(f"SFT did not fit the {len(data)} sequences in {max_steps} steps")


@pytest.fixture(scope="module")
def lab():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    env = make_env("calculator", parser="hermes", size=50, test_size=5)
    row = env.rows("train", n=1)[0]
    expr = row["metadata"]["expression"].replace(" ", "")
    answer = row["answer"]
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "%s"}}</tool_call>' % expr
    final = f"<answer>{answer}</answer>"
    think_call = "<think>add</think>" + call
    corpus = [template("qwen2_5"), template("qwen3"), row["prompt"], json.dumps(env.tools)]
    tok = build_tokenizer(corpus)
    tok3 = copy.deepcopy(tok)
    tok3.chat_template = template("qwen3")

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    def render(t, messages: list[dict]) -> str:
        return t.apply_chat_template(messages, tools=env.tools, add_generation_prompt=True, tokenize=False)

    def sequence(prompt: str, pieces: list[tuple[str | None, int]]) -> tuple[list[int], list[int]]:
        ids = enc(prompt)
        mask = [0] * len(ids)
        for text, m in pieces:  # None: the EOS token
            piece = [tok.eos_token_id] if text is None else enc(text)
            ids, mask = ids + piece, mask + [m] * len(piece)
        return ids, mask

    user = {"role": "user", "content": row["prompt"]}
    history3 = [user, {"role": "assistant", "content": think_call}, {"role": "tool", "name": "calc", "content": answer}]
    data = [
        sequence(render(tok, [user]), [(call, 1), (observation(answer), 0), (final, 1), (None, 1)]),
        sequence(render(tok, [{"role": "user", "content": BAD_PROMPT}]),
                 [(BAD, 1), (observation(ERR), 0), ("sorry", 1), (None, 1)]),
        sequence(render(tok3, [user]), [(think_call, 1)]),
        sequence(render(tok3, history3), [(final, 1), (None, 1)]),
    ]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    sft(model, data, pad=tok.pad_token_id)
    model.eval()
    yield types.SimpleNamespace(
        env=env, row=row, expr=expr, answer=answer, call=call, final=final, think_call=think_call, tok=tok,
        tok3=tok3, enc=enc, render=render, user=user, history3=history3, corpus=corpus, model=model,
        policy=Policy(model, tok, prompt_format="chat"), policy3=Policy(model, tok3, prompt_format="chat"))
    env.close()


def play(lab, policy, rows, **kw):
    rec = Recording(policy)
    settings = dict(n=1, max_turns=3, max_new_tokens=40, max_episode_tokens=200, greedy=True)
    settings.update(kw)
    return rec, run_episodes_flat(rec, lab.env, rows, **settings)


def assert_prefixes(rec, out):
    """At every turn the policy was given exactly its row's ids so far, and sampled exactly the turn's ids."""
    seen = 0
    for r in out:
        for a, b in r.turns:
            prompts, sampled = rec.calls[seen]
            assert prompts == [r.prompt_ids + r.completion_ids[:a]]
            assert sampled[0].ids == r.completion_ids[a:b] and sampled[0].logprobs == r.logprobs[a:b]
            seen += 1
    assert seen == len(rec.calls)


def assert_behaviour_logprobs(policy, out, temperature=1.0):
    """The behaviour log-probs are what the model gives the trained ids (no drift), and 0.0 off the sampled ids."""
    batch, old = rollout_batch(policy, out)
    with torch.no_grad():
        new, _ = policy.token_logprobs(batch, temperature=temperature)
    sampled = torch.zeros_like(old)
    for i, r in enumerate(out):
        sampled[i, : len(r.loss_mask)] = torch.tensor(r.loss_mask, dtype=torch.float32)
        assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.loss_mask) if not m)
    assert torch.allclose(new * sampled, old, atol=1e-4)


def assert_replay_rebuilds(policy, out, reward_output=None):
    """replay(episode_record(rows)), through JSON, gives the same packed tensors and credit inputs."""
    record = json.loads(json.dumps(episode_record(out, reward_output)))
    back = replay(record)
    (live_batch, live_old), (back_batch, back_old) = rollout_batch(policy, out), rollout_batch(policy, back)
    for field in ("input_ids", "attention_mask", "position_ids", "completion_ids", "mask"):
        assert torch.equal(getattr(live_batch, field), getattr(back_batch, field)), field
    assert torch.equal(live_old, back_old)
    width = live_batch.mask.shape[1]
    live_t, back_t = episode_tensors(out, width), episode_tensors(back, width)
    assert all(torch.equal(live_t[k], back_t[k]) for k in live_t)
    assert [(r.loss_mask, r.tool_calls, r.turns, r.termination) for r in back] == [
        (r.loss_mask, r.tool_calls, r.turns, r.termination) for r in out]


def test_the_tokenizer_keeps_the_tool_tags_as_text(lab):
    """As in Qwen2.5: each tag is one added token that is not special, so it stays in the model's decoded text."""
    ids = lab.enc("<tool_call>x</tool_call><|im_end|>")
    assert lab.tok.convert_ids_to_tokens(ids) == ["<tool_call>", "x", "</tool_call>", "<|im_end|>"]
    assert lab.tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_a_tool_episode_of_a_real_hf_model_is_token_exact_through_the_hermes_parser(lab):
    rec, out = play(lab, lab.policy, [lab.row])
    (r,) = out
    # the first prompt is the template's rendering of the question with the calc tool's schema
    assert r.prompt_ids == lab.enc(lab.render(lab.tok, [lab.user]))
    assert r.prompt.startswith("<|im_start|>system\nYou are Qwen") and '"name": "calc"' in r.prompt
    assert r.prompt.endswith(lab.row["prompt"] + "<|im_end|>\n<|im_start|>assistant\n")
    # the model called calc; the turn ended at the stop string, whose token was kept
    call, inserted = lab.enc(lab.call), lab.enc(observation(lab.answer))
    final = lab.enc(lab.final) + [lab.tok.eos_token_id]
    assert r.completion_ids == call + inserted + final
    assert r.turns == [(0, len(call)), (len(call) + len(inserted), len(r.completion_ids))]
    assert r.loss_mask == [1] * len(call) + [0] * len(inserted) + [1] * len(final)
    # the template's tokens after the stop string (it closes the turn with <|im_end|>) are not the model's
    after_stop = r.turns[0][1]
    assert lab.tok.convert_ids_to_tokens(r.completion_ids[after_stop]) == "<|im_end|>"
    assert r.loss_mask[after_stop] == 0 and r.logprobs[after_stop] == 0.0
    # the call was parsed and run, and the second turn was given the tool's output to read
    ((c,), none) = r.tool_calls
    assert (c["name"], c["arguments"], c["status"], none) == ("calc", {"expression": lab.expr}, "ok", [])
    assert len(rec.calls) == 2
    second_prompt = rec.calls[1][0][0]
    assert lab.tok.decode(second_prompt[len(r.prompt_ids) + len(call):]) == observation(lab.answer)
    assert f"<tool_response>\n{lab.answer}\n</tool_response>" in lab.tok.decode(second_prompt)
    assert_prefixes(rec, out)
    # the final model turn is the answer; the transcript holds the whole episode
    assert (r.completion, r.termination, r.truncated) == (lab.final, "stop", False)
    assert r.messages == [lab.user, {"role": "assistant", "content": lab.call},
                          {"role": "tool", "name": "calc", "content": lab.answer},
                          {"role": "assistant", "content": lab.final}]
    # the calculator's outcome reward scores the final turn (not the tool output it read)
    score = REWARDS[lab.env.reward](**lab.env.reward_options)
    (got,) = score(out)
    assert (got.score, got.components["correct"]) == (1.0, 1.0)
    assert_behaviour_logprobs(lab.policy, out)
    assert_replay_rebuilds(lab.policy, out, got)


def test_a_malformed_call_becomes_an_error_observation_and_the_episode_goes_on(lab):
    rec, out = play(lab, lab.policy, [{"prompt": BAD_PROMPT, "answer": "0"}])
    (r,) = out
    bad, inserted = lab.enc(BAD), lab.enc(observation(ERR))
    answer = lab.enc("sorry") + [lab.tok.eos_token_id]
    assert r.completion_ids == bad + inserted + answer
    assert r.loss_mask == [1] * len(bad) + [0] * len(inserted) + [1] * len(answer)
    ((c,), none) = r.tool_calls
    assert (c["name"], c["arguments"], c["status"], c["seconds"], none) == (None, "{bad json", "malformed", 0.0, [])
    assert r.messages[2] == {"role": "tool", "name": "", "content": ERR}
    assert (r.completion, r.termination, len(r.turns)) == ("sorry", "stop", 2)
    assert_prefixes(rec, out)
    assert_behaviour_logprobs(lab.policy, out)
    assert_replay_rebuilds(lab.policy, out)


def test_qwen3s_template_rewrites_the_reasoning_so_the_episode_continues_in_a_new_row(lab):
    # what the template does: a turn's reasoning is re-rendered in its own layout (here kept, multi-step tool turns)
    again = lab.render(lab.tok3, lab.history3)
    assert "<think>add</think>" not in again and "<|im_start|>assistant\n<think>\nadd\n</think>\n\n<tool_call>" in again
    rec, out = play(lab, lab.policy3, [lab.row])
    first, second = out
    assert first.episode_id == second.episode_id and (first.group, second.group) == (0, 0)
    # row 1: the question and the sampled call only (the template's next tokens belong to the new row's prompt)
    assert first.prompt_ids == lab.enc(lab.render(lab.tok3, [lab.user]))
    assert first.prompt.startswith("<|im_start|>system\n# Tools")
    assert first.completion_ids == lab.enc(lab.think_call) and set(first.loss_mask) == {1}
    assert first.turns == [(0, len(first.completion_ids))] and first.termination is None
    assert first.completion == lab.think_call and first.tool_calls[0][0]["status"] == "ok"
    # row 2: its prompt is the re-rendered history, which the model then conditioned on
    assert second.prompt_ids == lab.enc(again)
    assert second.prompt.endswith(lab.call + observation(lab.answer))
    assert second.completion_ids == lab.enc(lab.final) + [lab.tok.eos_token_id]
    assert second.first_turn == 1 and second.turns == [(0, len(second.completion_ids))]
    assert (second.completion, second.termination) == (lab.final, "stop")
    assert [m["content"] for m in second.messages] == [lab.row["prompt"], lab.think_call, lab.answer, lab.final]
    assert_prefixes(rec, out)
    score = REWARDS[lab.env.reward](**lab.env.reward_options)
    (got,) = score(out[-1:])  # the outcome is scored once, on the episode's last row
    assert got.score == 1.0
    assert_behaviour_logprobs(lab.policy3, out)
    assert_replay_rebuilds(lab.policy3, out, got)


def test_the_episode_token_figure_of_a_split_episode_is_what_max_episode_tokens_counts(lab):
    """The tool output and template tokens that a new row's prompt carries count as episode tokens: the figure is
    the smallest max_episode_tokens the episode fits in (it used to count the rows' completions only)."""
    _, out = play(lab, lab.policy3, [lab.row])
    first, second = out
    carried = len(second.prompt_ids) - len(first.prompt_ids) - len(first.completion_ids)
    tokens = episode_metrics([out])["episode/tokens_mean"]
    rewrite = len(lab.enc("<think>\nadd\n</think>\n\n")) - len(lab.enc("<think>add</think>"))
    assert carried == len(lab.enc(observation(lab.answer))) + rewrite  # the observation, the re-laid reasoning
    assert tokens == len(first.completion_ids) + carried + len(second.completion_ids)
    _, fits = play(lab, lab.policy3, [lab.row], max_episode_tokens=int(tokens))
    _, over = play(lab, lab.policy3, [lab.row], max_episode_tokens=int(tokens) - 1)
    assert [r.completion_ids for r in fits] == [r.completion_ids for r in out] and fits[-1].termination == "stop"
    assert over[-1].termination == "max_episode_tokens"


def test_qwen3s_template_appends_a_turn_whose_reasoning_is_in_its_own_layout(lab):
    """The same turn written as Qwen3 writes its reasoning is not rewritten: the row is only appended to."""
    renderer = make_renderer(lab.tok3, "chat", tools=lab.env.tools)
    row = renderer.start([lab.user])
    turn = "<think>\nadd\n</think>\n\n" + lab.call
    row = row + lab.enc(turn)
    tool = [{"role": "tool", "name": "calc", "content": lab.answer}]
    ids = renderer.extend(row, [lab.user, {"role": "assistant", "content": turn}], tool)
    assert ids is not None and lab.tok.decode(ids) == observation(lab.answer)


@pytest.mark.parametrize("qwen", ["qwen2_5", "qwen3"])
def test_sampled_episodes_of_a_real_hf_model_keep_the_contract_whatever_they_sample(lab, qwen):
    """Temperature 0.7, several episodes per question: whatever the model samples (calls, bad calls, cut turns, new
    rows), each turn was given its row's prefix, only sampled ids have mask 1, and their
    log-probs are the model's."""
    rows = [lab.row, {"prompt": BAD_PROMPT, "answer": "0"}]
    policy = lab.policy if qwen == "qwen2_5" else lab.policy3
    rec, out = play(lab, policy, rows, n=3, greedy=False, temperature=0.7, seed=0, max_new_tokens=30)
    assert sorted({r.episode_id for r in out}) == list(range(6)) and {r.group for r in out} == {0, 1}
    turns = 0
    for (prompts, sampled), streams in zip(rec.calls, rec.streams):
        for ids, s, (_, _, episode, _, turn) in zip(prompts, sampled, streams):
            (r,) = [r for r in out if r.episode_id == episode and r.first_turn <= turn < r.first_turn + len(r.turns)]
            a, b = r.turns[turn - r.first_turn]
            assert ids == r.prompt_ids + r.completion_ids[:a] and s.ids == r.completion_ids[a:b]
            turns += 1
    assert turns == sum(len(r.turns) for r in out)
    for r in out:
        assert [k for k, m in enumerate(r.loss_mask) if m] == [i for a, b in r.turns for i in range(a, b)]
        assert len(r.tool_calls) == len(r.turns)
    for k, r in enumerate(out):  # an episode's rows are consecutive; only its last has the termination
        last = k == len(out) - 1 or out[k + 1].episode_id != r.episode_id
        assert (r.termination is not None) == last
    assert_behaviour_logprobs(policy, out, temperature=0.7)


def test_tool_tags_that_are_special_tokens_are_refused_instead_of_losing_the_call(lab):
    """A tokenizer that marks the tags special (same ids, same model): decoding drops them, so the turn could never
    stop at `</tool_call>` and the parser would never see the call (the episode used to run on to max_new_tokens
    with no call recorded). `run_episodes` refuses it in one line instead."""
    special = build_tokenizer(lab.corpus, special_tags=True)
    assert [special.convert_tokens_to_ids(t) for t in TAGS] == [lab.tok.convert_tokens_to_ids(t) for t in TAGS]
    assert special.decode(lab.enc(lab.call), skip_special_tokens=True) == lab.call[len("<tool_call>"):-len(
        "</tool_call>")]
    policy = Policy(lab.model, special, prompt_format="chat")
    with pytest.raises(ValueError, match=r"^env stop string '</tool_call>': .*special tokens \(</tool_call>\)"):
        run_episodes_flat(policy, lab.env, [lab.row], n=1, max_turns=3, max_new_tokens=40, max_episode_tokens=200,
                          greedy=True)


def test_a_turn_that_fits_its_budget_exactly_is_kept_whole_and_one_token_less_is_cut(lab):
    call = lab.enc(lab.call)
    rec, (whole,) = play(lab, lab.policy, [lab.row], max_new_tokens=len(call))
    assert whole.completion_ids[: len(call)] == call and whole.turns[0] == (0, len(call))
    assert (whole.termination, whole.truncated, whole.tool_calls[0][0]["status"]) == ("stop", False, "ok")
    assert rec.calls[0][1][0].finish == "stop"
    rec, (cut,) = play(lab, lab.policy, [lab.row], max_new_tokens=len(call) - 1)
    assert cut.completion_ids == call[:-1] and cut.loss_mask == [1] * (len(call) - 1)
    assert (cut.termination, cut.truncated, cut.tool_calls) == ("max_new_tokens", True, [[]])  # the env never saw it
    assert rec.calls[0][1][0].finish == "length"


@pytest.mark.parametrize("cap", ["context", "episode"])
@pytest.mark.parametrize("room, kept", [
    ("all", "all"),  # everything fits exactly: the episode ends as the model ended it
    ("all-1", "all-1"),  # the final turn is cut one token short
    ("call+obs", "call+obs"),  # the observation fits exactly, and leaves no room for another turn
    ("call+obs-1", "call"),  # the observation would overflow: it is not appended
])
def test_the_context_window_and_the_episode_budget_bound_a_real_models_episode(lab, cap, room, kept):
    """Room (after the first prompt) for the whole episode, one token less, exactly the call and its observation,
    one token less: what is kept, and the termination, with the model's own context window (its config's
    max_position_embeddings) or max_episode_tokens as the cap."""
    call, obs = lab.enc(lab.call), lab.enc(observation(lab.answer))
    ids = {"call": call, "call+obs": call + obs, "all": call + obs + lab.enc(lab.final) + [lab.tok.eos_token_id]}
    ids["all-1"], ids["call+obs-1"] = ids["all"][:-1], ids["call+obs"][:-1]
    space = len(ids[room])
    config, window = lab.model.config, lab.model.config.max_position_embeddings
    try:
        if cap == "context":
            config.max_position_embeddings = len(lab.enc(lab.render(lab.tok, [lab.user]))) + space
            _, (r,) = play(lab, lab.policy, [lab.row])
        else:
            _, (r,) = play(lab, lab.policy, [lab.row], max_episode_tokens=space, max_new_tokens=len(call))
    finally:
        config.max_position_embeddings = window
    assert r.completion_ids == ids[kept]
    expected = "stop" if room == "all" else "context" if cap == "context" else "max_episode_tokens"
    assert (r.termination, r.truncated) == (expected, room != "all")


def test_train_runs_grpo_episodes_of_a_saved_hf_chat_model_on_the_calculator(lab, tmp_path):
    """`rewardlab train` on `env:calculator` (hermes calls) with the SFT'd model saved as a Hugging Face directory:
    every logged episode replays into rows whose first prompt is the template's rendering of its question with the
    calc tool, whose sampled tokens are exactly the turns, and whose tool calls the metrics count."""
    from rewardlab import rollout_log
    from rewardlab.config import TrainConfig, load_config
    from rewardlab.rl.trainer import train

    lab.model.save_pretrained(tmp_path / "model")
    lab.tok.save_pretrained(tmp_path / "model")
    cfg = load_config(TrainConfig, None, [
        "task.spec=env:calculator", "task.options.parser=hermes", "task.options.size=50", "task.options.test_size=5",
        f"model.path={tmp_path / 'model'}", "model.prompt_format=chat", f"out={tmp_path / 'run'}", "rl.steps=2",
        "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=40", "rl.sampling.temperature=0.7",
        "env.max_turns=3", "env.max_episode_tokens=200"])
    train(cfg, show_progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and len(records) == 8  # 2 steps x 2 questions x 2 episodes
    for step in (1, 2):
        mine = [r for r in records if r["step"] == step]
        calls = sum(len(c) for r in mine for c in r["tool_calls"])
        assert metrics[step - 1]["tool/calls_mean"] == calls / 4
    for record in records:
        rows = replay(record)
        user = {"role": "user", "content": record["row"]["prompt"]}
        assert rows[0].prompt_ids == lab.enc(lab.render(lab.tok, [user]))
        for r in rows:
            assert [k for k, m in enumerate(r.loss_mask) if m] == [i for a, b in r.turns for i in range(a, b)]
        assert record["completion"] == rows[-1].completion and record["termination"] == rows[-1].termination
    for step in (1, 2):  # the rollouts file: each episode's rows as sampled, its turns with their tool calls
        by_episode: dict[int, list[dict]] = {}
        for rec in rollout_log.read_step(tmp_path / "run", step).to_pylist():
            by_episode.setdefault(rec["episode"], []).append(rec)
        mine = [r for r in records if r["step"] == step]
        assert len(by_episode) == len(mine)
        for (_, logged), record in zip(sorted(by_episode.items()), mine):
            rows = replay(record)
            assert [r["token_ids"] for r in logged] == [r.completion_ids for r in rows]
            assert [r["loss_mask"] for r in logged] == [r.loss_mask for r in rows]
            turns = [t for r in logged for t in json.loads(r["turns"])]
            assert [t["tool_calls"] for t in turns] == record["tool_calls"]
            assert [t["span"] for t in turns] == [list(s) for r in rows for s in r.turns]
            assert logged[-1]["termination"] == record["termination"]
