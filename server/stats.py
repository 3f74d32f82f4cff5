"""Per-model-version inference statistics in the shape of Triton's statistics extension.

`GET /v2/models[/{m}[/versions/{v}]]/stats` (tritonclient's `get_inference_statistics`)
returns, per version: `inference_count` (inferences, i.e. batch rows served),
`execution_count` (invocations of the program; with dynamic batching fewer than the
requests, and inference_count / execution_count is the average batch size),
`last_inference` (ms since the epoch), and `inference_stats` with a count and total
nanoseconds for `success` and `fail` (end to end; `fail` counts requests the version
admitted, as Triton's: one refused before admission never reached it) and for each phase
of a successful
request: `queue` (waiting for an execution slot or a batch), `compute_input` (decoding the
request into arrays), `compute_infer` (the invocation; with batching, its batch's) and
`compute_output` (building the response). `batch_stats` counts executions by batch size
(Triton's three phases per batch size; the concatenation and split of a batch are part of
its `compute_infer`, so its `compute_input` and `compute_output` are 0 ns). As Triton's,
every version also has `response_stats` (empty: no model here is decoupled) and
`memory_usage` (empty: device memory per version is in /metrics).

`PHASES` is the one list of a request's phases, and `Latency` the one accumulator of
durations: `metrics.ModelSeries` records each finished request into these statistics and
into the Prometheus series in one call (metrics.py), each phase once.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PHASES", "Latency", "ModelStatistics"]

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


class Latency:
    """A count of durations, their total in nanoseconds and, given upper `bounds` (seconds,
    ascending), how many fell at or below each bound and not below the previous one (the
    last slot: above every bound). A few hundred nanoseconds per `add`, no lock: it is
    written from one thread (the event loop)."""

    __slots__ = ("count", "ns", "bounds", "buckets")

    def __init__(self, bounds: tuple[float, ...] = ()) -> None:
        self.count = 0
        self.ns = 0
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)
        if self.bounds:
            self.buckets[bisect_left(self.bounds, seconds)] += 1

    def add_counts(self, count: int, ns: int, buckets: list[int] | None = None) -> None:
        """Adds `count` durations of `ns` nanoseconds in all, falling in `buckets` (the
        bucket counts, as `buckets`; None without bounds): durations counted elsewhere,
        a whole table at once (`fold_latencies`)."""
        self.count += count
        self.ns += ns
        if buckets is not None:
            self.buckets = [a + b for a, b in zip(self.buckets, buckets)]

    def doc(self) -> dict:
        return {"count": self.count, "ns": self.ns}

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, durations at or below it) per bound, then (inf, count): the
        buckets of a Prometheus histogram."""
        out, total = [], 0
        for bound, n in zip(self.bounds, self.buckets):
            total += n
            out.append((bound, total))
        out.append((float("inf"), self.count))
        return out


@dataclass
class ModelStatistics:
    success: Latency = field(default_factory=Latency)
    fail: Latency = field(default_factory=Latency)
    phase_list: tuple[Latency, ...] = field(
        default_factory=lambda: tuple(Latency() for _ in PHASES))  # in PHASES order
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    batches: dict[int, Latency] = field(default_factory=dict)  # rows -> invocations

    def executed(self, requests: int, rows: int, seconds: float) -> None:
        self.execution_count += 1
        self.inference_count += rows
        latency = self.batches.get(rows)
        if latency is None:
            latency = self.batches[rows] = Latency()
        latency.add(seconds)
        self.last_inference_ms = int(time.time() * 1e3)

    def doc(self, name: str, version: str) -> dict:
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.doc(),
                "fail": self.fail.doc(),
                **{p: d.doc() for p, d in zip(PHASES, self.phase_list)},
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "response_stats": {},  # per response of decoupled models: none here
            # an execution's concatenation and split are timed within its invocation
            # here: Triton's per-batch input and output phases are present, at 0 ns
            "batch_stats": [{"batch_size": rows,
                             "compute_input": {"count": d.count, "ns": 0},
                             "compute_infer": d.doc(),
                             "compute_output": {"count": d.count, "ns": 0}}
                            for rows, d in sorted(self.batches.items())],
            "memory_usage": [],  # Triton's per-version allocations: see /metrics
        }


def fold_latencies(table: np.ndarray, bounds: tuple[float, ...]
                   ) -> tuple[list[int], list[list[int]]]:
    """For a table of durations (seconds, one column per series): each column's total
    in nanoseconds and its counts per bucket of `bounds` (as `Latency.buckets`), in a
    few array operations for the whole table."""
    columns = table.shape[1]
    ns = np.trunc(table * 1e9).astype(np.int64).sum(axis=0).tolist()
    width = len(bounds) + 1
    slots = np.searchsorted(bounds, table, side="left") + np.arange(columns) * width
    counts = np.bincount(slots.ravel(), minlength=columns * width)
    return ns, counts.reshape(columns, width).tolist()
