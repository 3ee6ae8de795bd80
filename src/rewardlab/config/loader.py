"""Loading configs: YAML files, dotted command-line overrides (`rl.lr=1e-4`), section defaults and one-line errors.

The schemas themselves live in `rewardlab.config.schema`; this module knows nothing of any verb. An unknown key or a
bad value raises `ConfigError` with one line naming the key and what was expected. A key that moved keeps its old
name for one release: a section's class lists its moved keys in `RENAMED` ({old: new}, dotted below the section),
and the old name is read at the new place with one `ConfigDeprecationWarning` line (`move_renamed`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config problem, one line naming the key."""


class ConfigDeprecationWarning(FutureWarning):
    """A config key given by the name it had before it moved: read at its new place until the next release. The
    message is one line: "rl.temperature is now rl.sampling.temperature; the old key is read until the next
    release"."""


def _has(node: Any, parts: list[str]) -> bool:
    """Whether the nested mapping `node` gives the dotted key `parts` (a section given as a model gives all its
    keys)."""
    for part in parts:
        if isinstance(node, BaseModel):
            return part in type(node).model_fields
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _copied_dicts(node: Any) -> Any:
    """`node` with every nested dict copied (other values shared), so that keys can move without touching it."""
    return {k: _copied_dicts(v) for k, v in node.items()} if isinstance(node, dict) else node


def move_renamed(data: dict[str, Any], renamed: Mapping[str, str], *, label: str = "",
                 quiet: bool = False) -> dict[str, Any]:
    """`data` (a nested mapping) with each key given by an old name moved to its new place: `renamed` maps old dotted
    keys to new ones, both relative to `data`; `label` prefixes them in messages ("rl."). Each key moved warns once
    (`ConfigDeprecationWarning`, "rl.temperature is now rl.sampling.temperature; the old key is read until the next
    release") unless `quiet` (a run directory's config.yaml, written by an earlier release). `data` is not changed.

    Raises:
        ConfigError: one line naming both keys, when the old and the new name are both given.
    """
    out = _copied_dicts(data)
    for old, new in renamed.items():
        *parents, last = old.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or last not in node:
            continue
        if _has(out, new.split(".")):
            raise ConfigError(f"config error: {label}{old} and {label}{new} are one setting, given twice (the old "
                              f"name and the new); give {label}{new} only")
        *new_parents, new_last = new.split(".")
        target = out
        for part in new_parents:
            target = target.setdefault(part, {}) if isinstance(target, dict) else None
        if not isinstance(target, dict):  # a value where the new section goes: validation names it
            continue
        target[new_last] = node.pop(last)
        if not quiet:
            warnings.warn(f"{label}{old} is now {label}{new}; the old key is read until the next release",
                          ConfigDeprecationWarning, stacklevel=2)
    return out


def renamed_keys(cls: type[BaseModel], prefix: str = "") -> dict[str, str]:
    """Every moved key of config `cls`, its sections' included: {old dotted key: new dotted key}, from the
    sections' `RENAMED` tables (e.g. {"rl.temperature": "rl.sampling.temperature"} for a verb with an `rl`)."""
    out = {f"{prefix}{old}": f"{prefix}{new}" for old, new in getattr(cls, "RENAMED", {}).items()}
    for name, field in cls.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out.update(renamed_keys(field.annotation, f"{prefix}{name}."))
    return out


def _renamed_override(item: str, renamed: Mapping[str, str]) -> str:
    """`item` with its key renamed: `rl.temperature=0.7` -> `rl.sampling.temperature=0.7`; a key below a moved one
    (`rl.curriculum_options.mu=0.5`) moves with it."""
    key, sep, value = item.partition("=")
    for old, new in renamed.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):] + sep + value
    return item


def _upgraded(cls: type[BaseModel], data: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The file's mapping and the overrides with the moved keys of `cls` at their new places (`move_renamed`), one
    warning line per old key given.

    Raises:
        ConfigError: an old key and its new name both given (in the file, on the command line, or one in each).
    """
    renamed = renamed_keys(cls)
    keys = [item.partition("=")[0] for item in overrides]
    given = []
    for old, new in renamed.items():
        old_given = _has(data, old.split(".")) or any(k == old or k.startswith(old + ".") for k in keys)
        new_given = _has(data, new.split(".")) or any(k == new or k.startswith(new + ".") for k in keys)
        if old_given and new_given:
            raise ConfigError(f"config error: {old} and {new} are one setting, given twice (the old name and the "
                              f"new); give {new} only")
        if old_given:
            given.append(old)
    for old in given:
        warnings.warn(f"{old} is now {renamed[old]}; the old key is read until the next release",
                      ConfigDeprecationWarning, stacklevel=3)
    return (move_renamed(data, renamed, quiet=True),
            [_renamed_override(item, renamed) for item in overrides])


class _YamlError(Exception):
    """Unparsable YAML text: `line` (1-based, or None) and a one-line `cause`."""

    def __init__(self, line: int | None, cause: str) -> None:
        super().__init__(cause)
        self.line, self.cause = line, cause


def _yaml_problem(exc: BaseException) -> tuple[int | None, str]:
    """(1-based line or None, one-line cause) of an exception raised while parsing YAML text."""
    if isinstance(exc, RecursionError):
        return None, "nested too deeply"
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    cause = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    if isinstance(exc, yaml.reader.ReaderError):  # its str() spans lines; the character is what matters
        cause = f"unacceptable character #x{exc.character:04x}" if isinstance(exc.character, int) else exc.reason
    return line, " ".join(str(cause).split())


def _safe_load(text: str) -> Any:
    """`yaml.safe_load`; what it raises for bad text (YAMLError, a ValueError for an impossible date such as
    2020-13-45, RecursionError for deep nesting) is re-raised as `_YamlError`."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise _YamlError(*_yaml_problem(exc)) from None


def _parse_value(text: str, key: str = "value") -> Any:
    try:
        value = _safe_load(text) if text.strip() else ""
    except _YamlError as exc:
        raise ConfigError(f"{key}: cannot parse {text!r} as a YAML value ({exc.cause})") from None
    if isinstance(value, str) and text.strip()[:1] not in ("'", '"'):  # a quoted value stays a string
        try:
            return float(value)  # YAML 1.1 reads "1e-4" as a string
        except ValueError:
            return value
    return value


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `dotted.key=value` override to a nested dict (value parsed as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. rl.lr=1e-4")
    if not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(f"override {item!r}: the key {key!r} holds spaces or control characters")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = _parse_value(raw, key)


def _key_text(part: Any) -> str:
    """A key as written in messages: as is when printable, else its repr (a message stays one line)."""
    text = str(part)
    return text if text.isprintable() else repr(text)


def _describe(err: dict[str, Any], cls: type[BaseModel]) -> str:
    loc = ".".join(_key_text(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        model: Any = cls
        for part in err["loc"][:-1]:
            field = model.model_fields.get(str(part)) if isinstance(model, type) else None
            model = field.annotation if field is not None else None
        valid = sorted(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
        hint = f"; valid keys here: {', '.join(valid)}" if valid else ""
        return f"{loc}: unknown key{hint}"
    if err["type"] == "value_error" and not loc:  # a cross-field check of a whole config: its own message
        return str(err.get("ctx", {}).get("error", err["msg"]))
    return f"{loc}: {err['msg'].rstrip('.')} (got {err.get('input')!r})"


def _section_default(cls: type[BaseModel], name: str) -> dict[str, Any] | None:
    """The default of section `name` of `cls` as a dict, when that field is a section with a default."""
    field = cls.model_fields.get(name)
    if field is None or field.is_required():
        return None
    default = field.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else None


def _merge_section(cls: type[BaseModel], base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` written over `base` for model `cls`: sub-sections are merged key by key, any other value (a plain
    mapping such as `task.options` included) replaced."""
    out = dict(base)
    for key, value in given.items():
        field = cls.model_fields.get(key)
        annotation = field.annotation if field is not None else None
        if (isinstance(value, dict) and isinstance(out.get(key), dict) and isinstance(annotation, type)
                and issubclass(annotation, BaseModel)):
            out[key] = _merge_section(annotation, out[key], value)
        else:
            out[key] = value
    return out


def _preset_section_default(cls: type[BaseModel], name: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """`_section_default`, with the values of the preset `data` names written over it, for a config class with
    presets (a classmethod `section_defaults(data) -> {section: values}`, e.g. `QuickstartConfig`)."""
    default = _section_default(cls, name)
    preset = getattr(cls, "section_defaults", None)
    if default is None or preset is None:
        return default
    try:
        given = preset(data).get(name)
    except ValueError as exc:
        raise ConfigError(f"config error: {exc}") from None
    annotation = cls.model_fields[name].annotation
    return default if given is None else _merge_section(annotation, default, given)


def with_section_defaults(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """Fill each partly given section of `data` from that section's default in `cls`, not from its class defaults.

    A verb's config may give a section non-class defaults (`QuickstartConfig.rl` is a `RLConfig` with 450 steps,
    128 prompts per step, lr 3e-4, ...). Without this, `rl: {steps: 450}` would build the section from its class
    defaults and silently drop the verb's other settings; with it, only the keys given change (as in Hydra).
    Sections without a default are filled recursively from their own fields' defaults.
    """
    out = dict(data)
    for name, value in data.items():
        field = cls.model_fields.get(name)
        annotation = field.annotation if field is not None else None
        if not isinstance(value, dict) or not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        default = _preset_section_default(cls, name, data)
        out[name] = (_merge_section(annotation, default, value) if default is not None
                     else with_section_defaults(annotation, value))
    return out


def validate(cls: type[BaseModel], data: dict[str, Any]) -> Any:
    """Validate a nested dict as config `cls`; a key given by its old name moves to its new place (`move_renamed`,
    one warning line each), and partly given sections keep the verb's other defaults (`with_section_defaults`).
    Raises ConfigError naming the first bad key."""
    try:
        return cls.model_validate(with_section_defaults(cls, move_renamed(data, renamed_keys(cls))))
    except ValidationError as exc:
        raise ConfigError("config error: " + _describe(exc.errors()[0], cls)) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds ({} for an empty file), parsed with `yaml.safe_load` (data only: no
    Python objects), unvalidated.

    Raises:
        ConfigError: one line naming the file (and its line where known): not found, not UTF-8, invalid YAML
            (including "nested too deeply"), or a top level that is not a mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark is accepted
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
    try:
        loaded = _safe_load(text)
    except _YamlError as exc:
        where = f":{exc.line}" if exc.line is not None else ""
        raise ConfigError(f"config file {path}{where}: invalid YAML ({exc.cause})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping of keys")
    return loaded


def load_config(cls: type[BaseModel], path: str | Path | None = None, overrides: list[str] | None = None) -> Any:
    """Load config `cls` from an optional YAML file, then apply dotted overrides.

    A key given by its old name (in the file or an override) is read at its new place, with one
    `ConfigDeprecationWarning` line per key (`renamed_keys`).

    Raises:
        ConfigError: a missing or unparsable file (named with its line), a top level that is not a mapping, an
            unknown key or a bad value, a key given both by its old and its new name.
    """
    data, overrides = _upgraded(cls, read_config_file(path) if path is not None else {}, list(overrides or []))
    data = with_section_defaults(cls, data)
    named = dict(data)  # the preset an override names sets the defaults of the sections other overrides edit
    for item in overrides or []:
        key, _, value = item.partition("=")
        if key.strip() == "preset":
            named["preset"] = value.strip()
    for item in overrides or []:
        # A dotted override edits the section's resolved default (e.g. quickstart's `task.options`), so
        # `task.options.size=5000` keeps the other options while `task.options={...}` replaces them all.
        top = item.partition("=")[0].split(".")[0]
        if "." in item.partition("=")[0] and top not in data:
            default = _preset_section_default(cls, top, named)
            if default is not None:
                data[top] = default
        apply_override(data, item)
    return validate(cls, data)


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML (every field, defaults included)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
