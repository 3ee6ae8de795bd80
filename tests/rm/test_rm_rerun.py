"""`rm pairs` and `rm eval` run directories: a used one is refused; --resume reruns the job whole with the same
settings and gives the same output; --overwrite replaces it."""

import json

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main


def _err(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _json(path):
    return {k: v for k, v in json.loads(path.read_text()).items() if k != "wall_s"}


def test_pairs_and_eval_refuse_a_used_directory_and_rerun_on_resume(tmp_path, capsys):
    # One-character answers and one-token completions: the tiny model is right now and then (see test_rm_cli).
    task = write_jsonl(tmp_path / "task.jsonl", [{"prompt": f"{i}=", "answer": "a"} for i in range(14)])
    pairs = ["rm", "pairs", "--no-progress", "--model", "tiny", "--task", f"jsonl:{task}", "--out",
             str(tmp_path / "P"), "task.options={test_size: 2}", "pairs.n=64", "pairs.max_new_tokens=1",
             *TINY_OVERRIDES]
    assert main(pairs) == 0
    first = (tmp_path / "P" / "pairs.jsonl").read_bytes()
    summary = _json(tmp_path / "P" / "summary.json")
    capsys.readouterr()
    assert main(pairs) == 2
    assert _err(capsys) == (f"rewardlab rm pairs: error: out: {tmp_path / 'P'} already holds a run; pass --resume "
                            "to continue it or --overwrite to replace it")
    assert main([*pairs, "--resume"]) == 0
    assert (tmp_path / "P" / "pairs.jsonl").read_bytes() == first and _json(tmp_path / "P" / "summary.json") == summary
    assert main([*pairs, "--resume", "pairs.n=32"]) == 2
    assert "other settings: pairs.n (run: 64, now: 32)" in _err(capsys)
    assert main([*pairs, "--overwrite", "pairs.n=32"]) == 0
    assert _json(tmp_path / "P" / "summary.json")["samples"] == 12 * 32

    ev = ["rm", "eval", "--no-progress", "--data", str(tmp_path / "P" / "pairs.jsonl"), "--out", str(tmp_path / "E"),
          "scorer=[{name: exact_match}]"]
    assert main(ev) == 0
    report = _json(tmp_path / "E" / "report.json")
    assert report["pairs"]["accuracy"] == 1.0
    capsys.readouterr()
    assert main(ev) == 2
    assert "already holds a run; pass --resume" in _err(capsys)
    assert main([*ev, "--resume"]) == 0
    assert _json(tmp_path / "E" / "report.json") == report
    assert main([*ev, "--resume", "scorer=[{name: numeric}]"]) == 2
    assert "other settings: scorer (run: [{'name': 'exact_match'}], now: [{'name': 'numeric'}])" in _err(capsys)
