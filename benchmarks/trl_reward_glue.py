"""The cost of rewardlab's TRL glue: a reward's share of TRL's GRPOTrainer step time, with the reward as a rewardlab
reward (`rewardlab.integrations.trl.as_trl_reward_funcs`) against the same reward written as a plain TRL function.

    python benchmarks/trl_reward_glue.py                       # defaults: 3 repeats x 2 arms x 4 steps
    python benchmarks/trl_reward_glue.py --repeats 1 --steps 1 --batch 4 --generations 2   # a smoke run

It benchmarks the rewardlab of this checkout (src/ next to benchmarks/) unless PYTHONPATH is set, and runs offline
(the tiny model is built in-process, saved as an HF checkpoint and loaded by TRL).

The reward: `verify_sum(completion, answer)`, math-verify's `parse` + `verify` of the completion against the row's
answer (1.0 / 0.0), in-process: the kind of verifier rewards are, with a per-completion cost of its own. The two arms:

- rewardlab: `@reward` turns `verify_sum` into a rewardlab reward, and `as_trl_reward_funcs` gives TRL the composed
  function (weight 1) and one component function (weight 0, logged only), as a user would write it;
- plain: one TRL reward function, `[verify_sum(c, a) for c, a in zip(completions, answer)]`.

A warm-up run of each arm comes first and is not counted (imports and first calls). Each repeat then builds a
fresh GRPOTrainer per arm from the same checkpoint and seed and trains `--steps` steps; the arms
alternate within each repeat, and which goes first alternates between repeats, so that a drift of the machine's
load falls on both. Three clocks, all wall time (time.perf_counter):

- step: each optimizer step, from TRL's `on_step_begin` to `on_step_end` callbacks;
- reward functions: each call TRL makes to a reward function, from entry to return (what TRL waits for);
- own: each call of `verify_sum` itself, in both arms.

glue = reward functions - own, per arm: what TRL waits for beyond the reward's own work (for the rewardlab arm:
the peer-keyword filter, building rewardlab rollouts from TRL's lists, the composition, and the component
functions reading the shared outputs). The figure to read is the rewardlab arm's glue / own (target: under 5%),
next to the plain arm's (a list comprehension's and the calls of `verify_sum`, near 0; the rewardlab arm pays it
too, so the difference of the two is what rewardlab adds over a plain function) and each arm's reward share of the
step. Totals are over
all steps of all repeats of an arm; per-repeat figures are printed too, so that the spread is visible. Results go to
stdout and, with --out, to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(HERE.parent / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

OWN = [0.0]  # seconds inside verify_sum, since the last reset


def verify_sum(completion: str, answer: str) -> float:
    """1.0 when math-verify finds the completion's answer equal to `answer`, else 0.0 (the timed reward)."""
    from math_verify import parse, verify

    start = time.perf_counter()
    try:
        gold, pred = parse(answer), parse(completion)
        return float(bool(gold) and bool(pred) and verify(gold, pred))
    finally:
        OWN[0] += time.perf_counter() - start


class Timed:
    """A TRL reward function that accumulates the wall time of its calls (keeps the wrapped function's name)."""

    def __init__(self, fn, clock: list[float]) -> None:
        self.fn, self.clock, self.__name__ = fn, clock, fn.__name__

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
        finally:
            self.clock[0] += time.perf_counter() - start


def plain_verify_sum(prompts, completions, completion_ids=None, answer=None, trainer_state=None, log_extra=None,
                     log_metric=None, environments=None):
    """The same reward as a plain TRL reward function."""
    return [verify_sum(c, a) for c, a in zip(completions, answer)]


def reward_funcs(arm: str, clock: list[float]):
    """(reward functions, weights) of an arm, each function timed into `clock`."""
    if arm == "plain":
        return [Timed(plain_verify_sum, clock)], [1.0]
    from rewardlab.integrations.trl import as_trl_reward_funcs
    from rewardlab.rewards import WeightedSum, reward

    fn = reward(name="verify_sum", register=False)(verify_sum)
    funcs, weights = as_trl_reward_funcs(WeightedSum([(fn(), 1.0)], labels=["verify_sum"]))
    return [Timed(f, clock) for f in funcs], weights


def run_arm(arm: str, model_path: str, dataset, args, out_dir: str, seed: int) -> dict[str, float]:
    """Train one arm for `args.steps` steps; returns its step, reward-function and own seconds (totals)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    steps: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            steps.append(time.perf_counter() - self.start)

    torch.manual_seed(seed)
    clock = [0.0]
    funcs, weights = reward_funcs(arm, clock)
    config = GRPOConfig(output_dir=out_dir, use_cpu=True, report_to="none", per_device_train_batch_size=args.batch,
                        num_generations=args.generations, max_completion_length=args.max_completion_length,
                        max_steps=args.steps, logging_steps=args.steps + 1, save_strategy="no",
                        reward_weights=weights, learning_rate=1e-4, disable_tqdm=True, dataloader_num_workers=0,
                        bf16=False, seed=seed)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), reward_funcs=funcs, args=config,
                          train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model_path),
                          callbacks=[StepClock()])
    OWN[0] = 0.0
    trainer.train()
    return {"step_s": sum(steps), "reward_funcs_s": clock[0], "own_s": OWN[0], "steps": len(steps)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="repeats of the pair of arms (default 3)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per arm and repeat (default 4)")
    p.add_argument("--batch", type=int, default=32, help="completions per step (default 32)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (default 8)")
    p.add_argument("--max-completion-length", type=int, default=16, help="tokens per completion (default 16)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    for key in ("repeats", "steps", "batch", "generations", "max_completion_length", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')}: must be >= 1, got {getattr(args, key)}")
    if args.batch % args.generations:
        p.error(f"--batch ({args.batch}) must be a multiple of --generations ({args.generations})")

    import random

    import torch
    from datasets import Dataset

    from rewardlab.policy.tiny import create_tiny

    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(256)]
    dataset = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])
    runs: dict[str, list[dict[str, float]]] = {"rewardlab": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(create_tiny(Path(tmp) / "tiny", seed=0))
        for arm in ("rewardlab", "plain"):  # warm-up, not counted: first imports and first calls
            run_arm(arm, model_path, dataset, args, str(Path(tmp) / f"{arm}-warmup"), seed=0)
        for r in range(args.repeats):
            order = ("rewardlab", "plain") if r % 2 == 0 else ("plain", "rewardlab")
            for arm in order:
                res = run_arm(arm, model_path, dataset, args, str(Path(tmp) / f"{arm}-{r}"), seed=r)
                runs[arm].append(res)
                glue = res["reward_funcs_s"] - res["own_s"]
                print(f"repeat {r} {arm:9s}: steps {res['steps']}, step {res['step_s']:.3f} s, reward functions "
                      f"{res['reward_funcs_s'] * 1e3:.2f} ms, own {res['own_s'] * 1e3:.2f} ms, glue "
                      f"{glue * 1e3:.2f} ms ({100 * glue / res['own_s'] if res['own_s'] else float('nan'):.1f}% "
                      "of own)", flush=True)
    summary = {}
    for arm, rs in runs.items():
        step, funcs, own = (sum(x[k] for x in rs) for k in ("step_s", "reward_funcs_s", "own_s"))
        summary[arm] = {"step_s": step, "reward_funcs_s": funcs, "own_s": own, "glue_s": funcs - own,
                        "glue_over_own": (funcs - own) / own if own else None,
                        "reward_share_of_step": funcs / step if step else None}
    print("\narm        reward share of step   glue / own (target < 5% for rewardlab)   per repeat (median)")
    for arm, s in summary.items():
        share = "n/a" if s["reward_share_of_step"] is None else f"{100 * s['reward_share_of_step']:.2f}%"
        ratio = "n/a" if s["glue_over_own"] is None else f"{100 * s['glue_over_own']:.2f}%"
        per = sorted((x["reward_funcs_s"] - x["own_s"]) / x["own_s"] for x in runs[arm] if x["own_s"])
        s["glue_over_own_per_repeat"] = per
        spread = (f"{100 * per[0]:.1f}-{100 * per[-1]:.1f}% ({100 * statistics.median(per):.1f}%)" if per else "n/a")
        print(f"{arm:9s}  {share:>20s}   {ratio:>8s}   {spread:>40s}")
    if summary["rewardlab"]["glue_over_own"] is not None and summary["plain"]["glue_over_own"] is not None:
        added = summary["rewardlab"]["glue_over_own"] - summary["plain"]["glue_over_own"]
        summary["added_over_plain"] = added
        print(f"rewardlab's glue beyond a plain function's: {100 * added:.2f}% of the verifier's own time")
    result = {"settings": vars(args) | {"out": str(args.out) if args.out else None}, "runs": runs,
              "summary": summary}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
