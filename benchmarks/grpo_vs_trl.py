"""rewardlab's GRPO trainer vs TRL's `GRPOTrainer`, side by side in one run, on the same tiny SFT'd checkpoint.

    python benchmarks/grpo_vs_trl.py          # (with the project's virtualenv's python; offline, ~5 min on 2 cores)

It benchmarks the rewardlab of this checkout (src/ next to benchmarks/) unless PYTHONPATH is set, and sets
HF_HUB_OFFLINE / HF_DATASETS_OFFLINE itself: nothing is downloaded.

What it does (defaults in brackets; all are flags, see --help):

1. A starting checkpoint: rewardlab SFT of the embedded tiny Llama on reasoning-gym chain_sum with the quickstart's
   task and SFT settings [650 steps x 64 rows, lr 3e-3], written to OUT/sft (reused when it is already there), or
   the checkpoint given with --sft-checkpoint.
2. Training runs, alternated: rewardlab, TRL, rewardlab, TRL, ... [--repeats 2 pairs]. Each run is a child process
   (a fresh interpreter, so imports, allocator state and peak memory are its own) that trains from the same
   checkpoint for the same wall-clock budget [--budget-s 45 s, counted from the start of the first step], stopping
   after the first step that ends past it, then saves its weights. With --steps N both instead run exactly N steps.
3. Held-out accuracy of every final checkpoint (and of the SFT start) with rewardlab's evaluator for both: greedy
   decoding, exact match by the task's verifier, on the task's test split [500 questions].
4. A table and OUT/results.json: steps/s of each (over the whole budget, and over the first S steps, S = the fewest
   steps any run did, so both are timed on the same number of steps), their ratio, the process CPU time per step
   (less sensitive than wall time to other load on a shared machine), peak RSS of each child (the high-water mark
   from os.wait4, plus the growth over the RSS after imports), and held-out accuracy at equal wall time.

The comparison, setting by setting (rewardlab | TRL `GRPOConfig`; where TRL's default differs and the comparison
forces a value, the line says why; benchmarks/README_grpo_vs_trl.md has the same list and the measured figures):

- model: the SFT checkpoint in float32 | the same directory via AutoModelForCausalLM in float32, `bf16=False`
  (TRL's default turns on bf16 autocast, which rewardlab does not use).
- task rows: the quickstart chain_sum train split | the same rows as a `datasets.Dataset` (`prompt`, `row_id`).
- batch: 16 prompts x 8 = 128 completions, one optimizer step | `per_device_train_batch_size=128` (TRL counts
  completions), `num_generations=8`, `gradient_accumulation_steps=1`; `steps_per_generation` then defaults to 1,
  so each optimizer step generates its own 16 x 8 completions.
- epochs per batch: `rl.epochs=1`, one minibatch | `num_iterations=1` (default); with one generation per optimizer
  step TRL skips the old-log-prob forward, and rewardlab records behaviour log-probs while sampling: neither runs
  an extra forward.
- max new tokens 8 | `max_completion_length=8`.
- sampling: temperature --temperature, top_p 1, no top-k | `temperature`, `top_p=1.0`, `top_k=0` (defaults except
  the temperature), `use_vllm=False` (transformers `generate`).
- advantages: `grpo`, (R - mean_g) / (std_g + 1e-6) | `scale_rewards="group"` (default), (R - mean_g) / (std_g + 1e-4).
- loss: `ppo_clip` with eps 0.2, `token-mean` | `loss_type="dapo"` (default: token sum over the batch's token count,
  i.e. token-mean), `epsilon=0.2` (default).
- KL: beta 0, no reference model | `beta=0.0` (default).
- optimizer: AdamW, lr --lr, betas (0.9, 0.999), weight decay 0, grad-norm clip 1.0, constant lr | `learning_rate`,
  `lr_scheduler_type="constant"` (TRL's default linear decay needs a known number of steps; a wall budget has none),
  `warmup_steps=0`, `weight_decay=0.0`, `max_grad_norm=1.0` (defaults); TRL's default `adamw_torch_fused` is kept.
- reward: the task's verifier (`reasoning_gym`, 1.0 on an exact match) | the same rewardlab Reward object, called on
  TRL's completions with their task rows.
- activation checkpointing: none | `gradient_checkpointing=False` (TRL defaults to True: ~20% slower for memory
  that rewardlab does not save either).
- logging and saving: rewardlab always appends metrics.jsonl and samples.jsonl each step, with an fsync per append
  (~5 ms on this project's disk), so both sides' runs write to --scratch (a RAM disk by default), and no checkpoint
  is written before the end | `report_to="none"`, `logging_steps` beyond the run, `save_strategy="no"`,
  `disable_tqdm=True`, `log_completions=False` (default); the final weights are saved after the timed loop.
- threads and device: torch.set_num_threads(--threads) on the CPU, for both (`use_cpu=True`).
- seed: --seed + the repeat index, for both.

Both sides time the loop from the start of their first step: rewardlab's `time/elapsed_s` metric, TRL's
`on_step_begin` / `on_step_end` callbacks. Model loading, task loading and the final save are outside that window.

The two children (`child_rewardlab`, `child_trl`) and `run_child` also serve benchmarks/real_shape.py and
benchmarks/profile_grpo_step.py; the settings this benchmark leaves at the values above are optional keys of their
`cfg`: `micro_batch` (rollouts per forward/backward: rewardlab `rl.micro_batch_size` | TRL
`per_device_train_batch_size`, with `gradient_accumulation_steps` = the batch / micro_batch so that one generation
batch is one optimizer step; None: the whole batch), `bf16` (rewardlab `model.autocast=bfloat16` | TRL `bf16=True`,
accelerate's bf16 autocast over float32 weights), `gradient_checkpointing` (rewardlab `model.gradient_checkpointing` |
TRL `gradient_checkpointing`, both non-reentrant), `lora` ({r, alpha}: rewardlab `model.lora` | TRL
`peft_config=LoraConfig(r, lora_alpha, lora_dropout=0, target_modules="all-linear")`), `rewards` (a rewardlab
`rewards:` spec, built once by rewardlab and called by both; None: the task verifier) and `save_final` (False: no
final checkpoint on either side); rewardlab's child alone takes `device` and `dtype` (model.device, model.dtype:
benchmarks/gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ("rewardlab", "trl")
if "PYTHONPATH" not in os.environ:  # benchmark this checkout's rewardlab, not whichever one is installed
    os.environ["PYTHONPATH"] = str(ROOT / "src")
    sys.path.insert(1, str(ROOT / "src"))


# ---------------------------------------------------------------------------------------------------- helpers
def _offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _rss_mib() -> float | None:
    """Current resident set size (MiB) from /proc, None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _maxrss_mib(usage: resource.struct_rusage) -> float:
    """`ru_maxrss` of a getrusage/wait4 result in MiB (the kernel reports KiB on Linux, bytes on macOS)."""
    return usage.ru_maxrss * (1 if platform.system() == "Darwin" else 1024) / 2**20


def _peak_rss_so_far_mib() -> float:
    """This process's peak resident set size so far (MiB): the kernel's high-water mark, no polling."""
    return _maxrss_mib(resource.getrusage(resource.RUSAGE_SELF))


def _quickstart():
    from rewardlab.config import QuickstartConfig

    return QuickstartConfig()


def _load_rows_and_reward(rewards: Any = None):
    """The quickstart's task and a rewardlab Reward: `rewards` (a `rewards:` spec) or, when None, the task's
    verifier."""
    from rewardlab.rewards import build_reward
    from rewardlab.tasks import load as load_task

    q = _quickstart()
    task = load_task(q.task.spec, **q.task.options)
    return task, build_reward(rewards if rewards is not None else task.reward)


def _load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# ---------------------------------------------------------------------------------------------------- children
def child_rewardlab(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train with rewardlab's `train` for the budget (or the steps) in `cfg`; returns the timing record."""
    import rewardlab.rl.trainer as trainer_mod
    from rewardlab.config import ModelConfig, RLConfig, SamplingParams, TrainConfig
    from rewardlab.rl.trainer import train

    from rewardlab.runs import RunDir

    rss_start = _rss_mib()
    cpu_ends: list[float] = []
    step_peaks: list[float] = []
    log_metrics = RunDir.log_metrics

    def log_metrics_and_cpu_clock(self, step, metrics):  # called once per step, after the step's work
        cpu_ends.append(time.process_time())
        step_peaks.append(_peak_rss_so_far_mib())
        log_metrics(self, step, metrics)

    RunDir.log_metrics = log_metrics_and_cpu_clock
    if not cfg.get("save_final", True):  # train checkpoints its last step; a benchmark of steps does not need it
        trainer_mod.save_checkpoint = lambda state: None
    q = _quickstart()
    rl = RLConfig(
        steps=cfg["steps"] or 10**9, prompts_per_step=cfg["prompts"], group_size=cfg["group_size"], epochs=1,
        lr=cfg["lr"], sampling=SamplingParams(temperature=cfg["temperature"], max_new_tokens=cfg["max_new_tokens"]),
        beta=0.0,
        lr_schedule="constant", estimator="grpo", loss="ppo_clip", agg="token-mean",
        micro_batch_size=cfg.get("micro_batch"),
    )
    lora = cfg.get("lora")
    model = ModelConfig.model_validate({
        **q.model.model_dump(), "path": cfg["checkpoint"], "device": cfg.get("device", "cpu"),
        "dtype": cfg.get("dtype", "float32"), "autocast": "bfloat16" if cfg.get("bf16") else None,
        "gradient_checkpointing": cfg.get("gradient_checkpointing", False),
        "lora": {"r": lora["r"], "alpha": lora["alpha"]} if lora else None})
    # A run directory of its own: run_dir also holds this benchmark's files, and train refuses a directory that
    # holds anything but a run; each benchmark run replaces the previous one.
    out = Path(cfg["run_dir"]) / "rewardlab"
    train_cfg = TrainConfig(
        model=model, task=q.task, rl=rl, out=str(out), rewards=cfg.get("rewards"), seed=cfg["seed"],
        save_every=10**9, keep_checkpoints=1,
    )
    summary = train(train_cfg, mode="overwrite", show_progress=False,
                    time_budget_s=None if cfg["steps"] else cfg["budget_s"])
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {
        "final_checkpoint": summary["final_checkpoint"],
        "step_ends_s": [m["time/elapsed_s"] for m in metrics],
        "step_ends_cpu_s": cpu_ends,
        "train_reward_mean": [m["reward/mean"] for m in metrics],
        "gen_s_mean": statistics.mean(m["time/gen_s"] for m in metrics),
        "gen_tokens": [m["rollout/len_mean"] * m["rollout/generated"] for m in metrics],
        "step_peak_rss_mib": step_peaks,
        "rss_after_imports_mib": rss_start,
    }


def child_trl(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer for the budget (or the steps) in `cfg`; returns the timing record."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rewardlab.types import Rollout

    rss_start = _rss_mib()
    task, reward = _load_rows_and_reward(cfg.get("rewards"))
    rows = task.train
    batch_rewards: list[float] = []
    gen_tokens: list[int] = []

    def rewardlab_reward(prompts, completions, completion_ids, row_id, **_):
        """rewardlab's Reward (the task verifier unless cfg["rewards"]), on the same rows; called once per
        generation batch."""
        rollouts = [Rollout(prompt=p, prompt_ids=[], completion=c, completion_ids=list(ids), logprobs=[0.0] * len(ids),
                            row=rows[i]) for p, c, ids, i in zip(prompts, completions, completion_ids, row_id)]
        scores = [o.score for o in reward(rollouts)]
        batch_rewards.append(sum(scores) / len(scores))
        gen_tokens.append(sum(len(ids) for ids in completion_ids))
        return scores

    dataset = Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "row_id": list(range(len(rows)))})
    model = AutoModelForCausalLM.from_pretrained(cfg["checkpoint"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(cfg["checkpoint"])
    n_completions = cfg["prompts"] * cfg["group_size"]
    micro = cfg.get("micro_batch") or n_completions
    if n_completions % micro:
        raise ValueError(f"micro_batch {micro} does not divide the {n_completions} completions of a step")
    lora = cfg.get("lora")
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    args = GRPOConfig(
        output_dir=str(Path(cfg["run_dir"]) / "trainer"),
        # batch: one optimizer step = prompts x group_size completions, generated once (steps_per_generation defaults
        # to gradient_accumulation_steps, so generation_batch_size = micro x accumulation = the whole batch), used once
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=n_completions // micro,
        num_generations=cfg["group_size"],
        num_iterations=1,
        max_completion_length=cfg["max_new_tokens"],
        # sampling (TRL's defaults except the temperature, which both sides share)
        temperature=cfg["temperature"],
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        # objective: TRL's defaults, written out
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        # optimizer: same lr as rewardlab, constant; TRL's default fused AdamW, no weight decay, grad clip 1.0
        learning_rate=cfg["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=cfg["steps"] or 10**9,
        # like with like: float32 unless cfg["bf16"] (then accelerate's bf16 autocast, as rewardlab's model.autocast),
        # activation checkpointing only with cfg["gradient_checkpointing"] (non-reentrant, as rewardlab's), CPU
        bf16=bool(cfg.get("bf16")),
        gradient_checkpointing=bool(cfg.get("gradient_checkpointing")),
        gradient_checkpointing_kwargs={"use_reentrant": False},
        use_cpu=True,
        # no logging/saving overhead inside the timed loop
        report_to="none",
        logging_steps=10**9,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=cfg["seed"],
    )
    step_begins: list[float] = []
    step_ends: list[float] = []
    cpu_ends: list[float] = []
    step_peaks: list[float] = []
    budget = None if cfg["steps"] else cfg["budget_s"]

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            step_begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            cpu_ends.append(time.process_time())
            step_peaks.append(_peak_rss_so_far_mib())
            if budget is not None and step_ends[-1] - step_begins[0] >= budget:
                control.should_training_stop = True

    trainer = GRPOTrainer(model=model, reward_funcs=rewardlab_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()], peft_config=peft_config)
    trainer.train()
    final = None
    if cfg.get("save_final", True):
        final = Path(cfg["run_dir"]) / "final"
        trainer.model.save_pretrained(final)
        tokenizer.save_pretrained(final)
    return {
        "final_checkpoint": str(final) if final else None,
        "step_ends_s": [t - step_begins[0] for t in step_ends],
        "step_ends_cpu_s": cpu_ends,
        "train_reward_mean": batch_rewards,
        "gen_tokens": gen_tokens,
        "step_peak_rss_mib": step_peaks,
        "rss_after_imports_mib": rss_start,
    }


def run_child(role: str, cfg: dict[str, Any], script: str = __file__) -> dict[str, Any]:
    """Run `script --child ROLE CONFIG RESULT` (one training) in a fresh interpreter with cfg["threads"] OpenMP/MKL
    threads; returns the record it wrote plus `peak_rss_mib`, the child's peak RSS (MiB) from os.wait4 (the whole
    process: imports, model loading, every step, any final save), and `process_s` (its wall clock, seconds).

    Raises:
        RuntimeError: the child exited non-zero (the message ends with its log's tail).
    """
    Path(cfg["run_dir"]).mkdir(parents=True, exist_ok=True)
    cfg_path = Path(cfg["run_dir"]) / "bench_config.json"
    out_path = Path(cfg["run_dir"]) / "bench_result.json"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads"]), MKL_NUM_THREADS=str(cfg["threads"]))
    log = (Path(cfg["run_dir"]) / "child.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, script, "--child", role, str(cfg_path), str(out_path)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    if proc.returncode != 0:
        tail = (Path(cfg["run_dir"]) / "child.log").read_text()[-3000:]
        raise RuntimeError(f"{role} run failed (exit {proc.returncode}); log tail:\n{tail}")
    rec = json.loads(out_path.read_text())
    rec["peak_rss_mib"] = _maxrss_mib(usage)
    rec["process_s"] = time.perf_counter() - t0
    return rec


def child_main(role: str, cfg_path: str, out_path: str) -> None:
    _offline_env()
    cfg = json.loads(Path(cfg_path).read_text())
    _set_threads(cfg["threads"])
    rec = (child_rewardlab if role == "rewardlab" else child_trl)(cfg)
    rec["load_avg_end"] = _load_avg()
    Path(out_path).write_text(json.dumps(rec))


# ---------------------------------------------------------------------------------------------------- parent
def make_sft(out: Path, steps: int, seed: int) -> str:
    """The quickstart's SFT (task, batch, lr) for `steps` steps, cached under `out`."""
    from rewardlab.config import SFTConfig
    from rewardlab.commands.sft import run as run_sft

    q = _quickstart()
    final = out / "checkpoints" / f"step-{steps}"
    if (final / "model.safetensors").is_file():
        print(f"reusing SFT checkpoint {final}")
        return str(final)
    shutil.rmtree(out, ignore_errors=True)
    sft = q.sft.model_copy(update={"steps": steps})
    summary = run_sft(SFTConfig(model=q.model, task=q.task, sft=sft, out=str(out), seed=seed), show_progress=False)
    print(f"SFT: {steps} steps in {summary['wall_s']:.1f} s, final loss {summary['final_loss']:.3f}")
    return summary["final_checkpoint"]


def held_out_accuracy(checkpoint: str, limit: int | None) -> float:
    """Greedy exact-match accuracy on the test split with rewardlab's evaluator (one sample for pass@1)."""
    from rewardlab.evaluation.policy import EvalSettings, evaluate_policy
    from rewardlab.policy import SamplingSettings
    from rewardlab.policy import load_policy
    from rewardlab.rewards import build_reward
    from rewardlab.tasks import load as load_task

    q = _quickstart()
    task = load_task(q.task.spec, **q.task.options)
    rows = task.test[:limit]
    policy = load_policy(checkpoint)
    res = evaluate_policy(policy, rows, build_reward(task.reward), SamplingSettings(max_new_tokens=8),
                          settings=EvalSettings(n=1, ks=(1,)))
    return res["accuracy"]


def steps_per_s(ends: list[float], k: int) -> float:
    """Steps per second over the first `k` steps (time from the first step's start to the k-th step's end)."""
    return k / ends[k - 1]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    common = min(len(r["step_ends_s"]) for r in records)
    out: dict[str, Any] = {"common_steps": common}
    for name in TRAINERS:
        rs = [r for r in records if r["trainer"] == name]
        full = [len(r["step_ends_s"]) / r["step_ends_s"][-1] for r in rs]
        same = [steps_per_s(r["step_ends_s"], common) for r in rs]
        cpu = [1000 * (r["step_ends_cpu_s"][-1] - r["step_ends_cpu_s"][0]) / (len(r["step_ends_cpu_s"]) - 1)
               for r in rs if len(r["step_ends_cpu_s"]) > 1]
        out[name] = {
            "cpu_ms_per_step": statistics.median(cpu) if cpu else float("nan"),
            "steps_per_s": statistics.median(full),
            "steps_per_s_first_common_steps": statistics.median(same),
            "steps": [len(r["step_ends_s"]) for r in rs],
            "loop_s": [r["step_ends_s"][-1] for r in rs],
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
            "rss_growth_mib": max(r["peak_rss_mib"] - (r["rss_after_imports_mib"] or 0) for r in rs),
            "held_out_accuracy": statistics.mean(r["held_out_accuracy"] for r in rs),
            "held_out_accuracy_runs": [r["held_out_accuracy"] for r in rs],
        }
    out["ratio_steps_per_s"] = out["rewardlab"]["steps_per_s"] / out["trl"]["steps_per_s"]
    out["ratio_first_common_steps"] = (out["rewardlab"]["steps_per_s_first_common_steps"]
                                       / out["trl"]["steps_per_s_first_common_steps"])
    out["ratio_cpu_time_per_step"] = out["trl"]["cpu_ms_per_step"] / out["rewardlab"]["cpu_ms_per_step"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_grpo_vs_trl", help="output directory [%(default)s]")
    ap.add_argument("--sft-checkpoint", default=None, help="start from this HF checkpoint instead of running SFT")
    ap.add_argument("--sft-steps", type=int, default=650, help="SFT steps when making the checkpoint [%(default)s]")
    ap.add_argument("--budget-s", type=float, default=45.0, help="wall-clock seconds of training per run [%(default)s]")
    ap.add_argument("--steps", type=int, default=None, help="run exactly this many steps instead of a time budget")
    ap.add_argument("--repeats", type=int, default=2, help="(rewardlab, TRL) pairs, alternated [%(default)s]")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for both, and for evaluation [%(default)s]")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate for both [%(default)s]")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature for both [%(default)s]")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step [%(default)s]")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt [%(default)s]")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="completion token limit [%(default)s]")
    ap.add_argument("--scratch", default="/dev/shm" if Path("/dev/shm").is_dir() else "none",
                    help="where the training runs write (logs, final weights); a RAM disk keeps disk syncs out of the "
                         "timed loop for both; 'none': under --out [%(default)s]")
    ap.add_argument("--eval-limit", type=int, default=None, help="evaluate only the first N test questions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", nargs=3, metavar=("ROLE", "CONFIG", "RESULT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child_main(*a.child)
        return {}

    _offline_env()
    _set_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    import torch
    import transformers
    import trl

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "trl": trl.__version__, "cpus": os.cpu_count(), "threads": a.threads}
    print(f"environment: {env}; load average at start: {_load_avg()}")
    checkpoint = a.sft_checkpoint or make_sft(out / "sft", a.sft_steps, a.seed)
    sft_acc = held_out_accuracy(checkpoint, a.eval_limit)
    print(f"start checkpoint {checkpoint}: held-out greedy accuracy {sft_acc:.1%}")

    scratch = out if a.scratch == "none" else Path(tempfile.mkdtemp(prefix="grpo_vs_trl-", dir=a.scratch))
    records = []
    try:
        for rep in range(a.repeats):
            for name in TRAINERS:
                cfg = {"checkpoint": checkpoint, "run_dir": str(scratch / f"{name}-{rep}"), "steps": a.steps,
                       "budget_s": a.budget_s, "threads": a.threads, "lr": a.lr, "temperature": a.temperature,
                       "prompts": a.prompts, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens,
                       "seed": a.seed + rep}
                shutil.rmtree(cfg["run_dir"], ignore_errors=True)
                load_before = _load_avg()
                rec = run_child(name, cfg)
                rec.update(trainer=name, repeat=rep, load_avg_start=load_before)
                rec["held_out_accuracy"] = held_out_accuracy(rec["final_checkpoint"], a.eval_limit)
                ends, rewards = rec["step_ends_s"], rec["train_reward_mean"]
                k = max(1, min(20, len(rewards) // 2))
                print(f"{name:9s} run {rep}: {len(ends)} steps in {ends[-1]:.1f} s = {len(ends) / ends[-1]:.2f} "
                      f"steps/s, peak RSS {rec['peak_rss_mib']:.0f} MiB, train reward (first/last {k} steps) "
                      f"{sum(rewards[:k]) / k:.2f}/{sum(rewards[-k:]) / k:.2f}, held-out accuracy "
                      f"{rec['held_out_accuracy']:.1%} (load avg {load_before} -> {rec['load_avg_end']})")
                records.append(rec)
    finally:
        if scratch != out:
            shutil.rmtree(scratch, ignore_errors=True)

    summary = summarize(records)
    r, t = summary["rewardlab"], summary["trl"]
    lines = [
        "",
        f"| | rewardlab | TRL GRPOTrainer |",
        f"|---|---|---|",
        f"| steps/s over the {f'{a.steps} steps' if a.steps else f'{a.budget_s:.0f} s budget'} (median of {a.repeats}) "
        f"| {r['steps_per_s']:.3f} | {t['steps_per_s']:.3f} |",
        f"| steps/s over the first {summary['common_steps']} steps | {r['steps_per_s_first_common_steps']:.3f} "
        f"| {t['steps_per_s_first_common_steps']:.3f} |",
        f"| steps done | {r['steps']} | {t['steps']} |",
        f"| process CPU time per step, ms (steps 2..end, all threads) | {r['cpu_ms_per_step']:.0f} "
        f"| {t['cpu_ms_per_step']:.0f} |",
        f"| peak RSS, MiB (growth over post-import RSS) | {r['peak_rss_mib']:.0f} ({r['rss_growth_mib']:.0f}) "
        f"| {t['peak_rss_mib']:.0f} ({t['rss_growth_mib']:.0f}) |",
        f"| held-out greedy accuracy {'after the same steps' if a.steps else 'at equal wall time'} "
        f"(SFT start: {sft_acc:.1%}) | {r['held_out_accuracy']:.1%} "
        f"{[f'{x:.1%}' for x in r['held_out_accuracy_runs']]} | {t['held_out_accuracy']:.1%} "
        f"{[f'{x:.1%}' for x in t['held_out_accuracy_runs']]} |",
        "",
        f"rewardlab / TRL steps/s: {summary['ratio_steps_per_s']:.2f}x over the {'run' if a.steps else 'budget'}, "
        f"{summary['ratio_first_common_steps']:.2f}x over the first {summary['common_steps']} steps; "
        f"TRL / rewardlab CPU time per step: {summary['ratio_cpu_time_per_step']:.2f}x",
        f"load average at end: {_load_avg()}; total {time.perf_counter() - t_start:.0f} s",
    ]
    print("\n".join(lines))
    result = {"args": vars(a), "environment": env, "sft_checkpoint": checkpoint, "sft_accuracy": sft_acc,
              "summary": summary, "runs": records}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"results: {out / 'results.json'}")
    return result


if __name__ == "__main__":
    main()
