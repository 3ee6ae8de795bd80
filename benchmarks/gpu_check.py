"""rewardlab's GRPO steps on the Qwen2.5-0.5B shape on a CUDA GPU in bf16: seconds per step, tokens/s, peak GPU memory.

    bash benchmarks/gpu_check.sh                      # = python benchmarks/gpu_check.py with the project's python
    python benchmarks/gpu_check.py --dtype bfloat16   # bf16 weights instead of bf16 autocast over float32 weights
    python benchmarks/gpu_check.py --device cpu --smoke   # the same path on the CPU, tiny (no GPU needed)

What it runs: benchmarks/real_shape.py's setting --setting [0.5b-L128-mb8-bf16: the qwen2.5-0.5b shape (random
weights, built offline into --models and reused), 2 prompts x 8 = 16 rollouts x 128 new tokens, micro-batches of
8, full fine-tuning], through the same rewardlab child as the CPU benchmark (`rl.trainer.train`, the `parity`
reward, AdamW lr 1e-6, temperature 1.0), with model.device = --device [cuda] for --steps [3] steps, in this process.

Precision: by default `model.autocast=bfloat16`, bf16 autocast over float32 weights (the weights, gradients and AdamW
state stay float32: what the CPU benchmark's -bf16 arms measure); `--dtype bfloat16` loads the weights in bfloat16
instead (model.dtype=bfloat16, no autocast: weights, gradients and AdamW state in bf16, about half the memory).

Prints each step's seconds and generated tokens, then the steady state (median of steps 2..n): seconds per step,
generated tokens per second of the whole step, and the peak GPU memory of the run, torch.cuda.max_memory_allocated
(tensors) and max_memory_reserved (the caching allocator's pool), MiB; on a CPU, the peak RSS instead.

Exits with status 2 and a one-line message, before building or loading any model, when torch is missing or
--device is CUDA and torch sees no CUDA device.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402
import real_shape  # noqa: E402


def no_cuda_message(device: str) -> str | None:
    """None when `device` is usable, else why not (one line): no torch, or a CUDA device torch does not see."""
    try:
        import torch
    except ImportError:
        return (f"gpu_check: {sys.executable} has no torch; run it with the project's virtualenv (make install; "
                "PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh)")
    if not device.startswith("cuda") or torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"gpu_check: no CUDA device: torch {torch.__version__} ({build}) sees no GPU. Run this on a machine with "
            "an NVIDIA GPU and a CUDA build of torch; --device cpu --smoke runs the same steps on the CPU")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="0.5b-L128-mb8-bf16", choices=sorted(real_shape.SETTINGS),
                    help="benchmarks/real_shape.py setting to run [%(default)s]")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="model.dtype; bfloat16: bf16 weights (and no autocast) [%(default)s, with the setting's "
                    "bf16 autocast]")
    ap.add_argument("--device", default="cuda", help="torch device [%(default)s]")
    ap.add_argument("--steps", type=int, default=3, help="GRPO steps [%(default)s]")
    ap.add_argument("--smoke", action="store_true", help="the setting's tiny version (benchmarks/real_shape.py "
                    "--smoke): to try the path without a GPU")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads [%(default)s]")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="runs/real_shape/models", help="model directories, built once [%(default)s]")
    a = ap.parse_args(argv)
    setting = real_shape.SETTINGS[a.setting]
    setting = dataclasses.replace(setting.smoke() if a.smoke else setting, steps=a.steps)
    if a.dtype == "bfloat16":  # autocast needs float32 weights: bf16 weights compute in bf16 without it
        setting = dataclasses.replace(setting, bf16=False)
    precision = "bf16 weights (model.dtype=bfloat16)" if a.dtype == "bfloat16" else setting.precision

    message = no_cuda_message(a.device)
    if message:
        print(message, file=sys.stderr)
        return 2
    bench._offline_env()
    bench._set_threads(a.threads)
    import torch

    gpu = a.device.startswith("cuda")
    where = torch.cuda.get_device_name(a.device) if gpu else "CPU"
    print(f"gpu_check: {where}, torch {torch.__version__}; {setting.shape}, {setting.rollouts} rollouts x "
          f"{setting.max_new_tokens} new tokens, micro-batch {setting.micro_batch or 'whole'}, {precision}, "
          f"{setting.steps} steps", flush=True)
    model = real_shape.model_dir(Path(a.models), setting.shape, a.seed)
    run_dir = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    try:
        cfg = real_shape.child_cfg(setting, model, run_dir, a, a.seed)
        cfg.update(device=a.device, dtype=a.dtype)
        if gpu:
            torch.cuda.reset_peak_memory_stats(a.device)
        rec = bench.child_rewardlab(cfg)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    ends = rec["step_ends_s"]
    print("| step | s | generated tokens | tokens/s |\n|---|---|---|---|")
    for i, (start, end, tokens) in enumerate(zip([0.0, *ends], ends, rec["gen_tokens"]), 1):
        print(f"| {i} | {end - start:.2f} | {tokens:.0f} | {tokens / (end - start):.0f} |")
    t = real_shape.timing(rec, setting.rollouts)
    print(f"steady state (median of steps 2..{len(ends)}): {t['steady_s_per_step']:.2f} s/step, "
          f"{t['tokens_per_s']:.0f} generated tokens/s, mean completion {t['mean_completion_len']:.1f} tokens; "
          f"sampling alone {statistics.mean(rec['gen_tokens']) / rec['gen_s_mean']:.0f} tokens/s")
    if gpu:
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated(a.device) / 2**20:,.0f} MiB allocated, "
              f"{torch.cuda.max_memory_reserved(a.device) / 2**20:,.0f} MiB reserved")
    else:
        print(f"peak RSS: {bench._peak_rss_so_far_mib():,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
