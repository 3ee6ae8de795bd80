"""The over-optimization monitor (`rl.monitor`; Gao, Schulman & Hilton 2022, "Scaling laws for reward model
overoptimization", arXiv 2210.10760): a policy optimizes the reward it is given (the proxy), not the one its trainer
meant (the gold). Every rl.monitor.every steps the policy samples rl.monitor.samples completions of each of a fixed
probe set of held-out prompts (the first rl.monitor.n rows of the task's test split, the rows `rl.eval` evaluates,
`evaluation.heldout.heldout_rows`), and both rewards score them. The step's metrics line gets

    monitor/proxy            mean training reward (the run's own reward: `rewards:`, else the task's verifier)
    monitor/gold             mean gold reward (rl.monitor.gold, else the task's verifier)
    monitor/gap              monitor/proxy - monitor/gold
    monitor/proxy/<name>     mean of each component of the proxy (and monitor/gold/<name> of the gold's)
    monitor/kl_to_init       mean per-token k3 estimate of KL(policy || initial policy), nats per token
    monitor/sqrt_kl          sqrt(monitor/kl_to_init): the x axis of Gao et al.'s plots
    monitor/len_mean         mean completion length, tokens
    monitor/len_drift        monitor/len_mean minus the first probe's (the run's first probe, kept across resumes)
    monitor/entropy          mean per-token entropy of the policy on the probe completions, nats
    monitor/gold_drop        the gold's drop from its best window to the current one (`overoptimization_alarm`)
    monitor/gold_drop_low    the lower bound of its bootstrap confidence interval
    monitor/proxy_rise       the proxy's change over the same windows
    monitor/alarm            1 when the alarm is raised at this probe, else 0
    time/monitor_s           seconds the probe took (not counted in time/step_s)

KL estimator: k3 (Schulman 2020), KL_t = exp(d_t) - 1 - d_t with d_t = log pi_0(y_t) - log pi(y_t) on tokens y_t
sampled from the current policy pi: unbiased for KL(pi || pi_0), never negative per token (so its mean has a square
root), and of lower variance than k1 = -d_t. Both log-probs are taken at rl.sampling.temperature (the distribution the
policy samples from, as `policy/kl` does), with the KL estimators' clamps (`rl.losses.kl_penalty`).

Initial policy: the KL reference when rl.beta > 0 and rl.ref_refresh_every is null (it is the initial weights); under
model.lora the base with the adapter disabled (`Policy.without_adapter`; a fresh adapter starts at zero, so that is
the initial policy); otherwise a frozen copy of model.path (one more copy of the weights, no gradients and no
optimizer state). The completions change every probe, so the initial log-probs cannot be cached: they are scored
anew, rl.micro_batch_size rows at a time. The copy is made only under rl.monitor.kl_to_init=true; the default, auto,
logs the KL only when the reference or the adapter-free base gives it for free; false logs none.

Same seed, same result: completions are drawn from the streams (seed, MONITOR_STREAM, step, rollout index)
(`rewardlab.policy.streams`), never from the global generators, whose state is restored afterwards besides; the
rewards are called on the probe completions only. Training (every metric but monitor/* and time/*, the samples, the
weights) is the same with the monitor on or off.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rewardlab.evaluation.heldout import heldout_rows
from rewardlab.policy import Policy, SamplingSettings, load_policy
from rewardlab.rewards import Reward, build_reward, parse_rewards
from rewardlab.rl.losses import kl_penalty
from rewardlab.train_state import rng_state, set_rng_state

#: The second int of a probe completion's random stream key, (seed, MONITOR_STREAM, step, index): a training stream
#: (seed, step, ...) would share it only at step 7,171,950.
MONITOR_STREAM = 0x6D6F6E  # "mon"


@dataclass(frozen=True)
class AlarmDecision:
    """What `overoptimization_alarm` decided.

    Attributes:
        alarm: the test fired at the last probe and at the `patience` - 1 probes before it.
        fired: the test fired at the last probe (alone).
        gold_drop: mean gold of the best earlier window minus that of the current window (reward units; NaN when
            there are too few probes).
        gold_drop_low: the lower (1 - confidence) / J quantile of its bootstrap distribution, J the number of earlier
            windows (NaN likewise).
        proxy_rise: mean proxy of the current window minus that of the best-gold window (NaN likewise).
        reference_step: the step of the last probe of the best-gold window, or None.
    """

    alarm: bool
    fired: bool
    gold_drop: float
    gold_drop_low: float
    proxy_rise: float
    reference_step: int | None


def _windowed(values: np.ndarray, window: int) -> np.ndarray:
    """[P, n] per-probe per-prompt values -> [P - window + 1, n]: the mean over each trailing window of probes."""
    csum = np.cumsum(np.concatenate([np.zeros((1, values.shape[1])), values]), axis=0)
    return (csum[window:] - csum[:-window]) / window


def _test(proxy: np.ndarray, gold: np.ndarray, steps: Sequence[int], *, window: int, confidence: float,
          min_drop: float, resamples: int, seed: Sequence[int]) -> AlarmDecision:
    """The alarm's test on the last probe of [P, n] `proxy` and `gold` (see `overoptimization_alarm`)."""
    P, n = gold.shape
    if P < window + 1:
        return AlarmDecision(False, False, math.nan, math.nan, math.nan, None)
    G, X = _windowed(gold, window), _windowed(proxy, window)  # [J, n]: window j ends at probe j + window - 1
    earlier, current = G[:-1], G[-1]
    best = int(np.argmax(earlier.mean(axis=1)))
    drop = float(earlier[best].mean() - current.mean())
    rise = float(X[-1].mean() - X[best].mean())
    # paired bootstrap over the probe prompts of the drop from the best window; the best is the largest of J noisy
    # windows, so its one-sided level is Bonferroni-corrected for the J candidates: (1 - confidence) / J
    idx = np.random.default_rng([int(x) % 2**64 for x in seed]).integers(0, n, size=(resamples, n))  # seeds >= 0
    drops = (earlier[best] - current)[idx].mean(axis=1)  # [resamples]
    low = float(np.quantile(drops, (1.0 - confidence) / len(earlier)))
    # the proxy's rise over the same two windows, beyond its noise at the plain level (the windows were not chosen
    # by the proxy)
    rise_low = float(np.quantile((X[-1] - X[best])[idx].mean(axis=1), 1.0 - confidence))
    fired = rise_low > 0 and low > min_drop
    return AlarmDecision(fired, fired, drop, low, rise, int(steps[best + window - 1]))


def overoptimization_alarm(history: Sequence[Mapping[str, Any]], *, window: int = 2, confidence: float = 0.99,
                           min_drop: float = 0.0, patience: int = 2, resamples: int = 1000,
                           seed: int = 0) -> AlarmDecision:
    """Whether the proxy rises while the gold falls beyond the noise: the over-optimization alarm at the last probe.

    Each probe's per-prompt values are averaged over a trailing window of `window` probes. The best window is the
    earlier one (ending before the last probe) with the highest mean gold. The test fires when
        the lower (1 - confidence) quantile of the bootstrap distribution of
        proxy_rise = mean proxy(current window) - mean proxy(best window) is > 0, and
        the lower (1 - confidence) / J quantile of the bootstrap distribution of
        gold_drop = mean gold(best window) - mean gold(current window) is > min_drop,
    J being the number of earlier windows (Bonferroni: the best window is the largest of J noisy means, and the
    correction keeps a flat noisy trace quiet), the bootstrap resampling the probe prompts (paired: the same prompts in
    both windows; `resamples` draws from numpy's generator seeded with (seed, last step), so a decision is
    reproducible; past J > resamples * (1 - confidence) the quantile is the smallest resample, a conservative bound).
    The alarm is raised when the test fires at the last probe and at each of the `patience` - 1 probes before it (each
    tested on the history up to it).

    Args:
        history: the probes in step order, each {"step": int, "proxy": [n] floats, "gold": [n] floats}: the mean
            proxy and gold reward of each probe prompt's completions, the same n prompts in the same order.
        window: probes per window (>= 1). confidence: in (0, 1). min_drop: reward units (>= 0). patience: >= 1.
        resamples: bootstrap draws (>= 1). seed: the run's seed.
    Returns:
        `AlarmDecision` of the last probe; no alarm (and NaN figures) while there are fewer than window + 1 probes.
    Raises:
        ValueError: a probe whose proxy and gold have another length than the first probe's, or a bad argument.
    """
    if window < 1 or patience < 1 or resamples < 1 or not 0 < confidence < 1 or min_drop < 0:
        raise ValueError(f"overoptimization_alarm: window {window}, patience {patience} and resamples {resamples} "
                         f"must be >= 1, confidence {confidence} in (0, 1), min_drop {min_drop} >= 0")
    if not history:
        return AlarmDecision(False, False, math.nan, math.nan, math.nan, None)
    n = len(history[0]["gold"])
    for k, probe in enumerate(history):
        if len(probe["gold"]) != n or len(probe["proxy"]) != n:
            raise ValueError(f"overoptimization_alarm: history[{k}] has {len(probe['proxy'])} proxy and "
                             f"{len(probe['gold'])} gold values, the first probe {n}")
    proxy = np.array([p["proxy"] for p in history], dtype=np.float64).reshape(len(history), n)
    gold = np.array([p["gold"] for p in history], dtype=np.float64).reshape(len(history), n)
    steps = [int(p["step"]) for p in history]
    tests = [_test(proxy[:P], gold[:P], steps[:P], window=window, confidence=confidence, min_drop=min_drop,
                   resamples=resamples, seed=(seed, steps[P - 1]))
             for P in range(len(history), max(0, len(history) - patience), -1)]
    last = tests[0]
    alarm = len(tests) == patience and all(t.fired for t in tests)
    return AlarmDecision(alarm, last.fired, last.gold_drop, last.gold_drop_low, last.proxy_rise, last.reference_step)


def _component_means(outputs: Sequence[Any], prefix: str) -> dict[str, float]:
    """{prefix/<name>: mean} over the outputs of each component any of them has (a missing one counts 0)."""
    names = sorted({k for o in outputs for k in o.components})
    return {f"{prefix}/{k}": float(np.mean([o.components.get(k, 0.0) for o in outputs])) for k in names}


@dataclass(frozen=True)
class MonitorSettings:
    """When and how a `Monitor` probes.

    Attributes:
        every: steps between probes (>= 1). last_step: the run's last step, always probed. samples: completions per
            probe prompt. micro_batch_size: rows per scoring pass (None: all at once). seed: the run's seed (the
            random streams and the bootstrap). alarm: `overoptimization_alarm`'s keyword arguments (window,
            confidence, min_drop, patience, resamples).
    """

    every: int
    last_step: int
    samples: int
    micro_batch_size: int | None
    seed: int
    alarm: Mapping[str, Any]


class Monitor:
    """The over-optimization monitor of a run (see the module docstring), due every `settings.every` steps and at the
    last.

    Args:
        rows: the probe prompts (task rows). proxy: the run's training reward. gold: the gold reward; None: the proxy
            itself (the run trains on the gold, so the gap is 0; the KL, length and entropy are still logged).
        initial: the initial policy whose log-probs monitor/kl_to_init compares with; None: no KL.
        settings: `MonitorSettings`. sampling: the run's rl.sampling (temperature, top_p, max_new_tokens,
            max_prompt_length; chunk and greedy are not read).
    """

    def __init__(self, rows: Sequence[dict[str, Any]], *, proxy: Reward, gold: Reward | None,
                 initial: Policy | None, settings: MonitorSettings, sampling: SamplingSettings) -> None:
        self.rows, self.proxy, self.gold, self.initial = list(rows), proxy, gold, initial
        self.every, self.last_step, self.samples = settings.every, settings.last_step, settings.samples
        self.sampling = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                         "max_new_tokens": sampling.max_new_tokens, "max_prompt_length": sampling.max_prompt_length}
        self.micro_batch_size, self.seed, self.options = settings.micro_batch_size, settings.seed, dict(settings.alarm)
        self.history: list[dict[str, Any]] = []  # per probe: step, per-prompt proxy and gold means
        self.first_len: float | None = None
        self.alarms: list[int] = []  # the steps whose probe raised the alarm

    def due(self, step: int, *, last: bool = False) -> bool:
        """Whether step `step` (1-based) is probed: a multiple of `every`, the last step, or any step when `last`."""
        return step % self.every == 0 or step == self.last_step or last

    def _sample(self, policy: Policy, step: int) -> list[Any]:
        """rl.monitor.samples completions of each probe prompt, from the streams (seed, MONITOR_STREAM, step, k)."""
        prompts = [r["prompt"] for r in self.rows]
        streams = [(self.seed, MONITOR_STREAM, step, k) for k in range(len(prompts) * self.samples)]
        return policy.generate(prompts, n=self.samples, rows=self.rows, streams=streams, **self.sampling)

    @torch.no_grad()
    def _token_figures(self, policy: Policy, rollouts: Sequence[Any]) -> dict[str, float]:
        """Mean per-token entropy of `policy` and k3 KL from the initial policy on the rollouts' completion tokens
        (micro_batch_size rows per pass)."""
        batch = policy.collate([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts])
        temperature, n = self.sampling["temperature"], batch.mask.shape[0]
        size = self.micro_batch_size or n
        entropy_sum, kl_sum = 0.0, 0.0
        tokens = float(batch.mask.sum().clamp(min=1))
        for start in range(0, n, size):
            rows = torch.arange(start, min(n, start + size), device=batch.mask.device)
            part = batch.select(rows)
            logp, entropy = policy.token_logprobs(part, temperature=temperature, with_entropy=True)
            entropy_sum += float((entropy * part.mask).sum())
            if self.initial is not None:
                init = self.initial.scored_logprobs(part, temperature=temperature)
                kl_sum += float((kl_penalty("k3", logp, init) * part.mask).sum())
        out = {"monitor/entropy": entropy_sum / tokens}
        if self.initial is not None:
            out.update({"monitor/kl_to_init": kl_sum / tokens, "monitor/sqrt_kl": math.sqrt(max(kl_sum / tokens, 0))})
        return out

    def __call__(self, policy: Policy, step: int) -> tuple[dict[str, float], AlarmDecision]:
        """Probe `policy` at step `step`: returns the metrics (see the module docstring) and the alarm's decision,
        and records the probe in the history. The global RNG state (torch, CUDA, Python's random) is the same
        afterwards."""
        saved, t0 = rng_state(), time.perf_counter()
        try:
            rollouts = self._sample(policy, step)
            proxy = self.proxy(rollouts)
            gold = self.gold(rollouts) if self.gold is not None else proxy
            figures = self._token_figures(policy, rollouts)
        finally:
            set_rng_state(saved)
        per_prompt = {name: np.array([o.score for o in outs], dtype=np.float64).reshape(-1, self.samples).mean(1)
                      for name, outs in (("proxy", proxy), ("gold", gold))}
        self.history.append({"step": step, "proxy": per_prompt["proxy"].tolist(), "gold": per_prompt["gold"].tolist()})
        length = float(np.mean([len(r.completion_ids) for r in rollouts]))
        if self.first_len is None:
            self.first_len = length
        decision = overoptimization_alarm(self.history, seed=self.seed, **self.options)
        if decision.alarm:
            self.alarms.append(step)
        p, g = float(per_prompt["proxy"].mean()), float(per_prompt["gold"].mean())
        metrics = {"monitor/proxy": p, "monitor/gold": g, "monitor/gap": p - g,
                   **_component_means(proxy, "monitor/proxy"), **_component_means(gold, "monitor/gold"), **figures,
                   "monitor/len_mean": length, "monitor/len_drift": length - self.first_len,
                   "monitor/alarm": float(decision.alarm)}
        if not math.isnan(decision.gold_drop):
            metrics.update({"monitor/gold_drop": decision.gold_drop, "monitor/gold_drop_low": decision.gold_drop_low,
                            "monitor/proxy_rise": decision.proxy_rise})
        return {**metrics, "time/monitor_s": time.perf_counter() - t0}, decision

    def state_dict(self) -> dict[str, Any]:
        """The history, the first probe's length and the alarms' steps (plain lists and floats: a checkpoint's
        trainer_state.pt holds it)."""
        return {"history": [dict(h) for h in self.history], "first_len": self.first_len, "alarms": list(self.alarms)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore what `state_dict` returned (None, from a checkpoint of a run without the monitor: start empty).

        Raises:
            ValueError: the saved probes hold another number of prompts than rl.monitor.n gives now.
        """
        if not state:
            return
        history = [dict(h) for h in state["history"]]
        if history and len(history[0]["gold"]) != len(self.rows):
            raise ValueError(f"rl.monitor.n: the checkpoint's probes hold {len(history[0]['gold'])} prompts, and the "
                             f"probe set has {len(self.rows)} now")
        self.history, self.first_len, self.alarms = history, state["first_len"], list(state["alarms"])


def monitor_every(cfg: Any, task: Any) -> int:
    """The monitor's cadence: rl.monitor.every, or when it is null rl.eval.every for a single-turn task and 0 (off)
    for an environment task."""
    every = cfg.rl.monitor.every
    if every is None:
        return cfg.rl.eval.every if task.env is None else 0
    return every


def initial_policy(cfg: Any, policy: Policy, reference: Policy | None) -> Policy | None:
    """The initial policy monitor/kl_to_init compares with (see the module docstring): the reference when it is the
    initial weights, the base without the adapter under LoRA, else - only when rl.monitor.kl_to_init is true, not
    "auto" - a frozen copy of model.path; None: no KL."""
    if reference is not None and cfg.rl.ref_refresh_every is None:
        return reference
    if policy.has_adapter:
        return policy.without_adapter()
    if cfg.rl.monitor.kl_to_init is not True:
        return None
    initial = load_policy(cfg.model.path, **{"seed": cfg.seed, **cfg.model.policy_options(), "lora": None})
    initial.model.eval().requires_grad_(False)
    return initial


def probe_rows(cfg: Any, task: Any) -> list[dict[str, Any]] | None:
    """The monitor's probe prompts (`cfg` a `TrainConfig`): the first rl.monitor.n held-out rows, or None when the
    monitor is off (`monitor_every` 0). Checked before the run directory is touched.

    Raises:
        ValueError: rl.monitor.every > 0 on an environment task, or on a task without held-out rows (one line naming
            rl.monitor.every); any other rl.monitor key set on an environment task (naming it).
    """
    every = monitor_every(cfg, task)
    if task.env is not None:
        m = cfg.rl.monitor
        changed = [k for k, field in type(m).model_fields.items() if k != "every" and getattr(m, k) != field.default]
        if changed:
            raise ValueError(f"rl.monitor.{changed[0]}: the monitor probes single completions, and task.spec is an "
                             "environment task (the monitor is off there); leave rl.monitor out")
    if not every:
        return None
    if task.env is not None:
        raise ValueError("rl.monitor.every: the monitor probes single completions, and task.spec is an environment "
                         "task; set rl.monitor.every=0")
    return heldout_rows(task, every, cfg.rl.monitor.n, field="rl.monitor.every")


def make_monitor(cfg: Any, rows: list[dict[str, Any]] | None, task: Any, reward: Reward, gold_spec: Any,
                 policy: Policy, reference: Policy | None) -> Monitor | None:
    """The run's monitor (`cfg` a `TrainConfig`) on the probe `rows` (`probe_rows`), or None when they are None (the
    monitor is off). Built right after the models, before the RNGs are seeded (a frozen copy of a tiny model draws
    its initial weights).

    Args:
        gold_spec: the parsed gold reward (`parse_gold`), or None: the task's verifier; that is the proxy itself
            when the run has no `rewards:` (`cfg.rewards` None), and it is not built twice.
    """
    if rows is None:
        return None
    if gold_spec is not None:
        gold = build_reward(gold_spec)
    else:
        gold = None if cfg.rewards is None else build_reward(task.reward)
    m, s = cfg.rl.monitor, cfg.rl.sampling
    settings = MonitorSettings(monitor_every(cfg, task), cfg.rl.steps, m.samples, cfg.rl.micro_batch_size, cfg.seed,
                               {"window": m.window, "confidence": m.confidence, "min_drop": m.min_drop,
                                "patience": m.patience, "resamples": m.resamples})
    sampling = SamplingSettings(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                max_prompt_length=s.max_prompt_length)
    return Monitor(rows, proxy=reward, gold=gold, initial=initial_policy(cfg, policy, reference) if m.kl_to_init
                   else None, settings=settings, sampling=sampling)


def parse_gold(cfg: Any) -> Any:
    """rl.monitor.gold parsed (`rewards.parse_rewards`, nothing constructed) with cfg.on_error, or None.

    Raises:
        ValueError: one line naming rl.monitor.gold and the problem.
    """
    gold = cfg.rl.monitor.gold
    if gold is None:
        return None
    try:
        return parse_rewards([gold], on_error=cfg.on_error)
    except ValueError as e:
        raise ValueError(f"rl.monitor.gold: {e}") from None


def probe(run: Any, progress: Any, step: int, *, say: Callable[[str], None],
          last: bool = False) -> tuple[dict[str, float], bool]:
    """Step `step`'s probe when the run's monitor (`run.monitor`, a `Monitor` or None) is due (`last`: the run ends
    at this step): its metrics and whether the alarm was raised; ({}, False) when not due. An alarm is said on the
    console (`say`, the run's one-line warning) and logged as a `monitor_alarm` event (the step, the decision's
    figures, the newest checkpoint `progress.latest` and whether rl.monitor.stop_on_alarm ends the run)."""
    monitor = run.monitor
    if monitor is None or not monitor.due(step, last=last):
        return {}, False
    metrics, decision = monitor(run.policy, step)
    stop = run.cfg.rl.monitor.stop_on_alarm
    if decision.alarm:
        checkpoint = progress.latest[1].name if progress.latest else None
        say(f"rl.monitor: over-optimization alarm at step {step}: the proxy reward rose by "
             f"{decision.proxy_rise:.4g} while the gold fell by {decision.gold_drop:.4g} (lower "
             f"{run.cfg.rl.monitor.confidence:g} bound {decision.gold_drop_low:.4g}) since step "
             f"{decision.reference_step}" + (f"; stopping, the newest checkpoint is {checkpoint}" if stop else ""))
        run.rundir.log_event("monitor_alarm", step=step, gold_drop=decision.gold_drop,
                             gold_drop_low=decision.gold_drop_low, proxy_rise=decision.proxy_rise,
                             reference_step=decision.reference_step, checkpoint=checkpoint, stop=stop)
    return metrics, decision.alarm
