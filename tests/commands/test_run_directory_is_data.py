"""A run directory is data, never code: `evaluate` and `search` adopt a checkpoint's task from its run's config.yaml
only when that imports nothing the user did not name (a registered reward is a name; MODULE:FUNCTION is code; so is
an environment class, env:MODULE:CLASS), and a malformed config.yaml beside a checkpoint is a one-line error, or
ignored when the task is given."""

import pytest
import yaml

from conftest import write_jsonl
from rewardlab.cli import main
from rewardlab.commands import common
from rewardlab.rewards import REWARDS
from rewardlab.types import Rollout


class Scripted:
    """Answers "5" to every prompt, greedy or sampled."""

    def generate(self, prompts, *, n=1, greedy=False, rows=None, **_kw):
        return [Rollout(prompt=p, prompt_ids=[1], completion="5", completion_ids=[53], logprobs=[0.0],
                        row=dict(rows[i]), group=i) for i, p in enumerate(prompts) for _ in range(n)]


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(common, "load_model", lambda *a, **k: Scripted())


def _checkpoint(tmp_path, config_text: str):
    """RUN/checkpoints/step-3 beside RUN/config.yaml holding `config_text`."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "config.yaml").write_text(config_text)
    return run / "checkpoints" / "step-3"


def _hostile(tmp_path):
    """A checkpoint whose run's task names a reward in a file that creates `pwned` when it is imported."""
    marker = tmp_path / "pwned"
    code = tmp_path / "evil.py"
    code.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef score(completion):\n    return 1.0\n")
    data = write_jsonl(tmp_path / "qs.jsonl", [{"prompt": f"q{i}", "answer": "5"} for i in range(3)])
    task = {"spec": f"jsonl:{data}", "options": {"reward": f"{code}:score"}}
    return _checkpoint(tmp_path, yaml.safe_dump({"task": task})), data, code, marker


def _verb_args(verb, model, out):
    extra = ["eval.n=1", "eval.k=[1]"] if verb == "evaluate" else ["search.n=[1]", "search.methods=[best_of_n]"]
    return [verb, "--no-progress", "--model", str(model), "--out", str(out), *extra]


def _error(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("rewardlab ")
    return err[-1]


@pytest.mark.parametrize("verb", ["evaluate", "search"])
def test_a_run_directory_naming_module_function_is_not_imported(tmp_path, scripted, capsys, verb):
    model, data, code, marker = _hostile(tmp_path)
    assert main(_verb_args(verb, model, tmp_path / "out")) == 2
    err = _error(capsys)
    assert not marker.exists()  # the file named by the run directory never ran
    assert f"task.options.reward {str(code) + ':score'!r}" in err and "MODULE:FUNCTION" in err
    assert f"--task jsonl:{data}" in err  # how to proceed: name it on the command line
    assert not (tmp_path / "out").exists()  # nothing was created


@pytest.mark.parametrize("verb", ["evaluate", "search"])
@pytest.mark.parametrize("form", ["file", "module"])
def test_a_run_directory_naming_an_environment_class_is_not_imported(tmp_path, scripted, capsys, monkeypatch, verb,
                                                                     form):
    marker = tmp_path / "pwned"
    (tmp_path / "evil_env_x.py").write_text(f"open({str(marker)!r}, 'w').close()\n\nclass Game:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    spec = f"env:{tmp_path / 'evil_env_x.py'}:Game" if form == "file" else "env:evil_env_x:Game"
    model = _checkpoint(tmp_path, yaml.safe_dump({"task": {"spec": spec, "options": {}}}))
    assert main(_verb_args(verb, model, tmp_path / "out")) == 2
    err = _error(capsys)
    assert not marker.exists()  # the class named by the run directory was never imported
    assert f"task.spec {spec!r}" in err and "MODULE:CLASS" in err and f"--task {spec}" in err
    assert not (tmp_path / "out").exists()


def test_os_system_in_a_run_directory_is_never_called(tmp_path, scripted, capsys, monkeypatch):
    """The reproduction of the report: task.options.reward os:system beside a shared checkpoint, a row field
    `command` (what os.system's parameter is called) holding a shell command."""
    marker = tmp_path / "pwned"
    data = write_jsonl(tmp_path / "qs.jsonl", [{"prompt": "q", "answer": "5", "command": f"touch {marker}"}])
    model = _checkpoint(tmp_path, yaml.safe_dump({"task": {"spec": f"jsonl:{data}",
                                                           "options": {"reward": "os:system"}}}))
    assert main(_verb_args("evaluate", model, tmp_path / "out")) == 2
    assert "'os:system'" in _error(capsys) and not marker.exists()
    assert "os:system" not in REWARDS


def test_naming_the_reward_on_the_command_line_runs_it(tmp_path, scripted, capsys):
    model, data, code, marker = _hostile(tmp_path)
    assert main([*_verb_args("evaluate", model, tmp_path / "out"), "--task", f"jsonl:{data}",
                 f"task.options.reward={code}:score"]) == 0
    assert marker.exists()  # the user named it: it is theirs to run


def test_a_registered_reward_is_still_adopted(tmp_path, scripted, capsys):
    data = write_jsonl(tmp_path / "qs.jsonl", [{"prompt": f"q{i}", "answer": "5"} for i in range(3)])
    model = _checkpoint(tmp_path, yaml.safe_dump({"task": {"spec": f"jsonl:{data}",
                                                           "options": {"reward": "numeric"}}}))
    assert main(_verb_args("evaluate", model, tmp_path / "out")) == 0
    written = yaml.safe_load((tmp_path / "out" / "config.yaml").read_text())["task"]
    assert written == {"spec": f"jsonl:{data}", "options": {"reward": "numeric"}}


MALFORMED = {
    "a list": ("- task\n- 1\n", "top level must be a mapping"),
    "20k-deep nesting": ("task: " + "[" * 20000 + "]" * 20000 + "\n", "nested too deeply"),
    "invalid YAML": ("task: [\n", "invalid YAML"),
    "a task that is a list": ("task: [a, b]\n", "task: expected a mapping"),
    "options that are a string": ("task: {spec: 'jsonl:x.jsonl', options: abc}\n", "task.options: expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_config_beside_a_checkpoint_is_one_line(tmp_path, scripted, capsys, case):
    text, cause = MALFORMED[case]
    model = _checkpoint(tmp_path, text)
    assert main(_verb_args("evaluate", model, tmp_path / "out")) == 2
    err = _error(capsys)
    assert str(model.parent.parent / "config.yaml") in err and cause in err and "--task" in err


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_config_is_ignored_when_the_task_is_given(tmp_path, scripted, capsys, case):
    model = _checkpoint(tmp_path, MALFORMED[case][0])
    data = write_jsonl(tmp_path / "qs.jsonl", [{"prompt": "q", "answer": "5"}])
    assert main([*_verb_args("evaluate", model, tmp_path / "out"), "--task", f"jsonl:{data}"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "ignored" in warning[0] and str(model.parent.parent / "config.yaml") in warning[0]
