"""`rewardlab merge`: a LoRA checkpoint merged into its base, written as a full Hugging Face model directory."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from rewardlab.commands.common import note, open_run
from rewardlab.config import MergeConfig
from rewardlab.modeldir import check_model_dir
from rewardlab.policy.hf import torch_dtype
from rewardlab.policy.lora import base_chain, is_adapter_dir, load_merged
from rewardlab.runs import RunMode
from rewardlab.threads import apply_threads

#: The temp directory inside --out the merged model is written to before its files are moved into place.
STAGING = ".merging"


def run(cfg: MergeConfig, *, mode: RunMode = "new",
        show_progress: bool = True) -> dict[str, Any]:
    """Merge the LoRA checkpoint `cfg.model.path` into its base (`rewardlab.policy.lora.load_merged`: every adapter
    of its chain loaded with peft and merged, W + (alpha / r) B A, in `cfg.model.dtype`) and write the result to
    `cfg.out` as a Hugging Face model directory (config.json, model.safetensors, generation_config.json and the
    tokenizer), which transformers' `from_pretrained`, vLLM or `rewardlab evaluate --model` read without peft. The
    merged model computes the adapter model's log-probs to float rounding.

    `cfg.out` is opened with `RunDir.start` once the checkpoint has loaded (so bad input creates nothing): a
    directory that holds anything is refused unless "overwrite" (a previous merge or run there is replaced) or
    "resume" (the merge is done again, same settings). The model is written to `cfg.out`/.merging first and its
    files moved into place one by one, config.json last, then summary.json: a merge that stops half way leaves no
    config.json (nothing loads it as a model) and no summary.

    Returns:
        the summary: model (the adapter directory), chain (the adapter directories and the full base model it stands
        on, nearest first), out, dtype, parameters, files, wall_s.
    Raises:
        ValueError: one line naming model.path when it is not given, is not a LoRA adapter directory (a full model
            has nothing to merge), or its base or adapter does not load; `RunDirError` (a ValueError) for `cfg.out`
            (see above).
        OSError: writing failed.
    """
    apply_threads(cfg.threads)
    path = cfg.model.path
    if path is None:
        raise ValueError("model.path: give the LoRA checkpoint to merge (--model DIR)")
    if not is_adapter_dir(path):
        check_model_dir(path, "model.path", adapters=True)  # does not exist / not a model directory
        raise ValueError(f"model.path: {path} is a full model directory, not a LoRA adapter (no adapter_config.json):"
                         " nothing to merge")
    t0 = time.perf_counter()
    chain = base_chain(path)
    model, tokenizer = load_merged(path, dtype=torch_dtype(cfg.model.dtype), device=cfg.model.device)
    with open_run(cfg, mode=mode) as run:
        out = run.path
        staging = out / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        try:
            model.save_pretrained(str(staging))
            tokenizer.save_pretrained(str(staging))
            files = sorted((f for f in staging.iterdir() if f.is_file()), key=lambda f: (f.name == "config.json",
                                                                                        f.name))
            for f in files:  # config.json last: until it is in place the directory is not a model
                os.replace(f, out / f.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        summary = {"stage": "merge", "model": str(path), "chain": [str(p) for p in chain], "out": str(out),
                   "dtype": cfg.model.dtype, "parameters": sum(p.numel() for p in model.parameters()),
                   "files": [f.name for f in files], "wall_s": time.perf_counter() - t0}
        run.write_summary(summary)
    if show_progress:
        note(f"merged {path} into its base {chain[-1]}: {out}")
    return summary
