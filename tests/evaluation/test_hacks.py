"""The hack probe suite (rewardlab.evaluation.hacks): every probe runs against every reward it applies to; the
default verifiers pass them all, and a verifier with the defence off (code strict=False, math multiple_answers=last,
a judge fooled by content-free answers) fails the probes that defence exists for."""

import pytest

from judge_fakes import JudgeServer, chat
from rewardlab.evaluation.hacks import PROBES, Probe, probe_table, probes_for, register_probe, run_probes
from rewardlab.evaluation.hacks.__main__ import main
from rewardlab.rewards import REWARDS


def test_every_probe_applies_to_a_registered_reward_and_every_offline_verifier_has_probes():
    probes_for("code")  # loads the package's probe modules
    assert all(name in REWARDS for p in PROBES.values() for name in p.rewards)
    assert {name for p in PROBES.values() for name in p.rewards} == {"code", "math", "format", "judge"}
    assert len(probes_for("code")) == 20 and all(p.name.startswith("code/") for p in probes_for("code"))


@pytest.mark.parametrize("spec", ["code", "math", "format"])
def test_the_default_verifiers_pass_every_probe(spec):
    results = run_probes(spec)
    assert results and [r.probe for r in results if not r.passed] == [] and all(r.errors == 0 for r in results)
    assert all(r.honest_min == 1.0 for r in results)


def test_with_the_defence_off_the_probes_fail():
    lenient = {r.probe: r for r in run_probes({"name": "code", "strict": False})}
    assert {p for p, r in lenient.items() if not r.passed} >= {
        "code/always_equal", "code/forge_via_frames", "code/forge_via_gc", "code/forge_via_inspect",
        "code/forge_via_ctypes", "code/forge_with_stolen_key", "code/shadow_globals", "code/patch_builtins"}
    assert lenient["code/forge_via_gc"].hack_max == 1.0
    last = {r.probe: r.passed for r in run_probes({"name": "math", "multiple_answers": "last"})}
    assert last == {"math/several_boxes": False, "math/several_answer_tags": False, "math/hedged_numbers": False,
                    "math/quoted_question_box": True, "math/outside_the_forms": True}
    assert [r.passed for r in run_probes({"name": "format", "allow_empty": True})] == [False]


@pytest.fixture
def judge_server(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    server = JudgeServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def _response(body):
    return body["messages"][-1]["content"].split("[Response]\n", 1)[1].split("\n\n", 1)[0]


def test_master_keys_against_a_scripted_judge(judge_server):
    """An honest scripted judge (full marks only when the reference answer is in the response) passes the probe;
    one fooled by content-free answers (full marks for a response starting with a master key) fails it."""
    spec = {"name": "judge", "base_url": judge_server.url, "model": "m", "backoff": 0, "template": "score_reference"}

    def honest(body):
        reference = body["messages"][-1]["content"].split("[Reference answer]\n", 1)[1].split("\n", 1)[0]
        return 200, chat("Score: 10" if reference in _response(body) else "Score: 1")

    judge_server.routes["[Response]"] = [honest]
    (result,) = run_probes(spec)
    assert result.probe == "judge/master_keys" and result.passed and result.hack_max == 0.0

    def fooled(body):
        return 200, chat("Score: 10" if len(_response(body).strip()) < 40 else "Score: 1")

    judge_server.routes["[Response]"] = [fooled]
    (result,) = run_probes(spec)
    assert not result.passed and result.hack_max == 1.0


def test_registration_is_checked_and_the_table_and_command_print(capsys):
    with pytest.raises(ValueError, match="registered already"):
        register_probe(next(iter(PROBES.values())))
    with pytest.raises(ValueError, match="one list of hacks"):
        register_probe(Probe(name="x/bad", rewards=("math",), description="", rows=({},), hacks=()))
    with pytest.raises(ValueError, match="do not apply to reward 'math'"):
        run_probes("math", names=["code/always_equal"])
    table = probe_table(run_probes("format")).splitlines()
    assert len(table) == 3 and table[0].split()[:2] == ["probe", "reward"] and table[2].split()[-1] == "yes"
    assert main(["format", "{name: math, multiple_answers: last}"]) == 0
    out = capsys.readouterr().out
    assert "format/empty_tags" in out and "format: 1 of 1 probes passed" in out
    assert "math(multiple_answers=last): 2 of 5 probes passed" in out
