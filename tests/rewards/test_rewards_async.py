"""Async and thread-parallel scoring in `@reward` / `FunctionReward`: concurrency limits, timeouts, running loops."""

import asyncio
import threading

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward, reward
from rewardlab.rewards.base import DEFAULT_MAX_CONCURRENCY, FunctionReward



def _tracking_async(peak):
    """An async reward that records how many of its calls are in flight at once."""
    state = {"now": 0}

    @reward(name="tracked", register=False)
    async def tracked(completion):
        state["now"] += 1
        peak.append(state["now"])
        for _ in range(3):  # yield to the loop so other items can start
            await asyncio.sleep(0)
        state["now"] -= 1
        return float(len(completion))

    return tracked


def test_async_reward_scores_in_order_with_the_concurrency_limit():
    peak = []
    built = _tracking_async(peak)(max_concurrency=3)
    outs = built([make_rollout("a" * k) for k in range(1, 8)])
    assert [o.score for o in outs] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # len("a" * k) = k, in input order
    assert max(peak) == 3  # 7 items, at most 3 awaited at once


def test_async_reward_default_concurrency_allows_the_whole_small_batch():
    peak = []
    built = _tracking_async(peak)()
    assert built.max_concurrency == DEFAULT_MAX_CONCURRENCY == 16
    built([make_rollout("x") for _ in range(5)])
    assert max(peak) == 5  # 5 < 16: all in flight together


def test_async_item_timeout_is_an_error_and_other_items_finish():
    @reward(name="slow_reward", register=False)
    async def slow_reward(completion):
        if completion == "slow":
            await asyncio.sleep(30)
        return 1.0

    fast, slow = slow_reward(item_timeout=0.05)([make_rollout("fast"), make_rollout("slow")])
    assert fast.score == 1.0 and fast.error is None
    assert slow.score == 0.0 and slow.error == "slow_reward: timed out after 0.05 s"


def test_async_reward_own_timeout_error_is_not_reported_as_our_timeout():
    @reward(name="own", register=False)
    async def own(completion):
        raise TimeoutError("upstream took too long")

    (out,) = own(item_timeout=10)([make_rollout("x")])
    assert out.error == "own: TimeoutError: upstream took too long"


def test_async_reward_exception_and_nan_become_errors():
    @reward(name="flaky", register=False)
    async def flaky(completion):
        if completion == "boom":
            raise ValueError("bad input\nsecond line")
        return float("nan")

    boom, nan = flaky()([make_rollout("boom"), make_rollout("nan")])
    assert boom.error == "flaky: ValueError: bad input" and boom.score == 0.0
    assert nan.error == "flaky: score is nan"


def test_async_reward_called_while_an_event_loop_runs():
    @reward(name="inner", register=False)
    async def inner(completion):
        await asyncio.sleep(0)
        return 2.0

    async def caller():
        built = inner()
        synced = built([make_rollout("a")])  # the trainer's sync call, from inside a running loop
        awaited = await built.acall([make_rollout("a"), make_rollout("b")])
        return synced, awaited

    synced, awaited = asyncio.run(caller())
    assert [o.score for o in synced] == [2.0] and [o.score for o in awaited] == [2.0, 2.0]


def test_sync_reward_workers_run_items_in_parallel_threads():
    barrier = threading.Barrier(3, timeout=10)  # passes only when 3 calls wait at the same time

    @reward(name="io_bound", register=False)
    def io_bound(completion):
        barrier.wait()
        return float(len(completion))

    outs = io_bound(workers=3)([make_rollout("a"), make_rollout("bb"), make_rollout("ccc")])
    assert [(o.score, o.error) for o in outs] == [(1.0, None), (2.0, None), (3.0, None)]


def test_sync_reward_acall_runs_off_the_loop():
    @reward(name="plain", register=False)
    def plain(completion):
        return 0.5

    assert [o.score for o in asyncio.run(plain().acall([make_rollout("a")]))] == [0.5]


@pytest.mark.parametrize(
    "kind, options, message",
    [
        ("async", {"workers": 2}, "'workers' is for sync functions"),
        ("sync", {"item_timeout": 1.0}, "'item_timeout' applies to async def rewards only"),
        ("sync", {"max_concurrency": 4}, "'max_concurrency' applies to async def rewards only"),
        ("async", {"max_concurrency": 0}, "max_concurrency must be an integer >= 1, got 0"),
        ("sync", {"workers": 1.5}, "workers must be an integer >= 1, got 1.5"),
        ("async", {"item_timeout": -1}, "item_timeout must be a number of seconds > 0, got -1"),
    ],
)
def test_execution_option_errors(kind, options, message):
    async def a(completion):
        return 0.0

    def s(completion):
        return 0.0

    with pytest.raises(ValueError, match="reward r: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        FunctionReward(a if kind == "async" else s, "r", options)


def test_function_parameter_named_like_an_execution_option_receives_it():
    @reward(name="own_workers", register=False)
    def own_workers(completion, workers=1):
        return float(workers)

    built = own_workers(workers=4)
    assert built.workers == 1  # not a thread pool: the function's own parameter
    assert built([make_rollout("a")])[0].score == 4.0


def test_decorator_defaults_and_config_override():
    @reward(name="async_cfg", register=False, max_concurrency=2, item_timeout=5)
    async def async_cfg(completion):
        return 1.0

    assert (async_cfg().max_concurrency, async_cfg().item_timeout) == (2, 5.0)
    REWARDS.register("async_cfg")(async_cfg)
    try:
        built = build_reward([{"name": "async_cfg", "max_concurrency": 7, "item_timeout": 0.5}])
    finally:
        REWARDS.unregister("async_cfg")
    (member, _), = built.members
    assert (member.max_concurrency, member.item_timeout) == (7, 0.5)
    assert built([make_rollout("x")])[0].score == 1.0
