"""rewardlab vs TRL's `GRPOTrainer` on real model shapes: peak memory and seconds per step, side by side.

    python benchmarks/real_shape.py --smoke            # each kind of arm once, tiny (small body, a few tokens)
    python benchmarks/real_shape.py                    # the settings below (long: split it with --only)
    python benchmarks/real_shape.py --only 'small-*'   # fnmatch patterns over the setting names; --list shows them
    python benchmarks/real_shape.py --only '0.5b-*' --libraries trl

(with the project's virtualenv's python; offline: the models are built here with random weights, nothing is
downloaded). It benchmarks the rewardlab of this checkout (src/ next to benchmarks/) unless PYTHONPATH is set.

Models (`rewardlab.policy.shapes`, built once into --models and reused): `qwen2-small`, Qwen2.5's 151,936-token
vocabulary on a body of width 256 and 2 layers (41.5M parameters, 38.9M of them the tied embedding), and
`qwen2.5-0.5b`, Qwen2.5-0.5B's architecture (494M parameters); random weights, float32, a byte-level tokenizer of
exactly 151,936 tokens. Random weights rarely sample EOS (1 token in 151,936), so completions run to the token
limit; the table reports the measured mean completion length.

Settings (`--list`; NAME: model, prompts x G rollouts x new tokens, micro-batch, precision, options):

- small-L{32,128,512}-mb8 / -whole: qwen2-small, 8 x 8 = 64 rollouts x L tokens, micro-batches of 8 / the whole
  batch in one forward and backward. The issue's budget: rewardlab completes L = 512 within 12 GB.
- small-L128-mb8-bf16: as small-L128-mb8 under bf16 autocast (against float32: speed and memory).
- 0.5b-L128-mb8: qwen2.5-0.5b, 2 x 8 = 16 rollouts x 128 tokens, micro-batches of 8, full fine-tuning, float32;
  -lora: LoRA r 16, alpha 32 on every linear layer; -bf16: bf16 autocast; -gc: gradient checkpointing. Budget:
  20 GB.

Each setting runs rewardlab, then TRL (--repeats pairs, alternated), each run a child process (a fresh interpreter:
imports, allocator state and peak memory are its own) that trains the same model directory for the setting's steps
[small body 3, 0.5B 2; --steps] and writes no checkpoint. Per run: peak RSS, the child's high-water mark from
os.wait4 (kernel accounting of the whole child: imports, model load, every step; the per-step high-water marks,
getrusage(RUSAGE_SELF) at each step's end, are in the JSON), the first step's seconds (it includes one-time work:
allocator growth, lazy initialization) apart from the steady state (median seconds of steps 2..n), generated tokens
per steady-state second, the mean completion length, and where the time goes: every run goes through
benchmarks/profile_grpo_step.py's child, whose timers (one perf_counter pair per timed call) split each step into
generation, reward, log-prob forward, backward, optimizer, logging and other (mean ms of steps 2..n; with --repeats,
the last repeat's). Records are appended to --results (JSON lines); the runs are printed as a markdown table, then
each setting's phases side by side.

The same settings on both sides (the children are benchmarks/grpo_vs_trl.py's; its docstring maps every setting):

- model: the same directory, float32 weights | `AutoModelForCausalLM.from_pretrained(dtype=float32)`.
- prompts: the quickstart's chain_sum train rows (raw text, e.g. `4-1+7=`, no chat template) | the same rows as the
  dataset's `prompt` column.
- reward: `parity` below, through rewardlab's reward layer on both sides (built once by rewardlab, called inside
  TRL's reward function).
- batch: prompts x G rollouts, one optimizer step per batch | `num_generations=G`; `per_device_train_batch_size` =
  the micro-batch and `gradient_accumulation_steps` = rollouts / micro-batch, so that `steps_per_generation`
  (default: gradient_accumulation_steps) makes `generation_batch_size` the whole batch: one generation, one optimizer
  step. Whole batch: `per_device_train_batch_size` = rollouts, accumulation 1.
- sampling: temperature 1.0, top_p 1, no top-k, max_new_tokens L | `temperature=1.0, top_p=1.0, top_k=0`,
  `max_completion_length=L`, transformers `generate` (no vLLM).
- objective: `grpo` advantages, `ppo_clip` (eps 0.2), `token-mean`, one epoch, beta 0 | `scale_rewards="group"`,
  `epsilon=0.2`, `loss_type="dapo"` (TRL 1.16's default: the token sum over the generation batch's token count, the
  same token mean), `num_iterations=1`, `beta=0.0`.
- optimizer: AdamW, lr --lr [1e-6], constant, grad clip 1.0, no weight decay | the same (`adamw_torch_fused`).
- precision: float32 | `bf16=False`; -bf16: `model.autocast=bfloat16` | `bf16=True` (accelerate's CPU bf16
  autocast); the weights, gradients and AdamW state stay float32 on both.
- gradient checkpointing: off | `gradient_checkpointing=False` (TRL's default is on); -gc: on, non-reentrant, both.
- LoRA: -lora: `model.lora={r: 16, alpha: 32}` (dropout 0, all linear layers) | `peft_config=LoraConfig(r=16,
  lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")`.
- threads: torch.set_num_threads(--threads) [2] and OMP/MKL_NUM_THREADS in every child, CPU only.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl as bench  # noqa: E402
import profile_grpo_step as prof  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The LoRA settings of the -lora arms (rewardlab model.lora; TRL LoraConfig r / lora_alpha).
LORA = {"r": 16, "alpha": 32}
#: The reward both sides train on: `parity` below, imported by rewardlab's reward layer from this file.
REWARDS = [f"{Path(__file__).resolve()}:parity"]


def parity(completion: str) -> float:
    """1.0 when the completion's UTF-8 bytes sum to an odd number, else 0.0.

    As cheap as a reward gets, and on a random model's completions about half of each group scores 1, so the
    advantages are non-zero and every step really changes the weights on both sides.
    """
    return float(sum(completion.encode("utf-8")) % 2)


@dataclass(frozen=True)
class Setting:
    """One benchmark setting, run by both libraries.

    Attributes:
        name: e.g. "small-L512-mb8".
        shape: a `rewardlab.policy.shapes.SHAPES` name.
        prompts, group_size: prompts per step and rollouts per prompt (G).
        max_new_tokens: the completion token limit L.
        micro_batch: rollouts per forward/backward pass; None: the whole batch.
        bf16: bf16 autocast over float32 weights.
        gradient_checkpointing: recompute activations in the backward pass.
        lora: train LoRA adapters (`LORA`) instead of every weight.
        steps: optimizer steps per run.
        budget_gb: the issue's peak-memory budget for this setting (GB, 10^9 bytes), or None.
    """

    name: str
    shape: str
    prompts: int
    max_new_tokens: int
    group_size: int = 8
    micro_batch: int | None = 8
    bf16: bool = False
    gradient_checkpointing: bool = False
    lora: bool = False
    steps: int = 3
    budget_gb: float | None = None

    def smoke(self) -> Setting:
        """The same arm, tiny: the small body, 2 prompts x 4 rollouts, L / 16 tokens, micro-batches of 4, 2 steps."""
        return dataclasses.replace(self, shape="qwen2-small", prompts=2, group_size=4,
                                   max_new_tokens=max(2, self.max_new_tokens // 16),
                                   micro_batch=4 if self.micro_batch else None, steps=2, budget_gb=None)

    @property
    def rollouts(self) -> int:
        return self.prompts * self.group_size

    @property
    def precision(self) -> str:
        return "bf16 autocast" if self.bf16 else "float32"


def _settings() -> list[Setting]:
    out = []
    for length in (32, 128, 512):
        budget = 12.0 if length == 512 else None
        out.append(Setting(f"small-L{length}-mb8", "qwen2-small", 8, length, budget_gb=budget))
        out.append(Setting(f"small-L{length}-whole", "qwen2-small", 8, length, micro_batch=None, budget_gb=budget))
    out.append(Setting("small-L128-mb8-bf16", "qwen2-small", 8, 128, bf16=True))
    big = Setting("0.5b-L128-mb8", "qwen2.5-0.5b", 2, 128, steps=2, budget_gb=20.0)
    out += [big, dataclasses.replace(big, name="0.5b-L128-mb8-lora", lora=True),
            dataclasses.replace(big, name="0.5b-L128-mb8-bf16", bf16=True),
            dataclasses.replace(big, name="0.5b-L128-mb8-gc", gradient_checkpointing=True)]
    return out


SETTINGS: dict[str, Setting] = {s.name: s for s in _settings()}


# ---------------------------------------------------------------------------------------------------- models
def model_dir(root: Path, shape: str, seed: int) -> Path:
    """The directory of `shape` with weights from `seed` under `root`, built on first use (into a temporary
    directory, then renamed, so an interrupted build is never reused)."""
    from rewardlab.policy.shapes import create_shape_model

    path = root / f"{shape}-seed{seed}"
    if (path / "config.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{shape}-", dir=root))
    t0 = time.perf_counter()
    create_shape_model(tmp, shape, seed=seed)
    tmp.rename(path)
    print(f"built {shape} (seed {seed}) in {path} in {time.perf_counter() - t0:.0f} s")
    return path


# ---------------------------------------------------------------------------------------------------- runs
def child_cfg(s: Setting, model: Path, run_dir: Path, a: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The config of one child run of setting `s` (the keys of benchmarks/grpo_vs_trl.py's children)."""
    return {"checkpoint": str(model), "run_dir": str(run_dir), "steps": s.steps, "budget_s": None,
            "threads": a.threads, "lr": a.lr, "temperature": 1.0, "prompts": s.prompts, "group_size": s.group_size,
            "max_new_tokens": s.max_new_tokens, "seed": seed, "micro_batch": s.micro_batch, "bf16": s.bf16,
            "gradient_checkpointing": s.gradient_checkpointing, "lora": LORA if s.lora else None,
            "rewards": REWARDS, "save_final": False}


def timing(rec: dict[str, Any], rollouts: int) -> dict[str, float]:
    """First-step seconds, steady-state seconds per step (median of steps 2..n), generated tokens per steady
    second and mean completion length (tokens) of a child's record."""
    ends = rec["step_ends_s"]
    durations = [b - a for a, b in zip([0.0, *ends], ends)]
    steady = statistics.median(durations[1:]) if len(durations) > 1 else float("nan")
    tokens = rec["gen_tokens"]
    steady_tokens = statistics.mean(tokens[1:]) if len(tokens) > 1 else float("nan")
    return {"first_step_s": durations[0], "steady_s_per_step": steady, "tokens_per_s": steady_tokens / steady,
            "mean_completion_len": statistics.mean(tokens) / rollouts}


def run_arm(s: Setting, library: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One child run, through benchmarks/profile_grpo_step.py's child (the training child of grpo_vs_trl.py with
    phase timers around it: one perf_counter pair per timed call); `phases_ms` holds the mean ms per step of each
    phase over steps 2..n. A failed run (an exception, out of memory, LoRA not available) is recorded with its error
    (the last line of its log) instead of stopping the benchmark."""
    load_before = bench._load_avg()
    try:
        rec = bench.run_child(library, cfg, script=prof.__file__)
    except RuntimeError as e:  # "ROLE run failed (exit N); log tail: ..." (a negative N: killed by that signal)
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return {"error": f"{lines[0].split(';')[0]}: {lines[-1]}", "load_avg_start": load_before}
    out = {k: rec[k] for k in ("peak_rss_mib", "step_peak_rss_mib", "rss_after_imports_mib", "step_ends_s",
                               "step_ends_cpu_s", "gen_tokens", "train_reward_mean", "process_s", "load_avg_end")}
    out.update(timing(rec, s.rollouts), load_avg_start=load_before)
    out["phases_ms"] = prof.per_step_ms(rec["steps"], warmup=1) if len(rec["steps"]) > 1 else None
    return out


def row(s: Setting, library: str, r: dict[str, Any]) -> str:
    head = (f"| {s.name} | {s.shape} | {s.rollouts} x {s.max_new_tokens} | {s.micro_batch or 'whole'} "
            f"| {s.precision} | {library} |")
    if "error" in r:
        return head + f" failed: {r['error'][:120]} | | | | | |"
    budget = "" if s.budget_gb is None else (" (within)" if r["peak_rss_mib"] * 2**20 <= s.budget_gb * 1e9
                                             else " (over)")
    return head + (f" {r['peak_rss_mib']:,.0f}{budget} | {r['first_step_s']:.1f} | {r['steady_s_per_step']:.2f} "
                   f"| {r['tokens_per_s']:.0f} | {r['mean_completion_len']:.1f} | {len(r['step_ends_s'])} |")


TABLE_HEAD = ("| setting | model | rollouts x new tokens | micro-batch | precision | library | peak RSS MiB "
              "| first step s | steady s/step | tokens/s | mean completion tokens | steps |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|")


def environment(threads: int) -> dict[str, Any]:
    import peft
    import torch
    import transformers
    import trl

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "n/a") if Path("/proc/cpuinfo").is_file() else "n/a"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "peft": peft.__version__, "cpu": cpu, "cpus": os.cpu_count(), "memory_gib": round(mem, 1),
            "threads": threads}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", default=["*"], metavar="PATTERN",
                    help="settings to run: fnmatch patterns over their names [all]")
    ap.add_argument("--libraries", default="rewardlab,trl", help="comma-separated, run in this order [%(default)s]")
    ap.add_argument("--smoke", action="store_true", help="the first selected setting of each kind (micro-batch or "
                    "whole batch, bf16, gradient checkpointing, LoRA) made tiny (Setting.smoke); results under --out "
                    "instead of --results; no memory budgets")
    ap.add_argument("--steps", type=int, default=None, help="steps per run [each setting's own: small 3, 0.5B 2]")
    ap.add_argument("--repeats", type=int, default=1, help="(rewardlab, TRL) pairs per setting [%(default)s]")
    ap.add_argument("--threads", type=int, default=2, help="torch and OpenMP threads in every child [%(default)s]")
    ap.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate, both sides [%(default)s]")
    ap.add_argument("--seed", type=int, default=0, help="weights' seed; run seeds are seed + repeat [%(default)s]")
    ap.add_argument("--out", default="runs/real_shape", help="output directory (models, smoke results) [%(default)s]")
    ap.add_argument("--models", default=None, help="where the model directories are built and reused [OUT/models]")
    ap.add_argument("--results", default=None, help="JSON lines file the records are appended to "
                    "[benchmarks/results/real_shape.jsonl; --smoke: OUT/smoke.jsonl]")
    ap.add_argument("--scratch", default="/dev/shm" if Path("/dev/shm").is_dir() else "none",
                    help="where the runs write their logs (a RAM disk keeps disk syncs out of the timed loop); "
                         "'none': under --out [%(default)s]")
    ap.add_argument("--list", action="store_true", help="print the settings and exit")
    a = ap.parse_args(argv)
    chosen = [s for s in SETTINGS.values() if any(fnmatch.fnmatchcase(s.name, p) for p in a.only)]
    if a.smoke:  # one run of each kind of arm: lengths and bodies differ only in sizes, which smoke shrinks away
        kinds: dict[tuple, Setting] = {}
        for s in chosen:
            kinds.setdefault((s.micro_batch is None, s.bf16, s.gradient_checkpointing, s.lora), s.smoke())
        chosen = list(kinds.values())
    if a.steps is not None:
        chosen = [dataclasses.replace(s, steps=a.steps) for s in chosen]
    if a.list:
        for s in chosen:
            print(f"{s.name}: {s.shape}, {s.prompts} x {s.group_size} rollouts x {s.max_new_tokens} tokens, "
                  f"micro-batch {s.micro_batch or 'whole'}, {s.precision}, gradient checkpointing "
                  f"{'on' if s.gradient_checkpointing else 'off'}, {'LoRA' if s.lora else 'full'}, {s.steps} steps"
                  + (f", budget {s.budget_gb:g} GB" if s.budget_gb else ""))
        return []
    libraries = [x.strip() for x in a.libraries.split(",") if x.strip()]
    unknown = set(libraries) - set(bench.TRAINERS)
    if unknown or not chosen:
        ap.error(f"unknown libraries {sorted(unknown)}" if unknown else f"no setting matches {a.only}")
    bench._offline_env()
    out = Path(a.out)
    models_root = Path(a.models) if a.models else out / "models"
    results_path = Path(a.results) if a.results else (out / "smoke.jsonl" if a.smoke else
                                                       ROOT / "benchmarks" / "results" / "real_shape.jsonl")
    env = environment(a.threads)
    print(f"environment: {env}; load average {bench._load_avg()}")
    print("peak RSS: os.wait4 of each child process (imports, model load, every step; no checkpoint is written)")
    scratch_root = out if a.scratch == "none" else Path(a.scratch)
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="real_shape-", dir=scratch_root))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    records, lines = [], [TABLE_HEAD]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    try:
        for s in chosen:
            model = model_dir(models_root, s.shape, a.seed)
            for rep in range(a.repeats):
                for library in libraries:
                    run_dir = scratch / f"{s.name}-{library}-{rep}"
                    r = run_arm(s, library, child_cfg(s, model, run_dir, a, a.seed + rep))
                    shutil.rmtree(run_dir, ignore_errors=True)
                    rec = {"benchmark": "real_shape", "time": stamp, "smoke": a.smoke, "setting": s.name,
                           "library": library, "repeat": rep, **dataclasses.asdict(s), "rollouts": s.rollouts,
                           "model_dir": str(model), "environment": env, "lr": a.lr, **r}
                    records.append(rec)
                    with results_path.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
                    lines.append(row(s, library, r))
                    print(lines[-1], flush=True)
        print("\n" + "\n".join(lines))
        for s in chosen:
            phases = {r["library"]: r["phases_ms"] for r in records if r["setting"] == s.name and r.get("phases_ms")}
            if phases:
                print(f"\nphases of {s.name} (ms per step, mean of steps 2..{s.steps}; "
                      f"benchmarks/profile_grpo_step.py's timers):\n{prof.phase_table(phases)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"records appended to {results_path}; load average at end {bench._load_avg()}")
    return records


if __name__ == "__main__":
    main()
