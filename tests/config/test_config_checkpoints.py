"""`save_every` and `keep_checkpoints` mean the same on every verb that trains, and are CLI overrides of each."""

import pytest
import yaml

from conftest import CHAIN_SUM, TINY_OVERRIDES
from rewardlab.cli import main
from rewardlab.runs import RunDir
from rewardlab.config import (ConfigError, PrmLabelConfig, PrmTrainConfig, RmTrainConfig, SFTConfig, TrainConfig,
                              load_config)

TRAINING = [TrainConfig, SFTConfig, RmTrainConfig, PrmTrainConfig]


@pytest.mark.parametrize("cls", TRAINING)
def test_every_training_verb_has_the_checkpoint_keys_of_train(cls):
    data = ["data=x.jsonl"] if cls in (RmTrainConfig, PrmTrainConfig) else []
    cfg = load_config(cls, overrides=[*data, "save_every=50", "keep_checkpoints=3"])
    assert (cfg.save_every, cfg.keep_checkpoints) == (50, 3)
    default = load_config(cls, overrides=data)
    assert (default.save_every, default.keep_checkpoints) == (25, 2)
    for key in ("save_every", "keep_checkpoints"):
        assert cls.model_fields[key].description == TrainConfig.model_fields[key].description
    with pytest.raises(ConfigError, match="save_every: Input should be greater than 0"):
        load_config(cls, overrides=[*data, "save_every=0"])


def test_prm_label_checkpoints_every_question_batch_by_default():
    cfg = load_config(PrmLabelConfig)
    assert (cfg.save_every, cfg.keep_checkpoints) == (1, 2)
    assert "question batches" in PrmLabelConfig.model_fields["save_every"].description


def test_sft_save_every_on_the_command_line(tmp_path):
    out = tmp_path / "sft"
    task = "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items()) + ", size: 20, test_size: 2}"
    assert main(["sft", "--no-progress", "--out", str(out), "save_every=2", "sft.steps=5", "sft.batch_size=2",
                 task, *TINY_OVERRIDES]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["save_every"] == 2
    # checkpoints at steps 2 and 4 and the final 5; keep_checkpoints=2 leaves the last two
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-4", "step-5"]


def test_sft_resume_refuses_other_settings_but_may_train_longer(tmp_path, capsys):
    out = tmp_path / "sft"
    task = "task.options={" + ", ".join(f"{k}: {v}" for k, v in CHAIN_SUM.items()) + ", size: 20, test_size: 2}"
    base = ["sft", "--no-progress", "--out", str(out), "save_every=2", "sft.batch_size=2", task, *TINY_OVERRIDES]
    assert main([*base, "sft.steps=2"]) == 0
    capsys.readouterr()
    assert main([*base, "sft.steps=2", "sft.lr=0.01", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "was started with other settings: sft.lr (run: 0.003, now: 0.01)" in err
    assert main([*base, "sft.steps=4", "--resume"]) == 0  # sft.steps may change: train on
    assert [r["step"] for r in RunDir(out).read_jsonl("metrics.jsonl")] == [1, 2, 3, 4]
