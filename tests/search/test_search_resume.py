"""`rewardlab search` and its run directory: each finished unit (greedy, the sample pool, a method at a budget) is
logged with the RNG state; --resume skips the logged units and writes the uninterrupted run's report."""

import json
import shutil

import pytest

from conftest import TINY_OVERRIDES
from rewardlab.config import SearchConfig, load_config
from rewardlab.runs import RunDirError
from rewardlab.commands.search import run as run_search

TIMING = ("timing_s", "select_s", "wall_s")  # wall-clock fields


def _config(out, *overrides):
    return load_config(SearchConfig, None, [
        f"out={out}", "model.path=tiny", *TINY_OVERRIDES, "task.spec=reasoning_gym:chain_sum",
        "task.options={min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, template: compact, target: steps, "
        "size: 60, test_size: 3}", "scorer=arithmetic_steps", "search.n=[1, 2, 4]", "search.beam_width=2",
        "search.max_steps=2", "search.max_new_tokens=8", "search.max_step_tokens=4", *overrides])


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _strip(obj):
    """`obj` without wall-clock fields."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING and not k.endswith("_s")}
    return obj


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    run_search(_config(tmp / "A"), show_progress=False)
    return tmp / "A"


def test_units_are_logged_in_order(uninterrupted):
    units = [u["unit"] for u in _lines(uninterrupted / "units.jsonl")]
    assert units == ["greedy", "pool", "best_of_n:1", "majority:1", "weighted_majority:1", "best_of_n:2",
                     "majority:2", "weighted_majority:2", "best_of_n:4", "majority:4", "weighted_majority:4",
                     "beam:2", "beam:4", "dvts:2", "dvts:4"]
    pool = _lines(uninterrupted / "units.jsonl")[1]
    assert [len(c) for c in pool["completions"]] == [4, 4, 4]  # max(N) samples for each of the 3 questions
    report = json.loads((uninterrupted / "report.json").read_text())
    assert report["pass@N"]["4"] == sum(any(c) for c in pool["correct"]) / 3


@pytest.mark.parametrize("cut", [1, 2, 12, 14])  # after greedy, the pool, beam at N=2, DVTS at N=2
def test_resume_after_any_unit_writes_the_uninterrupted_report(uninterrupted, tmp_path, cut):
    d = shutil.copytree(uninterrupted, tmp_path / "D")
    lines = (uninterrupted / "units.jsonl").read_text().splitlines(keepends=True)
    (d / "report.json").unlink()
    (d / "units.jsonl").write_text("".join(lines[:cut]) + lines[cut][:30])  # killed while logging the next unit
    report = run_search(_config(d), mode="resume", show_progress=False)
    expected = json.loads((uninterrupted / "report.json").read_text())
    assert _strip(report) == _strip({**expected, "plot": str(d / "accuracy_vs_n.png")})
    assert _strip(json.loads((d / "report.json").read_text())) == _strip(report)
    assert [_strip(u) for u in _lines(d / "units.jsonl")] == [_strip(u) for u in _lines(uninterrupted / "units.jsonl")]


def test_logged_units_are_not_run_again(uninterrupted, tmp_path):
    d = shutil.copytree(uninterrupted, tmp_path / "D")
    units = _lines(uninterrupted / "units.jsonl")
    units[1]["correct"] = [[False] * 4, [False] * 4, [True] * 4]  # only question 3 right in the logged pool
    (d / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units[:2]))
    report = run_search(_config(d), mode="resume", show_progress=False)
    assert report["pass@N"] == {"1": 1 / 3, "2": 1 / 3, "4": 1 / 3}


def test_a_resume_with_other_settings_is_refused(uninterrupted, tmp_path):
    d = shutil.copytree(uninterrupted, tmp_path / "D")
    with pytest.raises(RunDirError, match=r"other settings: search.n \(run: \[1, 2, 4\], now: \[1, 2\]\)"):
        run_search(_config(d, "search.n=[1, 2]"), mode="resume", show_progress=False)
    with pytest.raises(RunDirError, match="already holds a run"):
        run_search(_config(d), show_progress=False)
