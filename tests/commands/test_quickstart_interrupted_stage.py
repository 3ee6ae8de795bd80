"""`quickstart --resume` resumes a stage that a Ctrl-C stopped (its summary says interrupted) instead of reusing it."""

import json

from rewardlab.commands.quickstart import _stage_mode


def test_a_stage_stopped_by_ctrl_c_is_resumed_and_a_finished_one_reused(tmp_path):
    stage = tmp_path / "grpo"
    (stage / "checkpoints" / "step-3").mkdir(parents=True)
    (stage / "summary.json").write_text(json.dumps({"stage": "train", "steps_done": 3, "interrupted": True}))
    assert _stage_mode(stage, resume=True) == {"mode": "resume"}
    finished = {"stage": "train", "steps_done": 3, "interrupted": False}
    (stage / "summary.json").write_text(json.dumps(finished))
    assert _stage_mode(stage, resume=True) == {"summary": finished}
