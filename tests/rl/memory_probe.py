"""Run as a script by test_memory_bound.py, in a fresh process whose allocator returns freed blocks to the system
(MALLOC_MMAP_THRESHOLD_), so that the process's peak RSS follows the peak of live memory.

One RL update (`rl.update.update`: micro-batched log-probs, loss, backward, AdamW step) of N rollouts of a
Qwen2-style model with a 16,000-token vocabulary, for N and 2N at micro-batch M, then for N and 2N without
micro-batches; prints, as one JSON line, the process's peak RSS (MiB) during each update: the kernel's high-water
mark (VmHWM), reset before each update (/proc/self/clear_refs). The unsplit updates measure what N more rollouts'
activations take."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rewardlab.policy import Policy
from rewardlab.policy.batch import collate
from rewardlab.policy.tiny import build_tokenizer
from rewardlab.rl.specs import LossSpec
from rewardlab.rl.update import update

VOCAB, PROMPT, COMPLETION, GROUP = 16_000, 8, 48, 4


def credit(n: int) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(n)
    prompts = [torch.randint(0, VOCAB, (PROMPT,), generator=gen).tolist() for _ in range(n // GROUP)]
    packed = collate([p for p in prompts for _ in range(GROUP)],
                     [torch.randint(0, VOCAB, (COMPLETION,), generator=gen).tolist() for _ in range(n)], pad_id=0)
    m = packed.mask
    return SimpleNamespace(rows=list(range(n)), packed=packed, old_logprobs=-10.0 * m, loss_mask=m, episode=None,
                           advantages=torch.randn(m.shape, generator=gen) * m, group=torch.arange(n) // GROUP,
                           ref_logprobs=None, first_epoch={})


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS


def peak_mib() -> float:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


def main(n: int, micro: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=1024,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         tie_word_embeddings=True))
    policy = Policy(model, build_tokenizer())
    policy.model.train()
    rl = SimpleNamespace(epochs=1, minibatch_size=None, micro_batch_size=micro, loss="ppo_clip", agg="token-mean",
                         sampling=SimpleNamespace(temperature=1.0), entropy_coef=0.0, kl_in="loss", beta=0.0,
                         kl_estimator="k3", grad_clip=1.0, ref_refresh_every=None,
                         logging=SimpleNamespace(log_completions=True, log_tokens=8))
    state = SimpleNamespace(cfg=SimpleNamespace(rl=rl), policy=policy, critic=None, reference=None, step=1,
                            optimizer=torch.optim.AdamW(model.parameters(), lr=1e-6), loss_options={}, agg_options={},
                            scheduler=SimpleNamespace(step=lambda: None),
                            specs=SimpleNamespace(loss=LossSpec("ppo_clip", "token-mean", "k3", {}, {})))
    update(state, credit(micro), 1)  # AdamW's state and one micro-batch's peak exist from here on
    peaks = {}
    for label, size, batch in (("micro_n", micro, n), ("micro_2n", micro, 2 * n), ("whole_n", None, n),
                               ("whole_2n", None, 2 * n)):
        rl.micro_batch_size = size
        rollouts = credit(batch)
        reset_peak()
        update(state, rollouts, 1)
        peaks[label] = peak_mib()
    print(json.dumps(peaks))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
