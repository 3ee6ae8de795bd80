"""The verbs with model.lora on the tiny model: sft and train (GRPO, with a KL penalty) change the adapter and never the
base, checkpoint the adapter (and the tiny base, which is not on disk) and resume bit for bit; the KL reference is the
policy's own base with the adapter disabled; an SFT adapter chains into train and evaluate; `rewardlab merge` writes
a full model with the adapter model's log-probs; the settings that cannot apply are refused in one line."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY_ARCH, TINY_OVERRIDES, read_jsonl, sha256_of, write_jsonl
from rewardlab.cli import main
from rewardlab.commands.sft import run as run_sft
from rewardlab.config import EvaluateConfig, SFTConfig, TrainConfig, load_config
from rewardlab.policy import load_policy, rollout_batch
from rewardlab.policy.lora import adapter_parameters
from rewardlab.rl.trainer import close, setup, train
from rewardlab.train_state import load_weights

pytest.importorskip("peft")  # the `lora` extra (in `test`)

LORA = "model.lora={r: 4, alpha: 8}"
ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(3)]


def _task(tmp_path):
    return [f"task.spec=jsonl:{write_jsonl(tmp_path / 'task.jsonl', ROWS)}", "task.options={test_size: 5}"]


def _sft(tmp_path, out, *overrides):
    return load_config(SFTConfig, None, [*_task(tmp_path), *TINY_OVERRIDES, LORA, "sft.batch_size=8", "sft.lr=1e-2",
                                         "threads=1", f"out={tmp_path / out}", *overrides])


#: A dense reward (the fraction of characters with an even code), so groups are rarely tied and the model moves.
DENSE = "def dense(completion):\n    return sum(ord(c) % 2 == 0 for c in completion) / max(1, len(completion))\n"


def _dense(tmp_path):
    (tmp_path / "dense.py").write_text(DENSE)
    return f"rewards=[{{name: '{tmp_path / 'dense.py'}:dense'}}]"


def _train(tmp_path, out, *overrides):
    return load_config(TrainConfig, None, [*_task(tmp_path), *TINY_OVERRIDES, LORA, "rl.prompts_per_step=2",
                                           "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=5e-2", "threads=1",
                                           _dense(tmp_path), f"out={tmp_path / out}", *overrides])


def _adapter(checkpoint):
    return load_file(str(checkpoint / "adapter_model.safetensors"))


def _assert_base_is_the_seeded_tiny_model(checkpoint):
    base = load_file(str(checkpoint / "base" / "model.safetensors"))
    fresh = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0).model.state_dict()
    assert base and all(torch.equal(v, fresh[k]) for k, v in base.items())


def _batch(policy):
    rollouts = policy.generate(["1+2=", "7+0="], n=2, max_new_tokens=4, streams=[(i,) for i in range(4)])
    return rollout_batch(policy, rollouts)[0]


def _logprobs(policy, batch):
    with torch.no_grad():
        return policy.token_logprobs(batch)[0]


@pytest.mark.slow  # sft twice
def test_sft_with_lora_trains_the_adapter_checkpoints_it_with_its_base_and_resumes_bit_for_bit(tmp_path):
    full = run_sft(_sft(tmp_path, "A", "sft.steps=6", "save_every=3"), show_progress=False)
    ck = tmp_path / "A" / "checkpoints" / "step-6"
    files = {p.name for p in ck.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "trainer_state.pt", "base"} <= files
    assert "model.safetensors" not in files
    adapter = _adapter(ck)
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter)
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in adapter.items())  # B left 0: it trained
    _assert_base_is_the_seeded_tiny_model(ck)  # the base did not move
    losses = [m["sft/loss"] for m in read_jsonl(tmp_path / "A" / "metrics.jsonl")]
    assert losses[-1] < losses[0]

    # what a SIGKILL during step 5 leaves: checkpoint step-3, four metrics lines, no summary
    b = shutil.copytree(tmp_path / "A", tmp_path / "B")
    shutil.rmtree(b / "checkpoints" / "step-6")
    (b / "summary.json").unlink()
    (b / "metrics.jsonl").write_text("".join((b / "metrics.jsonl").read_text().splitlines(keepends=True)[:4]))
    resumed = run_sft(_sft(tmp_path, "B", "sft.steps=6", "save_every=3"), mode="resume", show_progress=False)
    assert resumed["resumed_from"] == 3 and resumed["final_loss"] == full["final_loss"]
    assert _without_time(read_jsonl(tmp_path / "B" / "metrics.jsonl")) == _without_time(
        read_jsonl(tmp_path / "A" / "metrics.jsonl"))  # the same losses and lr, bit for bit
    ab = "checkpoints/step-6/adapter_model.safetensors"
    assert sha256_of(tmp_path / "B" / ab) == sha256_of(tmp_path / "A" / ab)


def _without_time(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def test_the_kl_reference_of_a_lora_run_is_its_base_with_the_adapter_disabled(tmp_path):
    state, progress = setup(_train(tmp_path, "S", "rl.steps=1", "rl.beta=0.1"))
    try:
        policy, ref = state.policy, state.reference
        assert ref.model is policy.model  # no second model: the same parameters
        n_params = sum(p.numel() for p in policy.model.parameters())
        assert n_params == sum(p.numel() for p in ref.model.parameters())
        assert [p.requires_grad for p in adapter_parameters(policy.model).values()] == [True] * 14  # still trainable
        plain = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
        batch = _batch(plain)
        with torch.no_grad():
            for name, p in adapter_parameters(policy.model).items():
                p.add_(0.1 if ".lora_B." in name else 0.0)  # the adapter moves; the reference must not
        assert torch.equal(ref.scored_logprobs(batch), _logprobs(plain, batch))
        assert (_logprobs(policy, batch) - _logprobs(plain, batch)).abs().max() > 1e-3
    finally:
        close(state, progress)


@pytest.mark.slow  # GRPO twice
def test_grpo_with_lora_and_a_kl_penalty_trains_the_adapter_only_and_resumes_bit_for_bit(tmp_path):
    common = ["rl.beta=0.2", "rl.kl_in=reward", "save_every=1", "rl.epochs=2", "rl.minibatch_size=4"]
    train(_train(tmp_path, "A", "rl.steps=3", *common), show_progress=False)
    metrics = read_jsonl(tmp_path / "A" / "metrics.jsonl")
    assert metrics[0]["policy/kl_reward"] == pytest.approx(0.0, abs=1e-7)  # step 1 samples with policy == base
    assert metrics[-1]["policy/kl_reward"] > 1e-4  # the adapter moved away from the base
    ck = tmp_path / "A" / "checkpoints" / "step-3"
    assert not (ck / "model.safetensors").exists() and (ck / "adapter_model.safetensors").is_file()
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in _adapter(ck).items())
    _assert_base_is_the_seeded_tiny_model(ck)

    train(_train(tmp_path, "B", "rl.steps=2", *common), show_progress=False)
    summary = train(_train(tmp_path, "B", "rl.steps=3", *common), mode="resume", show_progress=False)
    assert summary["resumed_from"] == 2
    # the base rebuilt as the run built it and the adapter loaded exactly: step 3 logs what the uninterrupted run
    # logs, bit for bit
    assert _without_time(read_jsonl(tmp_path / "B" / "metrics.jsonl")) == _without_time(metrics)
    assert read_jsonl(tmp_path / "B" / "samples.jsonl") == read_jsonl(tmp_path / "A" / "samples.jsonl")
    name = "checkpoints/step-3/adapter_model.safetensors"
    assert sha256_of(tmp_path / "B" / name) == sha256_of(tmp_path / "A" / name)


@pytest.mark.slow  # sft, train, evaluate and merge through the CLI
def test_sft_adapter_chains_into_train_evaluate_and_merge(tmp_path, capsys):
    task = ["--task", f"jsonl:{write_jsonl(tmp_path / 'task.jsonl', ROWS)}", "task.options={test_size: 5}"]
    common = ["--no-progress", *task, *TINY_OVERRIDES, "threads=1"]
    assert main(["sft", *common, LORA, "sft.steps=4", "sft.batch_size=8", "sft.lr=1e-2",
                 "--out", str(tmp_path / "sft")]) == 0
    sft_ck = tmp_path / "sft" / "checkpoints" / "step-4"
    assert main(["train", *common, LORA, "--model", str(sft_ck), "rl.steps=2", "rl.prompts_per_step=2",
                 "rl.group_size=4", "rl.sampling.max_new_tokens=3", "rl.lr=5e-2", "rl.beta=0.1", _dense(tmp_path),
                 "--out", str(tmp_path / "grpo")]) == 0
    grpo_ck = tmp_path / "grpo" / "checkpoints" / "step-2"
    config = json.loads((grpo_ck / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(sft_ck) and not (grpo_ck / "base").exists()
    # the GRPO run's base and KL reference is the SFT model (adapter merged): its first KL is 0
    assert read_jsonl(tmp_path / "grpo" / "metrics.jsonl")[0]["policy/kl"] == pytest.approx(0.0, abs=1e-7)

    capsys.readouterr()
    assert main(["evaluate", "--no-progress", "--model", str(grpo_ck), "eval.n=2", "eval.k=[1,2]",
                 "eval.max_new_tokens=3", "--out", str(tmp_path / "ev")]) == 0
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["n_questions"] == 30 and summary["task_from"] == "model's run"  # the trained task, whole

    assert main(["merge", "--no-progress", "--model", str(grpo_ck), "--out", str(tmp_path / "merged")]) == 0
    merged_dir = tmp_path / "merged"
    assert (merged_dir / "config.json").is_file() and (merged_dir / "model.safetensors").is_file()
    assert not (merged_dir / ".merging").exists()
    merge_summary = json.loads((merged_dir / "summary.json").read_text())
    assert merge_summary["chain"] == [str(grpo_ck), str(sft_ck), str(sft_ck / "base")]
    # the merged model computes the adapter model's log-probs (base + SFT merged, GRPO adapter unmerged)
    adapter_model = load_policy(str(sft_ck), lora={"r": 4, "alpha": 8.0})
    load_weights(adapter_model.model, grpo_ck)
    merged = load_policy(str(merged_dir))
    assert not merged.has_adapter
    batch = _batch(merged)
    gap = (_logprobs(merged, batch) - _logprobs(adapter_model, batch)).abs().max()
    assert gap < 1e-5
    assert (_logprobs(merged, batch) - _logprobs(adapter_model.without_adapter(), batch)).abs().max() > 1e-3

    # a used directory is refused; a full model has nothing to merge
    capsys.readouterr()
    assert main(["merge", "--no-progress", "--model", str(grpo_ck), "--out", str(merged_dir)]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert main(["merge", "--no-progress", "--model", str(merged_dir), "--out", str(tmp_path / "m2")]) == 2
    assert capsys.readouterr().err.strip() == (f"rewardlab merge: error: model.path: {merged_dir} is a full model "
                                               "directory, not a LoRA adapter (no adapter_config.json): nothing to "
                                               "merge")
    assert not (tmp_path / "m2").exists()


def test_grpo_with_lora_runs_with_micro_batches_gradient_checkpointing_and_autocast(tmp_path):
    train(_train(tmp_path, "M", "rl.steps=1", "rl.beta=0.1", "rl.micro_batch_size=2",
                 "model.gradient_checkpointing=true", "model.autocast=bfloat16"), show_progress=False)
    ck = tmp_path / "M" / "checkpoints" / "step-1"
    assert read_jsonl(tmp_path / "M" / "metrics.jsonl")[0]["policy/grad_norm"] > 0
    assert any(".lora_B." in k and v.abs().max() > 0 for k, v in _adapter(ck).items())
    _assert_base_is_the_seeded_tiny_model(ck)


def test_settings_that_cannot_apply_with_lora_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as info:
        _train(tmp_path, "R", "rl.beta=0.1", "rl.ref_refresh_every=2")
    assert str(info.value) == ("config error: rl.ref_refresh_every: with model.lora the KL reference is the base "
                               "model with the adapter disabled, not a copy of the policy that could be refreshed; "
                               "unset it (or train without model.lora)")
    with pytest.raises(ValueError) as info:
        load_config(EvaluateConfig, None, [LORA])
    assert str(info.value) == ("config error: model.lora: applies to the verbs that train the policy (sft, train, "
                               "po, rft, quickstart); this verb only runs it, so drop the setting (a LoRA checkpoint loads as "
                               "model.path)")
    assert not (tmp_path / "R").exists()


def test_a_lora_runs_critic_starts_from_the_base_weights(tmp_path):
    state, progress = setup(_train(tmp_path, "C", "rl.steps=1", "rl.estimator=gae"))
    try:
        critic = state.critic.model.state_dict()
        base = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0).model.state_dict()
        shared = [k for k in base if k in critic]
        assert shared == [k for k in critic if not k.startswith("score.")]  # every weight but the value head's
        assert all(torch.equal(critic[k], base[k]) for k in shared)
    finally:
        close(state, progress)


@pytest.mark.slow  # four stages
def test_quickstart_with_lora_chains_its_stages_through_adapter_checkpoints(tmp_path):
    q = tmp_path / "Q"
    assert main(["quickstart", "--no-progress", *TINY_OVERRIDES, LORA, "threads=1", "--out", str(q),
                 "task.options={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1, template: compact, "
                 "size: 300, test_size: 20}", "sft.steps=3", "sft.batch_size=8", "sft.eval_every=0", "rl.steps=2",
                 "rl.prompts_per_step=2", "rl.group_size=2", "rl.eval.every=0", "rl.lr=1e-2", "eval.n=2",
                 "eval.k=[1,2]"]) == 0
    summary = json.loads((q / "summary.json").read_text())
    sft_ck, grpo_ck = q / "sft" / "checkpoints" / "step-3", q / "grpo" / "checkpoints" / "step-2"
    assert summary["sft"]["checkpoint"] == str(sft_ck) and summary["grpo"]["checkpoint"] == str(grpo_ck)
    assert (sft_ck / "base" / "model.safetensors").is_file() and not (sft_ck / "model.safetensors").exists()
    config = json.loads((grpo_ck / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(sft_ck.resolve())  # GRPO's adapter sits on the SFT model
    for stage in ("eval_sft", "eval_grpo"):
        evaluated = json.loads((q / stage / "summary.json").read_text())
        assert evaluated["n_questions"] == 20 and "model.lora" not in (q / stage / "config.yaml").read_text()
