"""The LLM judge against a real HTTP server on 127.0.0.1 with canned replies, and against the local tiny model."""

import math
import socket
import threading

import pytest
import torch

from conftest import TINY_ARCH, make_rollout
from judge_fakes import JudgeServer, chat
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.judge import Judge, JudgeError, choice_probability, parse_choice, parse_score


#: The row a judged rollout gets when a test names none.
QA = {"prompt": "What is 3+4?", "answer": "7"}


@pytest.fixture
def server(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    s = JudgeServer()
    s.thread.start()
    yield s
    s.release.set()
    s.httpd.shutdown()
    s.httpd.server_close()


def judge(server, **options):
    return Judge(base_url=server.url, model="judge-model", backoff=0.0, **options)


# ---------------------------------------------------------------------------------------------- score mode
def test_score_mode_parses_and_normalizes(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sk-secret-123")
    server.routes = {"RESP-7": [(200, chat("The answer is right.\nScore: 7"))],
                     "RESP-X": [(200, chat("I think it is quite good"))],
                     "RESP-11": [(200, chat("Score: 11"))]}
    j = judge(server, api_key_env="JUDGE_KEY_FOR_TEST", system="You are a strict grader.")
    seven, unparsable, off_scale = j([make_rollout(c, QA) for c in ("RESP-7", "RESP-X", "RESP-11")])
    assert seven.score == pytest.approx(2 / 3) and seven.error is None  # (7 - 1) / (10 - 1)
    assert seven.components == {"judge_raw": 7.0}
    assert unparsable.score == 0.0
    assert unparsable.error == "judge: cannot parse a score from reply 'I think it is quite good'"
    assert off_scale.error == "judge: score 11 is outside the scale [1, 10] (reply 'Score: 11')"
    path, headers, body = next(r for r in server.requests if "RESP-7" in r[2]["messages"][-1]["content"])
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-secret-123"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 64
    assert body["messages"][0] == {"role": "system", "content": "You are a strict grader."}
    user = body["messages"][1]["content"]
    assert "What is 3+4?" in user and "RESP-7" in user and "from 1 (worst) to 10 (best)" in user
    assert "logprobs" not in body
    assert "sk-secret-123" not in repr(j) and all("sk-secret" not in (o.error or "") for o in (unparsable, off_scale))


def test_custom_template_scale_and_row_fields(server):
    server.routes = {"GRADE": [(200, chat("3"))]}  # a bare number is accepted
    j = judge(server, template="GRADE {topic}: {completion} vs {answer} on {scale_min}-{scale_max}", scale=[0, 4])
    ok, missing = j([make_rollout("c", {"topic": "sums", "answer": "7"}), make_rollout("c", {"answer": "7"})])
    assert ok.score == pytest.approx(0.75)  # (3 - 0) / (4 - 0)
    assert server.requests[0][2]["messages"][0]["content"] == "GRADE sums: c vs 7 on 0-4"
    assert missing.error == "judge: template field 'topic' is not in the task row"


# ---------------------------------------------------------------------------------------------- HTTP failures
def test_transient_500_is_retried_then_succeeds(server):
    server.routes = {"FLAKY": [(500, {"error": "busy"}), (200, chat("Score: 10"))]}
    (out,) = judge(server, retries=2)([make_rollout("FLAKY", QA)])
    assert out.score == 1.0 and out.error is None  # (10 - 1) / 9
    assert server.count("FLAKY") == 2


def test_persistent_500_is_an_error_after_all_attempts(server):
    server.routes = {"DOWN": [(503, {"error": "down"})]}
    (out,) = judge(server, retries=2)([make_rollout("DOWN", QA)])
    assert out.score == 0.0
    assert out.error == (f'judge: HTTP 503 from {server.url}/v1/chat/completions: \'{{"error": "down"}}\' '
                         "[3 attempts]")
    assert server.count("DOWN") == 3  # 1 + 2 retries


def test_client_error_is_not_retried(server):
    server.routes = {"BAD": [(400, {"error": "bad request"})]}
    (out,) = judge(server, retries=3)([make_rollout("BAD", QA)])
    assert out.error.startswith("judge: HTTP 400 from ") and server.count("BAD") == 1


def test_timeout_is_an_error(server):
    def slow(body):
        server.release.wait(5)
        return 200, chat("Score: 5")

    server.routes = {"SLOW": [slow]}
    (out,) = judge(server, timeout=0.2, retries=0)([make_rollout("SLOW", QA)])
    assert out.error == f"judge: timed out after 0.2 s at {server.url}/v1/chat/completions [1 attempt]"


def test_non_json_reply_and_bad_shapes_are_errors(server):
    bad_logprobs = chat("Yes")
    bad_logprobs["choices"][0]["logprobs"] = {"content": [{"top_logprobs": [{"logprob": -1.0}]}]}  # no token
    server.routes = {"RAW": [(200, b"oops")], "SHAPE": [(200, {"choices": []})], "BADLP": [(200, bad_logprobs)]}
    raw, shape, lp = judge(server, mode="yes_no")([make_rollout(c, QA) for c in ("RAW", "SHAPE", "BADLP")])
    assert raw.error == "judge: reply is not JSON: 'oops'"
    assert shape.error == "judge: unexpected reply shape (no choices[0].message): '{\"choices\": []}'"
    assert lp.error == "judge: unexpected logprobs shape: '{\"content\": [{\"top_logprobs\": [{\"logprob\": -1.0}]}]}'"


def test_refused_connection_is_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    (out,) = Judge(base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=1, backoff=0.0)([make_rollout("x", QA)])
    assert out.error.startswith(f"judge: connection to http://127.0.0.1:{port}/v1/chat/completions failed: "
                                "ConnectionRefusedError")
    assert out.error.endswith(" [2 attempts]")


def test_requests_run_concurrently_up_to_the_limit(server):
    barrier = threading.Barrier(3, timeout=10)  # passes only when 3 requests are in flight together
    state = {"now": 0, "peak": 0}

    def gathered(body):
        with server.lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            barrier.wait()
            reply = (200, chat("Score: 4"))
        except threading.BrokenBarrierError:
            reply = (400, {"error": "requests were not concurrent"})
        with server.lock:
            state["now"] -= 1
        return reply

    server.routes = {"CONC": [gathered]}
    outs = judge(server, max_concurrency=3)([make_rollout(f"CONC-{k}", QA) for k in range(6)])
    assert [o.error for o in outs] == [None] * 6 and [o.score for o in outs] == pytest.approx([1 / 3] * 6)  # 3/9
    assert state["peak"] == 3  # never more than max_concurrency in flight


# ---------------------------------------------------------------------------------------------- yes / no
def test_yes_no_probability_from_top_logprobs(server):
    top = [("Yes", 0.6), (" yes", 0.1), ("No", 0.2), ("Maybe", 0.05)]
    server.routes = {"LP": [(200, chat("Yes", top))], "TEXT": [(200, chat("No."))],
                     "NONE": [(200, chat("Maybe", [("Maybe", 0.9), ("Perhaps", 0.1)]))]}
    lp, text, none = judge(server, mode="yes_no")([make_rollout(c, QA) for c in ("LP", "TEXT", "NONE")])
    assert lp.score == pytest.approx(0.7 / 0.9)  # (0.6 + 0.1) / (0.6 + 0.1 + 0.2)
    assert lp.components == {"from_logprobs": 1.0}
    assert text.score == 0.0 and text.components == {"from_logprobs": 0.0}  # no log-probs returned: the text
    assert none.error == "judge: neither 'yes' nor 'no' among the 2 top log-probs of the first token"
    body = server.requests[0][2]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 4
    assert "Reference answer]\n7" in body["messages"][0]["content"]  # the yes_no template shows the answer


# ---------------------------------------------------------------------------------------------- pairwise
def _pairwise_route(body):
    """P(A) = 0.8 when GOOD is shown first, 0.3 when BAD is shown first."""
    content = body["messages"][-1]["content"]
    p_a = 0.8 if content.index("GOOD") < content.index("BAD") else 0.3
    return 200, chat("A" if p_a > 0.5 else "B", [("A", p_a), ("B", 1 - p_a)])


def test_judge_pair_swaps_and_averages(server):
    server.routes = {"GOOD": [_pairwise_route]}
    j = judge(server, mode="pairwise")
    # P(good > bad) = (P(A | good first) + 1 - P(A | bad first)) / 2 = (0.8 + 1 - 0.3) / 2
    assert j.judge_pair("Which?", "GOOD answer", "BAD answer") == pytest.approx(0.75)
    assert j.judge_pair("Which?", "BAD answer", "GOOD answer") == pytest.approx(0.25)  # (0.3 + 1 - 0.8) / 2
    assert judge(server, mode="pairwise", swap=False).judge_pair("Which?", "GOOD", "BAD") == pytest.approx(0.8)


def test_pairwise_reward_against_the_row_reference_and_text_verdicts(server):
    server.routes = {"GOOD": [_pairwise_route], "TXT-1": [(200, chat("After thought: [[B]]"))],
                     "TXT-2": [(200, chat("Both are fine"))]}
    j = judge(server, mode="pairwise", swap=False, logprobs=False)
    row = {"prompt": "Q", "reference": "BAD reference"}
    good, text, bad_text, no_ref = j([make_rollout("GOOD", row), make_rollout("TXT-1", row), make_rollout("TXT-2", row),
                                      make_rollout("GOOD", {"prompt": "Q"})])
    assert good.score == pytest.approx(0.8)  # logprobs not requested, but the server sent them anyway
    assert text.score == 0.0 and text.components == {"from_logprobs": 0.0}  # [[B]]: the reference is better
    assert bad_text.error == "judge: cannot parse A or B from reply 'Both are fine'"
    assert no_ref.error == "judge: the task row has no field 'reference' to compare with"
    assert "logprobs" not in server.requests[0][2]


def test_judge_pairs_raises_naming_the_failed_pair(server):
    server.routes = {"GOOD": [_pairwise_route], "NOPE": [(200, chat("?"))]}
    j = judge(server, mode="pairwise", swap=False, logprobs=False)
    with pytest.raises(JudgeError, match=r"pair 1: cannot parse A or B from reply '\?'"):
        j.judge_pairs([("q", "GOOD", "BAD"), ("q", "NOPE", "other")])
    with pytest.raises(ValueError, match="judge_pairs needs mode 'pairwise'"):
        judge(server).judge_pair("q", "a", "b")


# ---------------------------------------------------------------------------------------------- parsing units
@pytest.mark.parametrize("text, value", [("Score: 8", 8.0), ("score=2.5", 2.5), ("Score: 3\nScore: 9", 9.0),
                                         (" 6 ", 6.0), ("**Score:** 4", 4.0), ("Score: 7/10", 7.0)])
def test_parse_score(text, value):
    assert parse_score(text, 1, 10) == value


@pytest.mark.parametrize("text, mode, value", [("Yes", "yes_no", 1.0), ("no, because", "yes_no", 0.0),
                                               ("[[A]]", "pairwise", 1.0), (" b.", "pairwise", 0.0)])
def test_parse_choice(text, mode, value):
    assert parse_choice(text, mode) == value


def test_choice_probability_counts_each_token_once():
    top = [("A", math.log(0.5)), ("B", math.log(0.25)), ("A", math.log(0.5))]  # the sampled token repeated
    assert choice_probability(top, "pairwise") == pytest.approx(2 / 3)  # 0.5 / (0.5 + 0.25)


# ---------------------------------------------------------------------------------------------- construction
@pytest.mark.parametrize(
    "options, message",
    [
        ({"mode": "rank", "base_url": "http://x", "model": "m"}, "judge.mode: expected one of"),
        ({"base_url": "http://x"}, "judge.model: the served model name is required with base_url"),
        ({}, "judge: give base_url"),
        ({"base_url": "http://x", "model": "m", "api_key_env": "NO_SUCH_VAR_FOR_TEST"},
         "judge.api_key_env: environment variable 'NO_SUCH_VAR_FOR_TEST' is not set"),
        ({"base_url": "http://x", "model": "m", "template": "scroe"},
         "judge.template: a score template must contain {completion}; built-in templates: score,"),
        ({"base_url": "http://x", "model": "m", "mode": "pairwise", "template": "{completion}"},
         "judge.template: a pairwise template must contain {completion_a}, {completion_b}"),
        ({"base_url": "http://x", "model": "m", "scale": [5, 1]}, "judge.scale: expected [lo, hi] with lo < hi"),
    ],
)
def test_bad_options(options, message, monkeypatch):
    monkeypatch.delenv("NO_SUCH_VAR_FOR_TEST", raising=False)
    with pytest.raises(ValueError) as info:
        Judge(**options)
    assert str(info.value).startswith(message)


def test_registered_and_built_from_config(server):
    assert REWARDS["judge"] is Judge
    server.routes = {"CFG": [(200, chat("Score: 10"))]}
    built = build_reward([{"name": "judge", "base_url": server.url, "model": "m", "weight": 0.5, "backoff": 0}])
    (out,) = built([make_rollout("CFG", QA)])
    assert out.score == 0.5 and out.components == {"judge": 1.0, "judge_raw": 10.0}  # 0.5 * (10 - 1) / 9
    with pytest.raises(ValueError, match=r"rewards\[0\]: unknown option 'modle' for reward 'judge'; valid: .*model, "):
        build_reward([{"name": "judge", "base_url": server.url, "modle": "m"}])


# ---------------------------------------------------------------------------------------------- local model
@pytest.fixture(scope="module")
def local_judge():
    return Judge(mode="yes_no", model="tiny", model_options={"tiny_arch": TINY_ARCH, "seed": 0},
                 template="Q: {prompt} A: {completion} ok?")


def _next_token_probs(policy, text):
    """Softmax of the tiny model's next-token logits after `text`, computed without the judge's batching."""
    ids = policy.tokenizer(text)["input_ids"]  # <s> + one token per character
    with torch.no_grad():
        logits = policy.model(torch.tensor([ids])).logits[0, -1]
    return torch.softmax(logits.float(), -1)


def test_local_yes_no_probability_from_next_token_distribution(local_judge):
    tok = local_judge.local.policy.tokenizer
    yes_ids, no_ids = tok.convert_tokens_to_ids(["Y", "y"]), tok.convert_tokens_to_ids(["N", "n"])
    # the char tokenizer's first tokens: "Yes"/"yes" -> Y/y, "No"/"no" -> N/n; " Yes" and " No" share " ", dropped
    assert local_judge.local.token_ids["yes_no"] == (sorted(yes_ids), sorted(no_ids))
    rows = [{"prompt": "2+2?"}, {"prompt": "a much longer question here?"}]
    outs = local_judge([make_rollout("4", rows[0]), make_rollout("5", rows[1])])
    for out, row, comp in zip(outs, rows, ["4", "5"]):
        p = _next_token_probs(local_judge.local.policy, f"Q: {row['prompt']} A: {comp} ok?")
        expected = p[yes_ids].sum() / (p[yes_ids].sum() + p[no_ids].sum())
        assert out.error is None and out.score == pytest.approx(expected.item(), abs=1e-5)


def test_local_pairwise_judge_pair(local_judge):
    j = Judge(mode="pairwise", model="tiny", model_options={"tiny_arch": TINY_ARCH, "seed": 0},
              template="{prompt}|{completion_a}|{completion_b}|")
    tok = j.local.policy.tokenizer
    a_ids, b_ids = tok.convert_tokens_to_ids(["A"]), tok.convert_tokens_to_ids(["B"])

    def p_first(text):
        p = _next_token_probs(j.local.policy, text)
        return (p[a_ids].sum() / (p[a_ids].sum() + p[b_ids].sum())).item()

    expected = (p_first("q|x|yy|") + 1 - p_first("q|yy|x|")) / 2
    assert j.judge_pair("q", "x", "yy") == pytest.approx(expected, abs=1e-5)


def test_local_score_mode_parses_the_greedy_reply():
    j = Judge(model="tiny", model_options={"tiny_arch": TINY_ARCH, "seed": 0}, template="{completion}", max_tokens=6)
    (out,) = j([make_rollout("abc", QA)])
    reply = j.local.policy.generate(["abc"], greedy=True, max_new_tokens=6)[0].completion
    try:
        expected = (parse_score(reply, 1, 10) - 1) / 9
    except JudgeError as exc:
        assert out.error == f"judge: {exc}" and out.score == 0.0
    else:
        assert out.score == pytest.approx(expected)
