"""Command line: `rewardlab VERB [--config FILE] [--model PATH] [--task SPEC] [--out DIR] [key=value ...]`.

Verbs: quickstart, sft, train, evaluate, search, rm (train|eval|pairs), prm (label|train). Overrides are dotted
config keys (`rl.lr=1e-4`); `--model`, `--task` and `--data` are shortcuts for `model.path=`, `task.spec=` and
`data=`. Every verb writes a run directory (`--out`) and refuses one that already holds a run unless given
`--resume` (continue it) or `--overwrite` (delete it first). Errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

VERBS = {
    "quickstart": "tiny model from scratch -> SFT -> GRPO -> evaluate on reasoning-gym chain_sum (offline)",
    "sft": "supervised warm start on task rows (loss on answer tokens)",
    "train": "RL training (GRPO family) against the task's verifier or configured rewards",
    "evaluate": "greedy exact-match accuracy and pass@k: a jsonl file whole, a generated task's held-out split "
                "(split=all|train|test to choose)",
    "search": "reward-guided search (best-of-N, majority votes, beam search, DVTS): accuracy against N",
}


#: What `--resume` continues from, per verb (the help text).
RESUME_HELP = {
    "quickstart": "continue the run in --out: finished stages are reused, an unfinished one resumed",
    "sft": "continue from the run directory's last valid checkpoint",
    "train": "continue from the run directory's last valid checkpoint",
    "evaluate": "continue the run in --out after its last finished batch",
    "search": "continue the run in --out after its last finished unit (greedy, sample pool, method x N)",
    "rm train": "continue from the run directory's last valid checkpoint",
    "rm eval": "rerun the evaluation in --out whole (same settings, same report)",
    "rm pairs": "rerun the pair generation in --out whole (same settings, same pairs)",
    "prm label": "continue the run in --out after its last labelled item",
    "prm train": "continue from the run directory's last valid checkpoint",
}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but the epilog (the config keys, laid out by `rewardlab.config.help_text`) prints as is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        from rewardlab.config.reference import HELP_HEADING

        if text.startswith(HELP_HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _config_help(verb: str) -> dict:
    """The parser arguments that list `verb`'s config keys, defaults and descriptions under its --help."""
    from rewardlab.config import VERB_CONFIGS, help_text

    width = max(shutil.get_terminal_size().columns - 2, 40)  # argparse's own width for the rest of the help
    return {"epilog": help_text(VERB_CONFIGS[verb], width), "formatter_class": _HelpFormatter}


def _add_run_flags(p: argparse.ArgumentParser, resume_help: str) -> None:
    p.add_argument("--resume", action="store_true", help=resume_help + " (same settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the run already in --out and start afresh (without --resume or --overwrite, a "
                        "directory that holds a run is refused)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardlab", description="Reward-guided policy optimization of LMs.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb, help_text in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text, **_config_help(verb))
        p.add_argument("--config", help="YAML config file")
        p.add_argument("--out", help="run directory (config key: out)")
        p.add_argument("--seed", type=int, help="random seed (config key: seed)")
        if verb != "quickstart":
            p.add_argument("--model", help='"tiny" or a local HF model directory (config key: model.path)')
            p.add_argument("--task", help='"reasoning_gym:NAME" or "jsonl:PATH" (config key: task.spec)')
        if verb == "search":
            p.add_argument("--scorer", help="reward that ranks candidates, e.g. arithmetic_steps (config key: scorer)")
            p.add_argument("--n", help="budgets N, comma-separated, e.g. 1,2,4,8 (config key: search.n)")
        _add_run_flags(p, RESUME_HELP[verb])
        p.add_argument("--no-progress", action="store_true", help="no progress bars")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. rl.lr=1e-4")
    _add_reward_model_verbs(sub)
    return parser


# Reward models: `rm train|eval|pairs` and `prm label|train`, dispatched by `_run_reward_model_verb`.
GROUPED_VERBS = {
    "rm": {
        "train": "train a Bradley-Terry reward model on preference pairs (JSONL)",
        "eval": "evaluate any scorer: pairwise / best-of-k accuracy, first-error F1, length and master-key probes",
        "pairs": "preference pairs: a policy's correct vs incorrect completion of the same question, or (--source "
                 "mutants, no model) a canonical solution vs a sandbox-confirmed failing mutant of it",
    },
    "prm": {
        "label": "step labels for a policy's solutions: Monte Carlo (Math-Shepherd) or binary search (OmegaPRM)",
        "train": "train a process reward model on step-labelled rows (JSONL)",
    },
}


def _add_reward_model_verbs(sub) -> None:
    helps = {"rm": "reward models: train | eval | pairs", "prm": "process reward models: label | train"}
    for verb, actions in GROUPED_VERBS.items():
        group = sub.add_parser(verb, help=helps[verb], description=helps[verb])
        acts = group.add_subparsers(dest="action", required=True, metavar="ACTION")
        for action, help_text in actions.items():
            p = acts.add_parser(action, help=help_text, description=help_text, **_config_help(f"{verb} {action}"))
            p.add_argument("--config", help="YAML config file")
            p.add_argument("--out", help="run directory (config key: out)")
            p.add_argument("--seed", type=int, help="random seed (config key: seed)")
            if action in ("pairs", "label"):
                p.add_argument("--model", help='the policy: "tiny" or an HF model directory (config key: model.path)')
                humaneval = '"humaneval" (canonical solutions, for --source mutants), ' if action == "pairs" else ""
                p.add_argument("--task", help='"reasoning_gym:NAME", "worked:NAME" (reasoning_gym:NAME with template '
                               'compact, target steps; answer = the worked solution), ' + humaneval +
                               'or "jsonl:PATH" (config key: task.spec)')
            else:
                p.add_argument("--model", help='backbone or scorer: "minilm", "tiny" or a model directory '
                               "(config key: model.path)")
                p.add_argument("--data", help="JSONL data file (config key: data)")
            if action == "pairs":
                p.add_argument("--source", choices=("policy", "mutants"),
                               help="policy (default): sample --model, judge with the task's verifier; mutants: "
                               "canonical solution vs failing mutants, no model (config key: pairs.source)")
            _add_run_flags(p, RESUME_HELP[f"{verb} {action}"])
            p.add_argument("--no-progress", action="store_true", help="no progress bars")
            p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def _run_reward_model_verb(key: str, cfg, run_kw: dict) -> None:
    if key == "rm train":
        from rewardlab.rm.bradley_terry import run_rm_train

        print(json.dumps(run_rm_train(cfg, **run_kw), indent=2))
    elif key == "rm eval":
        from rewardlab.rm.evaluate import run_rm_eval

        run_rm_eval(cfg, **run_kw)
    elif key == "rm pairs":
        from rewardlab.rm.pairs import run_rm_pairs

        print(json.dumps(run_rm_pairs(cfg, **run_kw), indent=2))
    elif key == "prm label":
        from rewardlab.rm.labels import run_prm_label

        print(json.dumps(run_prm_label(cfg, **run_kw), indent=2))
    elif key == "prm train":
        from rewardlab.rm.prm import run_prm_train

        print(json.dumps(run_prm_train(cfg, **run_kw), indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    # Overrides may come before, between or after the flags: argparse leaves those after a flag unparsed.
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = list(getattr(args, "overrides", None) or []) + extra
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    from rewardlab.config import VERB_CONFIGS, load_config
    from rewardlab.interrupt import EXIT_INTERRUPTED, Interrupted, resume_command
    from rewardlab.rewards import RewardError

    overrides = list(args.overrides)
    verb = f"{args.verb} {args.action}" if getattr(args, "action", None) else args.verb
    for flag, key in (("model", "model.path"), ("task", "task.spec"), ("out", "out"), ("seed", "seed"),
                      ("data", "data")):
        value = getattr(args, flag, None)
        if value is not None:
            overrides.append(f"{key}={value}")
    if getattr(args, "source", None) is not None:
        overrides.append(f"pairs.source={args.source}")
    if getattr(args, "scorer", None) is not None:
        overrides.append(f"scorer={args.scorer}")
    if getattr(args, "n", None) is not None:
        overrides.append(f"search.n=[{args.n}]")
    if args.resume and args.overwrite:
        print(f"rewardlab {verb}: error: --resume and --overwrite exclude each other", file=sys.stderr)
        return 2
    run_kw = {"resume": args.resume, "overwrite": args.overwrite, "show_progress": not args.no_progress}
    try:
        cfg = load_config(VERB_CONFIGS[verb], args.config, overrides)
        if " " in verb:
            _run_reward_model_verb(verb, cfg, run_kw)
        elif args.verb == "quickstart":
            from rewardlab.quickstart import run_quickstart

            run_quickstart(cfg, **run_kw)
        elif args.verb == "sft":
            from rewardlab.sft import run_sft

            print(json.dumps(run_sft(cfg, **run_kw), indent=2))
        elif args.verb == "train":
            from rewardlab.rl.trainer import train

            print(json.dumps(train(cfg, **run_kw), indent=2))
        elif args.verb == "evaluate":
            from rewardlab.evaluation.policy import run_evaluate

            result = run_evaluate(cfg, **run_kw)
            result.pop("examples", None)
            print(json.dumps(result, indent=2))
        elif args.verb == "search":
            from rewardlab.search.report import run_search

            run_search(cfg, **run_kw)
    except Interrupted as exc:  # a first Ctrl-C: the run stopped after a step, with a checkpoint
        print(f"rewardlab: {exc.message(resume_command(sys.argv[1:] if argv is None else argv))}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, OSError, RewardError) as exc:
        text = str(exc)
        if isinstance(exc, OSError) and exc.strerror and exc.filename is None:
            text = exc.strerror  # our own I/O messages name the file already: no "[Errno 28]" prefix
        print(f"rewardlab {verb}: error: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
