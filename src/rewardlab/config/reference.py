"""The config reference, generated from the schemas' field descriptions: `rewardlab VERB --help` lists a verb's keys
(`help_text`) and docs/config.md holds one table per verb (`reference_markdown`; rewrite it with
`python -m rewardlab.commands docs/config.md`).

A key's default is the verb's own: `quickstart`'s `rl.steps` is 450 (its `rl` section's default), not `RLConfig`'s
300.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel

from rewardlab.config.loader import renamed_keys



#: The first line of `help_text`.
HELP_HEADING = "config keys (set with key=value, or in the --config YAML file):"


class ConfigKey(NamedTuple):
    """One settable key: `key` dotted (`rl.lr`), `default` as YAML/JSON text ("required" when it has none)."""

    key: str
    default: str
    description: str


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _text(value: Any) -> str:
    """A default as it would be written in a config: null, true, 0.0001, "runs/sft", [1, 4, 8], {}."""
    return json.dumps(value, ensure_ascii=False)


def config_keys(cls: type[BaseModel], defaults: BaseModel | None = None, prefix: str = "") -> list[ConfigKey]:
    """Every leaf key of config `cls`, sections expanded into dotted keys, in declaration order.

    `defaults` is the section's default instance (its values are the defaults shown); None at the top level, where
    each field's own default is used and a field without one shows "required".
    """
    out: list[ConfigKey] = []
    for name, field in cls.model_fields.items():
        if defaults is not None:
            value, required = getattr(defaults, name), False
        else:
            required = field.is_required()
            value = None if required else field.get_default(call_default_factory=True)
        section = _section(field.annotation)
        if section is not None:
            out += config_keys(section, value, f"{prefix}{name}.")
        else:
            out.append(ConfigKey(prefix + name, "required" if required else _text(value), field.description or ""))
    return out


def undescribed(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of the fields of `cls`, sections and their fields included, that have no description."""
    out: list[str] = []
    for name, field in cls.model_fields.items():
        if not (field.description or "").strip():
            out.append(prefix + name)
        section = _section(field.annotation)
        if section is not None:
            out += undescribed(section, f"{prefix}{name}.")
    return out


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell: no column breaks, no HTML tags (`<step>` shows as written)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code that survives backticks inside `text`."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def describe(cls: type[BaseModel]) -> str:
    """A markdown table of config `cls`: dotted key | default | description, one row per key."""
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    rows += [f"| {_code(k.key)} | {_code(k.default)} | {_cell(k.description)} |" for k in config_keys(cls)]
    return "\n".join(rows) + "\n"


def help_text(cls: type[BaseModel], width: int = 100) -> str:
    """The `--help` listing of config `cls`: each key with its default, then its description indented below."""
    lines = [HELP_HEADING]
    for k in config_keys(cls):
        lines.append(f"  {k.key} = {k.default}")
        lines += textwrap.wrap(k.description, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


def _summary(verb: str, cls: type[BaseModel]) -> str:
    """The class docstring on one line, without a leading "`rewardlab VERB`: " (the section's heading says it)."""
    text = " ".join((cls.__doc__ or "").split())
    head = f"`rewardlab {verb}`: "
    return text[len(head):] if text.startswith(head) else text


def reference_markdown(configs: Mapping[str, type[BaseModel]]) -> str:
    """docs/config.md: one section per verb of `configs` ({verb: config class}, in order), each with its keys'
    table, then the table of renamed keys (`loader.renamed_keys`: old name -> new, read until the next release)."""
    parts = [
        "# Config reference\n",
        "Generated from the config schemas (`src/rewardlab/config/schema.py`) by "
        "`python -m rewardlab.commands docs/config.md`; do not edit by hand (a test checks that this file matches the "
        "schemas). `rewardlab VERB --help` prints the same keys.\n",
        "Every key can be set in a YAML file (`--config FILE`, sections as nested mappings) or on the command line "
        "as a dotted override (`rl.lr=1e-4`); the command line wins. A partly given section keeps the verb's other "
        "defaults. Defaults are shown as YAML/JSON values; `required` keys have none.\n",
    ]
    for verb, cls in configs.items():
        parts.append(f"## `rewardlab {verb}`\n")
        if _summary(verb, cls):
            parts.append(_summary(verb, cls) + "\n")
        parts.append(describe(cls))
    renamed: dict[str, str] = {}
    for cls in configs.values():
        renamed.update(renamed_keys(cls))
    if renamed:
        parts += ["## Renamed keys\n",
                  "These keys moved; their old names are read at the new place until the next release, each with one "
                  "warning line (`rewardlab: warning: OLD is now NEW; the old key is read until the next release`). "
                  "Giving both names is an error. A run directory written before the move resumes as it is.\n",
                  "| old key | new key |\n| --- | --- |\n"
                  + "".join(f"| {_code(old)} | {_code(new)} |\n" for old, new in renamed.items())]
    return "\n".join(parts)
