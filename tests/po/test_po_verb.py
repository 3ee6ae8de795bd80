"""`rewardlab po` (issue 36): offline DPO from a pairs file with the reference's log-probs cached, online and
semi-online DPO (po.sync_every, po.ref_refresh), TRL's metric names, exact resume, and refused bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import CHAIN_SUM, TINY_ARCH, TINY_OVERRIDES, read_jsonl, without_keys, write_jsonl
from rewardlab.cli import main, parse
from rewardlab.commands.po import run as run_po
from rewardlab.config import ConfigError, PoConfig, load_config
from rewardlab.po.data import load_preference_rows
from rewardlab.po.online import best_worst_pairs, sync_due
from rewardlab.po.train import encode_pairs, reference_logps
from rewardlab.policy import load_policy
from rewardlab.runs import RunDirError

TASK = ["task.spec=reasoning_gym:chain_sum", "task.options={size: 120, test_size: 10, min_terms: 2, max_terms: 2, "
        "min_digits: 1, max_digits: 1}"]
TRL_METRICS = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
               "logps/rejected"}


def _cfg(tmp_path: Path, *overrides: str, out: str = "run") -> PoConfig:
    return load_config(PoConfig, None, [*TINY_OVERRIDES, "threads=1", f"out={tmp_path / out}", *overrides])


def _pairs_file(tmp_path: Path, n: int = 12) -> Path:
    rows = [{"prompt": f"{i % 5}+{i % 3}=", "chosen": str(i % 5 + i % 3), "rejected": str((i * 7) % 10) + "9"}
            for i in range(n)]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


def _digit_reward(tmp_path: Path) -> str:
    """A reward that ranks a fresh model's samples: the number of digits in the completion (so pairs form)."""
    path = tmp_path / "digits.py"
    path.write_text("def digits(completion):\n    return float(sum(c.isdigit() for c in completion))\n")
    return f"rewards=[{path}:digits]"


def _metrics(out: Path) -> list[dict]:
    return without_keys(read_jsonl(out / "metrics.jsonl"), "time/")


# ------------------------------------------------------------------------------------------------- pure parts
def test_best_worst_pairs_take_the_extremes_first_sampled_on_ties_and_count_ties():
    scores = [0.0, 1.0, 1.0, 0.0,   # best = 1 (first of the 1.0s), worst = 0 (first of the 0.0s)
              2.0, 2.0, 2.0, 2.0,   # all equal: a tie
              None, 3.0, None, None,  # one scored sample: no pair
              None, 5.0, -1.0, 5.0]  # None ignored; best 13, worst 14
    pairs, ties, unscored = best_worst_pairs(scores, 4)
    assert pairs == [(1, 0), (13, 14)] and ties == 1 and unscored == 1
    with pytest.raises(ValueError, match="groups of 4"):
        best_worst_pairs([1.0] * 6, 4)


def test_sync_is_due_at_steps_1_and_every_s_after_and_never_without_s():
    assert [s for s in range(1, 9) if sync_due(s, 3)] == [1, 4, 7]
    assert [s for s in range(1, 4) if sync_due(s, 1)] == [1, 2, 3]
    assert not any(sync_due(s, None) for s in range(1, 9))


# ------------------------------------------------------------------------------------------------- offline
def test_offline_dpo_logs_trls_metrics_from_reference_log_probs_cached_once(tmp_path):
    pairs = _pairs_file(tmp_path)
    cfg = _cfg(tmp_path, f"pairs={pairs}", "po.lr=0.01", "po.batch_size=4", "po.epochs=2")
    summary = run_po(cfg, show_progress=False)
    assert summary["steps"] == 6 and summary["train_pairs"] == 12
    metrics = _metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert TRL_METRICS <= set(metrics[0])
    # the policy starts as the reference: every implicit reward is 0 and the DPO loss log 2 at the first step
    assert metrics[0]["train/loss"] == pytest.approx(0.693147, abs=1e-5)
    assert metrics[0]["rewards/chosen"] == pytest.approx(0.0, abs=1e-5)
    assert abs(metrics[-1]["rewards/margins"]) > 1e-3  # and it trained
    # the cache holds the starting model's summed log-probs of every pair (chosen, rejected)
    cached = torch.load(tmp_path / "run" / "ref_logps.pt", weights_only=True)["logps"]
    policy = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    expected = reference_logps(policy, encode_pairs(policy, load_preference_rows(pairs)[0]))
    assert cached.shape == (12, 2) and torch.allclose(cached, expected, atol=1e-5)


def test_offline_resume_after_a_crash_logs_what_the_uninterrupted_run_logs_without_recomputing_the_reference(
        tmp_path, monkeypatch):
    pairs = _pairs_file(tmp_path)
    args = [f"pairs={pairs}", "po.lr=0.01", "po.batch_size=4", "po.epochs=2", "save_every=2", "keep_checkpoints=5"]
    run_po(_cfg(tmp_path, *args), show_progress=False)
    whole = _metrics(tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-6")  # the crash: steps 5-6 logged, not checkpointed
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-4")
    import rewardlab.commands.po as po_command

    def refuse(*a, **k):
        raise AssertionError("the reference's log-probs were computed again on resume")

    monkeypatch.setattr(po_command, "reference_logps", refuse)
    summary = run_po(_cfg(tmp_path, *args), mode="resume", show_progress=False)
    assert summary["resumed_from"] == 2
    assert _metrics(tmp_path / "run") == whole


def test_offline_micro_batches_are_a_memory_switch(tmp_path):
    pairs = _pairs_file(tmp_path)
    base = [f"pairs={pairs}", "po.lr=0.01", "po.batch_size=6", "po.epochs=2"]
    run_po(_cfg(tmp_path, *base, out="whole"), show_progress=False)
    run_po(_cfg(tmp_path, *base, "po.micro_batch_size=4", out="micro"), show_progress=False)
    a, b = _metrics(tmp_path / "whole"), _metrics(tmp_path / "micro")
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), k


def test_reference_free_losses_load_no_reference(tmp_path, monkeypatch):
    import rewardlab.commands.po as po_command

    monkeypatch.setattr(po_command, "_reference", lambda *a: (_ for _ in ()).throw(AssertionError("loaded")))
    summary = run_po(_cfg(tmp_path, f"pairs={_pairs_file(tmp_path)}", "po.loss_type=simpo", "po.batch_size=6"),
                     show_progress=False)
    assert summary["steps"] == 2 and not (tmp_path / "run" / "ref_logps.pt").exists()
    assert "rewards/accuracies" in _metrics(tmp_path / "run")[0]


def test_held_out_pairs_and_greedy_accuracy_are_evaluated(tmp_path):
    pairs = _pairs_file(tmp_path)
    cfg = _cfg(tmp_path, f"pairs={pairs}", f"eval_pairs={pairs}", "po.eval_every=2", "po.batch_size=4", *TASK)
    run_po(cfg, show_progress=False)
    metrics = _metrics(tmp_path / "run")
    evaluated = [m["step"] for m in metrics if "eval/rewards/accuracies" in m]
    assert evaluated == [2, 3] and all("eval/accuracy" in m for m in metrics if m["step"] in evaluated)
    assert metrics[1]["eval/loss"] > 0


# ------------------------------------------------------------------------------------------------- online
ONLINE = ["po.online=true", "po.prompts_per_step=6", "po.num_generations=4", "po.max_new_tokens=3", "po.lr=0.02",
          *TASK]


def _samples(out: Path, step: int) -> list[str]:
    return [s["completion"] for s in read_jsonl(out / "samples.jsonl") if s["step"] == step]


def test_online_dpo_pairs_each_prompts_best_and_worst_and_writes_them_as_pairs(tmp_path):
    summary = run_po(_cfg(tmp_path, *ONLINE, _digit_reward(tmp_path), "po.steps=2"), show_progress=False)
    out = tmp_path / "run"
    metrics = _metrics(out)
    assert TRL_METRICS <= set(metrics[0]) and metrics[0]["po/pairs"] + metrics[0]["po/ties"] == 6
    assert summary["pairs"] == sum(m["po/pairs"] for m in metrics) > 0 and summary["samples"] == 2 * 6 * 4
    samples = read_jsonl(out / "samples.jsonl")
    for pair in read_jsonl(out / "pairs.jsonl"):
        group = [s for s in samples if s["step"] == pair["step"] and s["prompt"] == pair["prompt"]]
        assert pair["chosen_score"] == max(s["reward"] for s in group) > pair["rejected_score"]
    # the pairs file is an offline run's input and TRL's
    from rewardlab.integrations.trl import pairs_to_trl

    assert len(pairs_to_trl(out / "pairs.jsonl")) == summary["pairs"]
    run_po(_cfg(tmp_path, f"pairs={out / 'pairs.jsonl'}", out="offline"), show_progress=False)


def test_online_trains_on_the_sampled_ids(tmp_path, monkeypatch):
    import rewardlab.po.online as online

    seen = []
    original = online.pair_loss

    def spy(policy, pairs, ref, spec):
        seen.extend(pairs)
        return original(policy, pairs, ref, spec)

    sampled = {}
    original_sample = online.sample_rollouts

    def record(*a, **k):
        out = original_sample(*a, **k)
        sampled.update({(tuple(r.prompt_ids), tuple(r.completion_ids)): r for r in out})
        return out

    monkeypatch.setattr(online, "pair_loss", spy)
    monkeypatch.setattr(online, "sample_rollouts", record)
    run_po(_cfg(tmp_path, *ONLINE, _digit_reward(tmp_path), "po.steps=1"), show_progress=False)
    assert seen
    for pair in seen:
        assert (tuple(pair.prompt_ids), tuple(pair.chosen_ids)) in sampled
        assert (tuple(pair.prompt_ids), tuple(pair.rejected_ids)) in sampled


def test_sync_every_decides_which_policy_samples(tmp_path):
    reward = _digit_reward(tmp_path)
    for name, sync in (("online", "1"), ("semi", "2"), ("never", "null")):
        run_po(_cfg(tmp_path, *ONLINE, reward, "po.steps=3", f"po.sync_every={sync}", out=name), show_progress=False)
    online, semi, never = (tmp_path / n for n in ("online", "semi", "never"))
    assert _samples(online, 1) == _samples(semi, 1) == _samples(never, 1)  # all start from the same policy
    assert _samples(semi, 2) == _samples(never, 2) != _samples(online, 2)  # step 2: semi still samples the start
    assert _samples(semi, 3) != _samples(never, 3)  # synced at step 3
    assert [m["po/synced"] for m in _metrics(semi)] == [1, 0, 1]


def test_ref_refresh_makes_the_last_sync_the_reference(tmp_path):
    reward = _digit_reward(tmp_path)
    run_po(_cfg(tmp_path, *ONLINE, reward, "po.steps=3", "po.ref_refresh=true", out="fresh"), show_progress=False)
    run_po(_cfg(tmp_path, *ONLINE, reward, "po.steps=3", out="fixed"), show_progress=False)
    fresh, fixed = _metrics(tmp_path / "fresh"), _metrics(tmp_path / "fixed")
    # online with a refreshed reference: the policy is its reference when each step's loss is computed
    assert all(m["rewards/chosen"] == pytest.approx(0, abs=1e-6) for m in fresh if "rewards/chosen" in m)
    assert any(abs(m.get("rewards/chosen", 0)) > 1e-4 for m in fixed[1:])


def test_semi_online_resume_restores_the_sampling_copy(tmp_path):
    args = [*ONLINE, _digit_reward(tmp_path), "po.steps=4", "po.sync_every=2", "save_every=1", "keep_checkpoints=9"]
    run_po(_cfg(tmp_path, *args), show_progress=False)
    out = tmp_path / "run"
    whole, samples = _metrics(out), read_jsonl(out / "samples.jsonl")
    assert (out / "checkpoints" / "step-3" / "sampler.pt").is_file()
    shutil.rmtree(out / "checkpoints" / "step-4")  # resume from step 3: step 4 samples with the copy synced at 3
    summary = run_po(_cfg(tmp_path, *args), mode="resume", show_progress=False)
    assert summary["resumed_from"] == 3
    assert _metrics(out) == whole and read_jsonl(out / "samples.jsonl") == samples


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("override, key", [
    ("po.beta=0", "po.beta"), ("po.beta=-1", "po.beta"), ("po.loss_type=dpoo", "po.loss_type"),
    ("po.loss_options={bogus: 1}", "po.loss_options"), ("po.loss_options={label_smoothing: 0.7}", "po.loss_options"),
    ("po.loss_type=[dpo, sft]", None), ("po.loss_weights=[1.0, 2.0]", "po.loss_weights"),
    ("po.steps=5", "po.steps"), ("po.ref_refresh=true", "po.ref_refresh"), ("rewards=[math]", "rewards"),
    ("eval_pairs=x.jsonl", "eval_pairs"),
])
def test_bad_settings_are_refused_before_anything_loads_naming_the_key(tmp_path, override, key):
    pairs = _pairs_file(tmp_path)
    if key is None:  # a valid mix, for contrast
        run_po(_cfg(tmp_path, f"pairs={pairs}", override, "po.batch_size=12"), show_progress=False)
        return
    with pytest.raises((ConfigError, ValueError), match=key.replace(".", r"\.")):
        run_po(_cfg(tmp_path, f"pairs={pairs}", override), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_mode_keys_and_reference_free_refresh_are_refused(tmp_path):
    pairs = _pairs_file(tmp_path)
    with pytest.raises(ConfigError, match="pairs: offline po needs a pairs file"):
        _cfg(tmp_path)
    with pytest.raises(ConfigError, match="pairs: po.online samples its pairs"):
        _cfg(tmp_path, "po.online=true", f"pairs={pairs}")
    with pytest.raises(ConfigError, match="po.epochs: does not apply to online po"):
        _cfg(tmp_path, "po.online=true", "po.epochs=2")
    with pytest.raises(ConfigError, match="task.spec: po samples single completions"):
        _cfg(tmp_path, "po.online=true", "task.spec=env:calculator")
    with pytest.raises(ValueError, match="po.ref_refresh: the loss"):
        run_po(_cfg(tmp_path, *ONLINE, "po.loss_type=simpo", "po.ref_refresh=true"), show_progress=False)


def test_a_bad_pairs_row_is_a_file_line_error_or_a_counted_skip(tmp_path):
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "1+2=", "chosen": "3", "rejected": "3"}]
    pairs = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=rf"{pairs}:2: 'chosen' and 'rejected' are the same"):
        run_po(_cfg(tmp_path, f"pairs={pairs}"), show_progress=False)
    assert not (tmp_path / "run").exists()
    summary = run_po(_cfg(tmp_path, f"pairs={pairs}", "skip_invalid=true"), show_progress=False)
    assert summary["train_pairs"] == 1 and summary["skipped_pairs"]["identical"] == 1
    long = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "1+1=", "chosen": "2" * 400, "rejected": "3"}])
    with pytest.raises(ValueError, match=rf"{long}:1: .* context window"):
        run_po(_cfg(tmp_path, f"pairs={long}", out="long"), show_progress=False)


def test_a_directory_holding_another_run_is_refused(tmp_path):
    pairs = _pairs_file(tmp_path)
    run_po(_cfg(tmp_path, f"pairs={pairs}", "po.batch_size=12"), show_progress=False)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError):
        run_po(_cfg(tmp_path, f"pairs={pairs}", "po.batch_size=12"), show_progress=False)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_the_cli_spells_out_the_flags(tmp_path):
    verb, _, overrides = parse(["po", "--online", "--loss", "ipo", "--task", "reasoning_gym:chain_sum"])
    assert verb == "po" and {"po.online=true", "po.loss_type=ipo", "task.spec=reasoning_gym:chain_sum"} <= set(
        overrides)
    verb, _, overrides = parse(["po", "--pairs", "p.jsonl"])
    assert "pairs=p.jsonl" in overrides and not any(o.startswith("po.online") for o in overrides)
    out = tmp_path / "cli"
    assert main(["po", "--pairs", str(_pairs_file(tmp_path)), f"--out={out}", *TINY_OVERRIDES, "threads=1",
                 "po.batch_size=12", "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


def test_lora_runs_offline_and_semi_online_against_the_adapter_free_base(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    import rewardlab.commands.po as po_command

    loads = []
    original = po_command.load_policy
    monkeypatch.setattr(po_command, "load_policy", lambda *a, **k: loads.append(k.get("lora")) or original(*a, **k))
    lora = "model.lora={r: 4}"
    run_po(_cfg(tmp_path, f"pairs={_pairs_file(tmp_path)}", lora, "po.lr=0.01", "po.batch_size=4", out="off"),
           show_progress=False)
    assert loads == []  # the reference is the base with the adapter disabled: no second model
    metrics = _metrics(tmp_path / "off")
    assert metrics[0]["train/loss"] == pytest.approx(0.693147, abs=1e-5) and abs(metrics[-1]["rewards/margins"]) > 0
    assert (tmp_path / "off" / "checkpoints" / "step-3" / "adapter_model.safetensors").is_file()
    summary = run_po(_cfg(tmp_path, *ONLINE, _digit_reward(tmp_path), lora, "po.steps=2", "po.sync_every=2",
                          out="semi"), show_progress=False)
    assert summary["pairs"] > 0 and loads == [{"r": 4, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}]
    assert (tmp_path / "semi" / "checkpoints" / "step-2" / "sampler.pt").is_file()


def test_a_bad_reward_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import rewardlab.commands.common as common

    monkeypatch.setattr(common, "load_policy", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ValueError, match="no_such_reward"):
        run_po(_cfg(tmp_path, *ONLINE, "rewards=[no_such_reward]"), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_the_reward_flag_is_the_rewards_list(tmp_path):
    _, _, overrides = parse(["po", "--online", "--reward", "math"])
    assert "rewards=[math]" in overrides
    _, _, overrides = parse(["rft", "--reward", "{name: reward_model, path: rm}", "--n", "4"])
    assert "rewards=[{name: reward_model, path: rm}]" in overrides and "rft.n=4" in overrides
    cfg = _cfg(tmp_path, *ONLINE, *[o for o in parse(["po", "--reward", "format"])[2]])
    assert cfg.rewards == ["format"]


def test_online_micro_batches_are_a_memory_switch(tmp_path):
    reward = _digit_reward(tmp_path)
    run_po(_cfg(tmp_path, *ONLINE, reward, "po.steps=3", out="whole"), show_progress=False)
    run_po(_cfg(tmp_path, *ONLINE, reward, "po.steps=3", "po.micro_batch_size=2", out="micro"), show_progress=False)
    a, b = _metrics(tmp_path / "whole"), _metrics(tmp_path / "micro")
    assert sum(m["po/pairs"] for m in a) > 2  # steps with several pairs, so micro-batches of 2 split them
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6), k
