"""Command line: `rewardlab VERB [--config FILE] [--model PATH] [--task SPEC] [--out DIR] [key=value ...]`.

The verbs, their config classes, runners and shortcut flags are one table, `rewardlab.commands.COMMANDS`
(quickstart, sft, train, rft, evaluate, merge, search, rm train|eval|pairs, prm label|train). Overrides are dotted
config keys (`rl.lr=1e-4`); a verb's shortcut flags (`--model`, `--task`, `--data`, ...) are spelled-out overrides
(`model.path=`, `task.spec=`, `data=`). Every verb writes a run directory (`--out`) and refuses one that already
holds a run unless given `--resume` (continue it) or `--overwrite` (delete it first). Errors print one line and exit
with status 2. `rewardlab view RUN_DIR ...` (the local web viewer, `rewardlab.commands.view`) takes run directories
instead of a config.

Signals: during `train`, `sft` and `rft` (and the quickstart's stages) a first Ctrl-C or SIGTERM finishes the step (in
rft the round), writes a checkpoint, prints the `--resume` command and exits with 130 (Ctrl-C) or 143 (SIGTERM); a
second one stops at once.
After a first SIGTERM the process ends within $REWARDLAB_SIGTERM_GRACE_S seconds (default 20) whatever happens:
a step that does not finish in time is abandoned, to be resumed from the last checkpoint. Any other Ctrl-C (during
set-up, Ray's start-up included, a second one, or in another verb) stops at once with one line and status 130.
Other verbs die of SIGTERM at once, as of SIGKILL, and resume from their logs. No process a verb starts outlives it
(`rewardlab.lifetime`, docs/reliability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

from rewardlab.commands import COMMANDS, GROUPS, Command


#: The top-level help's epilog: what Ctrl-C and SIGTERM do.
SIGNALS_HELP = ("Ctrl-C or SIGTERM during train, sft and rft: finish the current step (rft: round), checkpoint it, "
                "print the --resume command, exit 130 (Ctrl-C) or 143 (SIGTERM); a second one stops at once (exit 130, "
                "as any other Ctrl-C: during set-up, Ray's start-up, other verbs). After a SIGTERM the "
                "process ends within REWARDLAB_SIGTERM_GRACE_S seconds (default 20), abandoning a step not finished "
                "by then. Other verbs stop at once and resume from their logs. No process a verb starts outlives it.")


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but the epilog (the config keys, laid out by `rewardlab.config.help_text`) prints as is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        from rewardlab.config.reference import HELP_HEADING

        if text.startswith(HELP_HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _add_verb(sub, name: str, command: Command) -> None:
    """The parser of one verb: its help, its config keys (epilog), the common flags and its shortcut flags."""
    from rewardlab.config import help_text

    width = max(shutil.get_terminal_size().columns - 2, 40)  # argparse's own width for the rest of the help
    p = sub.add_parser(name, help=command.help, description=command.help,
                       epilog=help_text(command.config, width), formatter_class=_HelpFormatter)
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--out", help="run directory (config key: out)")
    p.add_argument("--seed", type=int, help="random seed (config key: seed)")
    for flag in command.flags:
        if flag.switch:
            p.add_argument(f"--{flag.name}", action="store_true", default=None,
                           help=f"{flag.help} (config key: {flag.key}=true)")
        else:
            p.add_argument(f"--{flag.name}", help=f"{flag.help} (config key: {flag.key})")
    p.add_argument("--resume", action="store_true", help=command.resume_help + " (same settings)")
    p.add_argument("--overwrite", action="store_true",
                   help="delete the run already in --out and start afresh (without --resume or --overwrite, a "
                        "directory that holds a run is refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. rl.lr=1e-4")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewardlab", description="Reward-guided policy optimization of LMs.",
                                     epilog=SIGNALS_HELP)
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    from rewardlab.commands.view import HELP as VIEW_HELP

    groups: dict[str, argparse._SubParsersAction] = {}
    for verb, command in COMMANDS.items():
        group, _, action = verb.partition(" ")
        if not action:
            _add_verb(sub, verb, command)
            continue
        if group not in groups:
            g = sub.add_parser(group, help=GROUPS[group], description=GROUPS[group])
            groups[group] = g.add_subparsers(dest="action", required=True, metavar="ACTION")
        _add_verb(groups[group], action, command)
    sub.add_parser("view", help=VIEW_HELP, add_help=False)  # no config: `rewardlab.commands.view.main` parses it
    return parser


def parse(argv: list[str] | None = None) -> tuple[str, argparse.Namespace, list[str]]:
    """The verb ("rm train" for a grouped one), the parsed flags, and the config overrides the command line gives
    (dotted `key=value`s, then the shortcut flags spelled out). Exits with status 2 on a malformed command line."""
    parser = _parser()
    # Overrides may come before, between or after the flags: argparse leaves those after a flag unparsed.
    args, extra = parser.parse_known_args(argv)
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    verb = f"{args.verb} {args.action}" if getattr(args, "action", None) else args.verb
    overrides = list(args.overrides or []) + extra
    for key, value in (("out", args.out), ("seed", args.seed)):
        if value is not None:
            overrides.append(f"{key}={value}")
    overrides += [flag.override(getattr(args, flag.name)) for flag in COMMANDS[verb].flags
                  if getattr(args, flag.name) is not None]
    return verb, args, overrides


def _load(cls, path: str | None, overrides: list[str]):
    """`config.load_config`, each `ConfigDeprecationWarning` (a key given by its old name) printed as one
    "rewardlab: warning: ..." line; other warnings go on as they were."""
    import warnings

    from rewardlab.config import ConfigDeprecationWarning, load_config
    from rewardlab.runs import warn

    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigDeprecationWarning)
            return load_config(cls, path, overrides)
    finally:  # said before a config error too
        for w in caught:
            if issubclass(w.category, ConfigDeprecationWarning):
                warn(str(w.message))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["view"]:  # the viewer takes run directories, not a config
        from rewardlab.commands.view import main as view

        return view(words[1:])
    verb, args, overrides = parse(argv)
    command = COMMANDS[verb]
    if args.resume and args.overwrite:
        print(f"rewardlab {verb}: error: --resume and --overwrite exclude each other", file=sys.stderr)
        return 2
    mode = "resume" if args.resume else "overwrite" if args.overwrite else "new"  # rewardlab.runs.RunMode
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    from rewardlab.interrupt import EXIT_INTERRUPTED, Interrupted, resume_command, sigterm_grace_s
    from rewardlab.rewards import RewardError

    try:
        sigterm_grace_s()  # a bad REWARDLAB_SIGTERM_GRACE_S is an error before anything starts
        cfg = _load(command.config, args.config, overrides)
        result = command.run(cfg, mode=mode, show_progress=not args.no_progress)
        if command.prints_summary:
            print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))
    except Interrupted as exc:  # a first Ctrl-C or SIGTERM: the run stopped after a step, with a checkpoint
        print(f"rewardlab: {exc.message(resume_command(sys.argv[1:] if argv is None else argv))}", file=sys.stderr)
        return exc.exit_status  # 130 after Ctrl-C, 143 after SIGTERM
    except KeyboardInterrupt:  # Ctrl-C outside a training step (set-up, Ray's start-up, other verbs) or a second one
        print(f"rewardlab {verb}: interrupted (Ctrl-C); stopped at once", file=sys.stderr)
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
