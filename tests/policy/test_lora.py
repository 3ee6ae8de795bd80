"""LoRA through peft (`rewardlab.policy.lora`): the adapter is all that trains; a peft model samples and scores through
the shared-prefix sampler and scorer, the chunked LM head, gradient checkpointing and autocast as a plain model does;
the base with the adapter disabled is the reference (nothing copied); checkpoints hold the adapter (and the base when
it is not on disk) and load back merged; a base may itself be an adapter; a missing peft or a bad target list is one
line naming the key."""

import json
import sys

import pytest
import torch

from conftest import TINY_ARCH
from rewardlab.modeldir import check_model_dir
from rewardlab.policy import load_policy, rollout_batch
from rewardlab.policy.lora import adapter_parameters, load_adapter_weights
from rewardlab.policy.tiny import create_tiny

pytest.importorskip("peft")  # the `lora` extra (in `test`)

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear"}
PROMPTS = ["1+2=", "12+34+5=", "7="]


def _lora_policy(seed=0, *, lora=LORA, path="tiny", **options):
    return load_policy(path, tiny_arch=TINY_ARCH, seed=seed, lora=lora, **options)


def _move_adapter(policy, seed=1, std=0.2):
    """Give the adapter's B (zero at the start) random values, so the adapter changes the model's outputs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in adapter_parameters(policy.model).items():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _logprobs(policy, batch, **kw):
    with torch.no_grad():
        return policy.token_logprobs(batch, **kw)[0]


def _full_logits_logprobs(model, batch):
    """log softmax of the model's own full logits at the completion positions (no split LM head, no sharing)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       position_ids=batch.position_ids).logits.float()
    P, T = batch.prompt_len, batch.completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, P - 1:P - 1 + T], dim=-1)
    return logp.gather(2, batch.completion_ids[..., None]).squeeze(2) * batch.mask


def test_only_the_adapter_trains_and_a_fresh_adapter_is_the_base_model():
    policy, plain = _lora_policy(), load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: q, k, v, o, gate, up, down of the one block get A and B; the LM head (tied embedding) does not
    assert len(trainable) == 2 * 7 * TINY_ARCH["num_hidden_layers"]
    assert sorted(policy.trained_weights()) == sorted(trainable)
    batch, _ = rollout_batch(plain, plain.generate(PROMPTS, n=2, max_new_tokens=6, streams=[(i,) for i in range(6)]))
    assert torch.equal(_logprobs(policy, batch), _logprobs(plain, batch))  # B = 0: exactly the base model


def test_peft_missing_is_one_line_naming_the_key_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    with pytest.raises(ValueError) as info:
        _lora_policy()
    assert str(info.value) == ("model.lora: LoRA needs the peft package, which is not installed; "
                               "pip install 'rewardlab[lora]'")


def test_target_modules_that_match_nothing_are_one_line_naming_the_key():
    with pytest.raises(ValueError) as info:
        _lora_policy(lora={**LORA, "target_modules": ["query", "value"]})
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("model.lora.target_modules: ['query', 'value'] match no module of the model; its linear "
                          "layers are down_proj, gate_proj, k_proj")
    listed = _lora_policy(lora={**LORA, "target_modules": ["q_proj", "v_proj"]})
    assert {n.split(".")[-4] for n in listed.trained_weights()} == {"q_proj", "v_proj"}


@pytest.mark.parametrize("options", [{}, {"gradient_checkpointing": True}, {"autocast": "bfloat16"}],
                         ids=["plain", "gradient-checkpointing", "autocast"])
def test_a_lora_model_samples_and_scores_like_its_own_forward_pass(options):
    policy = _lora_policy(**options)
    _move_adapter(policy)
    plain = _lora_policy()  # without the options: the float32 reference values, with the same adapter
    plain.load_trained_weights({k: v.clone() for k, v in policy.trained_weights().items()})
    tol = 3e-2 if "autocast" in options else 1e-4
    for shared_prefix in (None, False):  # the shared-prefix sampler and scorer, and transformers' generate
        policy.shared_prefix = shared_prefix
        streams = [(7, i) for i in range(9)]
        rollouts = policy.generate(PROMPTS, n=3, temperature=1.0, max_new_tokens=8, streams=streams)
        batch, behaviour = rollout_batch(policy, rollouts)
        scored = _logprobs(policy, batch)
        assert (scored - behaviour).abs().max() < tol  # the sampler's log-probs are the scorer's
        # ... and the scorer's (split LM head, shared prompts) are the peft model's own full logits'
        assert (scored - _full_logits_logprobs(plain.model, batch)).abs().max() < tol
        assert (scored - _logprobs(policy.without_adapter(), batch)).abs().max() > 10 * tol  # the adapter counts
    # gradients reach the adapter only, through checkpointed layers and autocast alike, and equal plain ones
    policy.shared_prefix = plain.shared_prefix = None
    grads = []
    for p in (policy, plain):
        p.model.train()
        p.model.zero_grad()
        lp, _ = p.token_logprobs(batch)
        (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
        grads.append({n: w.grad.clone() for n, w in p.model.named_parameters() if w.grad is not None})
    assert sorted(grads[0]) == sorted(adapter_parameters(policy.model))  # no base weight has a gradient
    for name, g in grads[1].items():  # bfloat16 forward passes: gradients within a few percent
        assert (grads[0][name] - g).norm() <= (0.1 if "autocast" in options else 1e-4) * g.norm(), name


def test_the_reference_is_the_base_with_the_adapter_disabled_nothing_copied():
    policy = _lora_policy()
    _move_adapter(policy)
    policy.model.train()
    before = {id(p) for p in policy.model.parameters()}
    ref = policy.without_adapter()
    assert ref.model is policy.model and {id(p) for p in ref.model.parameters()} == before
    plain = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)  # the base model, loaded on its own
    batch, _ = rollout_batch(plain, plain.generate(PROMPTS, n=2, max_new_tokens=6, streams=[(i,) for i in range(6)]))
    adapted = _logprobs(policy, batch)
    assert (adapted - _logprobs(plain, batch)).abs().max() > 1e-3  # the policy is not the base
    assert torch.equal(ref.scored_logprobs(batch), _logprobs(plain, batch))
    assert policy.model.training  # the reference pass (eval mode, adapter off) gives the mode and adapter back
    assert torch.equal(_logprobs(policy, batch), adapted)
    assert all(p.requires_grad for p in adapter_parameters(policy.model).values())  # and it still trains
    assert len(adapter_parameters(policy.model)) == 2 * 7 * TINY_ARCH["num_hidden_layers"]
    with pytest.raises(ValueError, match="no LoRA adapter"):
        plain.without_adapter()


def test_a_checkpoint_of_the_tiny_model_holds_the_adapter_and_its_base_and_loads_merged(tmp_path):
    policy = _lora_policy()
    _move_adapter(policy)
    policy.save(tmp_path / "ck")
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "base"} <= set(files)
    assert "model.safetensors" not in files and "config.json" not in files  # no full weights beside the adapter
    assert json.loads((tmp_path / "ck" / "adapter_config.json").read_text())["base_model_name_or_path"] == "base"
    assert check_model_dir(tmp_path / "ck", adapters=True) == tmp_path / "ck"
    with pytest.raises(ValueError, match="has no config.json"):
        check_model_dir(tmp_path / "ck")  # where a full model is needed (a reward-model backbone)
    merged = load_policy(str(tmp_path / "ck"))
    assert not merged.has_adapter
    batch, _ = rollout_batch(merged, merged.generate(PROMPTS, n=2, max_new_tokens=6, streams=[(i,) for i in range(6)]))
    assert torch.allclose(_logprobs(merged, batch), _logprobs(policy, batch), atol=1e-5)
    # the saved base is the seeded tiny model, bit for bit
    base = load_policy(str(tmp_path / "ck" / "base"))
    fresh = load_policy("tiny", tiny_arch=TINY_ARCH, seed=0)
    for (name, a), (_, b) in zip(sorted(base.model.state_dict().items()), sorted(fresh.model.state_dict().items())):
        assert torch.equal(a, b), name


def test_a_checkpoint_of_a_base_on_disk_names_it_and_holds_no_base(tmp_path, monkeypatch):
    create_tiny(tmp_path / "base", seed=3, **TINY_ARCH)
    monkeypatch.chdir(tmp_path)
    policy = _lora_policy(path="base")  # a relative path: recorded absolute
    _move_adapter(policy)
    policy.save(tmp_path / "ck")
    assert not (tmp_path / "ck" / "base").exists()
    named = json.loads((tmp_path / "ck" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert named == str(tmp_path / "base")
    monkeypatch.chdir(tmp_path / "ck")  # loads from anywhere
    merged = load_policy(str(tmp_path / "ck"))
    batch, _ = rollout_batch(merged, merged.generate(PROMPTS, n=2, max_new_tokens=6, streams=[(i,) for i in range(6)]))
    assert torch.allclose(_logprobs(merged, batch), _logprobs(policy, batch), atol=1e-5)
    (tmp_path / "base" / "config.json").rename(tmp_path / "base" / "moved.json")
    (tmp_path / "base").rename(tmp_path / "gone")
    with pytest.raises(ValueError) as info:
        load_policy(str(tmp_path / "ck"))
    assert str(info.value) == (f"model.path: {tmp_path / 'ck'} is a LoRA adapter on the base model "
                               f"{tmp_path / 'base'}, which does not exist")


def test_an_adapter_as_the_base_is_merged_and_a_new_adapter_trains_on_it(tmp_path):
    sft = _lora_policy()
    _move_adapter(sft, seed=1)
    sft.save(tmp_path / "sft")
    grpo = _lora_policy(path=str(tmp_path / "sft"))  # merged SFT model + a fresh adapter
    ref = grpo.without_adapter()
    batch, _ = rollout_batch(sft, sft.generate(PROMPTS, n=2, max_new_tokens=6, streams=[(i,) for i in range(6)]))
    assert torch.allclose(_logprobs(ref, batch), _logprobs(sft, batch), atol=1e-5)  # the reference: the SFT model
    assert torch.equal(_logprobs(grpo, batch), _logprobs(ref, batch))  # fresh adapter
    _move_adapter(grpo, seed=2)
    grpo.save(tmp_path / "grpo")
    config = json.loads((tmp_path / "grpo" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tmp_path / "sft") and not (tmp_path / "grpo" / "base").exists()
    both = load_policy(str(tmp_path / "grpo"))  # tiny base <- sft adapter <- grpo adapter, merged
    assert torch.allclose(_logprobs(both, batch), _logprobs(grpo, batch), atol=1e-5)
    assert (_logprobs(both, batch) - _logprobs(sft, batch)).abs().max() > 1e-3


def test_a_resumed_run_loads_the_checkpoints_adapter_into_the_model_it_built(tmp_path):
    policy = _lora_policy()
    _move_adapter(policy)
    policy.save(tmp_path / "ck")
    again = _lora_policy()
    load_adapter_weights(again.model, tmp_path / "ck")
    for name, p in adapter_parameters(policy.model).items():
        assert torch.equal(adapter_parameters(again.model)[name], p), name
    other = _lora_policy(lora={**LORA, "r": 2})
    with pytest.raises(RuntimeError):
        load_adapter_weights(other.model, tmp_path / "ck")


def test_published_weights_are_the_adapter_and_load_into_a_replica():
    policy, replica = _lora_policy(), _lora_policy()
    _move_adapter(policy)
    published = policy.trained_weights()
    assert sorted(published) == sorted(n for n, p in policy.model.named_parameters() if p.requires_grad)
    replica.load_trained_weights({k: v.clone() for k, v in published.items()})
    for name, p in adapter_parameters(policy.model).items():
        assert torch.equal(adapter_parameters(replica.model)[name], p), name
    with pytest.raises(RuntimeError, match="does not fit"):
        replica.load_trained_weights({k: v for k, v in list(published.items())[1:]})


def test_the_adapters_random_init_is_the_seeds_and_leaves_torchs_generator_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = _lora_policy(seed=5)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the global generator
    torch.rand(1000)  # whatever ran before does not matter
    b, c = _lora_policy(seed=5), _lora_policy(seed=6)
    for name, p in a.trained_weights().items():
        assert torch.equal(b.trained_weights()[name], p), name
    assert any(not torch.equal(c.trained_weights()[n], p) for n, p in a.trained_weights().items() if ".lora_A." in n)


def test_an_adapter_saved_by_peft_itself_loads_with_its_bases_tokenizer(tmp_path):
    import peft
    from transformers import AutoModelForCausalLM

    create_tiny(tmp_path / "base", seed=2, **TINY_ARCH)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"))  # name_or_path: the base directory
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                         task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.fill_(0.05)
    wrapped.save_pretrained(str(tmp_path / "adapter"))  # as TRL or a peft script would: no tokenizer beside it
    assert not (tmp_path / "adapter" / "tokenizer.json").exists()
    policy = load_policy(str(tmp_path / "adapter"))
    assert policy.tokenizer.eos_token == "</s>"  # the base's
    batch, _ = rollout_batch(policy, policy.generate(PROMPTS, n=1, max_new_tokens=5, streams=[(i,) for i in range(3)]))
    assert torch.allclose(_logprobs(policy, batch), _full_logits_logprobs(wrapped.eval(), batch), atol=1e-5)
