"""`rewardlab view`: the extra it needs, the URL it prints, a real server's pages, exit 0 on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rewardlab import cli
from view_fixtures import make_run

SRC = Path(__file__).resolve().parents[2] / "src"


def test_without_the_extra_it_says_which_to_install_in_one_line(monkeypatch, capsys, tmp_path):
    import rewardlab.view

    monkeypatch.setattr(rewardlab.view, "missing", lambda: ["plotly"])
    assert cli.main(["view", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "rewardlab view: error: needs pip install 'rewardlab[view]' (missing plotly)\n"


def test_help_lists_the_verb(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "view" in capsys.readouterr().out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serves_on_localhost_and_exits_0_on_ctrl_c(tmp_path):
    pytest.importorskip("uvicorn")
    run = make_run(tmp_path / "run")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rewardlab.cli", "view", str(run), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"rewardlab view: 1 run(s) at http://127.0.0.1:{port}/")
        body = None
        for _ in range(100):
            try:
                body = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5))
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert body is not None and body["runs"][0]["status"] == "finished"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/api/runs", method="POST"))
        assert err.value.code == 405
    finally:
        proc.send_signal(signal.SIGINT)
        out, errs = proc.communicate(timeout=20)
    assert proc.returncode == 0, errs


def test_a_port_in_use_is_a_one_line_error(tmp_path, capsys):
    pytest.importorskip("uvicorn")
    run = make_run(tmp_path / "run")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert cli.main(["view", str(run), "--port", str(port)]) == 2
    assert "cannot serve on 127.0.0.1:" in capsys.readouterr().err
