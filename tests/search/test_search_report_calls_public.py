"""`rewardlab search`'s pool figures come from the public `best_of_n`, `majority` and `weighted_majority`: spies see
them called on the shared pool, altering them alters the report, and calling them directly gives the report's
figures."""

import pytest

from conftest import write_jsonl
from rewardlab.config import SearchConfig, load_config
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.search import Pool, SearchSettings, best_of_n, majority, weighted_majority
from rewardlab.commands import search as search_command
from rewardlab.search import report as report_module
from rewardlab.search.base import pool_groups, pool_scores

from scripted_policy import ScriptedPolicy

if "test_prefers_six" not in REWARDS:

    @reward(name="test_prefers_six")
    def _prefers_six(completion):
        """1.0 for the (wrong) answer 6, 0.25 for anything else: a scorer that misleads."""
        return 1.0 if completion.strip() == "6" else 0.25


# Held-out questions (answer 5 each) and their scripted samples, in sampling order.
SAMPLES = {"q1": ["6", "5", "5", "7"], "q2": ["7", "7", "7", "7"], "q3": ["5", "6", "6", "6"]}
POOL = ("best_of_n", "majority", "weighted_majority")


def _run(tmp_path, monkeypatch, *overrides):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"t{i}", "answer": "0"} for i in range(3)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": q, "answer": "5"} for q in SAMPLES])
    monkeypatch.setattr(search_command, "load_model", lambda *a, **k: ScriptedPolicy(solutions=SAMPLES))
    cfg = load_config(SearchConfig, overrides=[
        f"out={tmp_path / 'search'}", f"task.spec=jsonl:{train}", f"task.options={{test_path: {test}}}",
        "search.n=[1, 2, 4]", f"search.methods=[{', '.join(POOL)}]", *overrides])
    return search_command.run(cfg, show_progress=False)


def _accuracy(rep, method):
    return {n: v["accuracy"] for n, v in rep["methods"][method].items()}


def test_the_report_calls_the_public_functions_on_the_pool(tmp_path, monkeypatch):
    calls = []

    def spy(name, fn):
        def wrapped(policy, rows, *args, n, pool, **kwargs):
            want = [SAMPLES[row["prompt"]] for row in rows]  # the split's order
            calls.append((name, n, [[r.completion for r in g] for g in pool.samples] == want))
            return fn(policy, rows, *args, n=n, pool=pool, **kwargs)
        return wrapped

    for name, fn in (("best_of_n", best_of_n), ("majority", majority), ("weighted_majority", weighted_majority)):
        monkeypatch.setattr(report_module, name, spy(name, fn))
    rep = _run(tmp_path, monkeypatch)
    assert sorted((m, n) for m, n, _ in calls) == sorted((m, n) for m in POOL for n in (1, 2, 4))
    assert all(same for _, _, same in calls)  # the shared pool's samples, of which each function takes N
    # with the oracle scorer best-of-N is pass@N: 1/3, 2/3, 2/3
    assert _accuracy(rep, "best_of_n") == pytest.approx({"1": 1 / 3, "2": 2 / 3, "4": 2 / 3})


def test_altering_the_public_functions_alters_the_report(tmp_path, monkeypatch):
    def worst_of_n(policy, rows, scorer, *, n, pool, **kwargs):
        flipped = [[-s for s in g] for g in pool.scores]  # argmax of -score: the first lowest-scored sample
        return best_of_n(policy, rows, scorer, n=n, pool=Pool(pool.samples, flipped), **kwargs)

    def last_sample(policy, rows, *, n, **kwargs):
        out = majority(policy, rows, n=n, **kwargs)
        for r in out:
            r.info["index"] = n - 1
        return out

    monkeypatch.setattr(report_module, "best_of_n", worst_of_n)
    monkeypatch.setattr(report_module, "majority", last_sample)
    rep = _run(tmp_path, monkeypatch)
    # oracle scores 1 for "5", 0 else; the lowest first: N=1 the only samples 6, 7, 5 (1/3); N=2 q1 6, q3 6 (0)
    assert _accuracy(rep, "best_of_n") == pytest.approx({"1": 1 / 3, "2": 0.0, "4": 0.0})
    # the N-th sample: N=1 6, 7, 5 (1/3); N=2 5, 7, 6 (1/3); N=4 7, 7, 6 (0)
    assert _accuracy(rep, "majority") == pytest.approx({"1": 1 / 3, "2": 1 / 3, "4": 0.0})
    # weighted majority untouched: with the oracle it is pass@N
    assert _accuracy(rep, "weighted_majority") == pytest.approx({"1": 1 / 3, "2": 2 / 3, "4": 2 / 3})


def test_the_report_equals_the_public_functions_called_directly(tmp_path, monkeypatch):
    rep = _run(tmp_path, monkeypatch, "scorer=test_prefers_six")
    rows = [{"prompt": q, "answer": "5"} for q in SAMPLES]
    scorer = build_reward("test_prefers_six")
    for n in (1, 2, 4):
        direct = {  # each call samples afresh: a new scripted policy gives the same first N samples as the pool
            "best_of_n": best_of_n(ScriptedPolicy(solutions=SAMPLES), rows, scorer, n=n),
            "majority": majority(ScriptedPolicy(solutions=SAMPLES), rows, n=n),
            "weighted_majority": weighted_majority(ScriptedPolicy(solutions=SAMPLES), rows, scorer, n=n),
        }
        for m, results in direct.items():
            acc = sum(r.best.completion.strip() == "5" for r in results) / len(results)
            assert rep["methods"][m][str(n)]["accuracy"] == pytest.approx(acc), (m, n)
    # by hand: the scorer prefers 6, so from N=2 best-of-N and weighted majority pick 6 for q1 and q3
    assert _accuracy(rep, "best_of_n") == pytest.approx({"1": 1 / 3, "2": 0.0, "4": 0.0})
    assert _accuracy(rep, "weighted_majority") == pytest.approx({"1": 1 / 3, "2": 0.0, "4": 0.0})
    # majority: N=2 q1 ties 6/5 -> 6, q3 ties 5/6 -> 5; N=4 q1 5 (two votes), q3 6: 1/3 each
    assert _accuracy(rep, "majority") == pytest.approx({"1": 1 / 3, "2": 1 / 3, "4": 1 / 3})


def test_pooled_samples_and_scores_are_checked():
    rows = [{"prompt": "q1"}, {"prompt": "q2"}]
    with pytest.raises(ValueError, match="^samples: 1 lists for 2 rows$"):
        pool_groups(None, rows, 1, Pool([["a"]]), None, SearchSettings())
    with pytest.raises(ValueError, match="^samples: row 1 has 1, fewer than n=2$"):
        pool_groups(None, rows, 2, Pool([["a", "b"], ["c"]]), None, SearchSettings())
    assert pool_groups(None, rows, 1, Pool([["a", "b"], ["c", "d"]]), None, SearchSettings()) == [["a"], ["c"]]
    with pytest.raises(ValueError, match="^scores: row 0 has 0, fewer than n=1$"):
        pool_scores(None, [["a"], ["c"]], 1, Pool([], [[], [1.0]]))
    assert pool_scores(None, [["a"], ["c"]], 1, Pool([], [[0.5, 9.0], [float("-inf")]])) == [0.5, float("-inf")]
