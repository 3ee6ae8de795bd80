"""The viewer is read-only, confines paths to the run directories, and answers bad runs with a 4xx one-liner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("plotly")
from starlette.testclient import TestClient  # noqa: E402

from rewardlab.rollout_log import rollouts_path  # noqa: E402
from rewardlab.view import create_app  # noqa: E402
from view_fixtures import make_run  # noqa: E402

URLS = ["/", "/runs", "/metrics", "/runs/0/metrics", "/runs/0/steps", "/runs/0/steps/1", "/runs/0/steps/1/rollouts/0",
        "/runs/0/prompts/p1", "/runs/0/reports", "/runs/0/files/plots/m.png", "/static/common.js", "/plotly.min.js",
        "/api/runs", "/api/runs/0", "/api/runs/0/metrics", "/api/runs/0/metrics?since=10", "/api/runs/0/steps",
        "/api/runs/0/steps/1/rollouts", "/api/runs/0/steps/1/rollouts?filter=error&sort=reward&desc=1",
        "/api/runs/0/steps/1/rollouts/0", "/api/runs/0/steps/1/groups/0", "/api/runs/0/prompts/p1",
        "/api/runs/0/reports"]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime_ns)} of everything under `root`, directories included."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def run(tmp_path):
    path = make_run(tmp_path / "run")
    (path / "plots").mkdir()
    (path / "plots" / "m.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return path


def test_no_request_writes_and_writing_methods_are_refused(run):
    before = _snapshot(run.parent)
    client = TestClient(create_app([run], quiet=True))
    for url in URLS:
        assert client.get(url).status_code < 500, url
        for method in ("PUT", "POST", "DELETE", "PATCH"):
            r = client.request(method, url)
            assert r.status_code == 405, (method, url, r.status_code)
    assert _snapshot(run.parent) == before


@pytest.mark.parametrize("path", ["../secret.json", "%2e%2e/secret.json", "%2E%2E%2Fsecret.json",
                                  "plots/..%2F..%2Fsecret.json", "..%2fsecret.json", "%2Fetc%2Fpasswd",
                                  "/etc/passwd", "link/secret.json", "outside.json"])
def test_paths_outside_the_run_are_refused(run, path):
    secret = run.parent / "secret.json"
    secret.write_text('{"secret": 1}')
    (run / "link").symlink_to(run.parent, target_is_directory=True)
    (run / "outside.json").symlink_to(secret)
    r = TestClient(create_app([run], quiet=True)).get(f"/runs/0/files/{path}")
    assert r.status_code in (400, 404) and "secret" not in r.text.replace("secret.json", ""), (path, r.text)


def test_a_file_inside_the_run_is_served(run):
    r = TestClient(create_app([run], quiet=True)).get("/runs/0/files/plots/m.png")
    assert r.status_code == 200 and r.content.startswith(b"\x89PNG")


def test_a_symlinked_step_file_or_rollouts_dir_out_of_the_run_is_not_read(tmp_path, run):
    other = make_run(tmp_path / "other", steps=5)
    os.symlink(rollouts_path(other, 5), rollouts_path(run, 5))
    client = TestClient(create_app([run], quiet=True))
    assert client.get("/api/runs/0/steps").json()["steps"] == [1, 2, 3]
    assert client.get("/api/runs/0/steps/5/rollouts").status_code == 404
    third = tmp_path / "third"
    third.mkdir()
    (third / "config.yaml").write_text("rl: {}\n")
    (third / "rollouts").symlink_to(other / "rollouts", target_is_directory=True)
    client = TestClient(create_app([third], quiet=True))
    assert client.get("/api/runs/0/steps").json()["steps"] == []
    assert client.get("/api/runs/0/steps/1/rollouts/0").status_code == 404


def test_missing_dir_and_not_a_run_are_4xx_one_liners(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    app = create_app([tmp_path / "nope", tmp_path / "empty"])
    assert "no such directory" in capsys.readouterr().err
    client = TestClient(app)
    runs = client.get("/api/runs").json()["runs"]
    assert [r["status"] for r in runs] == ["missing", "missing"] and "not a rewardlab run" in runs[1]["error"]
    for url in ("/api/runs/0/metrics", "/api/runs/1/steps", "/api/runs/1/steps/1/rollouts", "/api/runs/7",
                "/api/runs/nope/reports"):
        r = client.get(url)
        assert r.status_code == 404 and "\n" not in r.json()["error"] and "Traceback" not in r.text, url
    page = client.get("/runs/0/steps/1")
    assert page.status_code == 404 and 'id="error"' in page.text


@pytest.mark.parametrize("damage", ["garbage", "half"])
def test_a_torn_or_corrupt_rollouts_file_is_422_with_one_line(run, damage):
    path = rollouts_path(run, 2)
    data = path.read_bytes()
    path.write_bytes(b"not parquet at all" if damage == "garbage" else data[: len(data) // 2])
    client = TestClient(create_app([run], quiet=True))
    for url in ("/api/runs/0/steps/2/rollouts", "/api/runs/0/steps/2/rollouts/0", "/api/runs/0/steps/2/groups/0"):
        r = client.get(url)
        assert r.status_code == 422 and "step-000002.parquet" in r.json()["error"], url
        assert "\n" not in r.json()["error"]
    assert client.get("/runs/0/steps/2").status_code == 422
    assert client.get("/api/runs/0/prompts/p1").json()["skipped"] == [2]


def test_a_torn_last_metrics_line_is_left_out(run):
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 4, "loss"')
    client = TestClient(create_app([run], quiet=True))
    body = client.get("/api/runs/0/metrics").json()
    assert [r["step"] for r in body["records"]] == [1, 2, 3] and body["torn"]
    assert client.get("/api/runs").json()["runs"][0]["steps"] == 3


def test_pages_of_a_bad_run_step_or_rollout_are_4xx(run):
    client = TestClient(create_app([run], quiet=True))
    for url in ("/metrics?runs=0,7", "/runs/7/reports", "/runs/0/steps/99", "/runs/0/steps/1/rollouts/999",
                "/runs/0/steps/x", "/runs/nope/prompts/p1"):
        r = client.get(url)
        assert 400 <= r.status_code < 500 and 'id="error"' in r.text, url
    assert client.get("/metrics?runs=0").status_code == 200
