"""The `rl` keys that moved into sections (rl.sampling, rl.filtering, rl.eval, rl.logging, rl.ray): each old flat name
is read at its new place for one release with one warning line, giving both names is a one-line error, and a run
directory whose config.yaml an earlier release wrote with the flat names still resumes."""

import copy
import warnings

import pytest
import yaml
from pydantic import ValidationError

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.config import (ConfigDeprecationWarning, ConfigError, RLConfig, TrainConfig, dump_config, load_config,
                              renamed_keys, validate)
from rewardlab.runs import RunDir, RunDirError, check_resume_config

#: Each old key, a value other than its new key's default, and the overrides it needs to be valid.
OLD_VALUES = {
    "rl.temperature": ("0.5", []), "rl.top_p": ("0.9", []), "rl.max_new_tokens": ("5", []),
    "rl.max_prompt_length": ("32", []), "rl.rollout_chunk": ("16", []), "rl.group_filter": ("dapo", []),
    "rl.filter_metric": ("score", []), "rl.group_filter_options": ("{min_std: 0.1}", []),
    "rl.max_rounds": ("2", []), "rl.curriculum": ("pass_rate", []), "rl.curriculum_options": ("{mu: 0.4}", []),
    "rl.eval_every": ("3", []), "rl.eval_n": ("7", []), "rl.log_samples": ("2", []),
    "rl.rollout_workers": ("3", ["rl.engine=ray"]), "rl.reward_workers": ("1", ["rl.engine=ray"]),
    "rl.rollout_worker_cpus": ("1", ["rl.engine=ray"]), "rl.rollout_worker_gpus": ("0.5", ["rl.engine=ray"]),
    "rl.reward_worker_cpus": ("1", ["rl.engine=ray"]), "rl.reward_worker_gpus": ("0.5", ["rl.engine=ray"]),
    "rl.max_staleness": ("1", ["rl.engine=ray"]), "rl.ray_address": ("auto", ["rl.engine=ray"]),
    "rl.ray_dashboard": ("true", ["rl.engine=ray"]),
}


def _load(*overrides, path=None):
    """(config, the ConfigDeprecationWarning messages) of `load_config(TrainConfig, path, overrides)`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(TrainConfig, path, list(overrides))
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigDeprecationWarning)]


def test_the_table_names_every_moved_key_once():
    renamed = renamed_keys(TrainConfig)
    assert sorted(renamed) == sorted(OLD_VALUES)
    new_keys = {k for k in renamed.values()}
    assert len(new_keys) == len(renamed)
    cfg = TrainConfig().model_dump()
    for new in new_keys:  # every new name is a key of the schema
        node = cfg
        for part in new.split("."):
            node = node[part]


@pytest.mark.parametrize("old", sorted(OLD_VALUES))
def test_an_old_key_reads_as_its_new_one_with_one_warning_line(old):
    value, extra = OLD_VALUES[old]
    new = renamed_keys(TrainConfig)[old]
    by_old, said = _load(*extra, f"{old}={value}")
    by_new, said_new = _load(*extra, f"{new}={value}")
    assert said == [f"{old} is now {new}; the old key is read until the next release"]
    assert said_new == []
    assert by_old == by_new and by_old != TrainConfig()


def test_old_keys_in_a_config_file_and_below_a_moved_key(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("rl:\n  temperature: 0.5\n  eval_every: 3\n  lr: 0.01\n")
    new = tmp_path / "new.yaml"
    new.write_text("rl:\n  sampling: {temperature: 0.5}\n  eval: {every: 3}\n  lr: 0.01\n")
    by_old, said = _load("rl.curriculum=pass_rate", "rl.curriculum_options.mu=0.4", path=old)
    by_new, _ = _load("rl.filtering.curriculum=pass_rate", "rl.filtering.curriculum_options.mu=0.4", path=new)
    assert by_old == by_new
    assert by_old.rl.sampling.temperature == 0.5 and by_old.rl.filtering.curriculum_options == {"mu": 0.4}
    assert said == [f"rl.{k} is now rl.{v}; the old key is read until the next release" for k, v in [
        ("temperature", "sampling.temperature"), ("curriculum", "filtering.curriculum"),
        ("curriculum_options", "filtering.curriculum_options"), ("eval_every", "eval.every")]]


def test_a_quickstart_preset_keeps_its_other_sampling_defaults_under_an_old_key():
    from rewardlab.config import QuickstartConfig

    with pytest.warns(ConfigDeprecationWarning):
        cfg = load_config(QuickstartConfig, None, ["preset=tools", "rl.temperature=0.9"])
    assert (cfg.rl.sampling.temperature, cfg.rl.sampling.max_new_tokens, cfg.rl.eval.every) == (0.9, 24, 0)


def test_both_names_are_a_one_line_error_naming_both(tmp_path):
    both = "config error: rl.temperature and rl.sampling.temperature are one setting, given twice (the old name and " \
           "the new); give rl.sampling.temperature only"
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, ["rl.temperature=0.5", "rl.sampling.temperature=0.4"])
    assert str(err.value) == both
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  temperature: 0.5\n")
    with pytest.raises(ConfigError) as err:  # one in the file, one on the command line
        load_config(TrainConfig, path, ["rl.sampling.temperature=0.4"])
    assert str(err.value) == both
    path.write_text("rl:\n  temperature: 0.5\n  sampling: {temperature: 0.4}\n")
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, path, [])
    assert str(err.value) == both
    with pytest.raises(ValidationError, match="rl.eval_every and rl.eval.every are one setting"):
        RLConfig(eval_every=3, eval={"every": 4})


def test_the_cli_says_each_old_key_in_one_line(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "run"), "rl.temperature=0.5", "rl.steps=-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "rewardlab: warning: rl.temperature is now rl.sampling.temperature; the old key is read until the next release",
        "rewardlab train: error: config error: rl.steps: Input should be greater than or equal to 0 (got -1)"]


@pytest.mark.parametrize("key", ["rl.ray.max_staleness=1", "rl.max_staleness=1"])
def test_ray_options_on_engine_local_name_the_new_key(key):
    with pytest.raises(ConfigError) as err:
        _load(key, "rl.ray.reward_workers=1")
    assert str(err.value) == ("config error: rl.ray.reward_workers, rl.ray.max_staleness: applies to rl.engine ray "
                              "only, and rl.engine is local; drop the setting or set rl.engine=ray")


def _flat(config: dict) -> dict:
    """`config` (a train config as dump_config writes it) with the moved keys back at their old flat places, as the
    release before the move wrote config.yaml."""
    rl = copy.deepcopy(config["rl"])
    for old, new in renamed_keys(TrainConfig).items():
        section, key = new.split(".")[1:]
        rl[old.split(".")[1]] = rl[section].pop(key)
    rl["logging"].pop("log_completions"), rl["logging"].pop("log_tokens")  # added after the move
    for section in ("sampling", "filtering", "eval", "logging", "ray"):
        assert rl.pop(section) == {}
    return {**config, "rl": rl}


def test_a_saved_config_with_the_old_keys_compares_equal_to_the_new_one(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "run"))
    run = RunDir.start(cfg.out, mode="new")
    try:
        (run.path / "config.yaml").write_text(yaml.safe_dump(_flat(cfg.model_dump(mode="json")), sort_keys=False))
        with pytest.raises(RunDirError, match="was started with other settings: rl.temperature"):
            check_resume_config(run, dump_config(cfg))  # read as it is, the flat keys differ
        # the two logging keys added after the move are missing from the old file; a resume may add them
        added = ("rl.logging.log_completions", "rl.logging.log_tokens")
        assert check_resume_config(run, dump_config(cfg), added, renamed=renamed_keys(TrainConfig)) == [
            ("rl.logging.log_completions", None, True), ("rl.logging.log_tokens", None, 8)]
        changed = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"lr": 0.5})})
        with pytest.raises(RunDirError, match=r"other settings: rl.lr \(run: 0.0001, now: 0.5\)"):
            check_resume_config(run, dump_config(changed), added, renamed=renamed_keys(TrainConfig))
    finally:
        run.close()


def test_a_run_directory_written_with_the_old_keys_resumes(tmp_path, capsys):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]
    task = write_jsonl(tmp_path / "task.jsonl", rows)
    out = tmp_path / "run"
    args = ["train", "--no-progress", "--out", str(out), "--task", f"jsonl:{task}", "task.options={test_size: 5}",
            *TINY_OVERRIDES, "rl.prompts_per_step=2", "rl.group_size=2", "rl.sampling.max_new_tokens=3",
            "rl.sampling.temperature=0.7", "save_every=1", "threads=1"]
    assert main([*args, "rl.steps=1"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump(_flat(saved), sort_keys=False))
    capsys.readouterr()
    assert main([*args, "rl.steps=2", "--resume"]) == 0
    assert "rl.steps 1 -> 2" in capsys.readouterr().err
    rewritten = yaml.safe_load((out / "config.yaml").read_text())
    assert rewritten == {**saved, "rl": {**saved["rl"], "steps": 2}}  # in the new layout, with the change


def test_an_old_key_beside_its_section_given_as_a_value_leaves_the_section_to_validation():
    with pytest.raises(ConfigError, match=r"^config error: rl.sampling: Input should be a valid dictionary"):
        validate(TrainConfig, {"rl": {"sampling": 3, "temperature": 1.0}})
