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
TRAINING_LOOPS = {"rl/trainer.py", "rm/fit.py", "sft.py", "po/rft.py"}
#: The verb layer itself and the modules it is built from; view/ (`rewardlab view`) reads run directories as the
#: verbs do (rewardlab.runs' markers, lock and event log names), read-only.
TOP = ("commands/", "cli.py", "config/", "runs.py", "progress.py", "view/")


def _type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): imports for annotations only, never run."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING")


def _walk(node: ast.AST):
    """`ast.walk` without the bodies of `if TYPE_CHECKING:` blocks."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not _type_checking(child):
            yield from _walk(child)


def _imports(path: Path) -> set[str]:
    """The modules `path` imports when it runs: at the top, inside functions, anywhere but under TYPE_CHECKING."""
    names = set()
    for node in _walk(ast.parse(path.read_text(encoding="utf-8"))):
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
LAYERS = ("cli", "commands", "view", "integrations", "po", "rl", "sft", "rm", "search", "evaluation", "envs", "rewards",
          "sandbox", "train_state", "policy", "tasks", "runs", "rollout_log", "config", "trackers", "progress",
          "interrupt", "optim", "modeldir", "threads", "lifetime", "registry", "types")


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


#: The most parameters a function in src/ takes (self and cls not counted): settings travel as objects passed whole
#: (`rewardlab.policy.SamplingSettings`, `rewardlab.envs.EpisodeSettings`, ...), not as loose keywords.
MAX_PARAMETERS = 8
#: "module path:qualified name" -> why it takes more than MAX_PARAMETERS parameters. Each entry is checked to still
#: need its place (a function that no longer exists or takes few enough parameters fails the test).
MANY_PARAMETERS_ALLOWED: dict[str, str] = {
    "rewards/judge/reward.py:Judge.__init__": "a registered reward: its keyword parameters are its declared options",
    "rewards/code.py:CodeReward.__init__": "a registered reward: its keyword parameters are its declared options",
    "envs/builtin.py:CalculatorEnv.__init__": "a registered environment: its keyword parameters are its declared "
                                              "options",
    "rl/advantages.py:gigpo": "a registered estimator: the registry passes each declared option and trainer input "
                              "as its own keyword",
    "rl/advantages.py:prime": "a registered estimator: the registry passes each declared option and trainer input "
                              "as its own keyword",
    "integrations/verl_agent.py:RewardlabAgentLoop.__init__": "verl dictates it: AgentLoopBase's arguments, then "
                                                              "hydra passes each agent-loop config key as a keyword",
    "policy/hf.py:Policy.generate": "the public sampling call, keyword for keyword Hugging Face's generate "
                                    "(n, temperature, top_p, max_new_tokens, stop, ...): what a user of transformers "
                                    "passes; the library's own samplers take a SamplingSettings",
    "policy/__init__.py:load_policy": "its keywords are the model section's fields (ModelConfig.policy_options), "
                                      "one each, so a config and a Python caller build the same policy",
}


def _parameter_counts(path: Path) -> dict[str, int]:
    """{qualified name: parameters} of every function and method of `path` (self and cls not counted)."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                counts[prefix + child.name] = len(names) - (1 if names and names[0] in ("self", "cls") else 0)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return counts


def _many_parameters() -> dict[str, int]:
    return {f"{path.relative_to(SRC).as_posix()}:{name}": n for path in sorted(SRC.rglob("*.py"))
            for name, n in _parameter_counts(path).items() if n > MAX_PARAMETERS}


def test_no_function_takes_more_than_8_parameters_but_the_listed_ones():
    many = _many_parameters()
    unlisted = sorted(f"{k} ({n})" for k, n in many.items() if k not in MANY_PARAMETERS_ALLOWED)
    assert unlisted == [], (f"{unlisted} take more than {MAX_PARAMETERS} parameters: pass a settings object whole, "
                            "or list the function in MANY_PARAMETERS_ALLOWED with the reason")
    stale = sorted(k for k in MANY_PARAMETERS_ALLOWED if k not in many)
    assert stale == [], f"{stale} no longer take more than {MAX_PARAMETERS} parameters: drop them from the list"


def test_the_parameter_scan_counts_methods_and_keywords(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self, a, b, *, c, d=1):\n        def g(x, /, y):\n            pass\n"
                      "def h(a, b, c, d, e, f, g, h, i):\n    pass\n")
    assert _parameter_counts(module) == {"A.f": 4, "A.f.g": 2, "h": 9}
