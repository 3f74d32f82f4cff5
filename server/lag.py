"""How long the event loop stalls, measured inside the server (`GET /metrics`).

One task sleeps `PERIOD` seconds at a time and measures how much later than asked it
woke up: the loop was busy (a task step, a callback, a thread holding the interpreter
lock) for that long. Every wake-up is counted into a histogram, and the longest since
start is kept:

    tinyhal_event_loop_lag_seconds           histogram of the oversleeps
    tinyhal_event_loop_lag_max_seconds       the longest since start

A latency bound for the server ("health answers within 50 ms while a model loads") is
checked on these, before and after, rather than on a client's wall clock: a loaded
machine delays the client as much as the server, the loop's own oversleep is the
server's share. A stall shorter than `PERIOD` may fall between two wake-ups only in
part; a stall longer than it is always seen (to within the timer's 1 ms). The task
wakes `1 / PERIOD` times a second: about 0.1% of one CPU.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator

import trio
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
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
        self.sum_seconds = 0.0
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: over the largest bound

    def record(self, lag: float) -> None:
        self.counts[bisect_left(BUCKETS, lag)] += 1
        self.sum_seconds += lag
        if lag > self.max_seconds:
            self.max_seconds = lag

    async def run(self) -> None:
        clock = time.perf_counter
        period = self.period
        while True:
            start = clock()
            await trio.sleep(period)
            self.record(max(0.0, clock() - start - period))

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        biggest = GaugeMetricFamily("tinyhal_event_loop_lag_max_seconds",
                                    "Longest stall of the event loop since start")
        biggest.add_metric([], self.max_seconds)
        histogram = HistogramMetricFamily("tinyhal_event_loop_lag_seconds",
                                          "How late the event loop's lag probe woke up")
        cumulative, running = [], 0
        for bound, n in zip((*BUCKETS, float("inf")), self.counts):
            running += n
            cumulative.append((floatToGoString(bound), running))
        histogram.add_metric([], cumulative, self.sum_seconds)
        yield biggest
        yield histogram
