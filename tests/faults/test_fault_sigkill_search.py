"""SIGKILL `rewardlab search` twice at seeded random moments, resume it with --resume each time, and get the
uninterrupted run's report back (but for wall-clock fields), each unit done once."""

import json
import random

from cli_kill import check_every_log, count_lines, kill_after_line, read_strict
from conftest import TINY_OVERRIDES
from rewardlab.cli import main

UNITS = 15  # greedy, pool, 3 selection methods x 3 budgets, beam and DVTS at N = 2 and 4
TIMING = ("timing_s", "select_s", "wall_s")


def _args(out):
    return ["search", "--model", "tiny", "--task", "reasoning_gym:chain_sum", "--out", str(out),
            "--scorer", "arithmetic_steps", "--n", "1,2,4", *TINY_OVERRIDES,
            "task.options={min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, template: compact, "
            "target: steps, size: 60, test_size: 3}",
            "search.beam_width=2", "search.max_steps=2", "search.max_new_tokens=8", "search.max_step_tokens=4",
            "search.temperature=1.5"]


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING and not k.endswith("_s")}
    return obj


def test_search_killed_twice_and_resumed_writes_the_uninterrupted_report(tmp_path):
    rng = random.Random(5)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*_args(a), "--no-progress"]) == 0

    kill_after_line(_args(b), b / "units.jsonl", rng.randint(1, 6), rng)
    done = count_lines(b / "units.jsonl")
    kill_after_line([*_args(b), "--resume"], b / "units.jsonl", rng.randint(done + 2, UNITS - 3), rng)
    assert not (b / "report.json").exists() and count_lines(b / "units.jsonl") < UNITS
    assert main([*_args(b), "--resume", "--no-progress"]) == 0

    check_every_log(b)
    got, expected = read_strict(b / "units.jsonl"), read_strict(a / "units.jsonl")
    assert [u["unit"] for u in got] == [u["unit"] for u in expected] and len(got) == UNITS  # each unit once
    assert [_strip(u) for u in got] == [_strip(u) for u in expected]  # same results and RNG states
    report, full = json.loads((b / "report.json").read_text()), json.loads((a / "report.json").read_text())
    full["plot"] = str(b / "accuracy_vs_n.png")
    assert _strip(report) == _strip(full)
    # the sampled completions differ from each other, so a resume that drew other samples would show
    assert any(len(set(q)) > 1 for q in got[1]["completions"])
