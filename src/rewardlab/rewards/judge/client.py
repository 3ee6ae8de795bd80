"""The LLM judge's backends: an OpenAI-compatible HTTP chat client with retries, and a local causal LM.

Both raise or return `JudgeError` (one line, the cause only) for a failed call; the API key is never logged or put in
an error text.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from rewardlab.rewards.judge.parse import CHOICES, SPELLINGS, JudgeError, short_repr

#: HTTP statuses worth retrying: request timeout, too early, rate limited, server errors.
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


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
                cause = f"HTTP {exc.code} from {self.url}: {short_repr(detail)}"  # no "; ": nodes join errors with it
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
            raise JudgeError(f"reply is not JSON: {short_repr(raw.decode('utf-8', 'replace'))}") from None


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
        for mode, (pos, neg) in CHOICES.items():
            firsts = [{ids[0] for s in SPELLINGS[c] if (ids := tok(s, add_special_tokens=False)["input_ids"])}
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
