"""The env keys checked against the environment and the model at set-up, before a run directory is written: tool
keys on an environment without tools, a max_tool_tokens that cannot hold the truncation marker; and sft on
an environment task, which trains on the environment's generated traces."""

import json

import pytest

from conftest import TINY_OVERRIDES
from rewardlab.cli import main
from rewardlab.envs import check_episode_keys, make_env
from rewardlab.envs.render import DEFAULT_MARKER
from rewardlab.envs.sampling import EpisodeSettings
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.envs import load_episodes
from rewardlab.config import EvaluateConfig, load_config
from rewardlab.tasks import Task, load

GUESS = ["task.spec=env:guess_number", "task.options={n: 8, size: 4, test_size: 2}"]
CALC = ["task.spec=env:calculator", "task.options={size: 30, test_size: 2}"]


class _Policy:
    tokenizer, prompt_format = build_tokenizer(), "raw"


def _error(capsys, *args):
    assert main([*args, "model.path=tiny", *TINY_OVERRIDES]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("key,value", [("tool_timeout_s", "3"), ("max_tool_tokens", "32"), ("tool_keep", "end"),
                                       ("max_tool_calls_per_turn", "2")])
def test_a_tool_key_on_an_environment_without_tools_is_refused_naming_it(tmp_path, capsys, key, value):
    out = tmp_path / "run"
    line = _error(capsys, "evaluate", *GUESS, f"env.{key}={value}", f"out={out}")
    assert f"env.{key}: environment 'guess_number' runs no tools" in line
    assert not out.exists()  # refused before the run directory


def test_max_tool_tokens_below_the_marker_is_refused_at_set_up(tmp_path, capsys):
    marker = len(build_tokenizer()(DEFAULT_MARKER, add_special_tokens=False)["input_ids"])  # one token a character
    assert marker == len(DEFAULT_MARKER)
    out = tmp_path / "run"
    line = _error(capsys, "evaluate", *CALC, f"env.max_tool_tokens={marker - 1}", f"out={out}")
    assert f"env.max_tool_tokens: {marker - 1} tokens cannot hold the truncation marker" in line
    assert f"set it to at least {marker}" in line
    assert not out.exists()


def test_the_check_itself():
    policy = _Policy()
    calc = make_env("calculator", size=20, test_size=2)
    marker = len(DEFAULT_MARKER)
    check_episode_keys(EpisodeSettings(calc, 4, 64, max_tool_tokens=marker), policy,
                       changed={"max_tool_tokens", "tool_keep", "tool_timeout_s"})  # a tool env reads them all
    with pytest.raises(ValueError, match=f"env.max_tool_tokens: {marker - 1} tokens"):
        check_episode_keys(EpisodeSettings(calc, 4, 64, max_tool_tokens=marker - 1), policy)
    guess = EpisodeSettings(make_env("guess_number"), 4, 64, max_tool_tokens=1, name="guess_number")
    check_episode_keys(guess, policy)  # defaults on a tool-less env: nothing to refuse (no tool output is clipped)
    with pytest.raises(ValueError, match=r"^env.tool_timeout_s, env.tool_keep: environment 'guess_number' runs no "
                                         "tools, so nothing reads them; drop the setting$"):
        check_episode_keys(guess, policy, changed={"tool_keep", "tool_timeout_s", "max_turns"})
    check_episode_keys(None, policy, changed={"tool_keep"})  # a single-turn task: the config already refused it


def test_the_env_section_reaches_the_episodes_and_the_tool_timeout_only_when_set():
    task = load("env:python")
    default = load_episodes(task, load_config(EvaluateConfig, None, ["task.spec=env:python"]).env, None)
    assert default.env.timeout_s == 15.0  # python's own (its sandbox stops a program after 5 s), not the key's 5.0
    assert default.env.max_calls_per_turn == 4
    cfg = load_config(EvaluateConfig, None, ["task.spec=env:python", "env.tool_timeout_s=2", "env.max_turns=3",
                                             "env.max_episode_tokens=300", "env.max_tool_tokens=40",
                                             "env.tool_keep=end", "env.max_tool_calls_per_turn=2"])
    settings = load_episodes(task, cfg.env, None)
    assert settings.env.timeout_s == 2.0 and settings.name == "python"
    assert settings.env.max_calls_per_turn == 2
    assert (settings.max_turns, settings.max_episode_tokens, settings.max_tool_tokens, settings.tool_keep) == (
        3, 300, 40, "end")
    single = Task("jsonl:x", train=[{"prompt": "1+1=", "answer": "2"}], test=[])
    assert load_episodes(single, load_config(EvaluateConfig, None, []).env, None) is None


@pytest.mark.parametrize("value,message", [
    ("0", "env.max_tool_calls_per_turn: Input should be greater than 0"),
    ("two", "env.max_tool_calls_per_turn: Input should be a valid integer"),
    ("1.5", "env.max_tool_calls_per_turn: Input should be a valid integer"),
])
def test_a_bad_max_tool_calls_per_turn_is_one_line_naming_the_key(tmp_path, capsys, value, message):
    out = tmp_path / "run"
    line = _error(capsys, "evaluate", *CALC, f"env.max_tool_calls_per_turn={value}", f"out={out}")
    assert message in line
    assert not out.exists()


def test_max_tool_calls_per_turn_on_a_tool_environment_that_does_not_take_it_is_refused():
    from rewardlab.envs import ENVIRONMENTS, ToolEnv, calc

    class NoLimit(ToolEnv):  # a tool environment whose options do not include max_calls_per_turn
        def __init__(self) -> None:
            super().__init__([calc], parser="compact")

    ENVIRONMENTS.register("no_limit")(NoLimit)
    try:
        task = Task("env:no_limit", train=[{"prompt": "1+1=", "answer": "2"}], test=[], env={"name": "no_limit"})
        default = load_config(EvaluateConfig, None, ["task.spec=env:calculator"]).env
        assert load_episodes(task, default, None).env.max_calls_per_turn == 4  # the default: nothing to refuse
        cfg = load_config(EvaluateConfig, None, ["task.spec=env:calculator", "env.max_tool_calls_per_turn=2"])
        with pytest.raises(ValueError, match=r"^env.max_tool_calls_per_turn: environment 'no_limit' does not take "
                                             "max_calls_per_turn, so nothing reads it; drop the setting$"):
            load_episodes(task, cfg.env, None)
    finally:
        ENVIRONMENTS.unregister("no_limit")


def test_sft_trains_on_an_environment_task_from_its_generated_traces(tmp_path):
    out = tmp_path / "run"
    assert main(["sft", *GUESS, f"out={out}", "sft.steps=2", "sft.batch_size=2", "--no-progress", "model.path=tiny",
                 *TINY_OVERRIDES]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps_done"] == 2 and summary["train_rows"] == 4


# ------------------------------------------------------------------------------------------------ turn budget
def test_each_built_in_environment_declares_the_turn_budget_its_own_format_needs():
    # measured on the rows' own transcripts with the tiny model's tokenizer (one token a character): the longest
    # model turn of every trace, plus EOS for a turn that ends at it (issue 32, item 1)
    tok = build_tokenizer()
    count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    for name, options in (("calculator", {"size": 300, "test_size": 30}),
                          ("calculator", {"size": 300, "test_size": 30, "dataset": "products"}),
                          ("calculator", {"size": 300, "test_size": 30, "max_terms": 2}),
                          ("guess_number", {"size": 100, "test_size": 0}), ("guess_number", {"n": 1000})):
        env = make_env(name, **options)
        turns = [(m["content"], i == len(t) - 1 and name == "calculator")
                 for t in env.traces(env.rows("all")) for i, m in enumerate(t) if m["role"] == "assistant"]
        longest = max(count(text) + ends_at_eos for text, ends_at_eos in turns)
        assert env.min_turn_tokens(tok) == longest, (name, options)
    assert make_env("calculator").min_turn_tokens(tok) == 21  # <c>9999-9999-9999</c>
    assert make_env("guess_number").min_turn_tokens(tok) == 9  # <g>64</g>
    with make_env("python") as python:  # a floor: the shortest complete run_python call
        call = '<tool_call>\n{"name": "run_python", "arguments": {"code": ""}}\n</tool_call>'
        assert python.min_turn_tokens(tok) == count(call) == 74


def test_a_turn_budget_below_the_format_is_warned_and_one_that_fits_is_not():
    from rewardlab.envs.sampling import turn_budget_warning

    guess = EpisodeSettings(make_env("guess_number"), 8, 256, name="guess_number")
    assert turn_budget_warning(guess, _Policy(), 8, key="rl.sampling.max_new_tokens") == (
        "rl.sampling.max_new_tokens=8 is below the 9 tokens a model turn of environment 'guess_number' needs for its "
        "own format with this model's tokenizer (min_turn_tokens): such turns are cut and end their episode "
        "max_new_tokens; set rl.sampling.max_new_tokens to at least 9")
    assert turn_budget_warning(guess, _Policy(), 9) is None and turn_budget_warning(guess, _Policy(), 64) is None
    assert turn_budget_warning(None, _Policy(), 1) is None  # a single-turn task
    assert turn_budget_warning(guess, object(), 1) is None  # no tokenizer to count with


@pytest.mark.parametrize("budget,warned", [(7, True), (8, False)])
def test_evaluate_warns_at_start_when_a_turn_cannot_hold_the_environments_format(tmp_path, capsys, budget, warned):
    # n = 8: the longest guess is <g>8</g>, 8 tokens
    assert main(["evaluate", *GUESS, "model.path=tiny", *TINY_OVERRIDES, f"eval.max_new_tokens={budget}",
                 "env.max_turns=2", f"out={tmp_path / 'run'}", "--no-progress"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "min_turn_tokens" in line]
    assert lines == ([f"rewardlab: warning: eval.max_new_tokens={budget} is below the 8 tokens a model turn of "
                      "environment 'guess_number' needs for its own format with this model's tokenizer "
                      "(min_turn_tokens): such turns are cut and end their episode max_new_tokens; set "
                      "eval.max_new_tokens to at least 8"] if warned else [])


@pytest.mark.parametrize("budget,warned", [(7, True), (8, False)])
def test_train_warns_at_start_when_a_turn_cannot_hold_the_environments_format(tmp_path, capsys, budget, warned):
    assert main(["train", *GUESS, "model.path=tiny", *TINY_OVERRIDES, f"rl.sampling.max_new_tokens={budget}",
                 "rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "env.max_turns=2", f"out={tmp_path / 'run'}",
                 "--no-progress"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "min_turn_tokens" in line]
    assert len(lines) == warned and (not warned or "rl.sampling.max_new_tokens=7 is below the 8 tokens" in lines[0])
