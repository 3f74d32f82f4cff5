"""How long the event loop stalls, measured inside the server (`GET /metrics`).

One task sleeps `PERIOD` seconds at a time and measures how much later than asked it
woke up: the loop was kept from running for that long, by a task step, a callback, or
a thread of this process holding the interpreter lock (a model loading, a kernel's host
code). Time the loop's thread spent ready to run but waiting for a CPU is taken off (the
kernel's scheduler statistics, `/proc/self/task/<tid>/schedstat`, Linux): on a machine
whose CPUs are busy with other processes, that wait is the machine's, not the server's.
(It errs low there: a thread waiting for the interpreter lock wakes every switch
interval, and those wake-ups may wait for a CPU too. On an idle machine nothing is
taken off.) The wall-clock figure is kept beside it:

    tinyhal_event_loop_lag_seconds             histogram of the stalls (each wake-up)
    tinyhal_event_loop_lag_max_seconds         the longest since start
    tinyhal_event_loop_lag_wall_max_seconds    the longest since start, nothing taken off
    tinyhal_event_loop_cpu_wait_seconds_total  time the loop's thread waited for a CPU

A latency bound for the server ("no stall of 50 ms while a model loads") is checked on
these, before and after, rather than on a client's wall clock. A stall shorter than
`PERIOD` may fall between two wake-ups only in part; a longer one is always seen (to
within the timer's 1 ms). The task wakes `1 / PERIOD` times a second. An idle server pays for
each wake-up of its loop (about 1% of one CPU on the shared 2-core machine: 52-61 ms of
the loop thread's CPU in 5 s, against 0.3 ms without it); a serving one mostly finds the
timer due in a pass it runs anyway. Where the scheduler statistics cannot be read,
nothing is taken off.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator

import trio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString

__all__ = ["LagMonitor"]

PERIOD = 0.025
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LagMonitor:
    """The loop's oversleeps: run `run()` in the server's nursery, register the monitor
    in a prometheus_client registry (it is a collector)."""

    def __init__(self, period: float = PERIOD) -> None:
        self.period = period
        self.max_seconds = 0.0
        self.wall_max_seconds = 0.0
        self.sum_seconds = 0.0
        self.cpu_wait_seconds = 0.0
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: over the largest bound

    def record(self, lag: float) -> None:
        self.counts[bisect_left(BUCKETS, lag)] += 1
        self.sum_seconds += lag
        if lag > self.max_seconds:
            self.max_seconds = lag

    async def run(self) -> None:
        """Measures until cancelled (on the loop's thread, whose CPU waits it reads)."""
        clock = time.perf_counter
        period = self.period
        schedstat = _open_schedstat()
        try:
            waited = _cpu_wait(schedstat)
            while True:
                start = clock()
                await trio.sleep(period)
                late = clock() - start - period
                if late > self.wall_max_seconds:
                    self.wall_max_seconds = late
                now_waited = _cpu_wait(schedstat)
                self.cpu_wait_seconds += now_waited - waited
                self.record(max(0.0, late - (now_waited - waited)))
                waited = now_waited
        finally:
            if schedstat is not None:
                os.close(schedstat)

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        biggest = GaugeMetricFamily("tinyhal_event_loop_lag_max_seconds",
                                    "Longest stall of the event loop since start")
        biggest.add_metric([], self.max_seconds)
        wall = GaugeMetricFamily("tinyhal_event_loop_lag_wall_max_seconds",
                                 "Longest stall of the event loop since start, by the wall "
                                 "clock (waits for a CPU included)")
        wall.add_metric([], self.wall_max_seconds)
        histogram = HistogramMetricFamily("tinyhal_event_loop_lag_seconds",
                                          "How late the event loop's lag probe woke up")
        cumulative, running = [], 0
        for bound, n in zip((*BUCKETS, float("inf")), self.counts):
            running += n
            cumulative.append((floatToGoString(bound), running))
        histogram.add_metric([], cumulative, self.sum_seconds)
        cpu_wait = CounterMetricFamily("tinyhal_event_loop_cpu_wait_seconds",
                                       "Time the event loop's thread was ready to run but "
                                       "waited for a CPU")
        cpu_wait.add_metric([], self.cpu_wait_seconds)
        yield biggest
        yield wall
        yield histogram
        yield cpu_wait


def _open_schedstat() -> int | None:
    try:
        return os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except (OSError, AttributeError):
        return None


def _cpu_wait(schedstat: int | None) -> float:
    """Seconds the calling thread spent runnable but not running, since it started (0.0
    when unknown). The file's second field, in nanoseconds."""
    if schedstat is None:
        return 0.0
    try:
        return int(os.pread(schedstat, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
