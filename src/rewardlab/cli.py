"""Command line: `rewardlab VERB [--config FILE] [--model PATH] [--task SPEC] [--out DIR] [key=value ...]`.

Verbs: quickstart, sft, train, evaluate, search. Overrides are dotted config keys (`rl.lr=1e-4`); `--model` and `--task`
are shortcuts for `model.path=` and `task.spec=`. Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

VERBS = {
    "quickstart": "tiny model from scratch -> SFT -> GRPO -> evaluate on reasoning-gym chain_sum (offline)",
    "sft": "supervised warm start on task rows (loss on answer tokens)",
    "train": "RL training (GRPO family) against the task's verifier or configured rewards",
    "evaluate": "greedy exact-match accuracy and pass@k on the held-out split",
    "search": "reward-guided search (best-of-N, majority votes, beam search, DVTS): accuracy against N",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardlab", description="Reward-guided policy optimization of LMs.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, help_text in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        p.add_argument("--config", help="YAML config file")
        p.add_argument("--out", help="run directory (config key: out)")
        p.add_argument("--seed", type=int, help="random seed (config key: seed)")
        if verb != "quickstart":
            p.add_argument("--model", help='"tiny" or an HF model directory / hub id (config key: model.path)')
            p.add_argument("--task", help='"reasoning_gym:NAME" or "jsonl:PATH" (config key: task.spec)')
        if verb == "train":
            p.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
        if verb == "search":
            p.add_argument("--scorer", help="reward that ranks candidates, e.g. arithmetic_steps (config key: scorer)")
            p.add_argument("--n", help="budgets N, comma-separated, e.g. 1,2,4,8 (config key: search.n)")
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. rl.lr=1e-4")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    from rewardlab.config import VERB_CONFIGS, load_config
    from rewardlab.rewards import RewardError

    overrides = list(args.overrides)
    for flag, key in (("model", "model.path"), ("task", "task.spec"), ("out", "out"), ("seed", "seed")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    if getattr(args, "scorer", None) is not None:
        overrides.append(f"scorer={args.scorer}")
    if getattr(args, "n", None) is not None:
        overrides.append(f"search.n=[{args.n}]")
    show = not args.no_progress
    try:
        cfg = load_config(VERB_CONFIGS[args.verb], args.config, overrides)
        if args.verb == "quickstart":
            from rewardlab.quickstart import run_quickstart

            run_quickstart(cfg, show_progress=show)
        elif args.verb == "sft":
            from rewardlab.sft import run_sft

            print(json.dumps(run_sft(cfg, show_progress=show), indent=2))
        elif args.verb == "train":
            from rewardlab.rl.trainer import train

            print(json.dumps(train(cfg, resume=args.resume, show_progress=show), indent=2))
        elif args.verb == "evaluate":
            from rewardlab.evaluation.policy import run_evaluate

            result = run_evaluate(cfg, show_progress=show)
            result.pop("examples", None)
            print(json.dumps(result, indent=2))
        elif args.verb == "search":
            from rewardlab.search.report import run_search

            run_search(cfg, show_progress=show)
    except (ValueError, OSError, RewardError) as exc:
        print(f"rewardlab {args.verb}: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
