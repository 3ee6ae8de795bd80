"""Property-based fuzzing of the config loader: arbitrary YAML files and dotted overrides, for every verb's config.

Property: `load_config` returns a config of the verb's class, or raises `ConfigError` with one line; never another
exception type. A config that loads also writes (`dump_config`, the run's config.yaml) and reads back to the same
config.
"""

from __future__ import annotations

import math
import os
import re

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rewardlab.commands import config_classes
from rewardlab.config import ConfigError, dump_config, load_config

VERB_CONFIGS = config_classes()

# FUZZ_EXAMPLES=5000 for a longer hunt; the suite's budget is 100.
FUZZ = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", 100)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
VERBS = sorted(VERB_CONFIGS)


def _dotted_keys(cls: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in cls.model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _dotted_keys(field.annotation, f"{prefix}{name}.")
    return keys


KEYS = sorted({k for cls in VERB_CONFIGS.values() for k in _dotted_keys(cls)})
key_st = st.one_of(st.sampled_from(KEYS), st.text(max_size=12),
                   st.lists(st.sampled_from(["rl", "model", "task", "x", "", "options"]), min_size=1,
                            max_size=4).map(".".join))
scalar_st = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**20, max_value=10**400),
                      st.floats(), st.text(max_size=12), st.sampled_from(["tiny", "jsonl:x.jsonl", "grpo", "cpu"]))
value_st = st.recursive(scalar_st, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                        max_leaves=8)


def _nest(items: list[tuple[str, object]]) -> dict:
    """{"rl.lr": 1} -> {"rl": {"lr": 1}} (later items win; a value in the way is replaced)."""
    out: dict = {}
    for key, value in items:
        node, parts = out, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


yaml_doc_st = st.lists(st.tuples(st.sampled_from(KEYS), value_st), max_size=6).map(
    lambda items: yaml.safe_dump(_nest(items), allow_unicode=True))
file_st = st.one_of(
    yaml_doc_st.map(lambda t: t.encode("utf-8")),
    st.text(max_size=200).map(lambda t: t.encode("utf-8")),  # arbitrary text: mostly invalid or non-mapping YAML
    st.binary(max_size=200),  # invalid UTF-8 included
)
override_st = st.one_of(
    st.text(max_size=30),  # no "=", empty key, control characters...
    st.tuples(key_st, st.text(max_size=20)).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.tuples(key_st, value_st).map(lambda kv: f"{kv[0]}={yaml.safe_dump(kv[1], default_flow_style=True).strip()}"),
)


def _same(a, b) -> bool:
    """Equal, with NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def check_load(tmp_path, verb: str, content: bytes | None, overrides: list[str]) -> None:
    cls = VERB_CONFIGS[verb]
    path = None
    if content is not None:
        path = tmp_path / "cfg.yaml"
        path.write_bytes(content)
    try:
        cfg = load_config(cls, path, overrides)
    except ConfigError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and "\r" not in msg, repr(msg)
        return
    assert isinstance(cfg, cls)
    # The resolved config is written as the run's config.yaml and must read back to the same config.
    saved = tmp_path / "resolved.yaml"
    saved.write_text(dump_config(cfg), encoding="utf-8")
    again = load_config(cls, saved)
    assert _same(again.model_dump(), cfg.model_dump())


@FUZZ
@given(verb=st.sampled_from(VERBS), content=st.none() | file_st, overrides=st.lists(override_st, max_size=4))
# Defects the fuzzing found (each a traceback before the fix):
@example(verb="train", content=b"\xff\xfe rl: {lr: 1}", overrides=[])  # invalid UTF-8: UnicodeDecodeError
@example(verb="train", content=None, overrides=["rl.lr=["])  # an override value that is not YAML: ParserError
@example(verb="train", content=None, overrides=["seed=\x00"])  # a character YAML refuses: ReaderError
@example(verb="sft", content=None, overrides=["model.path=!!python/object:os.system ls"])  # ConstructorError
@example(verb="evaluate", content=b"{" * 600, overrides=[])  # too deep for YAML's parser: RecursionError
@example(verb="train", content=None, overrides=["seed=2020-13-45"])  # YAML's date resolver: ValueError
@example(verb="train", content=b"seed: 2020-02-30\n", overrides=[])  # the same from a file
@example(verb="evaluate", content=None, overrides=["\r="])  # a control character broke the message's line
@example(verb="evaluate", content=b'"a\\nb": 1\n', overrides=[])  # the same from a file's key
# Edge cases that already held:
@example(verb="train", content=b"rl:\n  lr: .inf\n", overrides=[])  # a float JSON cannot hold
@example(verb="train", content=b"? [a]\n: 1\n", overrides=[])  # an unhashable key
@example(verb="train", content=None, overrides=["task.options=1", "task.options.size=5"])  # a value, not a section
@example(verb="rm train", content=b"1: 2\nnull: 3\n", overrides=["data=x.jsonl"])  # non-string keys
@example(verb="train", content=b"\xef\xbb\xbfseed: 3\n", overrides=[])  # a byte-order mark
def test_load_config_fuzz(tmp_path, verb, content, overrides):
    check_load(tmp_path, verb, content, overrides)


def test_the_fixed_errors_name_the_file_line_or_key(tmp_path):
    from rewardlab.config import TrainConfig

    f = tmp_path / "c.yaml"
    f.write_bytes(b"seed: 1\nrl:\n  lr: \xff\n")
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(f))}:3: not UTF-8 text \(byte 0xff\)$"):
        load_config(TrainConfig, f)
    f.write_bytes(b"seed: 2020-13-45\n")
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(f))}: invalid YAML \(month must be in"):
        load_config(TrainConfig, f)
    with pytest.raises(ConfigError, match=r"^rl\.lr: cannot parse '\[' as a YAML value \(.*\)$"):
        load_config(TrainConfig, None, ["rl.lr=["])
    with pytest.raises(ConfigError, match=r"^seed: cannot parse '\\x00' as a YAML value \(unacceptable character "
                                          r"#x0000\)$"):
        load_config(TrainConfig, None, ["seed=\x00"])
    with pytest.raises(ConfigError, match=r"^override '\\r=1': the key '\\r' holds spaces or control characters$"):
        load_config(TrainConfig, None, ["\r=1"])
    f.write_text('"a\\nb": 1\n')
    with pytest.raises(ConfigError, match=r"^config error: 'a\\nb': unknown key; valid keys here: "):
        load_config(TrainConfig, f)
