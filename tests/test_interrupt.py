"""rewardlab.interrupt: the first SIGINT is a request, the second a KeyboardInterrupt; the handler before is restored;
the resume command keeps the user's arguments."""

import signal

import pytest

from rewardlab.interrupt import EXIT_INTERRUPTED, Interrupted, StopRequest, resume_command


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
