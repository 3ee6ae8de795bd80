"""The config reference: every field described, `--help` and docs/config.md generated from the descriptions."""

from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from rewardlab.cli import main
from rewardlab.commands import config_classes
from rewardlab.config import config_keys, describe, reference_markdown, undescribed

VERB_CONFIGS = config_classes()

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"


@pytest.mark.parametrize("verb", list(VERB_CONFIGS))
def test_every_config_field_has_a_description(verb):
    assert undescribed(VERB_CONFIGS[verb]) == []


def test_undescribed_finds_a_field_without_description_inside_a_section():
    class Inner(BaseModel):
        a: int = Field(1, description="described")
        b: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner)
        c: str = Field("x", description="  ")  # blank counts as none

    assert undescribed(Outer) == ["inner", "inner.b", "c"]


def test_config_keys_show_each_verbs_own_section_defaults():
    keys = {k.key: k.default for k in config_keys(VERB_CONFIGS["quickstart"])}
    assert keys["rl.steps"] == "450" and keys["rl.lr"] == "0.0003" and keys["eval.k"] == "[1, 8]"
    assert keys["sft.steps"] == "650" and keys["out"] == '"runs/quickstart"'
    train = {k.key: k.default for k in config_keys(VERB_CONFIGS["train"])}
    assert train["rl.steps"] == "100" and train["rl.minibatch_size"] == "null" and train["rewards"] == "null"
    rm = {k.key: k.default for k in config_keys(VERB_CONFIGS["rm train"])}
    assert rm["data"] == "required" and rm["train.use_margin"] == "true" and rm["model.tiny.hidden_size"] == "128"
    assert "model" not in rm and "train" not in rm  # sections are expanded, not listed themselves


def test_describe_writes_a_markdown_table_that_escapes_pipes_and_tags():
    class Small(BaseModel):
        tag: str = Field(" <step>", description="appended to a step; a|b")
        n: int = Field(..., description="rows")

    assert describe(Small) == (
        "| key | default | description |\n"
        "| --- | --- | --- |\n"
        '| `tag` | `" <step>"` | appended to a step; a\\|b |\n'
        "| `n` | `required` | rows |\n"
    )


def test_docs_config_md_is_the_generated_reference():
    assert DOCS.read_text(encoding="utf-8") == reference_markdown(VERB_CONFIGS), (
        "docs/config.md is stale: regenerate it with PYTHONPATH=src python -m rewardlab.commands docs/config.md")
    text = DOCS.read_text(encoding="utf-8")
    for verb in VERB_CONFIGS:
        assert f"## `rewardlab {verb}`" in text
    assert "| `rl.weight_decay` | `0.0` | AdamW decoupled weight decay (Loshchilov & Hutter 2019); 0: off |" in text


@pytest.mark.parametrize("verb", list(VERB_CONFIGS))
def test_verb_help_lists_every_config_key_with_its_default(verb, capsys):
    with pytest.raises(SystemExit) as info:
        main([*verb.split(), "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "config keys (set with key=value, or in the --config YAML file):" in out
    for key in config_keys(VERB_CONFIGS[verb]):
        assert f"\n  {key.key} = {key.default}\n" in out


def test_train_help_shows_descriptions_under_their_keys(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("  rl.weight_decay = 0.0")
    assert "AdamW decoupled weight decay" in lines[at + 1] and lines[at + 1].startswith("      ")
    at = lines.index('  on_error = "zero"')
    assert lines[at + 1].startswith("      a rollout whose reward fails")


def test_every_verb_shares_the_out_and_seed_keys():
    # rm train and prm train used to re-declare out, seed (and model) without descriptions: now one base holds them.
    outs = {verb: cls.model_fields["out"] for verb, cls in VERB_CONFIGS.items()}
    assert {verb: f.default for verb, f in outs.items()} == {
        "sft": "runs/sft", "train": "runs/train", "evaluate": "runs/eval", "quickstart": "runs/quickstart",
        "search": "runs/search", "rm train": "runs/rm", "rm eval": "runs/rm_eval", "rm pairs": "runs/pairs",
        "prm label": "runs/labels", "prm train": "runs/prm", "merge": "runs/merged", "rft": "runs/rft",
        "po": "runs/po",
    }
    assert len({f.description for f in outs.values()}) == 1
    assert "seed" not in VERB_CONFIGS["merge"].model_fields  # a merge draws nothing at random
    seeds = {verb: cls.model_fields["seed"] for verb, cls in VERB_CONFIGS.items() if verb not in ("rm eval", "merge")}
    assert {f.default for f in seeds.values()} == {0} and len({f.description for f in seeds.values()}) == 1


def test_reward_model_training_verbs_keep_their_key_order():
    # config.yaml lists keys in field order; sharing bases must not reorder them.
    for verb in ("rm train", "prm train"):
        assert list(VERB_CONFIGS[verb].model_fields) == ["save_every", "keep_checkpoints", "out", "seed", "threads",
                                                        "report_to", "model", "data", "eval_data", "train"]
    assert list(VERB_CONFIGS["train"].model_fields) == ["model", "task", "out", "seed", "threads", "save_every",
                                                       "keep_checkpoints", "report_to", "rl", "env", "rewards",
                                                       "on_error"]


def test_verbs_that_only_run_a_policy_refuse_the_training_keys():
    from rewardlab.config import EvaluateConfig, SFTConfig, TrainConfig, load_config
    from rewardlab.config.schema import ModelConfig

    for verb in (SFTConfig, TrainConfig):
        assert load_config(verb, None, ["model.gradient_checkpointing=true"]).model.gradient_checkpointing
    with pytest.raises(ValueError, match=r"model.gradient_checkpointing: applies to the verbs that train"):
        load_config(EvaluateConfig, None, ["model.gradient_checkpointing=true"])
    model = ModelConfig(gradient_checkpointing=True, autocast="bfloat16")
    running = model.for_running()
    assert not running.gradient_checkpointing and running.autocast == "bfloat16"  # precision applies to running too
