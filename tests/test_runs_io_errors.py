"""Failed writes in a run directory (full disk, file too large) are one-line OSErrors naming the file, whatever
library did the writing; other errors pass through unchanged."""

import errno

import pytest

from rewardlab.cli import main
from rewardlab.runs import RunDir, as_os_error, atomic_write_text


def test_as_os_error_finds_the_io_failure_behind_library_errors():
    rust = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # safetensors
    assert (as_os_error(rust).errno, as_os_error(rust).strerror) == (errno.ENOSPC, "No space left on device")
    try:  # torch.save into a Python file: its RuntimeError is raised while handling the OSError
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError:
            raise RuntimeError("unexpected pos 704 vs 598")
    except RuntimeError as exc:
        assert as_os_error(exc).errno == errno.EFBIG
    assert as_os_error(ValueError("a bug, not I/O")) is None


def test_a_checkpoint_whose_library_fails_to_write_is_a_one_line_oserror(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint(1, lambda tmp: (tmp / "w").write_text("w1"))

    def safetensors_like(tmp):
        (tmp / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("Error while serializing: I/O error: File too large (os error 27)")

    with pytest.raises(OSError) as info:
        run.save_checkpoint(2, safetensors_like)
    assert info.value.errno == errno.EFBIG
    assert info.value.strerror == (f"checkpoint step-2 in {tmp_path / 'checkpoints'} could not be written (File too "
                                   "large); the previous checkpoint step-1 is intact")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]

    def bug(tmp):
        (tmp / "x").write_text("x")
        raise KeyError("not an I/O error")

    with pytest.raises(KeyError):
        run.save_checkpoint(3, bug)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]  # temp dir removed all the same


def test_failed_log_and_file_writes_name_the_file(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "metrics.jsonl").mkdir()  # appending to it fails (EISDIR)
    with pytest.raises(OSError) as info:
        run.log_metrics(1, {"x": 1})
    assert info.value.strerror == (f"could not append to {tmp_path / 'metrics.jsonl'} (Is a directory); a torn last "
                                   "line is cut on --resume")
    (tmp_path / "summary.json").mkdir()  # renaming onto it fails
    with pytest.raises(OSError) as info:
        atomic_write_text(tmp_path / "summary.json", "{}")
    assert info.value.strerror.startswith(f"could not write {tmp_path / 'summary.json'} (")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_the_cli_prints_an_io_error_without_the_errno_prefix(tmp_path, capsys, monkeypatch):
    import rewardlab.commands.evaluate as evaluate_command

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, f"could not write {tmp_path}/summary.json (No space left on device)")

    monkeypatch.setattr(evaluate_command, "run", full_disk)
    assert main(["evaluate", "--out", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err.strip() == (f"rewardlab evaluate: error: could not write {tmp_path}/summary.json "
                                               "(No space left on device)")
