"""The CLI verbs: one module per verb, and `COMMANDS`, the one table of verb -> (config class, runner, help).

Every verb is `runner(cfg, *, mode="new", show_progress=True) -> dict` over its validated config (`mode`, a
`rewardlab.runs.RunMode`: "new", "resume" or "overwrite", which the CLI's --resume and --overwrite select): it loads
what the config names (`commands.common.load_inputs`), opens the run directory (`commands.common.open_run`), calls
the library (`rewardlab.rl.trainer`, `rewardlab.sft`, `rewardlab.evaluation`, `rewardlab.search`, `rewardlab.rm`),
writes the run's files and prints its result. Only this layer (and the training loops, which write their run
directories step by step) imports `rewardlab.config`, `rewardlab.runs` and `rich`.

`rewardlab.cli` builds its parser and dispatches from `COMMANDS`; runners are imported when called, so `--help` does
not load torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from rewardlab.config.schema import (EvaluateConfig, MergeConfig, PoConfig, PrmLabelConfig, PrmTrainConfig,
                                     QuickstartConfig, RftConfig, RmEvalConfig, RmPairsConfig, RmTrainConfig,
                                     SearchConfig, SFTConfig, TrainConfig)


class Flag(NamedTuple):
    """A shortcut flag: `--NAME VALUE` is the override `KEY=VALUE` (`KEY=[VALUE]` when `listed`, so that
    `--n 1,2,4` is `search.n=[1,2,4]`); a `switch` takes no value: `--NAME` is `KEY=true` (`--online` is
    `po.online=true`)."""

    name: str
    key: str
    help: str
    listed: bool = False
    switch: bool = False

    def override(self, value: str | bool) -> str:
        if self.switch:
            return f"{self.key}=true"
        return f"{self.key}=[{value}]" if self.listed else f"{self.key}={value}"


@dataclass(frozen=True)
class Command:
    """One CLI verb.

    Attributes:
        config: its pydantic config class (`rewardlab.config.load_config(config, file, overrides)`).
        runner: "module:function" of its runner, imported when the verb runs.
        help: one line for `rewardlab --help` and the verb's own help.
        resume_help: what `--resume` continues from.
        flags: the verb's shortcut flags (`Flag`) beyond --config/--out/--seed/--resume/--overwrite.
        prints_summary: the CLI prints the runner's result as JSON (False: the runner prints its own tables).
    """

    config: type
    runner: str
    help: str
    resume_help: str
    flags: tuple[Flag, ...] = ()
    prints_summary: bool = True

    def run(self, cfg: Any, **kwargs: Any) -> dict[str, Any]:
        """Import the runner and call it on `cfg` (kwargs: mode, show_progress)."""
        module, name = self.runner.split(":")
        fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(module), name)
        return fn(cfg, **kwargs)


_MODEL = Flag("model", "model.path", '"tiny" or a local HF model directory')
_TASK = Flag("task", "task.spec", '"reasoning_gym:NAME", "worked:NAME", "humaneval", "jsonl:PATH" or "env:NAME" '
             "(an environment's episodes: calculator, guess_number, python, or your own class as env:MODULE:CLASS or "
             "env:PATH.py:CLASS)")
#: --reward of the verbs that rank sampled completions by a reward (`--reward math` is `rewards=[math]`).
_REWARD = Flag("reward", "rewards", "the reward that ranks the sampled completions, a name or a {name: ..., ...} spec, "
               "e.g. math or \"{name: reward_model, path: RM_DIR}\" (default: the task's verifier)", listed=True)
#: --task of the verbs that sample single completions (an environment task is refused there).
_SINGLE_TASK = Flag("task", "task.spec", '"reasoning_gym:NAME", "worked:NAME", "humaneval" or "jsonl:PATH" (single '
                    "completions: an environment task, env:NAME, runs in train, sft and evaluate)")
_BACKBONE = Flag("model", "model.path", 'backbone or scorer: "minilm", "tiny" or a model directory')
_DATA = Flag("data", "data", "JSONL data file")
_CHECKPOINT = "continue from the run directory's last valid checkpoint"

#: Every verb, in the order `rewardlab --help` lists them (grouped verbs as "rm train").
COMMANDS: dict[str, Command] = {
    "quickstart": Command(
        QuickstartConfig, "rewardlab.commands.quickstart:run",
        "tiny model from scratch -> SFT -> GRPO -> evaluate on reasoning-gym chain_sum (offline); --preset tools: "
        "the calculator environment (tool calls, multi-turn episodes) against the same budget without the tool",
        "continue the run in --out: finished stages are reused, an unfinished one resumed",
        (Flag("preset", "preset", "arithmetic (default: 1-digit chain sums) or tools (calculator environment: SFT "
              "on tool and direct-answer traces, GRPO on episodes, compared with no tool)"),),
        prints_summary=False),
    "sft": Command(SFTConfig, "rewardlab.commands.sft:run",
                   "supervised warm start on task rows (loss on answer tokens)", _CHECKPOINT, (_MODEL, _TASK)),
    "train": Command(TrainConfig, "rewardlab.commands.train:run",
                     "RL training (GRPO family) against the task's verifier or configured rewards", _CHECKPOINT,
                     (_MODEL, _TASK)),
    "rft": Command(RftConfig, "rewardlab.commands.rft:run",
                   "rejection-sampling fine-tuning (STaR/RAFT): sample N per prompt, keep what the reward passes, SFT "
                   "on it, for R rounds", _CHECKPOINT,
                   (_MODEL, _SINGLE_TASK, _REWARD,
                    Flag("n", "rft.n", "completions sampled per prompt each round"))),
    "po": Command(
        PoConfig, "rewardlab.commands.po:run",
        "preference optimization (DPO, IPO, SimPO, KTO, ORPO, RPO, mixes): offline from a pairs file, or --online / "
        "semi-online (po.sync_every) with a reward ranking sampled completions", _CHECKPOINT,
        (_MODEL, _SINGLE_TASK,
         Flag("pairs", "pairs", "preference pairs JSONL (rm pairs' output, or TRL's preference format)"),
         Flag("loss", "po.loss_type", "dpo, ipo, simpo, kto, orpo, rpo, bco_pair, sft (or a list in po.loss_type)"),
         Flag("online", "po.online", "sample the pairs during training, labelled by the reward", switch=True),
         _REWARD)),
    "evaluate": Command(
        EvaluateConfig, "rewardlab.commands.evaluate:run",
        "greedy exact-match accuracy and pass@k: a jsonl file whole, a generated task's held-out split "
        "(split=all|train|test to choose)",
        "continue the run in --out after its last finished batch", (_MODEL, _TASK)),
    "merge": Command(
        MergeConfig, "rewardlab.commands.merge:run",
        "merge a LoRA checkpoint (sft/train with model.lora) into its base: a full Hugging Face model directory",
        "merge again into --out (same settings)",
        (Flag("model", "model.path", "the LoRA checkpoint (adapter directory) to merge"),)),
    "search": Command(
        SearchConfig, "rewardlab.commands.search:run",
        "reward-guided search (best-of-N, majority votes, beam search, DVTS): accuracy against N",
        "continue the run in --out after its last finished unit (greedy, sample pool, method x N)",
        (_MODEL, _SINGLE_TASK,
         Flag("scorer", "scorer", "reward that ranks candidates, e.g. arithmetic_steps"),
         Flag("n", "search.n", "budgets N, comma-separated, e.g. 1,2,4,8", listed=True)), prints_summary=False),
    "rm train": Command(RmTrainConfig, "rewardlab.commands.rm:train",
                        "train a Bradley-Terry reward model on preference pairs (JSONL)", _CHECKPOINT,
                        (_BACKBONE, _DATA)),
    "rm eval": Command(
        RmEvalConfig, "rewardlab.commands.rm:evaluate",
        "evaluate any scorer: pairwise / best-of-k accuracy, first-error F1, length and master-key probes",
        "rerun the evaluation in --out whole (same settings, same report)", (_BACKBONE, _DATA),
        prints_summary=False),
    "rm pairs": Command(
        RmPairsConfig, "rewardlab.commands.rm:pairs",
        "preference pairs: a policy's correct vs incorrect completion of the same question, or (--source mutants, "
        "no model) a canonical solution vs a sandbox-confirmed failing mutant of it",
        "rerun the pair generation in --out whole (same settings, same pairs)",
        (Flag("model", "model.path", 'the policy: "tiny" or an HF model directory'),
         Flag("task", "task.spec", '"reasoning_gym:NAME", "worked:NAME", "humaneval" (canonical solutions, for '
              '--source mutants) or "jsonl:PATH"'),
         Flag("source", "pairs.source", "policy (default): sample --model, judge with the task's verifier; mutants: "
          "canonical solution vs failing mutants, no model"))),
    "prm label": Command(
        PrmLabelConfig, "rewardlab.commands.prm:label",
        "step labels for a policy's solutions: Monte Carlo (Math-Shepherd) or binary search (OmegaPRM)",
        "continue the run in --out after its last labelled item",
        (Flag("model", "model.path", 'the policy: "tiny" or an HF model directory'),
         Flag("task", "task.spec", '"reasoning_gym:NAME", "worked:NAME" or "jsonl:PATH"'))),
    "prm train": Command(PrmTrainConfig, "rewardlab.commands.prm:train",
                         "train a process reward model on step-labelled rows (JSONL)", _CHECKPOINT,
                         (_BACKBONE, _DATA)),
}

#: Help for the verb groups (`rewardlab rm --help`).
GROUPS = {"rm": "reward models: train | eval | pairs", "prm": "process reward models: label | train"}


def config_classes() -> dict[str, type]:
    """{verb: config class}, read from `COMMANDS` (docs/config.md lists the verbs in this order)."""
    return {verb: command.config for verb, command in COMMANDS.items()}
