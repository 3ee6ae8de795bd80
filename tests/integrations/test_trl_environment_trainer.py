"""`as_trl_environment("calculator")` inside TRL's own GRPOTrainer: TRL's tool loop parses the model's tool call,
calls the rewardlab environment's `calc` tool, and logs it.

The model is a small randomly initialised Qwen2 built here, offline: a `Qwen2Tokenizer` over a byte-level BPE
vocabulary trained in milliseconds on the template's text and the task's, with Qwen2.5's chat template as TRL ships it
(`trl/chat_templates/qwen2_5.jinja`, which passes TRL's tool-calling check and gets TRL's Hermes response parser),
and a 2-layer, 64-wide Qwen2ForCausalLM. Its tool call is forced by a few seconds of SFT on the two turns TRL will
ask for: the prompt as TRL renders it (the environment's `calc` schema in the system turn) -> the call as Qwen2.5's
template writes one, and the conversation with the tool's answer -> `<answer>N</answer>`. TRL samples at a low
temperature, so the trained tokens are drawn."""

import importlib.resources
import json

import pytest

pytest.importorskip("trl")

import importlib.util  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from packaging.version import Version  # noqa: E402

# TRL parses tool calls with transformers' response templates (>= 5.13), or below that with its legacy schema, which
# needs jmespath (not installed with verl's transformers 5.10 in .venv-verl).
if Version(transformers.__version__) < Version("5.13") and importlib.util.find_spec("jmespath") is None:
    pytest.skip("TRL's tool parsing needs transformers >= 5.13 or jmespath", allow_module_level=True)

from rewardlab.integrations.trl import as_trl_environment, as_trl_reward_func  # noqa: E402


def template(name):
    return (importlib.resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text()


def build_tokenizer(corpus):
    """Qwen2's tokenizer class over a 600-entry byte-level BPE trained on `corpus`; `<|im_end|>` is EOS, the tool
    tags are added tokens that are not special (as in Qwen2.5's own tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    trained = json.loads(bpe.to_str())["model"]
    tok = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(m) for m in trained["merges"]], unk_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    tok.chat_template = template("qwen2_5")
    return tok


def sft(model, data, *, pad, margin, max_steps=300):
    """AdamW on the (ids, mask) sequences' mask-1 tokens until each target logit beats every other by `margin`."""
    width = max(len(ids) for ids, _ in data)
    x = torch.full((len(data), width), pad)
    att = torch.zeros_like(x)
    labels = torch.full_like(x, -100)
    for k, (ids, mask) in enumerate(data):
        x[k, :len(ids)], att[k, :len(ids)] = torch.tensor(ids), 1
        labels[k, :len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tgt = labels[:, 1:]
    for _ in range(max_steps):
        out = model(input_ids=x, attention_mask=att, labels=labels)
        logits = out.logits[:, :-1].detach()
        own = logits.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        other = logits.scatter(-1, tgt.clamp(min=0).unsqueeze(-1), float("-inf")).amax(-1)
        if bool(((own - other)[tgt != -100] > margin).all()):
            return
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    raise AssertionError(f"SFT did not fit in {max_steps} steps")


def test_grpo_trainer_calls_the_calculator_tool(tmp_path):
    from datasets import Dataset
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    cls = as_trl_environment("calculator", parser="hermes", size=4, test_size=2)
    probe = cls()
    try:
        row = cls.env.rows("train", 1)[0]
        expr = row["metadata"]["expression"].replace(" ", "")
        tok = build_tokenizer([template("qwen2_5"), row["prompt"], json.dumps(cls.env.tools), expr, row["answer"]])
        prompt = [{"role": "user", "content": row["prompt"]}]
        call = {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": expr}}}]}
        tool = {"role": "tool", "name": "calc", "content": row["answer"]}

        def render(messages):
            return tok.apply_chat_template(messages, tools=[probe.calc], add_generation_prompt=True, tokenize=False)

        def enc(text):
            return tok(text, add_special_tokens=False)["input_ids"]

        # The call as Qwen2.5's template writes an assistant tool call (what TRL's parser reads back).
        turn = tok.apply_chat_template(prompt + [call], tools=[probe.calc], tokenize=False)[len(render(prompt)):]
        assert "<tool_call>" in turn and turn.endswith("<|im_end|>\n")
        first = enc(render(prompt)), enc(turn.removesuffix("\n"))
        second = enc(render(prompt + [call, tool])), enc(f"<answer>{row['answer']}</answer>") + [tok.eos_token_id]
        data = [(p + c, [0] * len(p) + [1] * len(c)) for p, c in (first, second)]
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
        sft(model, data, pad=tok.pad_token_id, margin=3.0)

        args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none",
                          per_device_train_batch_size=2, num_generations=2, max_completion_length=48, max_steps=2,
                          logging_steps=1, save_strategy="no", learning_rate=1e-6, temperature=0.05,
                          disable_tqdm=True, dataloader_num_workers=0, bf16=False, seed=0)
        dataset = Dataset.from_list([{"prompt": prompt, "answer": row["answer"]}] * 2)
        trainer = GRPOTrainer(model=model, reward_funcs=as_trl_reward_func("exact_match"), args=args,
                              train_dataset=dataset, processing_class=tok, environment_factory=cls)
        trainer.train()

        logged = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
        assert len(logged) == 2
        assert all(h["tools/call_frequency"] == 1.0 and h["tools/failure_frequency"] == 0.0 for h in logged)
        # The calls ran in the rewardlab environment, with its checks: each instance TRL used recorded its call.
        calls = [c for env in trainer._environment_pool[None] for c in env.tool_calls]
        assert calls and all(c["name"] == "calc" and c["arguments"] == {"expression": expr} and c["status"] == "ok"
                             for c in calls)
    finally:
        cls.env.close()
