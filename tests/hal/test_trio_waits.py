"""The trio bridge: `Semaphore.wait_async` / `Fence.wait_async` never block the event loop;
work finishing on worker threads wakes trio through its token; cancellation leaves the
semaphore consistent. On every driver.
"""

from __future__ import annotations

import threading

import pytest
import trio

from tinyhal import errors
from tinyhal.hal import Fence

T = 30


async def _ticker(counter: list[int]) -> None:
    while True:
        counter[0] += 1
        await trio.sleep(0.001)


@pytest.mark.trio
async def test_wait_async_on_device_work_keeps_the_loop_running(device):
    gate, done = device.create_semaphore(), device.create_semaphore()
    buf = device.allocator.allocate(1 << 16)
    device.queue_fill(buf, 0, 1 << 16, b"\x07", wait=[(gate, 1)], signal=[(done, 1)])
    ticks = [0]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_ticker, ticks)
        threading.Timer(0.05, gate.signal, args=(1,)).start()
        with trio.fail_after(T):
            await done.wait_async(1)
        nursery.cancel_scope.cancel()
    assert ticks[0] >= 5
    assert done.query() == 1


@pytest.mark.trio
async def test_fence_wait_async(device):
    a, b = device.create_semaphore(), device.create_semaphore()
    device.queue_barrier(wait=[(a, 1)], signal=[(b, 2)])
    fence = Fence([(a, 1), (b, 2)])
    threading.Timer(0.01, a.signal, args=(1,)).start()
    with trio.fail_after(T):
        await fence.wait_async()
    assert fence.query()


@pytest.mark.trio
async def test_wait_async_already_reached_and_failure(device):
    s = device.create_semaphore(3)
    with trio.fail_after(T):
        await s.wait_async(2)
    bad = device.create_semaphore()
    device.queue_barrier(wait=[(s, 4)], signal=[(bad, 1)])
    threading.Timer(0.01, s.fail, args=(errors.DataLossError("lost"),)).start()
    with trio.fail_after(T), pytest.raises(errors.DataLossError, match="lost"):
        await bad.wait_async(1)


@pytest.mark.trio
async def test_cancellation_leaves_the_semaphore_consistent(device):
    s = device.create_semaphore()
    with trio.move_on_after(0.02) as scope:
        await s.wait_async(1)
    assert scope.cancelled_caught
    assert s.statistics().pending_timepoints == 0  # the cancelled waiter is gone
    results = []

    async def waiter(v):
        await s.wait_async(v)
        results.append(v)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, 1)
        nursery.start_soon(waiter, 2)
        with trio.CancelScope() as doomed:
            nursery.start_soon(waiter, 3)
            doomed.cancel()
        await trio.sleep(0.01)
        device.queue_barrier(signal=[(s, 2)])  # completes on a worker (task) or inline
        with trio.fail_after(T):
            while len(results) < 2:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    assert sorted(results) == [1, 2]
    s.signal(5)
    assert s.query() == 5 and s.statistics().pending_timepoints == 0


@pytest.mark.trio
async def test_many_concurrent_async_waiters(device):
    sems = [device.create_semaphore() for _ in range(50)]
    got = []

    async def wait_one(i):
        await sems[i].wait_async(1)
        got.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(wait_one, i)
        await trio.sleep(0.005)
        for i in range(49):
            device.queue_barrier(wait=[(sems[i + 1], 1)], signal=[(sems[i], 1)])
        sems[49].signal(1)
        with trio.fail_after(T):
            while len(got) < 50:
                await trio.sleep(0.001)
    assert sorted(got) == list(range(50))
