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

Modules: `parse` (templates and reply parsing), `client` (the HTTP client with retries and the local backend),
`reward` (the `Judge` reward, registered on import).
"""

from rewardlab.rewards.judge.client import TRANSIENT_STATUS, HTTPChatClient, LocalJudgeModel
from rewardlab.rewards.judge.parse import (
    DEFAULT_TEMPLATE,
    MODES,
    TEMPLATES,
    JudgeError,
    choice_probability,
    parse_choice,
    parse_score,
    read_choice,
)
from rewardlab.rewards.judge.reward import Judge

__all__ = [
    "DEFAULT_TEMPLATE",
    "MODES",
    "TEMPLATES",
    "TRANSIENT_STATUS",
    "HTTPChatClient",
    "Judge",
    "JudgeError",
    "LocalJudgeModel",
    "choice_probability",
    "parse_choice",
    "parse_score",
    "read_choice",
]
