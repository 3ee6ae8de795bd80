"""Engine ray: the trainer's generation and scoring on Ray actors; the learner stays in the driver process.

- `RolloutWorker` (rl.ray.rollout_workers actors, rl.ray.rollout_worker_cpus / _gpus each): a policy replica built from
  the run's config, and its own environment (`load_episodes`: an environment's tool pools live in the worker's process).
  Workers build the task, the model and the reward from the config as the driver does (`worker_config`: an environment's
  file, env:PATH.py:CLASS, travels as its absolute path): `rewardlab` (and any reward or environment a config imports by
  path) must be importable on every node, and model.path readable there. A single-turn task is not loaded again: the
  driver sends it without its rows (`worker_task`; rows travel with each chunk), which saves each worker the task's
  loading (generating a reasoning-gym dataset, reading a file). It loads each published state dict and samples the
  chunks it is given (`sample_chunk`, the call engine local makes).
- `RewardWorker` (rl.ray.reward_workers actors, rl.ray.reward_worker_cpus / _gpus each): the run's reward, built from
  its spec (`build_reward`); it scores the chunks it is given. A failed item is the reward's own RewardOutput error (or
  its exception, with on_error=raise), never a silent 0.
- `RayEngine.publish` puts the learner's state dict (with model.lora: the adapter's parameters only; each worker
  built the frozen base itself) into the object store once (`ray.put`) and every rollout worker loads that one
  object. Chunk i goes to worker i mod W (round robin); results are gathered in chunk order, so they
  do not depend on the worker count.

Every worker sets torch's threads to the run's `threads` (Ray sets OMP_NUM_THREADS to an actor's CPUs), so a chunk
computes the same floats on any worker as in the driver, and takes on the driver's transformers progress bars and
verbosity (`transformers_logging`: under the CLI, no "Loading weights" bar per worker).

Fault tolerance: a worker that dies (its process killed, its node lost) is replaced by a new actor in its slot, built
from the config as at the start; a rollout worker then loads the last published weights (and version). The chunks it
had not returned run again there. A chunk is a pure function of (weights, rows, n, stream) for generation and of its
rollouts for scoring, so the re-run returns what the first run would have. A chunk re-runs at most `MAX_RERUNS`
times; a worker's own exception (a RewardError with on_error=raise, a bug) is not a death and is raised as itself.
Restarts and re-runs are logged as ray/worker_restarts and ray/chunk_reruns.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from rewardlab.policy.settings import SamplingSettings
from rewardlab.rl.engines import chunk_spans, row_spans, sample_chunk
from rewardlab.types import RewardOutput, Rollout

INSTALL_HINT = "pip install rewardlab[ray]"

#: How many times one chunk may run again after the worker running it died (and how many times in a row a worker
#: slot may die while it is being rebuilt) before the step fails with one line naming the worker kind and the chunk.
MAX_RERUNS = 3
#: Seconds a TCP connection to the head node that rl.ray.address names may take before the run is refused (ray.init
#: itself retries an address where nothing answers for minutes, then names the node's own IP instead of it).
CONNECT_TIMEOUT_S = 10.0


def import_ray() -> Any:
    """The `ray` module.

    Raises:
        ValueError: one line naming rl.engine and `pip install rewardlab[ray]` when ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise ValueError(f"rl.engine: ray needs the ray package, which is not installed; {INSTALL_HINT}") from None
    return ray


def worker_config(cfg: Any) -> Any:
    """The config the workers are built from: `cfg`, with an environment class named by its file (`task.spec`
    env:PATH.py:CLASS) named by its absolute path (`rewardlab.rewards.importing.canonical_name`), so that a worker
    imports the driver's file whatever its current directory. A module (env:MODULE:CLASS) is imported as the driver
    imports it, with the worker's current directory on the module path (on a local cluster, the driver's)."""
    from rewardlab.rewards.importing import canonical_name, is_import_name

    kind, _, argument = cfg.task.spec.partition(":")
    if kind != "env" or not is_import_name(argument) or canonical_name(argument) == argument:
        return cfg
    task = cfg.task.model_copy(update={"spec": f"env:{canonical_name(argument)}"})
    return cfg.model_copy(update={"task": task})


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse within `timeout_s` seconds a cluster address that nothing answers at, before `ray.init` tries it.

    `address` is rl.ray.address: HOST:PORT, or ray://HOST:PORT (Ray Client), or 'auto' (then $RAY_ADDRESS, when it
    names a HOST:PORT, is checked). One TCP connection to HOST:PORT is opened and closed; an address without a port
    ('auto' without $RAY_ADDRESS: the cluster `ray start` left on this machine, which Ray finds or refuses at once) is
    left to ray.init.

    Raises:
        ValueError: one line naming rl.ray.address, the address given and why nothing answered (refused, timed out
            after `timeout_s` s, unknown host).
    """
    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    host, _, port = target.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return
    via = f" ($RAY_ADDRESS={target!r})" if target != address else ""
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except TimeoutError:
        raise ValueError(f"rl.ray.address: cannot join {address!r}{via}: nothing answered at {host}:{port} within "
                         f"{timeout_s:g} s; is a Ray cluster running there (ray start --head)?") from None
    except OSError as exc:
        raise ValueError(f"rl.ray.address: cannot join {address!r}{via}: nothing answers at {host}:{port} "
                         f"({exc.strerror or exc}); is a Ray cluster running there (ray start --head)?") from None


def transformers_logging() -> tuple[bool, int]:
    """This process's transformers progress-bar switch and log verbosity (`transformers.utils.logging`), which every
    worker takes on (`set_transformers_logging`): the CLI turns the bars off and the verbosity to errors, so a
    worker's model load prints no "Loading weights" bar and its transformers warnings no more than the driver's."""
    from transformers.utils import logging as hf_logging

    return hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()


def set_transformers_logging(state: tuple[bool, int] | None) -> None:
    """Take on `transformers_logging()`'s (bars on, verbosity) of the driver; None leaves transformers' defaults."""
    if state is None:
        return
    from transformers.utils import logging as hf_logging

    bars, verbosity = state
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    hf_logging.set_verbosity(verbosity)


def worker_task(task: Any) -> Any:
    """What the workers get of the driver's task (`rewardlab.tasks.Task`): a single-turn task without its rows (they
    read only its reward spec; the rows come with each chunk), so they do not load it again; None for an environment
    task (or None), which every worker loads by its spec (loading it builds the environment's class, which may be
    the user's code, in the worker's process)."""
    if task is None or task.env is not None:
        return None
    return dataclasses.replace(task, train=[], test=[], all_rows=None, origins={})


class RolloutWorker:
    """A rollout worker (the state of one actor): a policy replica and its environment, built by `start` inside
    the actor's process from the run's config, as the driver builds its own (`load_task`, `load_policy`,
    `load_episodes`).

    Args:
        cfg: the run's `TrainConfig` (model, seed, task, env section).
        settings: the run's sampling settings.
        threads: torch threads (the driver's).
        hf_logging: the driver's `transformers_logging()`, taken on before anything loads; None: transformers'
            defaults.
        task: the driver's `worker_task` (a single-turn task without rows); None: load the task from cfg.task.
    """

    def __init__(self, cfg: Any, settings: SamplingSettings, threads: int,
                 hf_logging: tuple[bool, int] | None = None, task: Any = None) -> None:
        self.cfg, self.settings, self.threads, self.hf_logging = cfg, settings, threads, hf_logging
        self.task = task
        self.policy: Any = None
        self.episodes: Any = None
        self.version = 0

    def start(self) -> None:
        """Build the policy and the environment (a method, not the constructor: an error here reaches the driver
        as itself)."""
        from rewardlab.envs.sampling import load_episodes
        from rewardlab.policy import load_policy
        from rewardlab.tasks import load as load_task
        from rewardlab.threads import apply_threads, freeze_heap

        cfg = self.cfg
        set_transformers_logging(self.hf_logging)
        apply_threads(self.threads)
        task = self.task if self.task is not None else load_task(cfg.task.spec, **cfg.task.options)
        self.policy = load_policy(cfg.model.path, seed=cfg.seed, **cfg.model.policy_options())
        self.episodes = load_episodes(task, cfg.env, self.policy)
        freeze_heap()  # as the driver does after its set-up

    def load(self, state_dict: dict[str, Any], version: int) -> int:
        """Load published weights (an object-store reference resolves to them: the state dict, or a LoRA run's
        adapter parameters, `Policy.load_trained_weights`); returns `version`."""
        self.policy.load_trained_weights(_tensors(state_dict))
        self.version = version
        return version

    def generate(self, rows: list[dict[str, Any]], n: int, stream: tuple[int, int, int],
                 first_row: int, weights: tuple[int, list[Any]] | None = None) -> list[Rollout]:
        """One chunk: `sample_chunk` with this worker's policy, environment and last loaded version; with `weights`
        (version, [its object-store reference]), with that version, loaded first unless it is the loaded one."""
        if weights is not None and weights[0] != self.version:
            import ray

            self.load(ray.get(weights[1][0]), weights[0])
        return _pack(sample_chunk(self.policy, self.episodes, self.settings, rows, n=n, stream=stream,
                                  first_row=first_row, version=self.version))

    def close(self) -> None:
        """Stop the environment's tool workers (`close_env`)."""
        from rewardlab.envs.sampling import close_env

        close_env(self.episodes)


def _arrays(state: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """A CPU state dict as (numpy array, torch dtype name) per key, which Ray's object store holds without a copy
    per reader (`ray.put` of torch tensors takes 2.5x as long for the tiny model, and each `ray.get` 2.5x). A
    bfloat16 tensor travels as its int16 bits. Tensors that are views of one another (tied weights) map to one
    array object, so the pickle holds their bytes once."""
    import torch

    seen: dict[tuple[Any, ...], Any] = {}
    out = {}
    for key, t in state.items():
        ident = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if ident not in seen:
            seen[ident] = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        out[key] = (seen[ident], str(t.dtype).removeprefix("torch."))
    return out


def _tensors(arrays: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """`_arrays` back as tensors (sharing the arrays' read-only memory: `load_state_dict` copies them into the
    model's own parameters)."""
    import warnings

    import torch

    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for key, (array, dtype) in arrays.items():
            t = torch.from_numpy(array)
            out[key] = t.view(torch.bfloat16) if dtype == "bfloat16" else t
    return out


def _pack(items: list[Any]) -> bytes:
    """A chunk's rollouts or reward outputs as one pickle (protocol 5), which Ray moves as bytes: its own
    serializer (cloudpickle, which consults a hook for every object) takes 1.5-2x as long on a list of 1024
    dataclasses; `pickle.loads` on the other side gives them back exactly. A row holding something only cloudpickle
    can write (a lambda, a class defined in a script) falls back to it, as Ray itself would have."""
    try:
        return pickle.dumps(items, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        from ray import cloudpickle

        return cloudpickle.dumps(items, protocol=5)


class RewardWorker:
    """A reward worker (the state of one actor): the run's reward, built by `start` inside the actor's process as
    the driver builds it (`build_reward(cfg.rewards, else the task's reward, on_error=cfg.on_error)`, after loading
    the task, which registers the rewards it names, unless the driver sent it: `worker_task`).

    Args:
        cfg: the run's `TrainConfig`.
        threads: the run's threads (torch's, and the default size of the reward's process pools).
        hf_logging: as for `RolloutWorker` (a reward model or judge loads through transformers too).
        task: as for `RolloutWorker`.
    """

    def __init__(self, cfg: Any, threads: int, hf_logging: tuple[bool, int] | None = None, task: Any = None) -> None:
        self.cfg, self.threads, self.hf_logging, self.task = cfg, threads, hf_logging, task
        self.reward: Any = None

    def start(self) -> None:
        """Build the reward (an error here reaches the driver as itself)."""
        from rewardlab.rewards import build_reward
        from rewardlab.tasks import load as load_task
        from rewardlab.threads import apply_threads, freeze_heap

        cfg = self.cfg
        set_transformers_logging(self.hf_logging)
        apply_threads(self.threads)
        task = self.task if self.task is not None else load_task(cfg.task.spec, **cfg.task.options)
        self.reward = build_reward(cfg.rewards if cfg.rewards is not None else task.reward, on_error=cfg.on_error)
        freeze_heap()

    def score(self, rollouts: bytes) -> bytes:
        """One chunk's reward outputs, one per rollout (both packed, `_pack`)."""
        return _pack(self.reward(pickle.loads(rollouts)))


class RayEngine:
    """Generation on rollout worker actors, scoring on reward worker actors (see the module doc and
    `rewardlab.rl.engines.Engine`).

    Joins the cluster rl.ray.address names (`ray.init(address=...)`), or starts a local one (dashboard per
    rl.ray.dashboard); a process already connected to Ray (`ray.is_initialized()`) keeps its connection. `close`
    kills the actors and disconnects when this engine connected. A worker that dies is replaced and its unreturned
    chunks run again (see the module doc).

    Args:
        cfg: the run's `TrainConfig`.
        settings: the run's sampling settings (rl.sampling.rollout_chunk included).
        threads: the run's torch threads; every worker sets them.
        task: the run's task, loaded by the driver: a single-turn one reaches the workers without its rows
            (`worker_task`) instead of being loaded by each; None: every worker loads cfg.task.
    Raises:
        ValueError: ray not installed (naming `pip install rewardlab[ray]`); rl.ray.address that cannot be joined
            (nothing answering there is refused within CONNECT_TIMEOUT_S seconds, `check_reachable`);
            a worker that cannot be built (its cause, one line). generate and score: RuntimeError (one line) when a
            chunk's workers died more than MAX_RERUNS times.
    """

    def __init__(self, cfg: Any, settings: SamplingSettings, *, threads: int, task: Any = None) -> None:
        ray = import_ray()
        cfg = worker_config(cfg)
        rl = cfg.rl
        self.settings = settings
        self.version = 0
        self._started = False
        self._rollout: list[Any] = []
        self._reward: list[Any] = []
        self._loads: list[Any] = []
        self._published: Any = None  # the last published state dict's object-store reference: a new worker loads it
        self._weights: dict[int, Any] = {}  # version -> object-store reference, the last `_keep` published
        self._keep = rl.ray.max_staleness + 1
        self._actors: dict[str, tuple[Any, tuple[Any, ...]]] = {}  # kind -> (actor class, constructor arguments)
        self._figures = {"ray/weights_bytes": 0.0, "ray/rollout_s": 0.0, "ray/reward_s": 0.0,
                         "ray/worker_restarts": 0.0, "ray/chunk_reruns": 0.0}
        # publish runs in the learner's thread, generate / score / _restart in the prefetch thread (max_staleness >
        # 0, and k = 0 on this engine): the lock orders what both touch (the worker slots, the published weights,
        # the figures), so a replaced worker gets either publish's load call or the newest published weights
        self._lock = threading.Lock()
        if not ray.is_initialized():
            if rl.ray.address is not None:
                check_reachable(rl.ray.address)
            try:
                if rl.ray.address is None:
                    ray.init(include_dashboard=rl.ray.dashboard, logging_level=logging.WARNING)
                else:
                    ray.init(address=rl.ray.address, logging_level=logging.WARNING)
            except Exception as exc:  # noqa: BLE001 (ConnectionError, ValueError, RuntimeError: all one line)
                where = "rl.engine: ray: cannot start a local cluster"
                if rl.ray.address is not None:
                    where = f"rl.ray.address: cannot join {rl.ray.address!r}"
                elif rl.ray.dashboard and "dashboard" in str(exc):
                    where = "rl.ray.dashboard: the dashboard needs ray's full install (pip install 'ray[default]')"
                raise ValueError(f"{where}: {_first_line(exc)}") from None
            self._started = True
        try:
            rollout_actor = ray.remote(RolloutWorker).options(num_cpus=rl.ray.rollout_worker_cpus,
                                                              num_gpus=rl.ray.rollout_worker_gpus)
            reward_actor = ray.remote(RewardWorker).options(num_cpus=rl.ray.reward_worker_cpus,
                                                            num_gpus=rl.ray.reward_worker_gpus)
            logs = transformers_logging()  # the workers print what the driver prints (the CLI: no bars)
            sent = worker_task(task)
            self._actors = {"rollout": (rollout_actor, (cfg, settings, threads, logs, sent)),
                            "reward": (reward_actor, (cfg, threads, logs, sent))}
            self._rollout = [rollout_actor.remote(*self._actors["rollout"][1]) for _ in range(rl.ray.rollout_workers)]
            self._reward = [reward_actor.remote(*self._actors["reward"][1]) for _ in range(rl.ray.reward_workers)]
            _get(ray, [a.start.remote() for a in self._rollout + self._reward], "building the workers")
        except BaseException:
            self.close()
            raise

    def publish(self, policy: Any, version: int) -> None:
        """Put `policy`'s trained weights (`Policy.trained_weights`: the state dict, or with model.lora the adapter's
        parameters only, the frozen base being every worker's own) into the object store once; every rollout worker
        loads that object before its next chunk (actor calls run in order). The references of the last
        rl.ray.max_staleness + 1 versions are kept for `generate(..., version=v)` (a batch prefetched with older
        weights). Their bytes (each tensor storage once) are logged as ray/weights_bytes on the step that samples
        with them."""
        import ray

        state = {k: v.to("cpu") for k, v in policy.trained_weights().items()}
        storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes() for v in state.values()}
        ref = ray.put(_arrays(state))
        with self._lock:
            self._loads = [w.load.remote(ref, version) for w in self._rollout]
            self._published = ref
            self._weights[version] = ref
            for old in sorted(self._weights)[:-self._keep]:
                del self._weights[old]
            self._figures["ray/weights_bytes"] = float(sum(storages.values()))
            self.version = version

    def generate(self, rows: Sequence[dict[str, Any]], *, n: int, stream: tuple[int, int, int],
                 version: int | None = None) -> list[Rollout]:
        """See `Engine.generate`: chunk i on rollout worker i mod rl.ray.rollout_workers with the weights of `version`
        (default: the last published), results in chunk order; a chunk whose worker died runs again, with the same
        version, on its replacement. Safe to call from another thread than `publish`'s (the trainer's prefetch
        thread).

        Raises:
            RuntimeError: `version` is not one of the last rl.ray.max_staleness + 1 published; what `_run_chunks`
                raises.
        """
        import ray

        t0 = time.perf_counter()
        with self._lock:
            version = self.version if version is None else version
            ref, loads, kept = self._weights.get(version), list(self._loads), sorted(self._weights)
        if ref is None:
            raise RuntimeError(f"rl.engine ray: policy version {version} is not kept (kept: {kept})")
        for load in loads:
            try:
                _get(ray, [load], "loading the published weights")
            except _Died:  # its chunk finds the worker dead too, and the worker replacing it loads the weights
                pass
        spans = row_spans(len(rows), n, self.settings.chunk)
        chunks = self._run_chunks("rollout", "generate",
                                  [(list(rows[a:b]), n, tuple(stream), a, (version, [ref])) for a, b in spans],
                                  [f"rows {a}-{b - 1}" for a, b in spans])
        out = [r for chunk in chunks for r in pickle.loads(chunk)]
        self._count("ray/rollout_s", time.perf_counter() - t0)
        return out

    def score(self, rollouts: Sequence[Rollout]) -> list[RewardOutput]:
        """See `Engine.score`: chunk i on reward worker i mod rl.ray.reward_workers, outputs in chunk order; a chunk
        whose worker died runs again on its replacement."""
        t0 = time.perf_counter()
        spans = chunk_spans(len(rollouts), self.settings.chunk)
        chunks = self._run_chunks("reward", "score", [(_pack(list(rollouts[a:b])),) for a, b in spans],
                                  [f"rollouts {a}-{b - 1}" for a, b in spans])
        out = [o for chunk in chunks for o in pickle.loads(chunk)]
        self._count("ray/reward_s", time.perf_counter() - t0)
        return out

    def _run_chunks(self, kind: str, method: str, args: list[tuple[Any, ...]], names: list[str]) -> list[Any]:
        """Each chunk's result, in chunk order: chunk i runs as `method(*args[i])` on the `kind` worker in slot
        i mod W. A chunk whose worker died runs again on the worker that replaces it (`_restart`), at most
        MAX_RERUNS times.

        Raises:
            a worker's own exception, as itself; RuntimeError: a chunk's workers died more than MAX_RERUNS times
                (one line naming the worker kind, the chunk and its items).
        """
        import ray

        pool = self._rollout if kind == "rollout" else self._reward
        results: list[Any] = [None] * len(args)
        reruns = [0] * len(args)
        running: dict[Any, tuple[int, int, Any]] = {}  # result reference -> (chunk, slot, actor)

        def submit(i: int) -> None:
            slot = i % len(pool)
            running[getattr(pool[slot], method).remote(*args[i])] = (i, slot, pool[slot])

        for i in range(len(args)):
            submit(i)
        doing = "generating" if kind == "rollout" else "scoring"
        while running:
            (ref,), _ = ray.wait(list(running), num_returns=1)
            i, slot, actor = running.pop(ref)
            try:
                results[i] = _get(ray, [ref], doing)[0]
            except _Died as exc:
                if reruns[i] == MAX_RERUNS:
                    raise RuntimeError(f"rl.engine ray: the {kind} worker running chunk {i} ({names[i]}) died "
                                       f"{MAX_RERUNS + 1} times; gave up after {MAX_RERUNS} re-runs: "
                                       f"{exc.cause}") from None
                reruns[i] += 1
                self._count("ray/chunk_reruns", 1)
                if pool[slot] is actor:  # the first of its chunks to report the death replaces the worker
                    self._restart(kind, slot)
                submit(i)
        return results

    def _restart(self, kind: str, slot: int) -> None:
        """Replace the dead `kind` worker in `slot` by a new actor built as at the start (`start`); a rollout worker
        then loads the last published weights and version. Counted in ray/worker_restarts.

        Raises:
            the new worker's own exception while it is built; RuntimeError: the slot's new workers died MAX_RERUNS + 1
                times in a row while being built.
        """
        import ray

        pool = self._rollout if kind == "rollout" else self._reward
        actor_class, arguments = self._actors[kind]
        for _ in range(MAX_RERUNS + 1):
            ray.kill(pool[slot])  # a dead actor: Ray must not bring it back on its own
            with self._lock:
                pool[slot] = actor_class.remote(*arguments)
                self._figures["ray/worker_restarts"] += 1
                calls = [pool[slot].start.remote()]
                if kind == "rollout" and self._published is not None:
                    calls.append(pool[slot].load.remote(self._published, self.version))
            try:
                _get(ray, calls, f"restarting {kind} worker {slot}")
                return
            except _Died as exc:
                last = exc.cause
        raise RuntimeError(f"rl.engine ray: {kind} worker {slot} died {MAX_RERUNS + 1} times in a row while being "
                           f"rebuilt: {last}") from None

    def metrics(self) -> dict[str, float]:
        """ray/weights_bytes (the weights the step sampled with, bytes sent once through the object store),
        ray/rollout_s and ray/reward_s (seconds of wall clock waiting for generation and scoring since the last
        call), ray/worker_restarts (workers replaced after they died) and ray/chunk_reruns (chunks run again on
        them) since the last call."""
        with self._lock:
            out = dict(self._figures)
            self._figures.update({k: 0.0 for k in ("ray/rollout_s", "ray/reward_s", "ray/worker_restarts",
                                                   "ray/chunk_reruns")})
        return out

    def _count(self, key: str, value: float) -> None:
        with self._lock:
            self._figures[key] += value

    def close(self) -> None:
        """Stop the rollout workers' environments, kill every actor and, when this engine connected to Ray,
        disconnect (a local cluster it started stops)."""
        import ray

        if self._rollout:
            try:
                ray.get([w.close.remote() for w in self._rollout], timeout=30)
            except Exception:  # noqa: BLE001 (a dead worker has nothing left to close)
                pass
        for actor in self._rollout + self._reward:
            ray.kill(actor)
        self._rollout, self._reward, self._loads, self._published = [], [], [], None
        if self._started:
            ray.shutdown()
            self._started = False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


class _Died(RuntimeError):
    """A worker died (its actor is gone, or a result it returned was lost with its node): one line; `cause` is Ray's
    first line."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def _get(ray: Any, refs: list[Any], doing: str) -> list[Any]:
    """`ray.get(refs)`, with a worker's exception raised as itself (a RewardError with on_error=raise stays one)
    and a dead worker as one line.

    Raises:
        the worker's own exception; _Died (a RuntimeError): a worker died while `doing`, or a result it returned
            was lost.
    """
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            raise cause from None
        raise RuntimeError(f"rl.engine ray: a worker failed {doing}: {_first_line(exc)}") from None
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
        raise _Died(f"rl.engine ray: a worker died {doing}: {_first_line(exc)}", _first_line(exc)) from None
