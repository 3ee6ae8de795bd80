"""rewardlab inside verl (0.9.1): a custom reward function and advantage estimators.

Reward. verl's reward managers call a custom reward function per sample,

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info={...}) -> float | dict

and its batch reward manager calls the batch form with lists (`data_sources`, `solution_strs`, `ground_truths`,
`extra_infos`). A dict result must hold `score`; verl stacks the other keys per key across the batch
(`reward_extra_info`), so every sample scored by one reward returns the same keys. Here the reward is named by
`extra_info["reward"]` (a registered name or a spec, as in `rewards:`), else looked up by `data_source` in
`DATA_SOURCES`; `ground_truth` is the row's `answer` and the other `extra_info` entries are row fields.

Estimators. Importing this module with verl installed registers, in verl's advantage-estimator registry
(`verl.trainer.ppo.core_algos.register_adv_est`), `rewardlab_<name>` for each estimator in `VERL_ESTIMATORS`:
rewardlab's own formula, called with what verl gives a registered estimator (`token_level_rewards`,
`response_mask`, `index`, `reward_baselines`, `config`) and returning `(advantages, returns)`. The estimators
that need inputs verl does not pass (`UNSUPPORTED`) are registered too, as functions that raise one line saying why.

How verl's processes import rewardlab (docs/integrations.md):
`custom_reward_function.path=pkg://rewardlab.integrations.verl` (a file path to this module works too) and
`custom_reward_function.name=compute_score` (or `compute_score_batch` with the batch reward manager) for the reward;
`VERL_USE_EXTERNAL_MODULES=rewardlab.integrations.verl` in the environment of the driver (verl imports it when verl
is imported) for the estimators.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rewardlab.integrations.common import as_reward, component_keys
from rewardlab.rewards.base import Reward, RewardError
from rewardlab.rl.advantages import ESTIMATORS
from rewardlab.rl.segments import reverse_discounted_sum
from rewardlab.types import Rollout, RewardOutput

#: data_source -> the reward used when `extra_info` names none (verl's example datasets and common math sets).
DATA_SOURCES: dict[str, Any] = {
    "openai/gsm8k": "numeric",
    "gsm8k": "numeric",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math",
    "numina_aops_forum": "math",
    "numina_olympiads": "math",
}

#: What verl's own reward loop adds to `extra_info` (not row fields).
VERL_EXTRA_INFO = ("rollout_reward_scores", "num_turns")

#: What verl hands a registered estimator, as the rewardlab estimator inputs it fills: `needs` key -> verl argument.
#: The group comes from `index` (the uid) and options from `config` (`gamma`); nothing else reaches an estimator.
VERL_NEEDS = {"baseline": "reward_baselines"}


def _verl_reads(name: str) -> str:
    """What the verl wrapper of estimator `name` reads besides token_level_rewards and response_mask, derived from
    the registry's declarations (`needs`, `min_group_size`, options); "" when verl cannot feed it."""
    meta = ESTIMATORS.meta(name)
    if ESTIMATORS.inputs(name) or any(k not in VERL_NEEDS for k in meta.get("needs", ())):
        return ""
    reads = [f"{VERL_NEEDS[k]} as the {k}" for k in meta.get("needs", ())]
    if meta.get("min_group_size", 1) > 1:
        reads.append("index (uid) as the group")
    if "gamma" in (ESTIMATORS.options(name) or ()):
        reads.append("config.gamma (default 1.0)")
    return "; ".join(reads)


#: rewardlab estimator -> what its verl wrapper reads besides token_level_rewards and response_mask: every
#: registered estimator whose declared needs and inputs verl supplies (`VERL_NEEDS`).
VERL_ESTIMATORS: dict[str, str] = {name: reads for name in ESTIMATORS if (reads := _verl_reads(name))}

#: rewardlab estimator -> why verl cannot call it through its registry.
UNSUPPORTED: dict[str, str] = {
    "pure": "it needs per-step rewards (step_rewards, step_mask), which verl does not pass to an estimator",
    "process_sum": "it needs per-step rewards (step_rewards, step_mask), which verl does not pass to an estimator",
    "prime": "it needs per-token process rewards (step_rewards, step_mask), which verl does not pass to an estimator "
             "(verl's PRIME recipe computes them in its own trainer)",
    "gdpo": "it needs the reward components and their weights; verl passes only the summed token_level_rewards "
            "(use verl's own gdpo)",
    "gae": "it needs the critic's values, which verl passes only to its built-in gae (use verl's gae)",
    "turn_grpo": "it needs the turn of each token and the turn rewards, which verl does not pass to an estimator",
    "gigpo": "it needs the turn of each token, the turn rewards and the state keys, which verl does not pass",
}

_BUILT: dict[str, tuple[Reward, list[str]]] = {}
#: verl's reward loop calls compute_score from executor threads: one build per spec.
_BUILD_LOCK = threading.Lock()


def _reward_for(data_source: str, extra_info: Mapping[str, Any] | None) -> tuple[str, Reward, list[str]]:
    """The (key, reward, component keys) for one sample: extra_info["reward"], else DATA_SOURCES[data_source];
    built once per spec and kept (a reward holding a process pool is not rebuilt per call)."""
    spec = (extra_info or {}).get("reward")
    if spec is None:
        if data_source not in DATA_SOURCES:
            raise ValueError(f"data_source {data_source!r} has no rewardlab reward: name one in extra_info['reward'] "
                             f"or use a data_source of {', '.join(sorted(DATA_SOURCES))}")
        spec = DATA_SOURCES[data_source]
    key = json.dumps(spec, sort_keys=True, default=str)
    with _BUILD_LOCK:
        if key not in _BUILT:
            try:
                reward = as_reward(spec, on_error="zero")
            except ValueError as exc:
                raise ValueError(f"extra_info['reward']: {exc}") from None
            _BUILT[key] = (reward, component_keys(reward))
        reward, keys = _BUILT[key]
    return key, reward, keys


def _rollout(solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> Rollout:
    row = {k: v for k, v in (extra_info or {}).items() if k not in ("reward", *VERL_EXTRA_INFO)}
    if ground_truth is not None:
        row["answer"] = ground_truth
    prompt = str(row.get("prompt", ""))
    return Rollout(prompt=prompt, prompt_ids=[], completion=solution_str, completion_ids=[], logprobs=[], row=row)


def _result(out: RewardOutput, keys: Sequence[str], on_error: str) -> dict[str, float]:
    if out.error is not None and on_error == "raise":
        raise RewardError(out.error)
    result = {"score": 0.0 if out.error is not None else float(out.score)}
    for k in keys:
        value = out.components.get(k)
        result[k] = float(value) if value is not None and math.isfinite(value) else 0.0
    result["error"] = float(out.error is not None)
    return result


def _check_on_error(on_error: str) -> None:
    if on_error not in ("raise", "zero"):
        raise ValueError(f"on_error: expected raise or zero (verl needs a number for every sample), got {on_error!r}")


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None,
                  *, on_error: str = "zero", reward_router_address: Any = None,
                  reward_model_tokenizer: Any = None) -> dict[str, float]:
    """verl's custom reward function: score one response with a rewardlab reward.

    Args:
        data_source: the sample's `data_source`; picks the reward from `DATA_SOURCES` when `extra_info` names none.
        solution_str: the decoded response (verl decodes without special tokens).
        ground_truth: the reference answer (`reward_model.ground_truth`), the row's `answer`; None: no `answer`.
        extra_info: the sample's `extra_info`: `reward` (a reward name or spec, as in `rewards:`), and any other
            entries, which become row fields (`prompt` among them is the prompt the reward sees).
        on_error: "zero" (default: a failed reward scores 0.0 and `error` is 1.0) or "raise" (`RewardError`);
            set it with `custom_reward_function.reward_kwargs`.
        reward_router_address, reward_model_tokenizer: what verl's reward loop adds when it runs a reward model
            server; accepted by name and not used.
    Returns:
        {"score": float, <each component key of the reward (`integrations.common.component_keys`)>: float,
        "error": 0.0 or 1.0}: the same keys for every sample scored by one reward; a component the output lacks
        (e.g. a gated reward's on a closed gate) or a failed sample's components are 0.0.
    Raises:
        ValueError: an unknown data_source without extra_info["reward"], or a bad reward spec (one line listing
            the valid names), or a bad on_error.
        RewardError: a failed reward with on_error="raise".
    """
    del reward_router_address, reward_model_tokenizer
    _check_on_error(on_error)
    _, reward, keys = _reward_for(data_source, extra_info)
    return _result(reward([_rollout(solution_str, ground_truth, extra_info)])[0], keys, on_error)


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[Any],
                        extra_infos: Sequence[Mapping[str, Any] | None], *, on_error: str = "zero"
                        ) -> list[dict[str, float]]:
    """The batch form, for verl's batch reward manager (`reward_manager=batch`): the samples that share a reward are
    scored in one call of it (rewardlab's batching: one process-pool submission, one model forward...).

    Args: lists of one entry per sample, as in `compute_score`.
    Returns:
        one dict per sample, in order, as `compute_score` returns.
    Raises:
        ValueError: lists of different lengths, or as `compute_score`.
        RewardError: as `compute_score`.
    """
    _check_on_error(on_error)
    n = len(solution_strs)
    if not len(data_sources) == len(ground_truths) == len(extra_infos) == n:
        raise ValueError(f"compute_score_batch: {len(data_sources)} data_sources, {n} solution_strs, "
                         f"{len(ground_truths)} ground_truths, {len(extra_infos)} extra_infos; need one each")
    groups: dict[str, list[int]] = {}
    rewards: dict[str, tuple[Reward, list[str]]] = {}
    for i in range(n):
        key, reward, keys = _reward_for(data_sources[i], extra_infos[i])
        groups.setdefault(key, []).append(i)
        rewards[key] = (reward, keys)
    results: list[dict[str, float] | None] = [None] * n
    for key, idx in groups.items():
        reward, keys = rewards[key]
        outs = reward([_rollout(solution_strs[i], ground_truths[i], extra_infos[i]) for i in idx])
        for i, out in zip(idx, outs):
            results[i] = _result(out, keys, on_error)
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- estimators
def _groups(index: Any, n: int, name: str) -> torch.Tensor:
    """verl's `index` (one uid per row, usually strings) as rewardlab group ids [N] int64."""
    if index is None:
        raise ValueError(f"rewardlab_{name}: verl passed no index (uid); the estimator compares rollouts of a prompt")
    values = np.asarray(index, dtype=object)
    if values.shape != (n,):
        raise ValueError(f"rewardlab_{name}: index has shape {values.shape}, token_level_rewards has {n} rows")
    _, inverse = np.unique(values.astype(str), return_inverse=True)
    return torch.as_tensor(inverse, dtype=torch.int64)


def _config_get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    getter = getattr(config, "get", None)
    return getter(key, default) if callable(getter) else getattr(config, key, default)


def verl_estimator(name: str):
    """The verl-registry function for rewardlab estimator `name`:

        fn(token_level_rewards, response_mask, index=None, reward_baselines=None, config=None)
            -> (advantages [N, T] float32, returns [N, T] float32)

    token_level_rewards and response_mask are [N, T] (response tokens, right-padded); index is verl's uid per row
    (the prompt group); reward_baselines [N] float is the greedy response's reward (verl's remax). The advantages are
    `ESTIMATORS[name]` on (token_level_rewards, response_mask, group from index), as float32 on the rewards' device.
    returns: the advantages, like verl's outcome estimators, except reinforce_pp (the discounted reward-to-go,
    gamma = config.gamma) and remax (the reward-to-go, gamma 1), as verl's own.

    Conventions that differ from verl's built-ins: rewardlab's statistics are float64 with an unbiased std and
    eps 1e-6 added to it (as verl's grpo); a group of one rollout gets advantage 0 in grpo and the group-relative
    estimators (verl's grpo gives R / (1 + eps)); rloo raises on a group of one.

    Raises:
        ValueError: `name` is one of `UNSUPPORTED` (the message says which input verl does not pass) or not a
            rewardlab estimator (the message lists those verl can run).
    """
    if name in UNSUPPORTED:
        raise ValueError(f"rewardlab_{name} cannot run in verl: {UNSUPPORTED[name]}; verl passes a registered "
                         f"estimator only token_level_rewards, response_mask, index, reward_baselines and config")
    if name not in VERL_ESTIMATORS:
        raise ValueError(f"no rewardlab estimator {name!r} for verl; valid: {', '.join(VERL_ESTIMATORS)}")

    meta, option_names = ESTIMATORS.meta(name), ESTIMATORS.options(name) or ()
    grouped = meta.get("min_group_size", 1) > 1

    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  reward_baselines: torch.Tensor | None = None, config: Any = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        r, m = token_level_rewards, response_mask
        options: dict[str, Any] = {}
        for key in meta.get("needs", ()):  # verl's arguments for the estimator's declared needs (VERL_NEEDS)
            value = {"reward_baselines": reward_baselines}[VERL_NEEDS[key]]
            if value is None:
                raise ValueError(f"rewardlab_{name}: verl passed no {VERL_NEEDS[key]} (set algorithm.adv_estimator "
                                 f"so that verl generates the greedy baseline, as for its {name})")
            options[key] = value.detach().cpu().double()
        if "gamma" in option_names:
            options["gamma"] = float(_config_get(config, "gamma", 1.0))
        # Group-relative estimators group by verl's uid; the others see the batch (verl's reinforce_pp, remax).
        group = (_groups(index, r.shape[0], name) if grouped else torch.zeros(r.shape[0], dtype=torch.int64))
        with torch.no_grad():
            adv = ESTIMATORS.get(name)(token_rewards=r.detach().cpu(), mask=m.detach().cpu(), group=group, **options)
            if grouped:
                returns = adv
            else:  # verl's batch estimators return the (discounted) reward-to-go
                mask = m.detach().cpu().double()
                returns = reverse_discounted_sum(r.detach().cpu().double() * mask, mask,
                                                 options.get("gamma", 1.0)) * mask
        return adv.to(r.device).float(), returns.to(r.device).float()

    estimator.__name__ = f"rewardlab_{name}"
    estimator.__doc__ = f"rewardlab's {name} estimator for verl ({VERL_ESTIMATORS[name]}); see verl_estimator."
    return estimator


def _unsupported(name: str):
    def estimator(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                  reward_baselines: torch.Tensor | None = None, config: Any = None):
        verl_estimator(name)  # raises the one-line reason

    estimator.__name__ = f"rewardlab_{name}"
    return estimator


def register_verl_estimators() -> list[str]:
    """Register `rewardlab_<name>` in verl's estimator registry for every name of `VERL_ESTIMATORS` (and, for each of
    `UNSUPPORTED`, a function that raises why). Registering twice is a no-op. Returns the registered names.

    Raises:
        ModuleNotFoundError: verl (or a module verl imports) is not installed; one line naming the extra to install,
            `pip install 'rewardlab[verl]'`.
    """
    try:
        from verl.trainer.ppo import core_algos
    except ModuleNotFoundError as exc:
        what = "verl is" if (exc.name or "verl").split(".")[0] == "verl" else f"{exc.name!r} (which verl imports) is"
        raise ModuleNotFoundError(f"register_verl_estimators: {what} not installed; install rewardlab's verl extra: "
                                  "pip install 'rewardlab[verl]' (verl pins transformers<5.11: give it its own "
                                  "environment, as `make test-verl` does)", name=exc.name) from None

    names = []
    for name in [*VERL_ESTIMATORS, *UNSUPPORTED]:
        key = f"rewardlab_{name}"
        if key not in core_algos.ADV_ESTIMATOR_REGISTRY:
            fn = verl_estimator(name) if name in VERL_ESTIMATORS else _unsupported(name)
            core_algos.register_adv_est(key)(fn)
        names.append(key)
    return names


try:  # registration, when verl is there (VERL_USE_EXTERNAL_MODULES imports this module from verl's __init__)
    import verl.trainer.ppo.core_algos  # noqa: F401
except ImportError:
    pass
else:
    register_verl_estimators()
