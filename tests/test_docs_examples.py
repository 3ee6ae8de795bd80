"""Every example in README.md and docs/*.md runs: each fenced YAML block loads as a config and passes the checks a
run makes before it starts, each `rewardlab ...` command line parses and its config passes the same checks, and
each Python block executes. An example can no longer drift from the code."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from rewardlab.cli import parse
from rewardlab.commands import COMMANDS, GROUPS
from rewardlab.config import TrainConfig, load_config
from rewardlab.rewards.compose import parse_rewards
from rewardlab.rl.specs import resolve_specs
from rewardlab.tasks import LOADERS

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Command lines that are not rewardlab verbs with concrete arguments (placeholders in capitals, usage lines).
PLACEHOLDER = re.compile(r"\b(DIR|PATH|FILE|SPEC|POLICY|CHECKPOINT|REWARD|NAME|K|N|DATA|MODEL)\b|\[|\.\.\.")


#: The marker, on the line before a fence, of an example that cannot run here, with the reason.
NOT_RUN = re.compile(r"<!-- not run in tests: (.+?) -->\n$")


def _blocks(with_reason: bool = False):
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            line = text[: m.start()].count("\n") + 1
            reason = NOT_RUN.search(text[max(0, m.start() - 200) : m.start()])
            where = f"{path.relative_to(ROOT)}:{line}"
            yield (where, m.group(1), m.group(2), reason.group(1) if reason else None) if with_reason else \
                (where, m.group(1), m.group(2))


def _commands():
    for where, lang, body, not_run in _blocks(with_reason=True):
        if lang not in ("", "bash", "sh", "console") or not_run:  # a marked block is not run, its commands neither
            continue
        joined = re.sub(r"\\\n\s*", " ", body)
        for line in joined.splitlines():
            line = re.split(r"\s#\s", line)[0].strip()
            words = line.split()
            if words[:1] == ["rewardlab"] and len(words) > 1 and (words[1] in COMMANDS or words[1] in GROUPS) \
                    and not PLACEHOLDER.search(line):
                yield where, line


YAML_BLOCKS = [(w, b) for w, lang, b in _blocks() if lang == "yaml"]
PYTHON_BLOCKS = [(w, b, why) for w, lang, b, why in _blocks(with_reason=True) if lang == "python"]
COMMAND_LINES = list(_commands())


def _check(cfg, verb: str) -> None:
    """The checks a run makes on its config before it loads a model or writes anything."""
    task = getattr(cfg, "task", None)
    if task is not None:
        kind = task.spec.partition(":")[0]
        LOADERS.get(kind)
        LOADERS.check(kind, task.options, field="task.options")
    if getattr(cfg, "rewards", None) is not None:
        parse_rewards(cfg.rewards, on_error=cfg.on_error)
    if getattr(cfg, "scorer", None) is not None:
        parse_rewards(cfg.scorer)
    if verb == "train":
        resolve_specs(cfg)
    if verb == "po":
        from rewardlab.po.train import loss_spec

        loss_spec(cfg.po)  # the loss settings' dry run


def _verb_of(body: str) -> str:
    m = re.search(r"#\s*rewardlab (\w+(?: (?:train|eval|pairs|label))?) --config", body)
    return m.group(1) if m else "train"


#: The docs give every key by its current name: one read by an old name (a warning) fails the example.
NO_OLD_NAMES = pytest.mark.filterwarnings("error::rewardlab.config.ConfigDeprecationWarning")


@NO_OLD_NAMES
@pytest.mark.parametrize("where,body", YAML_BLOCKS, ids=[w for w, _ in YAML_BLOCKS])
def test_yaml_example_loads_and_passes_the_checks(where, body, tmp_path):
    data = yaml.safe_load(body)
    if isinstance(data, list):  # a fragment of a rewards list
        data = {"rewards": data}
    verb = _verb_of(body)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    cls = COMMANDS[verb].config
    required = [k for k, f in cls.model_fields.items() if f.is_required() and k not in data]
    cfg = load_config(cls, str(path), [f"{k}=placeholder.jsonl" for k in required])
    _check(cfg, verb)


@NO_OLD_NAMES
@pytest.mark.parametrize("where,line", COMMAND_LINES, ids=[f"{w} {l[:40]}" for w, l in COMMAND_LINES])
def test_command_example_parses_and_passes_the_checks(where, line):
    argv = shlex.split(line)[1:]
    verb, args, overrides = parse(argv)
    if args.config is not None:
        pytest.skip(f"{where}: names a config file of its own ({args.config})")
    cfg = load_config(COMMANDS[verb].config, None, overrides)
    _check(cfg, verb)


def _registries() -> list:
    """Every registry of the rewardlab modules imported so far."""
    from rewardlab.registry import Registry

    found = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("rewardlab") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, Registry):
                    found[id(value)] = value
    return list(found.values())


@pytest.fixture
def registries_restored():
    """What an example registers (an estimator, a reward, an input provider) into a registry that existed before it
    is unregistered after it, so that no later test sees it (a module the example imports first keeps its own
    registrations)."""
    before = {id(r): (r, set(r)) for r in _registries()}
    yield
    for registry, names in before.values():
        for name in set(registry) - names:
            registry.unregister(name)


@pytest.mark.parametrize("where,body,not_run", PYTHON_BLOCKS, ids=[w for w, _, _ in PYTHON_BLOCKS])
def test_python_example_runs(where, body, not_run, tmp_path, monkeypatch, registries_restored):
    if not_run:
        pytest.skip(f"{where}: {not_run}")
    monkeypatch.chdir(tmp_path)
    exec(compile(body, where, "exec"), {"__name__": "__docs_example__"})


def test_the_examples_are_found():
    # the scan itself: the README's GRPO command, its config block and its library block are among them
    assert any(line.startswith("rewardlab train --model runs/sft") for _, line in COMMAND_LINES)
    assert any(w.startswith("README.md") for w, _ in YAML_BLOCKS)
    assert any(w.startswith("README.md") for w, _, _ in PYTHON_BLOCKS)
    assert TrainConfig is COMMANDS["train"].config


ENV_COMMANDS = [(w, l) for w, l in COMMAND_LINES if "--task env:" in l or "task.spec=env:" in l]


@pytest.mark.parametrize("where,line", ENV_COMMANDS, ids=[f"{w} {l[:40]}" for w, l in ENV_COMMANDS])
def test_a_documented_environment_command_gives_a_turn_the_tokens_its_format_needs(where, line):
    # rl.sampling.max_new_tokens=8 cut every `<g>32</g>` (9 tokens of the tiny model), 16 every three-term calculator
    # call (up to 21) (issue 32, item 1)
    from rewardlab.envs import make_env
    from rewardlab.policy.tiny import build_tokenizer
    from rewardlab.tasks import load as load_task

    verb, _, overrides = parse(shlex.split(line)[1:])
    cfg = load_config(COMMANDS[verb].config, None, overrides)
    if cfg.model.path != "tiny":
        pytest.skip(f"{where}: a model other than the tiny one ({cfg.model.path})")
    budget = (cfg.rl.sampling.max_new_tokens if verb == "train" else cfg.eval.max_new_tokens if verb == "evaluate"
              else None)
    if budget is None:
        pytest.skip(f"{where}: {verb} has no per-turn budget")
    task = load_task(cfg.task.spec, **cfg.task.options)
    env = make_env(task.env["name"], **task.env["options"])
    assert budget >= env.min_turn_tokens(build_tokenizer()), where


def test_the_environment_commands_are_found():
    assert {line.split("env:")[1].split()[0] for _, line in ENV_COMMANDS} >= {"calculator", "guess_number"}
