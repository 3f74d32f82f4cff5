"""Waiting in trio for events that complete on other threads.

`await_callback(subscribe)` parks the calling trio task until a callback fires. The
callback may fire on any thread (a worker completing a task, a host thread signalling a
semaphore); it wakes the event loop through the run's `TrioToken.run_sync_soon`, so the
loop never blocks and never polls. Cancelling the waiting task unsubscribes it, so the
object being waited on keeps no stale waiter.

The module is generic: `subscribe` is any function taking a one-shot
`callback(error=None)` and returning an `unsubscribe()` function (or None if the
callback already fired synchronously).

trio (and asyncio) are imported only by the functions that run on their loops: a process
that never starts an event loop (`tinyhal-run`, `tinyhal.load` from a script) does not pay
for importing them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import sniffio  # trio's own dependency: how trio marks the thread that runs it

__all__ = ["await_callback", "on_event_loop"]


def on_event_loop() -> bool:
    """True when the calling thread runs a trio or asyncio event loop: work that would
    hold the thread up is better handed to another thread there."""
    if sniffio.thread_local.name is not None:
        return True
    asyncio = sys.modules.get("asyncio")  # never imported: no asyncio loop can be running
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def await_callback(
    subscribe: Callable[[Callable[..., None]], Callable[[], Any] | None],
) -> Any:
    """Waits until the callback handed to `subscribe` fires; returns its value.

    The callback is `callback(error=None, value=None)`: an error is raised in the waiting
    task, otherwise `value` is returned. On cancellation the subscription is removed
    before `trio.Cancelled` propagates; a callback racing with the cancellation is
    ignored.
    """
    import trio

    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    lock = threading.Lock()
    state = {"done": False}

    def wake(outcome_value: Any) -> None:
        # On the trio thread: resume the task unless it was aborted meanwhile.
        if state["done"]:
            return
        state["done"] = True
        trio.lowlevel.reschedule(task, outcome_value)

    def callback(error: BaseException | None = None, value: Any = None) -> None:
        import outcome

        with lock:
            if state.get("fired"):
                return
            state["fired"] = True
        result = outcome.Error(error) if error is not None else outcome.Value(value)
        try:
            token.run_sync_soon(wake, result)
        except trio.RunFinishedError:
            pass  # the loop is gone: nobody is waiting any more

    unsubscribe = subscribe(callback)

    def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
        state["done"] = True
        with lock:
            state["fired"] = True  # late callbacks do nothing
        if unsubscribe is not None:
            unsubscribe()
        return trio.lowlevel.Abort.SUCCEEDED

    return await trio.lowlevel.wait_task_rescheduled(abort)

