"""The shape of the house: below `rewardlab.commands` (the CLI verbs), library modules do not import the config,
the run directories, the progress bars or rich - only the training loops, which write their run directories step
by step, may - and nothing imports upward into `commands` or `cli`."""

import ast
import os
import subprocess
import sys
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


#: The layers above tasks/ that tasks/ must not import, even inside a function: `envs` registers the env:NAME loader
#: into the tasks registry, and the rewards layer installs the reward-name check (`rewardlab.tasks.KIND_PROVIDERS`,
#: `REWARD_CHECK_PROVIDER`: the modules tasks/ names, as entry points do, and imports on first use).
ABOVE_TASKS = ("rewardlab.envs", "rewardlab.rewards")


def test_tasks_import_neither_envs_nor_rewards():
    for path in sorted((SRC / "tasks").rglob("*.py")):
        up = sorted(n for n in _imports(path) if any(n == a or n.startswith(a + ".") for a in ABOVE_TASKS))
        assert up == [], f"tasks/{path.name} imports {up}: imports point down only (docs/layout.md)"


#: (module, the private name it imports from another rewardlab module) pairs allowed. Empty: a helper one module
#: borrows from another is public (named without an underscore, with a docstring). Tests are not checked.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str]] = set()


def _private_imports(path: Path) -> list[str]:
    """The private names `path` imports from rewardlab modules: `from rewardlab.x import _y` (the alias a module is
    bound to, `import rewardlab.x as _x`, does not count) and `import rewardlab._x`, anywhere in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rewardlab"):
            found += [a.name for a in node.names if a.name.startswith("_")]
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.startswith("rewardlab") and any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_no_module_imports_a_private_name_from_another():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        private = [n for n in _private_imports(path) if (rel, n) not in PRIVATE_IMPORTS_ALLOWED]
        assert private == [], f"{rel} imports the private {private}: make them public (no underscore, a docstring)"


def test_the_checks_see_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from rewardlab.envs.builtin import ENVIRONMENTS\n"
                      "    from rewardlab.tasks.reasoning_gym import _dataset\n")
    assert "rewardlab.envs.builtin" in _imports(module)
    assert _private_imports(module) == ["_dataset"]


def test_importing_tasks_loads_neither_envs_nor_rewards_yet_env_tasks_and_reward_names_work():
    code = ("import sys; import rewardlab.tasks as t; "
            "print(sorted(m for m in ('rewardlab.envs', 'rewardlab.rewards', 'torch') if m in sys.modules))\n"
            "try:\n    t.check_reward_name('nope', field='task.options.reward')\n"
            "except ValueError as e:\n    print(e)\n"
            "print(t.load('env:guess_number', n=4).name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=SRC.parents[1], env={**os.environ, "PYTHONPATH": str(SRC.parent)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "[]" and lines[2] == "env:guess_number"
    assert lines[1].startswith("task.options.reward: unknown reward 'nope'; valid: ") and "exact_match" in lines[1]


#: The layers, top to bottom: a module may import only modules of its own layer or of layers below it
#: (docs/layout.md draws this order; `config`, `runs` and `progress` sit beside the verbs and the training loops,
#: which `test_library_modules_import_no_verb_layer` checks).
LAYERS = ("cli", "commands", "integrations", "rl", "sft", "rm", "search", "evaluation", "envs", "rewards", "sandbox",
          "train_state", "policy", "tasks", "runs", "config", "progress", "interrupt", "optim", "modeldir", "threads",
          "lifetime", "registry", "types")


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC).as_posix()
    return rel.split("/")[0].removesuffix(".py")


def import_graph() -> dict[str, set[str]]:
    """Layer -> the other layers its modules import (at the top of a module or inside a function)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__init__.py" and path.parent == SRC:
            continue
        here = _layer(path)
        graph.setdefault(here, set())
        for name in _imports(path):
            if name.startswith("rewardlab.") and name.split(".")[1] != here:
                graph[here].add(name.split(".")[1])
    return graph


def test_imports_point_down_the_layers_and_the_drawing_is_the_graph():
    graph = import_graph()
    assert sorted(graph) == sorted(LAYERS), "a layer was added or removed: place it in LAYERS and docs/layout.md"
    up = sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets if LAYERS.index(b) < LAYERS.index(a))
    assert up == [], f"imports up the layers: {up}"
    drawn = (SRC.parents[1] / "docs" / "layout.md").read_text(encoding="utf-8")
    block = drawn.split("<!-- import graph -->\n```\n", 1)[1].split("```", 1)[0]
    expected = "".join(f"{layer:<13}-> {' '.join(b for b in LAYERS if b in graph[layer]) or '(nothing)'}\n"
                       for layer in LAYERS)
    assert block == expected, "docs/layout.md's import graph is out of date; its block should read:\n" + expected


def _module_cycles() -> list[list[str]]:
    """Import cycles between rewardlab modules (a package's modules importing their own package excepted)."""
    modules = {p.relative_to(SRC.parent).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__"): p
               for p in SRC.rglob("*.py")}
    edges = {m: {n for n in _imports(p) if n in modules and n != m and not m.startswith(n + ".")}
             for m, p in modules.items()}
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(modules):
        if m not in state:
            visit(m)
    return cycles


def test_no_import_cycle_between_modules():
    assert _module_cycles() == []


#: The folder whose functions are at most 60 lines (code and comments; the docstring is not counted).
SHORT_FUNCTIONS = ("rl/",)


def _functions():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield rel, node


def _code_lines(node) -> int:
    """The lines of a function, its docstring not counted."""
    first = node.body[0]
    doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    return node.end_lineno - node.lineno + 1 - (first.end_lineno - first.lineno + 1 if doc else 0)


def test_functions_in_rl_are_at_most_60_lines():
    long = [f"{rel}:{node.lineno} {node.name} ({_code_lines(node)} lines)" for rel, node in _functions()
            if rel.startswith(SHORT_FUNCTIONS) and _code_lines(node) > 60]
    assert long == []
