"""Typed configs, one per CLI verb, loaded from YAML with dotted command-line overrides (`rl.lr=1e-4`).

Every field states its default, unit and (where it has one) source. An unknown key or a bad value raises
`ConfigError` with one line naming the key and what was expected.

- `rewardlab.config.schema`: the pydantic models, one config class per verb (`rewardlab.commands.COMMANDS` maps
  verbs to them);
- `rewardlab.config.loader`: YAML files (`read_config_file`), dotted overrides, section defaults, `validate`,
  `load_config`, `dump_config`; keys read by their old names for one release (`renamed_keys`, `move_renamed`,
  `ConfigDeprecationWarning`);
- `rewardlab.config.reference`: the reference generated from the field descriptions (`describe(cls)`, a markdown
  table; `help_text(cls)`, the `--help` listing; docs/config.md via `python -m rewardlab.commands docs/config.md`).

Everything is re-exported here: `from rewardlab.config import TrainConfig, load_config`.
"""

from rewardlab.config.loader import (ConfigDeprecationWarning, ConfigError, apply_override, dump_config, load_config,
                                     move_renamed, read_config_file, renamed_keys, validate, with_section_defaults)
from rewardlab.config.reference import config_keys, describe, help_text, reference_markdown, undescribed
from rewardlab.config.schema import (EVAL_SPLIT_DESCRIPTION, BackboneConfig, EvalParams, EvaluateConfig,
                                     FilteringParams, LabelParams, MergeConfig, MergeModel, ModelConfig, PairsParams,
                                     PoConfig, POParams, PrmLabelConfig, PrmTrainConfig, PRMTrainParams,
                                     QuickstartConfig, RayParams, RftConfig, RFTParams, RLCanaryParams, RLConfig,
                                     RLEvalParams, RLLoggingParams, RLMonitorParams, RmEvalConfig, RMEvalParams,
                                     RmPairsConfig, RmTrainConfig, RMTrainParams, SamplingParams, ScorerModel,
                                     SearchConfig, SearchParams, SFTConfig, SFTParams, TaskConfig, TinyArch, TrainConfig)

__all__ = [
    "EVAL_SPLIT_DESCRIPTION", "BackboneConfig", "ConfigDeprecationWarning", "ConfigError", "EvalParams",
    "EvaluateConfig", "FilteringParams", "LabelParams", "MergeConfig", "MergeModel", "ModelConfig", "PairsParams",
    "PoConfig", "POParams", "PrmLabelConfig", "PrmTrainConfig", "PRMTrainParams", "QuickstartConfig", "RayParams",
    "RftConfig", "RFTParams", "RLCanaryParams", "RLConfig", "RLEvalParams", "RLLoggingParams", "RLMonitorParams",
    "RmEvalConfig", "RMEvalParams", "RmPairsConfig", "RmTrainConfig", "RMTrainParams", "SamplingParams", "ScorerModel",
    "SearchConfig", "SearchParams", "SFTConfig", "SFTParams", "TaskConfig", "TinyArch", "TrainConfig", "apply_override",
    "config_keys", "describe", "dump_config", "help_text", "load_config", "move_renamed", "read_config_file",
    "reference_markdown", "renamed_keys", "undescribed", "validate", "with_section_defaults",
]
