"""`evaluate` on environment tasks: greedy and sampled episodes, the outcome reward once per episode on its final
turn, predictions holding the transcript, and the episode figures (turns, terminations, tool call rate, tool errors)
counted by hand on scripted episodes; then `rewardlab evaluate task.spec=env:guess_number` with the tiny model
through the CLI."""

import json

from conftest import TINY_OVERRIDES, read_jsonl
from rewardlab.cli import main
from rewardlab.envs import episode_settings, make_env
from rewardlab.envs.sampling import EpisodeSettings
from rewardlab.evaluation.heldout import HeldOutEval
from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
from rewardlab.policy.settings import SamplingSettings
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.rewards import reward
from rewardlab.tasks import Task
from rewardlab.types import Sampled

TOK = build_tokenizer()


class Scripted:
    """A TokenSampler over the tiny char tokenizer: episode e's turn t writes `scripts[e][t]` ("$" = EOS) token by
    token, up to a stop string or the budget. Counts the turns it was asked for."""

    prompt_format = "raw"
    context_window = 512

    def __init__(self, scripts):
        self.scripts, self.tokenizer, self.eos_token_id = scripts, TOK, TOK.eos_token_id
        self.turns = 0

    def sample_ids(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, stop=None,
                   streams=None):
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        outs = []
        for budget, stream in zip(budgets, streams):
            self.turns += 1
            text = self.scripts[stream[2]][stream[4]]
            ids, finish = [], "length"
            for ch in text:
                ids += [self.eos_token_id] if ch == "$" else TOK(ch, add_special_tokens=False)["input_ids"]
                if ch == "$":
                    finish = "eos"
                    break
                if stop and any(s in TOK.decode(ids, skip_special_tokens=True) for s in stop):
                    finish = "stop"
                    break
                if len(ids) == budget:
                    break
            outs.append(Sampled(ids, [-1.0] * len(ids), finish))
        return outs


calls = []


@reward(register=False)
def _final_turn_is_answer(completion, answer):
    calls.append(completion)
    return float(completion.strip() == answer)


GUESS = "Guess my number from 1 to 8. Write <g>K</g>.\n"


def test_guess_number_greedy_episodes_scored_once_per_episode():
    rows = [{"prompt": GUESS, "answer": "3", "n": 8}, {"prompt": GUESS, "answer": "5", "n": 8}]
    # episode 0: 4 -> lower, 3 -> correct (env_done, 2 turns); episode 1: 4 -> higher, 7 -> lower (max_turns=2)
    policy = Scripted({0: ["<g>4</g>", "<g>3</g>"], 1: ["<g>4</g>", "<g>7</g>"]})
    settings = EpisodeSettings(make_env("guess_number", n=8), max_turns=2, max_episode_tokens=64, name="guess_number")
    task = Task("env:guess_number", train=[], test=rows, reward="guess_found")
    heldout = HeldOutEval(rows, task.reward, every=1, last_step=1, max_new_tokens=8, episodes=settings)
    metrics = heldout(policy)
    assert metrics["eval/accuracy"] == 0.5 and metrics["eval/episode/turns_mean"] == 2.0
    assert metrics["eval/tool/call_rate"] == 0.0 and metrics["eval/tool/errors_mean"] == 0.0
    assert policy.turns == 4  # greedy only: two episodes of two turns


def test_calculator_episodes_predictions_and_figures_by_hand():
    rows = [{"prompt": "12*34=", "answer": "408"}, {"prompt": "2+2=", "answer": "4"}]
    scripts = {  # greedy episodes 0, 1; sampled episodes (n=2) 0..3 reuse the scripts by index
        0: ["<c>12*34</c>", "408$"],                  # ok call, answer: 2 turns, 1 with a call
        1: ["<c>2+</c>", "<c>2+2</c>", "5$"],         # a call that fails, an ok call, a wrong answer: 3 turns, 2 calls
        2: ["<c>2+2</c>", "4$"], 3: ["4$"],
    }
    settings = EpisodeSettings(make_env("calculator", workers=1, size=20, test_size=2), max_turns=4,
                               max_episode_tokens=120, max_tool_tokens=32, name="calculator")
    calls.clear()
    try:
        result = evaluate_policy(Scripted(scripts), rows, _final_turn_is_answer(),
                                 SamplingSettings(max_new_tokens=16),
                                 settings=EvalSettings(n=2, ks=(1, 2), batch_size=8), episodes=settings)
    finally:
        settings.env.close()
    # the reward ran once per episode, on its final model turn: 2 greedy episodes, then 4 sampled ones
    assert calls == ["408", "5", "408", "5", "4", "4"]
    assert result["accuracy"] == 0.5
    # sampled: row 0's episodes 0, 1 -> "408" right, "5" wrong; row 1's episodes 2, 3 -> "4", "4" right
    assert result["pass@1"] == (0.5 + 1.0) / 2 and result["pass@2"] == 1.0
    # greedy figures: turns 2 and 3; 3 of the 5 turns call the tool; one call failed; both ended by answering
    assert result["turns_mean"] == 2.5 and result["tool_call_rate"] == 3 / 5 and result["tool_errors_mean"] == 0.5
    assert result["termination"] == {"stop": 1.0}
    first, second = result["predictions"]
    assert first["prediction"] == "408" and first["turns"] == 2 and first["termination"] == "stop"
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert first["messages"][2]["content"] == "408"  # the tool's output, not the model's answer
    assert [[c["status"] for c in turn] for turn in second["tool_calls"]] == [["error"], ["ok"], []]
    assert [s["completion"] for s in first["samples"]] == ["408", "5"]


def test_single_turn_rows_still_use_generate(tiny_policy):
    # no episodes: the same greedy completions as policy.generate
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]
    want = [r.completion for r in tiny_policy.generate([r["prompt"] for r in rows], greedy=True, max_new_tokens=3)]
    result = evaluate_policy(tiny_policy, rows, _final_turn_is_answer(), SamplingSettings(max_new_tokens=3),
                             settings=EvalSettings(n=0, ks=()))
    assert [p["prediction"] for p in result["predictions"]] == want
    assert "turns_mean" not in result and "messages" not in result["predictions"][0]


def test_episode_settings_of_a_loaded_task():
    from rewardlab.config.schema import EnvConfig
    from rewardlab.tasks import load

    task = load("env:guess_number", n=8, size=3, test_size=2)
    settings = episode_settings(task, EnvConfig(max_turns=3, max_episode_tokens=50))
    assert settings.env.n == 8 and settings.name == "guess_number" and settings.max_turns == 3


def test_evaluate_cli_runs_guess_number_episodes(tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["evaluate", "--no-progress", "task.spec=env:guess_number",
                 "task.options={n: 8, size: 4, test_size: 3}", "model.path=tiny", *TINY_OVERRIDES, "eval.n=2",
                 "eval.k=[1, 2]", "eval.max_new_tokens=6", "env.max_turns=3", "env.max_episode_tokens=40",
                 f"out={out}"]) == 0
    assert "evaluated 3 rows of env:guess_number (split test" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    predictions = read_jsonl(out / "predictions.jsonl")
    from rewardlab.envs import make_env as _make

    secrets = [r["answer"] for r in _make("guess_number", n=8, size=4, test_size=3).rows("test")]
    assert [p["answer"] for p in predictions] == secrets  # three rows with one prompt, none merged
    assert summary["n_questions"] == 3 and summary["samples_per_question"] == 2
    for p in predictions:
        assert p["messages"][0] == {"role": "user", "content": GUESS}
        assert p["messages"][-1] == {"role": "assistant", "content": p["prediction"]}
        assert sum(m["role"] == "assistant" for m in p["messages"]) == p["turns"] == len(p["tool_calls"])
        assert len(p["samples"]) == 2
    assert summary["turns_mean"] == sum(p["turns"] for p in predictions) / 3
    ends = [p["termination"] for p in predictions]
    assert summary["termination"] == {t: ends.count(t) / 3 for t in sorted(set(ends))}
    assert summary["tool_call_rate"] == 0.0 and summary["tool_errors_mean"] == 0.0  # guess_number runs no tools


def test_resumed_episode_evaluation_matches_the_uninterrupted_one(tmp_path):
    import shutil

    from rewardlab.commands.evaluate import run as run_evaluate
    from rewardlab.config import EvaluateConfig, load_config

    def config(out):
        return load_config(EvaluateConfig, None, [
            "task.spec=env:guess_number", "task.options={n: 8, size: 4, test_size: 3}", "model.path=tiny",
            *TINY_OVERRIDES, "eval.n=2", "eval.k=[1, 2]", "eval.max_new_tokens=6", "eval.batch_size=1",
            "eval.temperature=3.0", "env.max_turns=3", "env.max_episode_tokens=40", f"out={out}"])

    a, d = tmp_path / "A", tmp_path / "D"
    expected = run_evaluate(config(a), show_progress=False)
    shutil.copytree(a, d)
    lines = (a / "batches.jsonl").read_text().splitlines(keepends=True)
    (d / "summary.json").unlink()
    (d / "batches.jsonl").write_text(lines[0] + lines[1][:30])  # killed while logging batch 1
    summary = run_evaluate(config(d), mode="resume", show_progress=False)
    assert {k: v for k, v in summary.items() if k != "wall_s"} == {k: v for k, v in expected.items() if k != "wall_s"}
    assert read_jsonl(d / "predictions.jsonl") == read_jsonl(a / "predictions.jsonl")
    # the sampled episodes differ between the questions' batches (each batch draws from its own streams)
    samples = [[s["completion"] for s in p["samples"]] for p in read_jsonl(a / "predictions.jsonl")]
    assert len({tuple(s) for s in samples}) == 3
