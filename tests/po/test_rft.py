"""`rewardlab rft` (issue 36): rejection-sampling fine-tuning (STaR / RAFT / RAFT++). The keep rules and the batch
plan on hand-built inputs, RAFT++'s clipped loss on a hand vector, and the verb on the tiny model: it trains on the
sampled ids exactly, a round that keeps nothing takes no step, importance clip equals none at one step per round and
differs from it at more, a resume logs what the uninterrupted run logs, and bad configs are refused naming the key."""

import math
import random

import pytest
import torch

import rewardlab.po.rft as rft
from conftest import CHAIN_SUM, TINY_OVERRIDES, read_jsonl, sha256_of, without_keys
from rewardlab.cli import main
from rewardlab.commands.rft import run as run_rft
from rewardlab.config import ConfigError, RftConfig, load_config
from rewardlab.po.rft import plan_batches, raft_plus_plus_loss, select_samples
from rewardlab.policy import load_policy
from rewardlab.runs import RunDirError

# --------------------------------------------------------------------------------------------- keep rules

#: Three prompts of four samples: group 0 has a tie at 1.0 (samples 1 and 2, the same ids), group 1 never reaches
#: 1.0 (best 0.3, tied by samples 5 and 6), group 2 has three samples at 1.0, two of them the same ids.
SCORES = [0.5, 1.0, 1.0, 0.2, 0.0, 0.3, 0.3, 0.1, 1.0, 1.0, 0.0, 1.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
IDS = [[1], [2], [2], [3], [4], [5], [6], [7], [8], [8], [9], [10]]


def test_best_keeps_per_prompt_the_first_highest_sample_if_it_reaches_the_threshold():
    assert select_samples(SCORES, GROUPS, IDS, keep="best", threshold=1.0) == [1, 8]
    assert select_samples(SCORES, GROUPS, IDS, keep="best", threshold=0.3) == [1, 5, 8]
    assert select_samples(SCORES, GROUPS, IDS, keep="best", threshold=0.31) == [1, 8]
    # An ineligible sample (its reward failed under on_error skip) never wins: the next best of its prompt does.
    eligible = [i != 1 for i in range(12)]
    assert select_samples(SCORES, GROUPS, IDS, keep="best", threshold=1.0, eligible=eligible) == [2, 8]


def test_threshold_keeps_every_passing_sample_and_dedupe_counts_equal_ids_of_a_prompt_once():
    assert select_samples(SCORES, GROUPS, IDS, keep="threshold", threshold=1.0, dedupe=False) == [1, 2, 8, 9, 11]
    assert select_samples(SCORES, GROUPS, IDS, keep="threshold", threshold=1.0, dedupe=True) == [1, 8, 11]
    assert select_samples(SCORES, GROUPS, IDS, keep="threshold", threshold=0.3) == [0, 1, 5, 6, 8, 11]
    # The same ids in two prompts are two samples.
    assert select_samples([1.0, 1.0], [0, 1], [[4], [4]], keep="threshold") == [0, 1]
    assert select_samples([float("nan"), 1.0], [0, 0], [[1], [2]], keep="threshold", threshold=-1) == [1]
    with pytest.raises(ValueError, match="^rft.keep: expected 'best' or 'threshold', got 'all'"):
        select_samples(SCORES, GROUPS, IDS, keep="all")


def test_plan_batches_draws_distinct_samples_per_batch_and_every_sample_once_per_pass():
    batches = plan_batches(10, 5, 4, random.Random(0))
    assert [len(b) for b in batches] == [4] * 5 and all(len(set(b)) == 4 for b in batches)
    assert sorted(batches[0] + batches[1]) != list(range(8))  # shuffled, not in order...
    assert len(set(batches[0] + batches[1])) == 8  # ...and the second batch continues the first's pass
    # 2 samples are left after two batches: fewer than a batch, so batches 2 and 3 read a fresh shuffle.
    assert len(set(batches[2] + batches[3])) == 8 and set(batches[1]) & set(batches[2]) != set()
    assert [sorted(b) for b in plan_batches(3, 2, 64, random.Random(0))] == [[0, 1, 2], [0, 1, 2]]  # all, each step
    assert plan_batches(0, 4, 8, random.Random(0)) == []
    assert plan_batches(10, 5, 4, random.Random(7)) == plan_batches(10, 5, 4, random.Random(7))


# --------------------------------------------------------------------------------------------- RAFT++ loss

def test_raft_plus_plus_loss_on_a_hand_vector():
    # Ratios 1, 1.5 (above 1 + eps: clipped, no gradient), 0.5 (below 1 - eps: unclipped) and a masked token whose
    # ratio (e^10) would dominate if the mask were ignored.
    new = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2), 0.0]], requires_grad=True)
    old = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.4), -10.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss = raft_plus_plus_loss(new, old, mask, 0.2)
    # -(min(1, 1) + min(1.5, 1.2) + min(0.5, 0.8)) / 3
    assert loss.item() == pytest.approx(-(1.0 + 1.2 + 0.5) / 3)
    loss.backward()
    # d/dlogp of -r/3 is -r/3 where r is unclipped; 0 at the clipped and the masked token.
    assert new.grad.tolist()[0] == pytest.approx([-1 / 3, 0.0, -0.5 / 3, 0.0])
    assert raft_plus_plus_loss(new, old, mask, 0.2, denominator=6).item() == pytest.approx(-(2.7) / 6)
    # At ratio 1 the gradient is the negative log-likelihood's.
    lp = torch.tensor([[-0.7, -1.2]], requires_grad=True)
    raft_plus_plus_loss(lp, lp.detach().clone(), torch.ones(1, 2), 0.2).backward()
    assert lp.grad[0].tolist() == pytest.approx([-0.5, -0.5])
    with pytest.raises(ValueError, match="shapes differ"):
        raft_plus_plus_loss(new, old[:, :3], mask, 0.2)


# --------------------------------------------------------------------------------------------- the verb

def _config(tmp_path, out, *overrides):
    return load_config(RftConfig, None, [
        "model.path=tiny", *TINY_OVERRIDES, "task.spec=reasoning_gym:chain_sum", f"out={tmp_path / out}", "threads=1",
        "task.options={size: 200, test_size: 20, min_terms: %d, max_terms: %d, min_digits: %d, max_digits: %d}"
        % tuple(CHAIN_SUM.values()),
        "rft.prompts_per_round=4", "rft.n=3", "rft.max_new_tokens=4", "rft.batch_size=6", "rft.lr=1e-2",
        # The untrained tiny model is never right: threshold 0 keeps the samples the keep rule picks.
        "rft.threshold=0", *overrides])


def test_rft_trains_on_the_sampled_ids_of_the_kept_samples_exactly(tmp_path, monkeypatch):
    sampled, trained = [], []
    sample, gradient = rft.sample_rollouts, rft.sft_gradient

    def recording_sample(*args, **kwargs):
        out = sample(*args, **kwargs)
        sampled.append(out)
        return out

    def recording_gradient(policy, rows, micro_batch_size=None):
        trained.append(rows)
        return gradient(policy, rows, micro_batch_size)

    monkeypatch.setattr(rft, "sample_rollouts", recording_sample)
    monkeypatch.setattr(rft, "sft_gradient", recording_gradient)
    # threshold keeps every distinct sample; batch_size 64 trains on the whole kept set at each step.
    run_rft(_config(tmp_path, "A", "rft.rounds=2", "rft.keep=threshold", "rft.steps_per_round=2",
                    "rft.batch_size=64"), show_progress=False)
    lines = read_jsonl(tmp_path / "A" / "samples.jsonl")
    assert len(sampled) == 2 and len(trained) == 4 and len(lines) == 2 * 4 * 3
    for round_, rollouts in enumerate(sampled):
        flags = [line["kept"] for line in lines if line["step"] == round_ + 1]
        want = sorted((r.prompt_ids, r.completion_ids) for r, k in zip(rollouts, flags) if k)
        assert want and len(want) == len({(tuple(p), tuple(c)) for p, c in want})  # deduplicated
        for rows in trained[2 * round_: 2 * round_ + 2]:
            assert sorted((p, c) for p, c, mask in rows) == want and all(m is None for _, _, m in rows)
    # Completions cut at max_new_tokens have no EOS: re-encoding their text as a target would have appended one.
    eos = load_policy("tiny", **_config(tmp_path, "x").model.policy_options()).tokenizer.eos_token_id
    assert any(c[-1] != eos for rows in trained for _, c, _ in rows)


def test_a_round_that_keeps_nothing_takes_no_step(tmp_path):
    # Scores are in [0, 1]: a threshold of 2 keeps nothing, so the weights stay the initial ones.
    summary = run_rft(_config(tmp_path, "E", "rft.rounds=2", "rft.threshold=2"), show_progress=False)
    metrics = read_jsonl(tmp_path / "E" / "metrics.jsonl")
    assert [m["rft/empty_rounds"] for m in metrics] == [1, 2] and [m["rft/steps"] for m in metrics] == [0, 0]
    assert [m["rft/kept"] for m in metrics] == [0, 0] and metrics[0]["rft/sft_loss"] is None
    assert summary["empty_rounds"] == 2 and summary["steps"] == 0 and summary["kept_total"] == 0
    run_rft(_config(tmp_path, "F", "rft.rounds=0"), show_progress=False)
    weights = "model.safetensors"
    assert sha256_of(tmp_path / "E" / "checkpoints" / "step-2" / weights) == sha256_of(
        tmp_path / "F" / "checkpoints" / "step-0" / weights)


def _weights(path):
    return [p.detach().clone() for p in load_policy(str(path)).model.parameters()]


def test_importance_clip_trains_as_none_at_one_step_per_round_and_differently_at_more(tmp_path):
    for steps in (1, 3):
        for importance in ("none", "clip"):
            run_rft(_config(tmp_path, f"{importance}{steps}", "rft.rounds=1", f"rft.steps_per_round={steps}",
                            f"rft.importance={importance}", "rft.lr=3e-2"), show_progress=False)
    one = [_weights(tmp_path / f"{i}1" / "checkpoints" / "step-1") for i in ("none", "clip")]
    three = [_weights(tmp_path / f"{i}3" / "checkpoints" / "step-1") for i in ("none", "clip")]
    # One step: the sampler's weights are the trained ones, ratio 1 up to float rounding (the sampler's log-probs
    # come from a cached forward pass), which AdamW's first step (about lr x the gradient's sign) shows as ~1e-6.
    assert max((a - b).abs().max().item() for a, b in zip(*one)) < 2e-5
    clip1 = read_jsonl(tmp_path / "clip1" / "metrics.jsonl")[0]
    assert clip1["rft/clip_frac"] == 0.0 and clip1["rft/loss"] == pytest.approx(-1.0, abs=1e-5)
    # Three steps: the later steps' ratios move away from 1 and clip reweights (and zeroes) tokens.
    assert max((a - b).abs().max().item() for a, b in zip(*three)) > 1e-3
    assert read_jsonl(tmp_path / "clip3" / "metrics.jsonl")[0]["rft/clip_frac"] > 0


def test_resume_after_round_2_logs_what_the_uninterrupted_run_logs(tmp_path):
    common = ["save_every=1", "rft.eval_every=2", "rft.eval_n=5"]
    run_rft(_config(tmp_path, "A", "rft.rounds=3", *common), show_progress=False)
    run_rft(_config(tmp_path, "B", "rft.rounds=2", *common), show_progress=False)  # killed after round 2
    summary = run_rft(_config(tmp_path, "B", "rft.rounds=3", *common), mode="resume", show_progress=False)
    assert summary["resumed_from"] == 2 and summary["rounds_done"] == 3
    a, b = read_jsonl(tmp_path / "A" / "metrics.jsonl"), read_jsonl(tmp_path / "B" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2, 3] and "eval/accuracy" in b[1] and "eval/accuracy" in b[2]
    assert without_keys(b, "time/") == without_keys(a, "time/")
    assert read_jsonl(tmp_path / "B" / "samples.jsonl") == read_jsonl(tmp_path / "A" / "samples.jsonl")
    weights = "checkpoints/step-3/model.safetensors"
    assert sha256_of(tmp_path / "B" / weights) == sha256_of(tmp_path / "A" / weights)
    assert (tmp_path / "A" / "plots" / "rft.png").is_file()
    # A directory that holds a run is refused as a new run.
    with pytest.raises(RunDirError, match="already holds a run"):
        run_rft(_config(tmp_path, "A", "rft.rounds=3", *common), show_progress=False)
    # A resume with another setting is refused, naming it.
    with pytest.raises(RunDirError, match=r"rft\.lr"):
        run_rft(_config(tmp_path, "B", "rft.rounds=4", "rft.lr=0.5", *common), mode="resume", show_progress=False)


@pytest.mark.parametrize("overrides, key", [
    (["rft.bogus=1"], "rft.bogus: unknown key"),
    (["task.spec=env:calculator"], "task.spec: rft samples single completions"),
    (["rft.importance=clip", "rft.temperature=0.7"], "rft.importance, rft.temperature: "),
    (["rft.keep=all"], "rft.keep: "),
    (["rft.n=0"], "rft.n: "),
])
def test_bad_configs_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"^config error: {key}"):
        load_config(RftConfig, None, overrides)
    load_config(RftConfig, None, ["rft.importance=clip"])  # temperature 1 (the default) is fine


def test_cli_help_lists_the_verb_and_its_flags(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "rft" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["rft", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert all(flag in out for flag in ("--n", "--model", "--task", "--resume", "--overwrite", "rft.keep"))


@pytest.mark.parametrize("importance", ["none", "clip"])
def test_micro_batches_are_a_memory_switch(tmp_path, importance):
    common = ["rft.rounds=2", "rft.steps_per_round=2", f"rft.importance={importance}", "rft.lr=3e-2"]
    run_rft(_config(tmp_path, "whole", *common), show_progress=False)
    run_rft(_config(tmp_path, "micro", *common, "rft.micro_batch_size=1"), show_progress=False)
    a, b = (without_keys(read_jsonl(tmp_path / d / "metrics.jsonl"), "time/") for d in ("whole", "micro"))
    assert a[-1]["rft/kept"] > 1  # several kept samples, so micro-batches of 1 split the steps
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), k
