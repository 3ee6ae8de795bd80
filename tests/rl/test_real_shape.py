"""A real-shape check: a Qwen2-style model with Qwen2.5's 151,936-token vocabulary and a small body (random weights, a
tokenizer made offline: `rewardlab.policy.shapes`) trains two GRPO steps with micro-batches, LoRA, gradient
checkpointing and a KL reference, through the CLI as a user runs it."""

import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_jsonl
from rewardlab.cli import main
from rewardlab.policy.shapes import QWEN_VOCAB_SIZE, create_shape_model

pytest.importorskip("peft")  # the `lora` extra (in `test`)

ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(3)]
DENSE = "def dense(completion):\n    return sum(ord(c) % 2 == 0 for c in completion) / max(1, len(completion))\n"


@pytest.mark.slow
def test_a_qwen_vocabulary_model_trains_with_micro_batches_lora_and_checkpointing(tmp_path):
    model = create_shape_model(tmp_path / "qwen2-small", "qwen2-small")
    assert json.loads((model / "config.json").read_text())["vocab_size"] == QWEN_VOCAB_SIZE == 151_936
    (tmp_path / "dense.py").write_text(DENSE)
    out = tmp_path / "run"
    code = main(["train", "--model", str(model), "--task", f"jsonl:{write_jsonl(tmp_path / 't.jsonl', ROWS)}",
                 "--out", str(out), "--no-progress", "task.options={test_size: 3}",
                 f"rewards=[{{name: '{tmp_path / 'dense.py'}:dense'}}]", "rl.steps=2", "rl.prompts_per_step=2",
                 "rl.group_size=4", "rl.sampling.max_new_tokens=6", "rl.micro_batch_size=2", "rl.beta=0.05",
                 "rl.lr=1e-2", "model.lora={r: 4, alpha: 8}", "model.gradient_checkpointing=true", "threads=1"])
    assert code == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(torch.isfinite(torch.tensor([m["policy/loss"], m["policy/kl"], m["policy/entropy"]])).all()
               for m in metrics)
    assert metrics[1]["policy/kl"] != 0.0  # the adapter moved away from the reference (the base, adapter disabled)
    checkpoint = out / "checkpoints" / "step-2"
    adapter = load_file(str(checkpoint / "adapter_model.safetensors"))
    assert adapter and any("lora_B" in k and bool(v.abs().sum() > 0) for k, v in adapter.items())  # B starts at 0
    assert not (checkpoint / "model.safetensors").exists()  # the adapter, not a second copy of 41M weights
    assert json.loads((checkpoint / "adapter_config.json").read_text())["base_model_name_or_path"] == str(model)
