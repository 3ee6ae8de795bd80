"""`rewardlab quickstart` and its run directory: run twice it is refused, --resume reuses finished stages and resumes
the interrupted one, --overwrite replaces the whole directory (what `make demo` does)."""

import json
import shutil

from conftest import TINY_OVERRIDES
from rewardlab.cli import main

ARGS = ["quickstart", "--no-progress", *TINY_OVERRIDES,
        "task.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, template: compact, size: 300, "
        "test_size: 20}", "sft.steps=3", "sft.batch_size=8", "rl.steps=26", "rl.prompts_per_step=2", "rl.group_size=2",
        "eval.n=2", "eval.k=[1,2]"]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _figures(summary):
    return {k: v for k, v in summary.items() if k not in ("stage_seconds", "total_seconds")}


def test_quickstart_refuses_a_used_directory_resumes_by_stage_and_overwrites(tmp_path, capsys):
    q = tmp_path / "Q"
    assert main([*ARGS, "--out", str(q)]) == 0
    expected = json.loads((q / "summary.json").read_text())
    assert sorted(p.name for p in (q / "grpo" / "checkpoints").iterdir()) == ["step-25", "step-26"]  # resumable
    capsys.readouterr()
    assert main([*ARGS, "--out", str(q)]) == 2
    assert capsys.readouterr().err.strip() == (f"rewardlab quickstart: error: out: {q} already holds a run; pass "
                                               "--resume to continue it or --overwrite to replace it")

    # The state a crash during GRPO step 26 leaves.
    r = shutil.copytree(q, tmp_path / "R")
    for gone in ("summary.json", "grpo/summary.json", "eval_grpo"):
        shutil.rmtree(r / gone) if (r / gone).is_dir() else (r / gone).unlink()
    shutil.rmtree(r / "grpo" / "checkpoints" / "step-26")
    metrics = (r / "grpo" / "metrics.jsonl").read_text().splitlines(keepends=True)
    (r / "grpo" / "metrics.jsonl").write_text("".join(metrics[:25]) + metrics[25][:20])
    sft_before = {p.name: p.read_bytes() for p in (r / "sft").iterdir() if p.is_file()}
    eval_sft_before = (r / "eval_sft" / "summary.json").read_bytes()
    assert main([*ARGS, "--out", str(r), "--resume"]) == 0
    # (the reused stages' summaries were copied from Q, so the checkpoint paths they name are Q's)
    got = json.loads((r / "summary.json").read_text().replace(str(r), str(q)))
    assert _figures(got) == _figures(expected)
    assert {p.name: p.read_bytes() for p in (r / "sft").iterdir() if p.is_file()} == sft_before  # reused
    assert (r / "eval_sft" / "summary.json").read_bytes() == eval_sft_before
    assert [m["step"] for m in _lines(r / "grpo" / "metrics.jsonl")] == list(range(1, 27))  # each step once
    assert [e["step"] for e in _lines(r / "grpo" / "events.jsonl") if e["event"] == "resume_from"] == [25]

    assert main([*ARGS, "--out", str(r), "--resume", "rl.steps=30"]) == 2
    assert "other settings: rl.steps (run: 26, now: 30)" in capsys.readouterr().err
    assert main([*ARGS, "--out", str(q), "--overwrite"]) == 0  # `make demo` twice
    assert _figures(json.loads((q / "summary.json").read_text())) == _figures(expected)
    assert [e["event"] for e in _lines(q / "events.jsonl")] == ["overwrite"]
