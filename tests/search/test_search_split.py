"""`rewardlab search` on a user's JSONL file searches every row unless a split is asked for (as `evaluate` does)."""

import pytest

from conftest import write_jsonl
from rewardlab.config import SearchConfig, load_config
from rewardlab.commands import search as search_command
from rewardlab.tasks import load

from scripted_policy import ScriptedPolicy

# Greedy gives the first solution: q1 right, q2 and q3 wrong (answer 5 each).
SAMPLES = {"q1": ["5"], "q2": ["7"], "q3": ["6"]}


def _run(tmp_path, monkeypatch, *overrides):
    data = write_jsonl(tmp_path / "qs.jsonl", [{"prompt": q, "answer": "5"} for q in SAMPLES])
    monkeypatch.setattr(search_command, "load_model", lambda *a, **k: ScriptedPolicy(solutions=SAMPLES))
    cfg = load_config(SearchConfig, overrides=[f"out={tmp_path / 'search'}", f"task.spec=jsonl:{data}",
                                               "search.n=[1]", "search.methods=[best_of_n]", *overrides])
    return search_command.run(cfg, show_progress=False), data


def test_search_on_a_users_file_uses_every_row(tmp_path, monkeypatch, capsys):
    rep, _ = _run(tmp_path, monkeypatch)
    assert rep["split"] == "all" and rep["questions"] == rep["split_rows"] == 3
    assert rep["greedy"]["accuracy"] == pytest.approx(1 / 3)  # q1 of q1, q2, q3
    assert "accuracy on every row" in capsys.readouterr().out


def test_search_on_the_split_asked_for(tmp_path, monkeypatch):
    rep, data = _run(tmp_path, monkeypatch, "split=test")
    held = load(f"jsonl:{data}").test  # one row: test_size 0.1 of 3
    assert rep["split"] == "test" and rep["questions"] == rep["split_rows"] == len(held) == 1
    assert rep["greedy"]["accuracy"] == (1.0 if held[0]["prompt"] == "q1" else 0.0)
