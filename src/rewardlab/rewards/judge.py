"""LLM-as-a-judge rewards: an OpenAI-compatible chat endpoint or a local Hugging Face causal LM grades completions.

Registered as `judge`. Three modes (after Zheng et al. 2023, "Judging LLM-as-a-Judge with MT-Bench and Chatbot
Arena", arXiv 2306.05685, for pointwise grading, pairwise comparison and position swapping):

- `score`: the judge replies "Score: N" on a stated scale [lo, hi]; score = (N - lo) / (hi - lo) in [0, 1].
- `yes_no`: score = P(yes) = p(yes) / (p(yes) + p(no)) from the first reply token's log-probs when the server returns
  `top_logprobs` (or from a local model's next-token distribution), else 1.0 / 0.0 from a "Yes" / "No" reply.
- `pairwise`: P(A better than B) likewise from tokens "A" / "B" (or a "[[A]]" / "[[B]]" / bare "A" / "B" reply). With
  `swap` (default) both orders are asked and P = (P(a > b | a shown first) + 1 - P(b > a | b shown first)) / 2,
  which cancels the judge's position bias to first order. As a reward it compares each completion with the
  reference response in a row field; `Judge.judge_pair(prompt, a, b)` serves reward-model evaluation.

A reply that cannot be parsed, an HTTP error, a timeout or a connection failure is `RewardOutput.error`
("judge: <cause>"), never a score. Transient failures (HTTP 408, 425, 429, 5xx, timeouts, refused or reset
connections) are retried with exponential backoff. HTTP requests run concurrently, at most `max_concurrency` at
once. The API key is read from the environment variable named by `api_key_env` and is never logged or put in an
error text.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import math
import os
import re
import string
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from rewardlab.rewards.base import register_reward
from rewardlab.types import Rollout, RewardOutput

MODES = ("score", "yes_no", "pairwise")

#: Built-in rubric templates (`template: NAME`); a custom template is any `str.format` string over the same fields.
TEMPLATES: dict[str, str] = {
    "score": (
        "Evaluate the response to the task below.\n\n[Task]\n{prompt}\n\n[Response]\n{completion}\n\n"
        "Rate how correct and helpful the response is on a scale from {scale_min} (worst) to {scale_max} (best). "
        'Reply with "Score: <number>" and nothing else.'
    ),
    "score_reference": (
        "Evaluate the response to the task below against the reference answer.\n\n[Task]\n{prompt}\n\n"
        "[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\n"
        "Rate how well the response's answer agrees with the reference on a scale from {scale_min} (wrong) to "
        '{scale_max} (fully correct). Reply with "Score: <number>" and nothing else.'
    ),
    "yes_no": (
        "[Task]\n{prompt}\n\n[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\n"
        "Is the response's final answer correct, that is, equivalent to the reference answer? Answer Yes or No."
    ),
    "yes_no_solved": (
        "[Task]\n{prompt}\n\n[Response]\n{completion}\n\n"
        "Does the response solve the task completely and correctly? Answer Yes or No."
    ),
    "pairwise": (
        "[Task]\n{prompt}\n\n[Response A]\n{completion_a}\n\n[Response B]\n{completion_b}\n\n"
        "Which response answers the task better? Answer A or B."
    ),
}
DEFAULT_TEMPLATE = {"score": "score", "yes_no": "yes_no", "pairwise": "pairwise"}
_REQUIRED_FIELDS = {"score": ("completion",), "yes_no": ("completion",), "pairwise": ("completion_a", "completion_b")}

#: HTTP statuses worth retrying: request timeout, too early, rate limited, server errors.
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

#: The two answers of each probabilistic mode, as normalized first tokens, and their spellings for a local tokenizer.
_CHOICES = {"yes_no": ("yes", "no"), "pairwise": ("a", "b")}
_SPELLINGS = {"yes": ("Yes", "yes", "YES", " Yes", " yes"), "no": ("No", "no", "NO", " No", " no"),
              "a": ("A", " A"), "b": ("B", " B")}

# "Score: 7", "score=7", "**Score:** 7", "**Score**: 7". Each run of spaces or stars belongs to one group only:
# the older `score\s*[:=]?\s*\**\s*` let three `\s*` share a run of spaces and backtracked cubically (a reply of
# "Score" and 1,000 spaces took 4 s to reject, 4,000 spaces minutes).
_SCORE_RE = re.compile(r"score\s*(?:\*+\s*)?(?:[:=]\s*(?:\*+\s*)?)?(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:\.\s*)?")
_VERDICT_RE = re.compile(r"\[\[\s*([AB])\s*\]\]")


class JudgeError(RuntimeError):
    """A judge call failed: bad reply, HTTP error, timeout. The message is one line, the cause only."""


def _short(text: str, n: int = 80) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= n else text[: n - 3] + "...")


# ---------------------------------------------------------------------------------------------- reply parsing
def parse_score(text: str, lo: float, hi: float) -> float:
    """The number after the last "Score:" in `text` (or `text` itself when it is a bare number), checked to lie on
    the scale [lo, hi]. Raises JudgeError otherwise."""
    found = _SCORE_RE.findall(text or "")
    if found:
        value = float(found[-1])
    else:
        bare = _NUMBER_RE.fullmatch(text or "")
        if bare is None:
            raise JudgeError(f"cannot parse a score from reply {_short(text)}")
        value = float(bare.group(1))
    if not lo <= value <= hi:  # also a number too long for a float (inf)
        raise JudgeError(f"score {value:g} is outside the scale [{lo:g}, {hi:g}] (reply {_short(text)})")
    return value


def parse_choice(text: str, mode: str) -> float:
    """1.0 / 0.0 for a "Yes" / "No" reply (yes_no) or an "A" / "B" verdict (pairwise: "[[A]]" anywhere, or a reply
    that is just the letter). Raises JudgeError for anything else."""
    text = text or ""
    if mode == "pairwise":
        found = _VERDICT_RE.findall(text)
        letter = found[-1] if found else None
        if letter is None:
            bare = re.fullmatch(r"\W*([ABab])\W*", text)
            letter = bare.group(1).upper() if bare else None
        if letter is None:
            raise JudgeError(f"cannot parse A or B from reply {_short(text)}")
        return 1.0 if letter == "A" else 0.0
    word = re.match(r"\W*(\w+)", text)
    answer = word.group(1).lower() if word else ""
    if answer not in ("yes", "no"):
        raise JudgeError(f"cannot parse Yes or No from reply {_short(text)}")
    return 1.0 if answer == "yes" else 0.0


def choice_probability(top_logprobs: Sequence[tuple[str, float]], mode: str) -> float:
    """p(first) / (p(first) + p(second)) over the first reply token's top log-probs (natural log), where first /
    second are "yes" / "no" (yes_no) or "a" / "b" (pairwise) after stripping spaces and punctuation and lower-casing
    each token; each distinct token counts once. Raises JudgeError when neither appears, or when a counted log-prob
    is NaN or above 1e-6 (not a log-probability; values in (0, 1e-6] are rounding and count as 0)."""
    pos, neg = _CHOICES[mode]
    mass = {pos: 0.0, neg: 0.0}
    seen = set()
    for token, logprob in top_logprobs:
        if token in seen:
            continue
        seen.add(token)
        key = token.strip().strip(".,:;!?*[]()\"'").lower()
        if key in mass:
            if not logprob <= 1e-6:  # NaN, +inf or a positive log-probability: exp() would give no probability
                raise JudgeError(f"top log-prob of token {_short(token)} is {logprob!r}, not a log-probability")
            mass[key] += math.exp(min(logprob, 0.0))
    total = mass[pos] + mass[neg]
    if total <= 0:
        raise JudgeError(f"neither {pos!r} nor {neg!r} among the {len(seen)} top log-probs of the first token")
    return mass[pos] / total


# ---------------------------------------------------------------------------------------------- backends
class HTTPChatClient:
    """POST `{base_url}/v1/chat/completions` (OpenAI-compatible: vLLM, SGLang, llama.cpp, OpenAI) with retries.

    Args:
        base_url: server root, e.g. "http://127.0.0.1:8000" (a trailing "/v1" is accepted too).
        api_key: sent as "Authorization: Bearer ..." when given; kept private (not in repr or errors).
        timeout: seconds per attempt (connect and read).
        retries: extra attempts after a transient failure (HTTP 408/425/429/5xx, timeout, refused/reset connection).
        backoff: seconds before the first retry, doubling after each.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 60.0, retries: int = 2,
                 backoff: float = 0.5) -> None:
        root = base_url.rstrip("/")
        self.url = (root if root.endswith("/v1") else root + "/v1") + "/chat/completions"
        self._api_key = api_key
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)

    def __repr__(self) -> str:
        return f"HTTPChatClient({self.url!r}, timeout={self.timeout}, retries={self.retries})"

    def post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The decoded JSON reply. Raises JudgeError (after the retries, for transient failures)."""
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempts = self.retries + 1
        for attempt in range(attempts):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                break
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:200].decode("utf-8", "replace")
                cause = f"HTTP {exc.code} from {self.url}: {_short(detail)}"  # no "; ": nodes join errors with it
                if exc.code not in TRANSIENT_STATUS:
                    raise JudgeError(cause) from None
            except (TimeoutError, urllib.error.URLError, ConnectionError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", exc)
                if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                    cause = f"timed out after {self.timeout:g} s at {self.url}"
                else:
                    cause = f"connection to {self.url} failed: {type(reason).__name__}: {reason}"
            if attempt + 1 < attempts:
                time.sleep(self.backoff * 2**attempt)
        else:
            raise JudgeError(f"{cause} [{attempts} attempt{'s' if attempts > 1 else ''}]")
        try:
            return json.loads(raw)
        except ValueError:
            raise JudgeError(f"reply is not JSON: {_short(raw.decode('utf-8', 'replace'))}") from None


def read_choice(reply: Mapping[str, Any]) -> tuple[str, list[tuple[str, float]] | None]:
    """The first choice's text and its first token's top log-probs ([(token, logprob)], None when absent)."""
    try:
        choice = reply["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise JudgeError(f"unexpected reply shape (no choices[0].message): {_short(json.dumps(reply))}") from None
    if not isinstance(text, str):
        raise JudgeError(f"unexpected reply shape (choices[0].message.content is a {type(text).__name__}, not text): "
                         f"{_short(json.dumps(reply))}")
    try:
        content = (choice.get("logprobs") or {}).get("content") or []
        if not content:
            return text, None
        first = content[0]
        top = [(str(t["token"]), float(t["logprob"])) for t in first.get("top_logprobs") or []]
        if "token" in first and "logprob" in first:
            top.append((str(first["token"]), float(first["logprob"])))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise JudgeError(f"unexpected logprobs shape: {_short(json.dumps(choice.get('logprobs')))}") from None
    return text, top


class LocalJudgeModel:
    """A local causal LM as the judge, loaded with `rewardlab.policy.load_policy` ("tiny" or an HF path).

    The system text, when given, is prepended to the user text; the result is formatted like a policy prompt
    (the chat template when the tokenizer has one). Scores come from greedy generation; probabilities from the
    next-token distribution after the prompt: P(first) = sum_{t in T1} p(t) / (sum_{t in T1} p(t) + sum_{t in T2}
    p(t)), with T1 / T2 the first tokens of the spellings of the two answers ("Yes", " yes", ...), minus the
    tokens they share.
    """

    def __init__(self, path: str, **load_options: Any) -> None:
        from rewardlab.policy import load_policy  # torch and transformers only when a local judge is used

        self.policy = load_policy(path, key="judge.model", **load_options)
        self.policy.model.eval()
        tok = self.policy.tokenizer
        self.token_ids: dict[str, tuple[list[int], list[int]]] = {}
        for mode, (pos, neg) in _CHOICES.items():
            firsts = [{ids[0] for s in _SPELLINGS[c] if (ids := tok(s, add_special_tokens=False)["input_ids"])}
                      for c in (pos, neg)]
            shared = firsts[0] & firsts[1]
            self.token_ids[mode] = (sorted(firsts[0] - shared), sorted(firsts[1] - shared))

    def generate(self, texts: Sequence[str], max_tokens: int) -> list[str]:
        outs = self.policy.generate(list(texts), greedy=True, max_new_tokens=max_tokens)
        return [o.completion for o in outs]

    def probabilities(self, texts: Sequence[str], mode: str) -> list[float | JudgeError]:
        import torch

        pos_ids, neg_ids = self.token_ids[mode]
        if not pos_ids or not neg_ids:
            return [JudgeError(f"the tokenizer has no distinct first token for the {mode} answers")] * len(texts)
        p = self.policy
        ids = [p.encode_prompt(p.format_prompt(t)) for t in texts]
        batch = p.collate(ids, [[] for _ in ids])
        P = batch.prompt_len
        with torch.inference_mode():
            logits = p.model(input_ids=batch.input_ids[:, :P], attention_mask=batch.attention_mask[:, :P],
                             position_ids=batch.position_ids[:, :P]).logits[:, -1].float()
        probs = torch.softmax(logits, dim=-1)
        pos, neg = probs[:, pos_ids].sum(-1).tolist(), probs[:, neg_ids].sum(-1).tolist()
        return [a / (a + b) if a + b > 0 else JudgeError(f"zero probability on both {mode} answers")
                for a, b in zip(pos, neg)]


# ---------------------------------------------------------------------------------------------- the reward
class Judge:
    """An LLM judge as a `Reward` (registered as `judge`). Score range [0, 1] in every mode.

    Args:
        mode: "score", "yes_no" or "pairwise" (see the module docstring for each formula).
        template: a built-in template name (`TEMPLATES`: score, score_reference, yes_no, yes_no_solved, pairwise)
            or a `str.format` string. Fields: `prompt` (the task prompt), `completion`, `answer`, every task-row
            field, `scale_min` / `scale_max`; pairwise: `completion_a`, `completion_b` instead of `completion`.
            Literal braces are doubled. Default: the mode's built-in template.
        system: an optional system message.
        scale: [lo, hi] of the score mode (default [1, 10]); a reply off the scale is an error.
        base_url: an OpenAI-compatible server (selects the HTTP backend).
        model: with base_url, the served model name (required); without it, a local model path or "tiny".
        model_options: keyword options of `load_policy` for a local model (tiny_arch, seed, device, dtype, ...).
        api_key_env: name of the environment variable holding the API key (read once, at construction).
        timeout: seconds per HTTP attempt (default 60). retries: extra attempts on transient failures (default 2).
        backoff: seconds before the first retry, doubling (default 0.5).
        max_concurrency: HTTP requests in flight at once (default 8).
        max_tokens: reply token limit (default 64 for score, 4 otherwise).
        temperature: sampling temperature of the judge (default 0).
        logprobs: request `logprobs` / `top_logprobs` in yes_no and pairwise modes (default True); when the server
            returns none, the reply text is parsed instead. top_logprobs: how many (default 20, OpenAI's maximum).
        reference_field: pairwise reward: the row field holding the response each completion is compared with.
        swap: pairwise: also ask with the order swapped and average (default True).
        request_options: extra JSON fields of each request (e.g. {seed: 0}).
    Raises:
        ValueError: an unknown mode, a template without the mode's required fields, a bad scale, no backend, or an
            `api_key_env` that is not set.
    """

    name = "judge"

    def __init__(
        self,
        *,
        mode: str = "score",
        template: str | None = None,
        system: str | None = None,
        scale: Sequence[float] = (1, 10),
        base_url: str | None = None,
        model: str | None = None,
        model_options: Mapping[str, Any] | None = None,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_concurrency: int = 8,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        logprobs: bool = True,
        top_logprobs: int = 20,
        reference_field: str = "reference",
        swap: bool = True,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"judge.mode: expected one of {MODES}, got {mode!r}")
        self.mode = mode
        self.template = self._template(template)
        self.system = system
        if len(scale) != 2 or not float(scale[0]) < float(scale[1]) or not math.isfinite(float(scale[1]) -
                                                                                       float(scale[0])):
            raise ValueError(f"judge.scale: expected [lo, hi] with lo < hi, both finite, got {scale!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"judge.max_concurrency: expected an integer >= 1, got {max_concurrency!r}")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"judge.retries: expected an integer >= 0, got {retries!r}")
        if not timeout > 0:
            raise ValueError(f"judge.timeout: expected seconds > 0, got {timeout!r}")
        self.max_concurrency = max_concurrency
        self.max_tokens = max_tokens or (64 if mode == "score" else 4)
        self.temperature, self.logprobs, self.top_logprobs = float(temperature), bool(logprobs), int(top_logprobs)
        self.reference_field, self.swap = reference_field, bool(swap)
        self.request_options = dict(request_options or {})
        self.model = model
        self.client: HTTPChatClient | None = None
        self.local: LocalJudgeModel | None = None
        if base_url is not None:
            if not model:
                raise ValueError("judge.model: the served model name is required with base_url")
            api_key = None
            if api_key_env is not None:
                api_key = os.environ.get(api_key_env)
                if not api_key:
                    raise ValueError(f"judge.api_key_env: environment variable {api_key_env!r} is not set")
            self.client = HTTPChatClient(base_url, api_key=api_key, timeout=timeout, retries=retries,
                                         backoff=backoff)
        elif model is not None:
            self.local = LocalJudgeModel(model, **dict(model_options or {}))
        else:
            raise ValueError("judge: give base_url (an OpenAI-compatible server) or model (a local model path)")

    def __repr__(self) -> str:
        backend = repr(self.client) if self.client is not None else f"local {self.model!r}"
        return f"Judge(mode={self.mode!r}, {backend})"

    def _template(self, template: str | None) -> str:
        text = TEMPLATES[DEFAULT_TEMPLATE[self.mode]] if template is None else TEMPLATES.get(template, template)
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        except ValueError as exc:
            raise ValueError(f"judge.template: not a valid format string ({exc})") from None
        missing = [f for f in _REQUIRED_FIELDS[self.mode] if f not in fields]
        if missing:
            hint = f"; built-in templates: {', '.join(TEMPLATES)}" if not fields else ""
            raise ValueError(f"judge.template: a {self.mode} template must contain "
                             f"{', '.join('{' + f + '}' for f in missing)}{hint}")
        return text

    # ------------------------------------------------------------------ prompts
    def _render(self, fields: Mapping[str, Any]) -> str:
        values = {"scale_min": f"{self.scale[0]:g}", "scale_max": f"{self.scale[1]:g}", **fields}
        try:
            return self.template.format_map(values)
        except KeyError as exc:
            raise JudgeError(f"template field {exc.args[0]!r} is not in the task row") from None
        except (IndexError, ValueError) as exc:
            raise JudgeError(f"template cannot be filled: {exc}") from None

    def _messages(self, text: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": text}]

    # ------------------------------------------------------------------ running
    def _ask_http(self, text: str) -> tuple[float, dict[str, float]]:
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(text),
                                "temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.mode != "score" and self.logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        body.update(self.request_options)
        reply_text, top = read_choice(self.client.post(body))
        return self._verdict(reply_text, top)

    def _verdict(self, text: str, top: list[tuple[str, float]] | None) -> tuple[float, dict[str, float]]:
        if self.mode == "score":
            lo, hi = self.scale
            raw = parse_score(text, lo, hi)
            return (raw - lo) / (hi - lo), {"judge_raw": raw}
        if top:
            return choice_probability(top, self.mode), {"from_logprobs": 1.0}
        return parse_choice(text, self.mode), {"from_logprobs": 0.0}

    def _run(self, texts: Sequence[str | JudgeError]) -> list[tuple[float, dict[str, float]] | JudgeError]:
        """One verdict (value, components) or a JudgeError per rendered prompt (a JudgeError passes through)."""
        todo = [i for i, t in enumerate(texts) if isinstance(t, str)]
        results: list[Any] = list(texts)
        if not todo:
            return results
        if self.client is not None:
            def ask(i: int) -> Any:
                try:
                    return self._ask_http(texts[i])
                except JudgeError as exc:
                    return exc
                except Exception as exc:  # noqa: BLE001 - one failed request must not sink the batch
                    return JudgeError(f"{type(exc).__name__}: {exc}")

            with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(todo)),
                                                       thread_name_prefix="judge") as pool:
                for i, value in zip(todo, pool.map(ask, todo)):
                    results[i] = value
            return results
        prompts = [self._local_text(texts[i]) for i in todo]
        try:
            if self.mode == "score":
                replies = self.local.generate(prompts, self.max_tokens)
            else:
                probabilities = self.local.probabilities(prompts, self.mode)
        except Exception as exc:  # noqa: BLE001 - e.g. a prompt longer than the model's context
            cause = JudgeError(f"local model failed: {type(exc).__name__}: {exc}".splitlines()[0])
            for i in todo:
                results[i] = cause
            return results
        if self.mode == "score":
            for i, reply in zip(todo, replies):
                try:
                    results[i] = self._verdict(reply, None)
                except JudgeError as exc:
                    results[i] = exc
        else:
            for i, p in zip(todo, probabilities):
                results[i] = p if isinstance(p, JudgeError) else (p, {"from_logprobs": 1.0})
        return results

    def _local_text(self, text: str) -> str:
        return f"{self.system}\n\n{text}" if self.system else text

    def _pair_texts(self, prompt: str, a: str, b: str, extra: Mapping[str, Any]) -> list[str | JudgeError]:
        orders = [(a, b), (b, a)] if self.swap else [(a, b)]
        out: list[str | JudgeError] = []
        for first, second in orders:
            try:
                out.append(self._render({**extra, "prompt": prompt, "completion_a": first, "completion_b": second}))
            except JudgeError as exc:
                out.append(exc)
        return out

    def _combine_pair(self, verdicts: Sequence[Any]) -> tuple[float, dict[str, float]] | JudgeError:
        for v in verdicts:
            if isinstance(v, JudgeError):
                return v
        p = verdicts[0][0] if len(verdicts) == 1 else (verdicts[0][0] + 1.0 - verdicts[1][0]) / 2
        comps = dict(verdicts[0][1])
        if len(verdicts) == 2:
            comps["p_first_order"], comps["p_swapped_order"] = verdicts[0][0], 1.0 - verdicts[1][0]
        return p, comps

    def judge_pairs(self, items: Sequence[tuple[str, str, str]]) -> list[float]:
        """P(a is better than b) for each (prompt, a, b), in [0, 1] (pairwise mode; swapped and averaged when
        `swap`). Raises JudgeError naming the first failed pair; ValueError outside pairwise mode."""
        if self.mode != "pairwise":
            raise ValueError(f"judge_pairs needs mode 'pairwise', this judge's mode is {self.mode!r}")
        per = 2 if self.swap else 1
        texts = [t for prompt, a, b in items for t in self._pair_texts(prompt, a, b, {})]
        verdicts = self._run(texts)
        out = []
        for k in range(len(items)):
            v = self._combine_pair(verdicts[k * per:(k + 1) * per])
            if isinstance(v, JudgeError):
                raise JudgeError(f"pair {k}: {v}")
            out.append(v[0])
        return out

    def judge_pair(self, prompt: str, a: str, b: str) -> float:
        """P(completion `a` is better than `b` for `prompt`), in [0, 1]. See `judge_pairs`."""
        return self.judge_pairs([(prompt, a, b)])[0]

    def __call__(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        per = 2 if self.mode == "pairwise" and self.swap else 1
        texts: list[str | JudgeError] = []
        for r in rollouts:
            fields = {**r.row, "prompt": r.row.get("prompt", r.prompt), "completion": r.completion,
                      "answer": r.row.get("answer")}
            if self.mode == "pairwise":
                if self.reference_field not in r.row:
                    texts.extend([JudgeError(f"the task row has no field {self.reference_field!r} to compare "
                                             "with")] * per)
                    continue
                texts.extend(self._pair_texts(fields["prompt"], r.completion, str(r.row[self.reference_field]),
                                              fields))
            else:
                try:
                    texts.append(self._render(fields))
                except JudgeError as exc:
                    texts.append(exc)
        verdicts = self._run(texts)
        outputs = []
        for k in range(len(rollouts)):
            group = verdicts[k * per:(k + 1) * per]
            v = self._combine_pair(group) if self.mode == "pairwise" else group[0]
            if isinstance(v, JudgeError):
                outputs.append(RewardOutput(score=0.0, error=f"judge: {v}".splitlines()[0]))
            else:
                outputs.append(RewardOutput(score=v[0], components=v[1]))
        return outputs


register_reward("judge")(Judge)
