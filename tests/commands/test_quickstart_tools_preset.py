"""`rewardlab quickstart --preset tools`: the preset's defaults, its refusals, and its stages wired end to end on a
very small budget (SFT on calculator traces, GRPO on episodes, greedy held-out episodes, the no-tool comparison)."""

import json

import pytest
from conftest import TINY_OVERRIDES

from rewardlab.cli import main, parse
from rewardlab.config import ConfigError, QuickstartConfig, load_config


def test_preset_tools_sets_the_sections_and_keys_given_still_win():
    plain = load_config(QuickstartConfig)
    tools = load_config(QuickstartConfig, None, ["preset=tools"])
    assert plain.preset == "arithmetic" and plain.task.spec == "reasoning_gym:chain_sum"
    assert plain.sft.tool_frac is None and plain.rl.sampling.max_new_tokens == 4
    assert tools.task.spec == "env:calculator"
    assert tools.task.options == {"size": 5000, "test_size": 300, "max_terms": 2}
    assert (tools.sft.tool_frac, tools.sft.eval_every, tools.rl.sampling.max_new_tokens,
            tools.env.max_turns) == (0.5, 0, 24, 3)
    # an override of one key, before or after the preset, changes that key only
    for overrides in (["rl.steps=5", "preset=tools"], ["preset=tools", "rl.steps=5"]):
        edited = load_config(QuickstartConfig, None, overrides)
        assert edited.rl.steps == 5
        assert edited.model_dump() == {**tools.model_dump(), "rl": {**tools.model_dump()["rl"], "steps": 5}}
    assert parse(["quickstart", "--preset", "tools"])[2] == ["preset=tools"]


@pytest.mark.parametrize("overrides, match", [
    (["preset=foo"], "preset"),
    (["sft.tool_frac=0.5"], "sft.tool_frac: applies to environment tasks"),
    (["preset=tools", "task.spec=reasoning_gym:chain_sum"], "preset tools runs env:calculator"),
    (["task.spec=env:calculator"], "run it with preset tools"),
    (["preset=tools", "task.options.parser=hermes"], "task.options.parser: preset tools runs"),
    (["preset=tools", "env.max_episode_tokens=16"], "rl.sampling.max_new_tokens: 24 tokens per model turn"),
])
def test_preset_refusals_are_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(QuickstartConfig, None, overrides)


def test_the_no_tool_comparison_asks_the_same_questions():
    from rewardlab.commands.quickstart import no_tool_task
    from rewardlab.tasks import load

    cfg = load_config(QuickstartConfig, None, ["preset=tools", "task.options={size: 200, test_size: 12, seed: 3}"])
    plain = no_tool_task(cfg)
    assert plain.spec == "reasoning_gym:chain_sum" and plain.options["template"] == "compact"
    env_task, single = load(cfg.task.spec, **cfg.task.options), load(plain.spec, **plain.options)
    assert env_task.env is not None and single.env is None
    for split in ("train", "test"):
        a, b = env_task.split(split), single.split(split)
        assert [(r["prompt"], r["answer"]) for r in a] == [(r["prompt"], r["answer"]) for r in b] and a


@pytest.mark.slow
def test_tools_preset_runs_every_stage_and_reports_the_figures(tmp_path):
    q = tmp_path / "T"
    args = ["quickstart", "--preset", "tools", "--no-progress", "--out", str(q), *TINY_OVERRIDES,
            "task.options={size: 200, test_size: 12}", "sft.steps=3", "sft.batch_size=8", "rl.steps=1",
            "rl.prompts_per_step=2", "rl.group_size=2"]
    assert main(args) == 0
    summary = json.loads((q / "summary.json").read_text())
    assert summary["held_out_questions"] == 12 and summary["no_tool_task"] == "reasoning_gym:chain_sum"
    for arm in ("sft", "grpo"):
        fig = summary[arm]
        assert 0 <= fig["accuracy"] <= 1 and 0 <= fig["tool_call_rate"] <= 1 and fig["tool_errors_per_episode"] >= 0
        assert abs(sum(fig["terminations"].values()) - 1) < 1e-9
    assert set(summary["no_tool"]) == {"accuracy", "checkpoint"}  # single completions: no tool figures
    assert summary["improvement_points"] == pytest.approx(100 * (summary["grpo"]["accuracy"]
                                                                 - summary["sft"]["accuracy"]))
    assert set(summary["stage_seconds"]) == {"sft", "eval_sft", "grpo", "eval_grpo", "no_tool_sft", "no_tool_grpo",
                                             "eval_no_tool"}
    # the environment's GRPO ran episodes; the no-tool one single completions of the same questions
    grpo = [json.loads(line) for line in (q / "grpo" / "metrics.jsonl").read_text().splitlines()]
    plain = [json.loads(line) for line in (q / "no_tool_grpo" / "metrics.jsonl").read_text().splitlines()]
    assert "tool/call_rate" in grpo[-1] and "tool/call_rate" not in plain[-1]
    assert json.loads((q / "eval_sft" / "summary.json").read_text())["n_questions"] == 12
    # --resume reuses every finished stage and writes the same figures
    assert main([*args, "--resume"]) == 0
    again = json.loads((q / "summary.json").read_text())
    assert {k: v for k, v in again.items() if k not in ("stage_seconds", "total_seconds")} == \
        {k: v for k, v in summary.items() if k not in ("stage_seconds", "total_seconds")}
