"""Command line: exit codes and one-line errors."""

import json

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.runs import RunDir


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert all(verb in out for verb in ("quickstart", "sft", "train", "evaluate"))


def test_verb_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    assert "--resume" in capsys.readouterr().out


def test_unknown_verb_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        main(["fly"])
    assert info.value.code == 2


def test_unknown_override_key(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "rl.lrr=1e-4"]) == 2
    line = _stderr_line(capsys)
    assert line.startswith("rewardlab train: error:") and "rl.lrr" in line and "unknown key" in line


def test_overrides_after_a_flag_that_follows_overrides_are_applied(tmp_path, capsys):
    # argparse alone stops collecting `key=value` once a flag follows them; main() picks up the rest.
    assert main(["evaluate", "eval.n=2", "--out", str(tmp_path / "run"), "eval.n=many"]) == 2
    line = _stderr_line(capsys)
    assert "eval.n" in line and "many" in line
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "eval.n=2", "--out", str(tmp_path / "run"), "--bogus"])
    assert info.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_bad_override_value(tmp_path, capsys):
    assert main(["evaluate", "--out", str(tmp_path / "run"), "eval.n=many"]) == 2
    line = _stderr_line(capsys)
    assert "eval.n" in line and "integer" in line


def test_missing_task_file(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "--task", "jsonl:/nonexistent/x.jsonl"]) == 2
    line = _stderr_line(capsys)
    assert line.startswith("rewardlab train: error:") and "/nonexistent/x.jsonl" in line and "not found" in line


def test_missing_config_file(tmp_path, capsys):
    assert main(["sft", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in _stderr_line(capsys)


def test_resume_without_checkpoint(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}=", "answer": str(i)} for i in range(4)])
    args = ["train", "--no-progress", "--out", str(tmp_path / "run"), "--task", f"jsonl:{data}", "--resume",
            "task.options={test_size: 1}", *TINY_OVERRIDES]
    assert main(args) == 2
    assert _stderr_line(capsys) == f"rewardlab train: error: --resume: {tmp_path / 'run'} holds no run to resume"
    assert not (tmp_path / "run").exists()
    RunDir.start(tmp_path / "run").close()  # a run that died before its first checkpoint
    assert main(args) == 2
    assert _stderr_line(capsys) == (f"rewardlab train: error: --resume: cannot resume {tmp_path / 'run'}: it has no "
                                    "checkpoint")


def test_resume_and_overwrite_exclude_each_other(tmp_path, capsys):
    assert main(["evaluate", "--out", str(tmp_path / "run"), "--resume", "--overwrite"]) == 2
    assert _stderr_line(capsys) == "rewardlab evaluate: error: --resume and --overwrite exclude each other"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv", [["quickstart"], ["sft"], ["train"], ["evaluate"], ["search"], ["rm", "train"],
                                  ["rm", "eval"], ["rm", "pairs"], ["prm", "label"], ["prm", "train"]])
def test_every_verb_takes_resume_and_overwrite(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--resume" in out and "--overwrite" in out


def test_evaluate_writes_summary(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}=", "answer": str(i)} for i in range(6)])
    out = tmp_path / "eval"
    rc = main(["evaluate", "--no-progress", "--model", "tiny", "--task", f"jsonl:{data}", "--out", str(out),
               "task.options={test_size: 2}", "split=test", "eval.n=2", "eval.k=[1, 2]", "eval.max_new_tokens=2",
               *TINY_OVERRIDES])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_questions"] == printed["n_questions"] == 2  # the held-out split asked for: test_size 2
    assert summary["split"] == "test" and 0.0 <= summary["pass@2"] <= 1.0
    assert "examples" in summary and "examples" not in printed
    assert (out / "config.yaml").is_file()


def test_bad_task_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--task", "jsonl:/nonexistent/x.jsonl"]) == 2
    assert not out.exists()


def test_reward_error_with_on_error_raise_is_one_line(tmp_path, capsys):
    # JSONL rows lack the reasoning-gym fields (dataset, question, metadata), so the reasoning_gym reward
    # fails on every rollout, and on_error=raise turns that into a one-line CLI error.
    task = write_jsonl(tmp_path / "t.jsonl", [{"prompt": f"{i}=", "answer": str(i)} for i in range(12)])
    code = main(["train", "--out", str(tmp_path / "run"), "--task", f"jsonl:{task}", "--no-progress",
                 "rewards=[{name: reasoning_gym}]", "on_error=raise", "rl.steps=1", "rl.prompts_per_step=2",
                 "rl.group_size=2", "rl.sampling.max_new_tokens=2", *TINY_OVERRIDES])
    assert code == 2
    line = _stderr_line(capsys)
    assert "reasoning_gym: KeyError" in line


def test_quickstart_runs_all_stages_and_writes_summary(tmp_path, capsys):
    out = tmp_path / "qs"
    code = main(["quickstart", "--out", str(out), "--no-progress", *TINY_OVERRIDES,
                 "task.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, template: compact, "
                 "size: 300, test_size: 20}",
                 "sft.steps=3", "sft.batch_size=8", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2",
                 "eval.n=2", "eval.k=[1,2]"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["held_out_questions"] == 20
    for stage in ("sft", "grpo"):
        assert 0.0 <= summary[stage]["accuracy"] <= 1.0 and 0.0 <= summary[stage]["pass@2"] <= 1.0
    # improvement is the difference of the two accuracies, in points
    assert summary["improvement_points"] == pytest.approx(100 * (summary["grpo"]["accuracy"] - summary["sft"]["accuracy"]))
    assert set(summary["stage_seconds"]) == {"sft", "eval_sft", "grpo", "eval_grpo"}
    for sub in ("sft", "eval_sft", "grpo", "eval_grpo"):
        assert (out / sub / "summary.json").is_file()
    assert "after GRPO" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["sft", "evaluate"])
def test_bad_task_leaves_no_run_directory_for_sft_and_evaluate(tmp_path, capsys, verb):
    out = tmp_path / "run"
    assert main([verb, "--out", str(out), "--task", "reasoning_gym:no_such_dataset"]) == 2
    assert "no_such_dataset" in _stderr_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("verb", ["sft", "train", "evaluate", "search"])
def test_task_help_names_the_environment_forms(verb, capsys):
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert "env:NAME" in help_text
    if verb == "search":  # search samples single completions: it says where environment tasks run
        assert "env:NAME, runs in train, sft and evaluate" in help_text
    else:
        assert "calculator, guess_number, python" in help_text
        assert "env:MODULE:CLASS" in help_text and "env:PATH.py:CLASS" in help_text
