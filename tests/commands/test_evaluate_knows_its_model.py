"""`rewardlab evaluate` writes every prediction, and knows which task its model was trained on; `rewardlab search`
labels a scorer that reads the reference answer as an oracle."""

import json

import pytest
import yaml

from conftest import write_jsonl
from rewardlab.commands import common
from rewardlab.commands import evaluate as evaluate_command
from rewardlab.commands import search as search_command
from rewardlab.config import EvaluateConfig, SearchConfig, load_config
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.search.report import reads_reference
from rewardlab.types import Rollout

if "test_length_only" not in REWARDS:

    @reward(name="test_length_only")
    def _length_only(completion):
        """Reads nothing but the completion: 1 / (1 + its length)."""
        return 1.0 / (1 + len(completion))


class Scripted:
    """Greedy gives GREEDY[prompt]; the k-th sample of a prompt is SAMPLES[prompt][k]."""

    GREEDY = {"q1": "5", "q2": "7", "q3": "6"}
    SAMPLES = {"q1": ["5", "6"], "q2": ["7", "7"], "q3": ["5", "5"]}

    def generate(self, prompts, *, n=1, greedy=False, rows=None, **_kw):
        out = []
        for i, p in enumerate(prompts):
            texts = [self.GREEDY[p]] * n if greedy else self.SAMPLES[p][:n]
            out += [Rollout(prompt=p, prompt_ids=[1], completion=t, completion_ids=[ord(t)], logprobs=[0.0],
                            row=dict(rows[i]), group=i) for t in texts]
        return out


def _rows(tmp_path, name="qs.jsonl"):
    return write_jsonl(tmp_path / name, [{"prompt": q, "answer": "5"} for q in ("q1", "q2", "q3")])


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(common, "load_model", lambda *a, **k: Scripted())


def test_evaluate_writes_one_prediction_per_question_with_its_samples(tmp_path, scripted):
    data = _rows(tmp_path)
    cfg = load_config(EvaluateConfig, None, [f"task.spec=jsonl:{data}", f"out={tmp_path / 'e'}", "eval.n=2",
                                             "eval.k=[1, 2]"])
    summary = evaluate_command.run(cfg, show_progress=False)
    preds = [json.loads(x) for x in (tmp_path / "e" / "predictions.jsonl").read_text().splitlines()]
    assert [(p["question"], p["answer"], p["prediction"], p["correct"]) for p in preds] == [
        ("q1", "5", "5", True), ("q2", "5", "7", False), ("q3", "5", "6", False)]
    assert [[(s["completion"], s["correct"]) for s in p["samples"]] for p in preds] == [
        [("5", True), ("6", False)], [("7", False), ("7", False)], [("5", True), ("5", True)]]
    assert summary["accuracy"] == pytest.approx(1 / 3) and summary["pass@2"] == pytest.approx(2 / 3)
    assert summary["predictions_file"] == "predictions.jsonl" and "predictions" not in summary


def _trained_run(tmp_path, data, options):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"task": {"spec": f"jsonl:{data}", "options": options}}))
    return run / "checkpoints" / "step-3"


def test_evaluate_defaults_to_the_task_the_checkpoint_was_trained_on(tmp_path, scripted, capsys):
    data = _rows(tmp_path)
    model = _trained_run(tmp_path, data, {"test_size": 1})
    cfg = load_config(EvaluateConfig, None, [f"model.path={model}", f"out={tmp_path / 'e'}", "eval.n=1",
                                             "eval.k=[1]"])
    summary = evaluate_command.run(cfg, show_progress=False)
    # not the default reasoning_gym task: the run's file and options (test_size 1: the held-out row only)
    assert summary["task"] == f"jsonl:{data}" and summary["task_from"] == "model's run"
    assert summary["trained_on"] == {"spec": f"jsonl:{data}", "options": {"test_size": 1}}
    assert summary["task_differs"] is False
    assert f"task jsonl:{data}" in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "e" / "config.yaml").read_text())["task"]["options"] == {"test_size": 1}


def test_evaluate_on_another_task_says_so(tmp_path, scripted, capsys):
    model = _trained_run(tmp_path, _rows(tmp_path), {})
    other = _rows(tmp_path, "other.jsonl")
    cfg = load_config(EvaluateConfig, None, [f"model.path={model}", f"task.spec=jsonl:{other}",
                                             f"out={tmp_path / 'e'}", "eval.n=1", "eval.k=[1]"])
    summary = evaluate_command.run(cfg, show_progress=False)
    assert summary["task"] == f"jsonl:{other}" and summary["task_differs"] is True
    assert "differs from the task" in capsys.readouterr().err


def test_a_model_that_is_no_run_checkpoint_keeps_the_configured_task(tmp_path):
    assert common.trained_task(str(tmp_path)) is None
    assert common.trained_task("tiny") is None


def test_reads_reference_tells_a_verifier_from_a_reward_model_like_scorer():
    rollouts = [Rollout(prompt="q", prompt_ids=[], completion=c, completion_ids=[], logprobs=[],
                        row={"prompt": "q", "answer": "5"}) for c in ("4", "6")]  # both wrong: scores all 0
    assert reads_reference(build_reward("exact_match"), rollouts)
    assert not reads_reference(build_reward("test_length_only"), rollouts)


def test_search_labels_an_answer_reading_scorer_an_oracle(tmp_path, scripted, capsys):
    data = _rows(tmp_path)
    cfg = load_config(SearchConfig, None, [f"task.spec=jsonl:{data}", f"out={tmp_path / 's'}", "search.n=[1, 2]",
                                           "search.methods=[best_of_n]", "scorer=[{name: exact_match}]"])
    report = search_command.run(cfg, show_progress=False)
    assert report["scorer_reads_answer"] is True and "an oracle" in report["scorer"]
    assert "oracle" in capsys.readouterr().err
    # best-of-N with an oracle is pass@N, and its ceiling is that pass@N
    assert {n: c["accuracy"] for n, c in report["methods"]["best_of_n"].items()} == report["pass@N"]
    assert {n: c["ceiling"] for n, c in report["methods"]["best_of_n"].items()} == report["pass@N"]
    cfg = load_config(SearchConfig, None, [f"task.spec=jsonl:{data}", f"out={tmp_path / 't'}", "search.n=[1, 2]",
                                           "search.methods=[best_of_n]", "scorer=[{name: test_length_only}]"])
    report = search_command.run(cfg, show_progress=False)
    assert report["scorer_reads_answer"] is False and "oracle" not in report["scorer"]
