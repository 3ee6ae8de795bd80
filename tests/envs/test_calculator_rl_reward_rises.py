"""End to end in the `calculator` environment: after a short SFT on a mix of tool traces and direct answers, GRPO on
episodes raises the mean reward within a few dozen steps, by calling the tool more (the tiny model cannot add two
3-4 digit numbers in its head, so only a call and a copied result pay)."""

import json

import pytest

from rewardlab.cli import main


def _metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_grpo_in_the_calculator_raises_the_reward_by_calling_the_tool(tmp_path):
    task = ["--task", "env:calculator", "task.options={size: 2000, test_size: 50, max_terms: 2}", "threads=1",
            "env.max_turns=3", "env.max_episode_tokens=72", "env.max_tool_tokens=16"]
    sft, grpo = tmp_path / "sft", tmp_path / "grpo"
    main(["sft", "--model", "tiny", "--out", str(sft), "--no-progress", *task, "sft.steps=300", "sft.batch_size=64",
          "sft.lr=1e-3", "sft.tool_frac=0.5", "sft.eval_every=0"])
    main(["train", "--model", str(sft / "checkpoints" / "step-300"), "--out", str(grpo), "--no-progress", *task,
          "rl.steps=10", "rl.prompts_per_step=16", "rl.group_size=8", "rl.lr=2e-4", "rl.sampling.temperature=0.7",
          "rl.sampling.max_new_tokens=24", "save_every=100"])
    m = _metrics(grpo)
    assert [x["step"] for x in m] == list(range(1, 11))
    # the first step samples the SFT model; the last three, the policy after 7-9 updates
    first = {k: m[0][k] for k in ("reward/mean", "tool/calls_mean")}
    last = {k: sum(x[k] for x in m[-3:]) / 3 for k in ("reward/mean", "tool/calls_mean")}
    assert last["reward/mean"] > first["reward/mean"] + 0.25, [round(x["reward/mean"], 3) for x in m]
    assert last["tool/calls_mean"] > first["tool/calls_mean"] + 0.25, [round(x["tool/calls_mean"], 3) for x in m]
