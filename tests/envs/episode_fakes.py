"""Fakes for the episode-loop tests: a recording scripted `TokenSampler`, a raw renderer over the tiny char tokenizer
(one token per character: id = ord(c) - 28 for printable ASCII, <s>=1, </s>=2, <unk>=3) and small environments."""

from __future__ import annotations

import re
from typing import Any

from rewardlab.envs.base import StepResult
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.types import Sampled

TOK = build_tokenizer()
BOS, EOS, UNK = 1, 2, 3


def enc(text: str) -> list[int]:
    """Char ids of `text` (no BOS): ord(c) - 28."""
    return TOK(text, add_special_tokens=False)["input_ids"]


#: ChatML on the tiny tokenizer (its <s> and </s> spelled out) that drops the text up to the last </think> of assistant
#: turns before the last user message, as Qwen3's template does: not append-only once an observation follows a turn
#: that reasoned.
THINK_STRIP = (
    "{% set ns = namespace(last=-1) %}"
    "{% for m in messages %}{% if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set c = m.content %}"
    "{% if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}"
    "<s>{{ m.role }}\n{{ c }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


class RecordedChat:
    """The real chat renderer (`rewardlab.envs.make_renderer(tok, "chat", raw_text=raw_text)`) over the tiny
    tokenizer with `template`, recording the prompts it starts (`starts`: the fake sampler's prefix check allows a
    restarted row)."""

    def __init__(self, template: str, raw_text: Any = None) -> None:
        from rewardlab.envs.render import make_renderer

        self.tokenizer = build_tokenizer()
        self.tokenizer.chat_template = template
        self.inner, self.starts = make_renderer(self.tokenizer, "chat", raw_text=raw_text), []

    def start(self, messages):
        ids = self.inner.start(messages)
        self.starts.append(list(ids))
        return ids

    def __getattr__(self, name):
        return getattr(self.inner, name)


class RawRenderer:
    """A raw renderer fake: a prompt is <s> + the messages' texts joined; a tool message renders as `open + content +
    close`; extend appends the new messages' texts. `split_at`: the extend calls (1-based, counted over the whole
    run) that answer None (a template that is not append-only there). Records every start() result."""

    def __init__(self, split_at: tuple[int, ...] = (), tool: tuple[str, str] = ("<o>", "</o>")) -> None:
        self.split_at, self.tool = set(split_at), tool
        self.starts: list[list[int]] = []
        self.extends = 0
        self.clips: list[tuple[str, int, str]] = []

    def _text(self, m: dict[str, Any]) -> str:
        return self.tool[0] + m["content"] + self.tool[1] if m["role"] == "tool" else m["content"]

    def start(self, messages: list[dict]) -> list[int]:
        ids = [BOS] + enc("".join(self._text(m) for m in messages))
        self.starts.append(ids)
        return ids

    def extend(self, row_ids: list[int], history: list[dict], new: list[dict]) -> list[int] | None:
        assert history[-1]["role"] == "assistant"
        self.extends += 1
        if self.extends in self.split_at:
            return None
        return enc("".join(self._text(m) for m in new))

    def turn_text(self, ids: list[int]) -> str:
        return TOK.decode(ids, skip_special_tokens=True)

    decode = turn_text

    def clip(self, text: str, max_tokens: int, keep: str = "start") -> str:
        self.clips.append((text, max_tokens, keep))
        if len(enc(text)) <= max_tokens:
            return text
        return text[: max_tokens - 1] + "~" if keep == "start" else "~" + text[len(text) - max_tokens + 1:]


class ScriptedSampler:
    """A recording `TokenSampler`: episode e's turn t (read from its stream (seed, step, e, round, t)) continues with
    `scripts[e][t]`, a text where "$" stands for EOS and "#" for <unk> (which decodes to nothing, so a loop that
    decoded and re-tokenized the history would lose it). Tokens are emitted one by one until EOS, a stop string in
    the new text, or the budget. Log-prob of the j-th token of episode e's turn t: -(e + 1) - t / 4 - j / 64 (exact
    binary fractions).

    At every call it asserts that each prompt extends the ids this episode's row had after its previous turn (its
    previous prompt + what was sampled), unless the renderer has just started a new row with exactly these ids.
    """

    def __init__(self, scripts: dict[int, list[str]], *, context_window: int | None = None,
                 renderer: RawRenderer | None = None) -> None:
        self.scripts, self.context_window, self.renderer = scripts, context_window, renderer
        self.eos_token_id = EOS
        self.calls: list[dict[str, Any]] = []
        self.prev: dict[int, list[int]] = {}

    @staticmethod
    def ids_of(text: str) -> list[int]:
        out = []
        for ch in text:
            out += [EOS] if ch == "$" else [UNK] if ch == "#" else enc(ch)
        return out

    def sample_ids(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, stop=None,
                   streams=None):
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        outs = []
        for ids, budget, stream in zip(prompts, budgets, streams):
            e, t = stream[2], stream[4]
            prev = self.prev.get(e)
            if prev is not None:
                restarted = self.renderer is not None and ids in self.renderer.starts
                assert ids[: len(prev)] == prev or restarted, f"episode {e} turn {t}: the prompt is not the row's prefix"
            script = self.ids_of(self.scripts[e][t])
            out, finish = [], None
            for tok in script:
                out.append(tok)
                if tok == EOS:
                    finish = "eos"
                elif stop and any(s in TOK.decode(out, skip_special_tokens=True) for s in stop):
                    finish = "stop"
                if finish is None and len(out) == budget:
                    finish = "length"
                if finish is not None:
                    break
            assert finish is not None, f"episode {e} turn {t}: the script ended without EOS, stop or budget"
            logprobs = [-(e + 1) - t / 4 - j / 64 for j in range(len(out))]
            outs.append(Sampled(out, logprobs, finish))
            self.prev[e] = list(ids) + out
        self.calls.append({"prompts": [list(p) for p in prompts], "budgets": list(budgets),
                           "streams": [tuple(s) for s in streams], "outs": outs, "stop": stop,
                           "temperature": temperature, "greedy": greedy})
        return outs


def assert_prefixes(sampler: ScriptedSampler, rollouts) -> None:
    """Every turn was sampled from exactly its row's prefix, and its sampled ids are the turn's span of the row."""
    by_episode: dict[int, list] = {}
    for r in rollouts:
        by_episode.setdefault(r.episode_id, []).append(r)
    seen = 0
    for call in sampler.calls:
        for ids, stream, out in zip(call["prompts"], call["streams"], call["outs"]):
            e, t = stream[2], stream[4]
            row = next(r for r in by_episode[e] if r.first_turn <= t < r.first_turn + len(r.turns))
            a, b = row.turns[t - row.first_turn]
            assert ids == row.prompt_ids + row.completion_ids[:a]
            assert out.ids == row.completion_ids[a:b]
            assert out.logprobs == row.logprobs[a:b]
            seen += 1
    assert seen == sum(len(r.turns) for r in rollouts)


class CalcEnv:
    """A tool env: an action with `<c>a+b</c>` gets a tool message with the sum (reward 0.5 for the call); an action
    without one ends the episode ("stop"; reward None). `results` overrides the tool output per call (in order).
    Counts its steps."""

    stop = ("</c>",)

    def __init__(self, results: list[Any] | None = None) -> None:
        self.results = list(results or [])
        self.steps = 0

    def reset(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"calls": 0}

    def step(self, state: dict[str, Any], action: str) -> StepResult:
        self.steps += 1
        m = re.search(r"<c>(.*?)</c>", action)
        if not m:
            return StepResult(None, True, None, {"termination": "stop", "tool_calls": []})
        state["calls"] += 1
        expr = m.group(1)
        if self.results:
            out = self.results.pop(0)
        else:
            out = [{"role": "tool", "name": "calc", "content": str(sum(int(x) for x in expr.split("+")))}]
        return StepResult(out, False, 0.5, {"tool_calls": [{"name": "calc", "arguments": {"expression": expr},
                                                            "status": "ok", "seconds": 0.0}]})


#: The options of one flat keyword set that `episode_args` sorts into the settings objects `run_episodes` takes.
EPISODE_KEYS = ("max_turns", "max_episode_tokens", "max_tool_tokens", "tool_keep")
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "greedy")


def episode_args(env: Any, **kw: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The tests' shorthand for `run_episodes`: (EpisodeSettings of `env`, SamplingSettings, the other keywords)
    from one flat set of options; seed, step and round become `stream`."""
    from rewardlab.envs import EpisodeSettings
    from rewardlab.policy.settings import SamplingSettings

    episodes = EpisodeSettings(env, **{k: kw.pop(k) for k in EPISODE_KEYS if k in kw})
    sampling = SamplingSettings(**{k: kw.pop(k) for k in SAMPLING_KEYS if k in kw})
    if {"seed", "step", "round"} & kw.keys():
        kw["stream"] = (kw.pop("seed", 0), kw.pop("step", 0), kw.pop("round", 0))
    return episodes, sampling, kw


def run_episodes_flat(policy: Any, env: Any, rows: Any, **kw: Any) -> list[Any]:
    """`run_episodes(policy, episodes, rows, sampling, ...)` with the settings sorted from flat options
    (`episode_args`)."""
    from rewardlab.envs import run_episodes

    episodes, sampling, rest = episode_args(env, **kw)
    return run_episodes(policy, episodes, rows, sampling, **rest)
