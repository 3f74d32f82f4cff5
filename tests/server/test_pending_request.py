"""A pending request is its own one-waiter completion: `finish` hands its outcome to the
task parked in `wait_outcome`, once; a deadline or a cancellation hands it to `abandon`."""

from __future__ import annotations

import contextlib
import math

import pytest
import trio
import trio.testing

from tinyhal.server.admission import DeadlineExceeded, PendingRequest, wait_outcome


def _request(deadline: float = math.inf) -> PendingRequest:
    return PendingRequest([], 1, deadline, "model m version 1 request r", trio.current_time())


def test_finish_wakes_the_waiting_task_with_the_outcome():
    async def main():
        request = _request()
        got = []

        async def waiter():
            got.append(await wait_outcome(request, lambda r: pytest.fail("abandoned")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            request.infer_seconds = 0.5
            request.finish(([("y", "FP32", None)], None))
        assert got == [([("y", "FP32", None)], 0.0, 0.5)]

    trio.run(main)


def test_an_outcome_given_before_the_wait_is_returned_after_a_checkpoint():
    async def main():
        request = _request()
        request.finish(([], None))
        assert await wait_outcome(request, lambda r: pytest.fail("abandoned")) == \
            ([], 0.0, 0.0)

    trio.run(main)


def test_the_first_outcome_stays():
    async def main():
        request = _request()
        request.started = True
        raised = []

        async def waiter():
            try:
                await wait_outcome(request, lambda r: pytest.fail("abandoned"))
            except DeadlineExceeded as exc:
                raised.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            # the drain answers the running request 504, then its result arrives
            request.finish((None, DeadlineExceeded("drained", started=True)))
            request.finish(([("y", "FP32", None)], None))
        assert [str(e) for e in raised] == ["drained"]
        assert request.outcome[0] is None

    trio.run(main)


@pytest.mark.parametrize("cancel", [False, True])
def test_a_deadline_or_a_cancellation_hands_the_request_to_abandon(cancel):
    async def main():
        abandoned = []
        request = _request(math.inf if cancel else trio.current_time() + 0.01)
        with trio.move_on_after(0.01 if cancel else 10):
            with contextlib.nullcontext() if cancel else \
                    pytest.raises(DeadlineExceeded, match="in the queue"):
                await wait_outcome(request, abandoned.append)
        assert abandoned == [request]
        request.finish(([], None))  # the execution's result, later: nobody waits for it
        assert request.finished

    trio.run(main)

