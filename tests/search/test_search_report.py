"""`rewardlab search`: the report's figures on a scripted policy (hand-computed) and a CLI smoke test on the tiny model."""

import json

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.config import SearchConfig, load_config
from rewardlab.rewards import REWARDS, reward
from rewardlab.commands import search as search_command

from scripted_policy import ScriptedPolicy

if "test_constant" not in REWARDS:

    @reward(name="test_constant")
    def _constant(completion):
        """0.5 for every completion: ranks nothing."""
        return 0.5


# Held-out questions (answer 5 each) and their scripted samples, in sampling order; greedy gives the first.
SAMPLES = {"q1": ["6", "5", "5", "7"], "q2": ["7", "7", "7", "7"], "q3": ["5", "6", "6", "6"]}


def _run(tmp_path, monkeypatch, *overrides):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"t{i}", "answer": "0"} for i in range(3)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": q, "answer": "5"} for q in SAMPLES])
    policy = ScriptedPolicy(solutions=SAMPLES)
    monkeypatch.setattr(search_command, "load_model", lambda *a, **k: policy)
    cfg = load_config(SearchConfig, overrides=[
        f"out={tmp_path / 'search'}", f"task.spec=jsonl:{train}", f"task.options={{test_path: {test}}}",
        "search.n=[1, 2, 4]", "search.methods=[best_of_n, majority, weighted_majority]", *overrides])
    return search_command.run(cfg, show_progress=False)


def test_report_with_the_verifier_as_scorer(tmp_path, monkeypatch, capsys):
    rep = _run(tmp_path, monkeypatch)  # scorer: the task's verifier (exact_match), an oracle
    # pass@N over the first N samples: N=1: only q3 (1/3); N=2: q1 (6,5) and q3 (2/3); N=4: still q1, q3 (2/3).
    assert rep["pass@N"] == pytest.approx({"1": 1 / 3, "2": 2 / 3, "4": 2 / 3})
    # best-of-N with the oracle is pass@N on the same samples
    assert {n: v["accuracy"] for n, v in rep["methods"]["best_of_n"].items()} == pytest.approx(rep["pass@N"])
    # majority: N=1 q3; N=2 q1 ties 6/5 -> 6 (first), q3 ties 5/6 -> 5: 1/3; N=4 q1 5 (2 votes) and q3 6: 1/3.
    assert {n: v["accuracy"] for n, v in rep["methods"]["majority"].items()} == pytest.approx(
        {"1": 1 / 3, "2": 1 / 3, "4": 1 / 3})
    # weighted by the oracle, the right answer's group has the only non-zero total whenever it is present
    assert {n: v["accuracy"] for n, v in rep["methods"]["weighted_majority"].items()} == pytest.approx(rep["pass@N"])
    assert rep["greedy"]["accuracy"] == pytest.approx(1 / 3)  # first solutions 6, 7, 5
    # cost: each sample is 1 character + EOS = 2 tokens; scorer calls N (none for majority)
    assert rep["methods"]["best_of_n"]["4"]["tokens_per_question"] == 8.0
    assert rep["methods"]["best_of_n"]["4"]["scorer_calls_per_question"] == 4.0
    assert rep["methods"]["majority"]["4"]["scorer_calls_per_question"] == 0.0
    saved = json.loads((tmp_path / "search" / "report.json").read_text())
    assert saved["pass@N"] == rep["pass@N"] and "oracle" in saved["scorer"]
    assert (tmp_path / "search" / "accuracy_vs_n.png").stat().st_size > 0
    assert "pass@N" in capsys.readouterr().out


def test_report_with_a_constant_scorer_is_the_first_sample(tmp_path, monkeypatch):
    rep = _run(tmp_path, monkeypatch, "scorer=test_constant")
    # every score ties, so best-of-N keeps the first sample: q3 only, at every N
    assert {n: v["accuracy"] for n, v in rep["methods"]["best_of_n"].items()} == pytest.approx(
        {"1": 1 / 3, "2": 1 / 3, "4": 1 / 3})
    # equal weights make weighted majority plain majority
    assert {n: v["accuracy"] for n, v in rep["methods"]["weighted_majority"].items()} == pytest.approx(
        {n: v["accuracy"] for n, v in rep["methods"]["majority"].items()})


def test_report_rejects_an_unknown_method(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="^search.methods: unknown search method 'mcts'; valid: beam, best_of_n, dvts, "
                       "majority, weighted_majority$"):
        _run(tmp_path, monkeypatch, "search.methods=[mcts]")
    assert not (tmp_path / "search").exists()


@pytest.mark.slow
def test_cli_search_smoke(tmp_path, capsys):
    out = tmp_path / "search"
    code = main(["search", "--no-progress", "--model", "tiny", "--task", "reasoning_gym:chain_sum", "--out", str(out),
                 "--scorer", "arithmetic_steps", "--n", "1,2,4",
                 "task.options={min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, template: compact, "
                 "target: steps, size: 200, test_size: 3}",
                 "search.beam_width=2", "search.max_steps=2", "search.max_new_tokens=12", "search.max_step_tokens=6",
                 *TINY_OVERRIDES])
    assert code == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["questions"] == 3 and rep["scorer"] == "arithmetic_steps" and rep["verifier"] == "arithmetic_steps"
    assert set(rep["methods"]) == {"best_of_n", "majority", "weighted_majority", "beam", "dvts"}
    assert set(rep["methods"]["beam"]) == {"2", "4"}  # N=1 < M=2 is skipped
    for n in ("2", "4"):
        # at most max_steps=2 rounds of N scorer calls; at least the first round's N
        for m in ("beam", "dvts"):
            assert int(n) <= rep["methods"][m][n]["scorer_calls_per_question"] <= 2 * int(n)
            assert rep["methods"][m][n]["tokens_per_question"] <= 2 * int(n) * 6
            # a tree method's ceiling is its own candidates': at least its accuracy, at most 1
            assert rep["methods"][m][n]["accuracy"] <= rep["methods"][m][n]["ceiling"] <= 1
    assert rep["methods"]["best_of_n"]["4"]["tokens_per_question"] <= 4 * 12
    assert (out / "accuracy_vs_n.png").is_file() and (out / "config.yaml").is_file()
    printed = capsys.readouterr().out
    assert "beam search" in printed and "DVTS" in printed


def test_cli_search_bad_budget_is_one_line(tmp_path, capsys):
    assert main(["search", "--out", str(tmp_path / "s"), "--n", "1,x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "search.n" in err[0]
