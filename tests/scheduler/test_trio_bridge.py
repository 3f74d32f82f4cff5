"""The trio bridge: waiting for cross-thread events without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from tinyhal.scheduler import await_callback, on_event_loop


@pytest.mark.trio
async def test_cancellation_unsubscribes():
    waiters = []

    def subscribe(cb):
        waiters.append(cb)
        return lambda: waiters.remove(cb)

    with trio.move_on_after(0.02) as scope:
        await await_callback(subscribe)
    assert scope.cancelled_caught
    assert waiters == []


@pytest.mark.trio
async def test_callback_fired_synchronously_and_values():
    def subscribe(cb):
        cb(value=42)
        return None

    with trio.fail_after(10):
        assert await await_callback(subscribe) == 42


@pytest.mark.trio
async def test_late_callback_after_cancel_is_harmless():
    holder = []

    def subscribe(cb):
        holder.append(cb)
        return lambda: None  # does not actually remove: the callback may still fire

    with trio.move_on_after(0.01):
        await await_callback(subscribe)
    holder[0]()  # fires after the waiter left: ignored
    await trio.sleep(0.01)


def test_on_event_loop_tells_a_thread_that_runs_one():
    async def probe():
        return on_event_loop()

    assert not on_event_loop()
    assert trio.run(probe)
    assert asyncio.run(probe())
    assert not on_event_loop()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(on_event_loop()))
    worker.start()
    worker.join(10)
    assert seen == [False]
