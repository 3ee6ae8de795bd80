"""The viewer's JSON API and pages on fixture runs (Starlette's TestClient; no server, no browser)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

pytest.importorskip("starlette")
pytest.importorskip("plotly")
import pyarrow.parquet as pq  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from rewardlab.rollout_log import rollouts_path  # noqa: E402
from rewardlab.view import create_app  # noqa: E402
from view_fixtures import XSS, make_run  # noqa: E402


@pytest.fixture
def runs(tmp_path):
    make_run(tmp_path / "runs" / "a")
    make_run(tmp_path / "runs" / "b", lr=0.01)
    return tmp_path / "runs"


@pytest.fixture
def client(runs):
    return TestClient(create_app([runs], quiet=True))


def test_runs_are_found_below_a_directory_with_status_steps_final_metrics_and_config_diff(client):
    body = client.get("/api/runs").json()
    assert [(r["name"], r["verb"], r["task"], r["status"], r["steps"], r["logged_steps"]) for r in body["runs"]] == [
        ("a", "train", "reasoning_gym:chain_sum", "finished", 3, 3), ("b", "train", "reasoning_gym:chain_sum",
                                                                      "finished", 3, 3)]
    assert body["runs"][0]["final"] == {"reward/mean": 1.0, "loss": 1 / 3}
    assert body["config_diff"] == [{"key": "rl.lr", "values": ["0.001", "0.01"]}]


def test_status_running_interrupted_crashed(tmp_path):
    run = make_run(tmp_path / "r", summary=False)
    app = create_app([run], quiet=True)
    client = TestClient(app)
    assert client.get("/api/runs/0").json()["status"] == "crashed"
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert client.get("/api/runs/0").json()["status"] == "running"
    finally:
        os.close(fd)
    assert client.get("/api/runs/0").json()["status"] == "crashed"
    with open(run / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "reward_errors", "step": 2, "failed": 9, "rollouts": 16}) + "\n")
    assert "stopped at step 2: 9 of 16 rollouts" in client.get("/api/runs/0").json()["status_reason"]
    (run / "summary.json").write_text(json.dumps({"interrupted": True}))
    assert client.get("/api/runs/0").json()["status"] == "interrupted"


def test_status_probe_creates_no_lock_file(tmp_path):
    run = make_run(tmp_path / "r")
    TestClient(create_app([run], quiet=True)).get("/api/runs")
    assert not (run / ".lock").exists()


def test_metrics_are_read_incrementally_from_a_byte_offset(client, runs):
    first = client.get("/api/runs/0/metrics").json()
    assert [r["step"] for r in first["records"]] == [1, 2, 3] and not first["torn"]
    with open(runs / "a" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "loss": 0.2}) + "\n" + '{"step": 5, "lo')  # a torn last line
    nxt = client.get(f"/api/runs/0/metrics?since={first['next']}").json()
    assert [r["step"] for r in nxt["records"]] == [4] and nxt["torn"]
    assert client.get(f"/api/runs/0/metrics?since={nxt['next']}").json()["records"] == []
    assert client.get("/api/runs/0/metrics?since=999999").json()["reset"]


def test_rollouts_table_filters_sorts_and_pages(client):
    body = client.get("/api/runs/0/steps/2/rollouts?sort=reward&desc=1&limit=5").json()
    assert body["total"] == 16 and len(body["rows"]) == 5
    rewards = [r["reward"] for r in body["rows"]]
    assert rewards == sorted(rewards, reverse=True)
    assert "reward/correct" in body["columns"] and "tokens" not in body["columns"]
    assert {r["index"] for r in client.get("/api/runs/0/steps/2/rollouts?filter=error").json()["rows"]} == {5}
    assert {r["index"] for r in client.get("/api/runs/0/steps/2/rollouts?filter=truncated").json()["rows"]} == {6}
    kept = client.get("/api/runs/0/steps/2/rollouts?filter=kept=false").json()["rows"]
    assert {r["index"] for r in kept} == {i for i in range(16) if i % 3 == 0}
    assert {r["index"] for r in client.get("/api/runs/0/steps/2/rollouts?filter=group=3").json()["rows"]} == {
        12, 13, 14, 15}
    both = client.get("/api/runs/0/steps/2/rollouts", params={"filter": "group=0 reward>=0.5"}).json()["rows"]
    assert all(r["group"] == 0 and r["reward"] >= 0.5 for r in both)
    assert {r["index"] for r in client.get("/api/runs/0/steps/2/rollouts?filter=termination=length").json()["rows"]} \
        == {6}
    page = client.get("/api/runs/0/steps/2/rollouts?sort=index&offset=10&limit=4").json()
    assert [r["index"] for r in page["rows"]] == [10, 11, 12, 13] and page["matched"] == 16


def test_bad_filter_sort_and_paging_are_400_with_one_line(client):
    for query in ("filter=nope>1", "sort=nope", "limit=0", "offset=-1", "offset=x"):
        r = client.get(f"/api/runs/0/steps/2/rollouts?{query}")
        assert r.status_code == 400 and "\n" not in r.json()["error"], query


def test_per_token_values_equal_the_parquet_file(client, runs):
    body = client.get("/api/runs/0/steps/2/rollouts/2").json()
    row = pq.read_table(rollouts_path(runs / "a", 2)).slice(2, 1).to_pylist()[0]
    for key in ("tokens", "loss_mask", "advantages", "logprob", "ratio", "entropy", "clip", "step_spans"):
        assert body[key] == pytest.approx(row[key]), key
    assert body["logged"] and body["components"] == {"correct": 0.0, "format": 1.0}
    assert client.get("/api/runs/0/steps/2/rollouts/9").json()["logged"] is False


def test_html_from_the_data_comes_back_as_data_and_pages_interpolate_nothing(client):
    assert client.get("/api/runs/0/steps/1/rollouts/3").json()["completion"] == XSS
    assert client.get("/api/runs/0/steps/1/groups/0").json()["rollouts"][3]["completion"] == XSS
    for url in ("/runs", "/metrics", "/runs/0/steps/1", "/runs/0/steps/1/rollouts/3", "/runs/0/prompts/p1",
                "/runs/0/reports"):
        page = client.get(url)
        assert page.status_code == 200 and "<script>window" not in page.text and "answer " not in page.text, url
        assert "innerHTML" not in page.text
    for name in os.listdir(os.path.join(os.path.dirname(__import__("rewardlab.view").view.__file__), "static")):
        text = open(os.path.join(os.path.dirname(__import__("rewardlab.view").view.__file__), "static", name)).read()
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text and "document.write" not in text, name


def test_group_prompt_across_steps_and_reports(client, runs):
    group = client.get("/api/runs/0/steps/2/groups/1").json()
    assert [r["index"] for r in group["rollouts"]] == [4, 5, 6, 7]
    prompt = client.get("/api/runs/0/prompts/p1").json()  # p{(group + step) % 5}, groups 0..3: none at step 2
    assert prompt["all_steps"] == [1, 3] and [s["group"] for s in prompt["steps"]] == [0, 3]
    assert [r["index"] for r in prompt["steps"][1]["rollouts"]] == [12, 13, 14, 15]
    assert client.get("/api/runs/0/prompts/nope").status_code == 404
    (runs / "a" / "report.json").write_text(json.dumps({
        "task": "t", "questions": 4, "greedy": {"accuracy": 0.25}, "pass@N": {"1": 0.25, "4": 0.75},
        "methods": {"best_of_n": {"1": {"accuracy": 0.25}, "4": {"accuracy": 0.5}}}}))
    reports = client.get("/api/runs/0/reports").json()["reports"]
    search = next(r for r in reports if r["kind"] == "search")
    assert search["tables"][0]["rows"][0] == ["best_of_n", 0.25, 0.5]
    assert search["charts"][0]["traces"][0] == {"name": "best_of_n", "x": [1, 4], "y": [0.25, 0.5]}


def test_non_finite_floats_are_null(tmp_path):
    run = make_run(tmp_path / "r")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss": NaN, "x": Infinity}\n')
    body = TestClient(create_app([run], quiet=True)).get("/api/runs/0/metrics")
    assert body.status_code == 200 and "NaN" not in body.text and body.json()["records"][-1]["loss"] is None


def test_pages_and_root(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/runs"
    assert client.get("/runs/1/metrics", follow_redirects=False).headers["location"] == "/metrics?runs=1"
    assert client.get("/runs/0/steps", follow_redirects=False).headers["location"] == "/runs/0/steps/3"
    assert client.get("/runs/b/steps/2").status_code == 200  # a run by its name
    js = client.get("/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000


def test_final_metrics_come_from_the_last_complete_line_read_from_the_tail(tmp_path):
    from rewardlab.view.data import find_runs, last_metrics

    run = make_run(tmp_path / "r")
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 4, "loss": 0.25, "pad": "x" * 100}) + "\n" + '{"step": 5, "lo')
    found = find_runs([run])[0]
    assert last_metrics(found)["step"] == 4
    assert last_metrics(found, tail=20)["step"] == 4  # a line longer than the tail: the whole file is read
    assert TestClient(create_app([run], quiet=True)).get("/api/runs/0").json()["final"]["loss"] == 0.25


@pytest.mark.parametrize("sections,verb", [({"rl": {}, "task": {}}, "train"), ({"sft": {}}, "sft"),
                                           ({"rft": {}, "task": {}, "rewards": None}, "rft"),
                                           ({"search": {}, "scorer": "x"}, "search"), ({"eval": {}, "scorer": "x"},
                                                                                       "rm eval"),
                                           ({"eval": {}, "split": "test"}, "evaluate"), ({"preset": "tools"},
                                                                                          "quickstart")])
def test_the_verb_is_told_by_the_config_sections(sections, verb, tmp_path):
    from rewardlab.view.data import verb_of

    assert verb_of(sections) == verb


def test_runs_inside_a_run_are_found_and_each_run_is_listed_once(tmp_path):
    from rewardlab.view.data import find_runs

    top = make_run(tmp_path / "quickstart", steps=1)
    make_run(top / "sft", steps=1)
    make_run(top / "grpo", steps=1)
    make_run(tmp_path / "other" / "sft", steps=1)
    runs = find_runs([tmp_path, top, top / "grpo"])
    assert [(r.name, r.path.relative_to(tmp_path).as_posix()) for r in runs] == [
        ("other-sft", "other/sft"), ("quickstart", "quickstart"), ("grpo", "quickstart/grpo"),
        ("quickstart-sft", "quickstart/sft")]


def test_an_rm_eval_report_becomes_tables_and_a_per_subset_chart(tmp_path):
    run = make_run(tmp_path / "r", steps=1)
    (run / "report.json").write_text(json.dumps({
        "scorer": "exact_match", "pairs": {"n": 4, "accuracy": 0.75, "chosen_scores": [1, 2],
                                           "per_subset": {"subsets": {"a": {"n": 3, "mean": 1.0},
                                                                      "b": {"n": 1, "mean": 0.0}},
                                                          "macro_mean": 0.5}},
        "best_of_k": None, "first_error": {"f1": 0.5, "threshold": 0.3}}))
    report = TestClient(create_app([run], quiet=True)).get("/api/runs/0/reports").json()["reports"][0]
    assert report["kind"] == "rm eval"
    tables = {t["title"]: t for t in report["tables"]}
    assert ["accuracy", 0.75] in tables["pairs"]["rows"] and ["per_subset.macro_mean", 0.5] in tables["pairs"]["rows"]
    assert tables["pairs: per subset"]["rows"] == [["a", 1.0, 3], ["b", 0.0, 1]]
    assert ["f1", 0.5] in tables["first_error"]["rows"]
    assert report["charts"][0]["traces"][0] == {"name": "pairs", "x": ["a", "b"], "y": [1.0, 0.0]}
