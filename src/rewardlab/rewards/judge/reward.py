"""The LLM judge as a reward (registered as `judge`): renders the template per rollout, asks the backend, combines
verdicts (pairwise position swap) into `RewardOutput`s. Formulas: `rewardlab.rewards.judge`.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from rewardlab.rewards.base import register_reward
from rewardlab.rewards.judge.client import HTTPChatClient, LocalJudgeModel
from rewardlab.rewards.judge.parse import (
    DEFAULT_TEMPLATE,
    MODES,
    TEMPLATES,
    REQUIRED_FIELDS,
    JudgeError,
    choice_probability,
    parse_choice,
    parse_score,
    read_choice,
)
from rewardlab.types import Rollout, RewardOutput


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

    The constructor takes each option as its own keyword: a registered reward's keyword parameters are its
    declared options (`rewards:` config entries are checked against them by name), so they are not bundled.
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

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The row fields it cannot score without (read by the TRL adapter's column check): the template's fields
        other than the prompt, the completion(s) and the scale, and in pairwise mode `reference_field`."""
        own = {"prompt", "completion", "completion_a", "completion_b", "scale_min", "scale_max"}
        names = [re.split(r"[.\[]", f, maxsplit=1)[0] for _, f, _, _ in string.Formatter().parse(self.template) if f]
        fields = [n for n in names if n and not n.isdigit() and n not in own]
        if self.mode == "pairwise":
            fields.append(self.reference_field)
        return tuple(dict.fromkeys(fields))

    def __repr__(self) -> str:
        backend = repr(self.client) if self.client is not None else f"local {self.model!r}"
        return f"Judge(mode={self.mode!r}, {backend})"

    def _template(self, template: str | None) -> str:
        text = TEMPLATES[DEFAULT_TEMPLATE[self.mode]] if template is None else TEMPLATES.get(template, template)
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        except ValueError as exc:
            raise ValueError(f"judge.template: not a valid format string ({exc})") from None
        missing = [f for f in REQUIRED_FIELDS[self.mode] if f not in fields]
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
