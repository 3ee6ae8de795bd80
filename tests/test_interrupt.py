"""rewardlab.interrupt: the first SIGINT or SIGTERM is a request, the second a KeyboardInterrupt; the handlers before
are restored; a SIGTERM's grace period ends the process; the resume command keeps the user's arguments."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import rewardlab
from rewardlab.interrupt import (EXIT_INTERRUPTED, SIGTERM_GRACE_S, Interrupted, StopRequest, resume_command,
                                 sigterm_grace_s)


def test_first_sigint_is_a_request_second_stops_and_the_previous_handler_comes_back(capsys):
    calls = []
    previous = signal.signal(signal.SIGINT, lambda *a: calls.append("outer"))
    try:
        outer = signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            with StopRequest() as stop:
                assert not stop.requested
                signal.raise_signal(signal.SIGINT)  # handled: no exception, a request
                assert stop.requested
                assert "finishing the current step" in capsys.readouterr().err
                signal.raise_signal(signal.SIGINT)  # the second one stops at once
                pytest.fail("the second SIGINT did not stop the block")
        assert signal.getsignal(signal.SIGINT) is outer
        signal.raise_signal(signal.SIGINT)
        assert calls == ["outer"]  # the outer handler is in place again, and was not called inside the block
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_request_restores_the_handler_when_the_block_ends_normally():
    before = signal.getsignal(signal.SIGINT)
    with StopRequest():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_resume_command_keeps_the_arguments_drops_overwrite_and_adds_resume():
    assert resume_command(["train", "--config", "my run.yaml", "--out", "R", "--overwrite", "rl.lr=1e-4"]) == (
        "rewardlab train --config 'my run.yaml' --out R rl.lr=1e-4 --resume")
    assert resume_command(["sft", "--out", "R", "--resume"]) == "rewardlab sft --out R --resume"


def test_interrupted_names_step_checkpoint_and_command():
    exc = Interrupted("train", "runs/x", 7, "runs/x/checkpoints/step-7")
    assert isinstance(exc, KeyboardInterrupt) and EXIT_INTERRUPTED == 130
    assert str(exc) == ("interrupted at step 7; checkpoint step-7 written; continue with: "
                        "rewardlab train --out runs/x --resume")
    assert exc.message("rewardlab quickstart --out Q --resume").endswith("continue with: rewardlab quickstart --out Q "
                                                                         "--resume")


def test_first_sigterm_is_a_request_with_a_deadline_and_a_second_signal_stops(capsys):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(KeyboardInterrupt):
        with StopRequest(grace_s=600) as stop:
            try:
                signal.raise_signal(signal.SIGTERM)  # handled: no exception, a request, and the grace period starts
                assert stop.requested and stop.signum == signal.SIGTERM
                assert "rewardlab: SIGTERM: finishing the current step, then writing a checkpoint, within 600 s" in (
                    capsys.readouterr().err)
                signal.raise_signal(signal.SIGINT)  # a second signal of either kind stops at once
                pytest.fail("the second signal did not stop the block")
            finally:
                stop.cancel_deadline()
    assert {s: signal.getsignal(s) for s in before} == before


def test_the_process_exits_143_when_the_grace_period_ends_before_the_step():
    code = ("import os, signal, time\nfrom rewardlab.interrupt import StopRequest\n"
            "with StopRequest(grace_s=0.5):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(60)\n")
    src = str(Path(rewardlab.__file__).parents[1])  # this checkout's rewardlab in the child too
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=src))
    assert proc.returncode == 143
    assert proc.stderr.strip().splitlines()[-1] == (
        "rewardlab: SIGTERM: the 0.5 s grace period is over; stopping now (the step in progress is lost; --resume "
        "continues from the last checkpoint)")


def test_sigterm_grace_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.delenv("REWARDLAB_SIGTERM_GRACE_S", raising=False)
    assert sigterm_grace_s() == SIGTERM_GRACE_S == 20.0
    monkeypatch.setenv("REWARDLAB_SIGTERM_GRACE_S", "7.5")
    assert sigterm_grace_s() == 7.5 and StopRequest().grace_s == 7.5
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("REWARDLAB_SIGTERM_GRACE_S", bad)
        with pytest.raises(ValueError, match=rf"^REWARDLAB_SIGTERM_GRACE_S: expected a number of seconds >= 0, got "
                                             rf"'{bad}'$"):
            sigterm_grace_s()


def test_interrupted_by_sigterm_says_so_and_exits_143():
    exc = Interrupted("train", "runs/x", 7, "runs/x/checkpoints/step-7", signum=signal.SIGTERM)
    assert exc.exit_status == 143 and Interrupted("sft", "r", 1, "r/c").exit_status == 130
    assert str(exc) == ("stopped by SIGTERM at step 7; checkpoint step-7 written; continue with: "
                        "rewardlab train --out runs/x --resume")


def test_the_cli_refuses_a_bad_grace_period_before_anything_starts(monkeypatch, tmp_path, capsys):
    from rewardlab.cli import main

    monkeypatch.setenv("REWARDLAB_SIGTERM_GRACE_S", "soon")
    assert main(["train", "--model", "tiny", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip() == ("rewardlab train: error: REWARDLAB_SIGTERM_GRACE_S: expected a number "
                                               "of seconds >= 0, got 'soon'")
    assert not (tmp_path / "r").exists()
