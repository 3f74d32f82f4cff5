"""Admission and the batching policy in-process, on real instance threads: the next batch
takes everything queued (up to max_batch_size, cut to a preferred size), a queue delay
is waited out and ended early by a full batch, unload waits for everything admitted and
refuses what comes after, deadlines and detachment keep their counts, and one bad
request never fails its batch-mates."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import trio

from tinyhal.server.admission import Admission, DeadlineExceeded, Instance, Unavailable
from tinyhal.server.batching import BatchingConfig
from tinyhal.server.instances import InstanceThread

pytestmark = pytest.mark.timeout(60)


class Model:
    """y = 2 x on an instance thread; holds while `gate` is clear; a row of -1 fails."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.executions: list[int] = []

    def invoke(self, args: list) -> list:
        self.gate.wait(30)
        (x,) = args
        if (x == -1).any():
            raise ValueError("a row of -1")
        return [("y", "FP32", x * 2)]

    def executed(self, requests: int, rows: int, seconds: float) -> None:
        self.executions.append(rows)


def _admission(model: Model, batching: BatchingConfig | None, max_queue: int = 64,
               instances: int = 1) -> Admission:
    token = trio.lowlevel.current_trio_token()
    return Admission([Instance(InstanceThread(f"test#{i}", token), model.invoke)
                      for i in range(instances)], max_queue, batching,
                     executed=model.executed)


def _row(value: float, rows: int = 1) -> list:
    return [np.full((rows, 4), value, np.float32)]


async def _wait_running(admission: Admission, queued: int) -> None:
    with trio.fail_after(10):
        while admission.running < 1 or admission.queued < queued:
            await trio.sleep(0.001)


def test_the_next_batch_takes_everything_queued():
    async def main() -> None:
        model = Model()
        admission = _admission(model, BatchingConfig(16, 0, (8,)))
        results = {}

        async def one(i: int) -> None:
            out, _, _ = await admission.infer(_row(i), 1, math.inf, f"r{i}")
            results[i] = out[0][2]

        model.gate.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            await _wait_running(admission, 0)
            for i in range(1, 11):
                nursery.start_soon(one, i)
            await _wait_running(admission, 10)
            model.gate.set()
        # 1 alone, then the 10 queued: cut to the preferred 8, then the 2 left
        assert model.executions == [1, 8, 2]
        assert all((results[i] == 2 * i).all() for i in range(11))
        admission.close()
        await admission.wait_idle()
        admission.stop()

    trio.run(main)


def test_requests_arriving_together_form_one_batch_once_requests_come_in_company():
    async def main() -> None:
        model = Model()
        admission = _admission(model, BatchingConfig(16, 0))

        async def wave(n: int, base: int) -> None:
            async with trio.open_nursery() as nursery:  # all ready in one scheduler pass
                for i in range(n):
                    nursery.start_soon(admission.infer, _row(base + i), 1, math.inf,
                                       f"r{base + i}")

        # a lone request starts at once: the first of a wave runs alone, the rest after
        await admission.infer(_row(0), 1, math.inf, "lone")
        await wave(5, 10)
        assert model.executions == [1, 1, 4]
        # the last execution had company: the next wave waits for the pass and runs whole
        await wave(5, 20)
        assert model.executions[3:] == [5]
        admission.close()
        await admission.wait_idle()
        admission.stop()

    trio.run(main)


def test_queue_delay_is_waited_out_and_a_full_batch_ends_it():
    async def main() -> None:
        model = Model()
        admission = _admission(model, BatchingConfig(4, 20_000))  # 20 ms
        _, queued, _ = await admission.infer(_row(1), 1, math.inf, "alone")
        assert queued >= 0.020  # waited out the delay for more rows
        for i in range(5):  # the timer is armed early by its mean lateness: at most half
            _, queued, _ = await admission.infer(_row(1), 1, math.inf, f"again {i}")
            assert queued >= 0.010
        slow = _admission(model, BatchingConfig(4, 60_000_000))  # a minute
        with trio.fail_after(30):  # rows reaching max_batch_size end the wait at once
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(slow.infer, _row(i), 1, math.inf, f"r{i}")
        assert model.executions[-1] == 4
        for a in (admission, slow):
            a.close()
            await a.wait_idle()
            a.stop()

    trio.run(main)


def test_unload_waits_for_everything_admitted_and_refuses_the_rest():
    async def main() -> None:
        model = Model()
        admission = _admission(model, None, max_queue=8)
        done = []

        async def one(i: int) -> None:
            out, _, _ = await admission.infer(_row(i), 1, math.inf, f"r{i}")
            done.append(i)

        model.gate.clear()
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, i)
            await _wait_running(admission, 5)
            admission.close()
            with pytest.raises(Unavailable):
                await admission.infer(_row(9), 1, math.inf, "late")
            nursery.start_soon(admission.wait_idle)
            await trio.sleep(0.05)
            assert admission.in_flight == 6
            model.gate.set()
            with trio.fail_after(10):
                await admission.wait_idle()
        assert sorted(done) == list(range(6))
        admission.stop()

    trio.run(main)


def test_deadlines_detach_and_a_bad_request_fails_alone():
    async def main() -> None:
        model = Model()
        admission = _admission(model, BatchingConfig(8, 0))
        model.gate.clear()
        outcomes = {}

        async def one(i: int, value: float, deadline: float) -> None:
            try:
                out, _, _ = await admission.infer(_row(value), 1, deadline, f"r{i}")
                outcomes[i] = float(out[0][2][0, 0])
            except (DeadlineExceeded, ValueError) as exc:
                outcomes[i] = exc

        async with trio.open_nursery() as nursery:
            soon = trio.current_time() + 0.2
            nursery.start_soon(one, 0, 1.0, soon)  # runs, then detaches at its deadline
            await _wait_running(admission, 0)
            nursery.start_soon(one, 1, 2.0, soon)  # leaves the queue at its deadline
            nursery.start_soon(one, 2, 3.0, math.inf)
            nursery.start_soon(one, 3, -1.0, math.inf)  # fails alone
            nursery.start_soon(one, 4, 5.0, math.inf)
            await _wait_running(admission, 4)
            with trio.fail_after(10):
                while 1 not in outcomes or 0 not in outcomes:
                    await trio.sleep(0.01)
            assert admission.statistics().detached == 1
            model.gate.set()
        assert outcomes[0].started and not outcomes[1].started
        assert isinstance(outcomes[3], ValueError)
        assert (outcomes[2], outcomes[4]) == (6.0, 10.0)
        assert admission.statistics().detached == 0 and admission.in_flight == 0
        admission.stop()

    trio.run(main)


def test_both_schedulers_offer_the_whole_scheduler_protocol():
    """A model version holds one scheduler and the drain and unload use only the
    protocol: the dynamic and the sequence batcher both offer every part of it."""
    from tinyhal.server.scheduling import Scheduler
    from tinyhal.server.sequences import SequenceBatcher

    members = [name for name in vars(Scheduler) if not name.startswith("_")]
    members += list(Scheduler.__annotations__)
    assert {"infer", "abandon", "close", "wait_idle", "in_flight"} <= set(members)
    for scheduler in (Admission, SequenceBatcher):
        missing = [name for name in members if not hasattr(scheduler, name) and
                   name not in ("max_concurrency", "max_queue")]
        assert not missing, (scheduler.__name__, missing)
