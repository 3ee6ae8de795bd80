"""The shape of the house: below `rewardlab.commands` (the CLI verbs), library modules do not import the config,
the run directories, the progress bars or rich - only the training loops, which write their run directories step
by step, may - and nothing imports upward into `commands` or `cli`."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "rewardlab"
#: The layers only the verbs and the training loops use.
VERB_ONLY = ("rewardlab.config", "rewardlab.runs", "rewardlab.progress", "rich")
#: The training loops: they write run directories (config.yaml, metrics, checkpoints) as they go.
TRAINING_LOOPS = {"rl/trainer.py", "rm/fit.py", "sft.py"}
#: The verb layer itself and the modules it is built from.
TOP = ("commands/", "cli.py", "config/", "runs.py", "progress.py")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(TOP):
            yield rel, path


@pytest.mark.parametrize("rel,path", list(_modules()), ids=lambda x: x if isinstance(x, str) else "")
def test_library_modules_import_no_verb_layer(rel, path):
    imported = _imports(path)
    upward = sorted(n for n in imported if n.startswith(("rewardlab.commands", "rewardlab.cli")))
    assert upward == [], f"{rel} imports the verb layer: {upward}"
    if rel not in TRAINING_LOOPS:
        bad = sorted(n for n in imported if any(n == v or n.startswith(v + ".") for v in VERB_ONLY))
        assert bad == [], f"{rel} imports {bad}; only rewardlab.commands and the training loops may"


def test_the_check_sees_an_import():
    # the scan itself: a module that imports rich is caught
    assert "rich.console" in _imports(SRC / "progress.py")
