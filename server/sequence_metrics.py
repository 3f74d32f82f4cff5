"""Prometheus output of the sequence-batched model versions (`SequenceCollector`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["SequenceCollector"]


class SequenceCollector:
    """Prometheus families of every sequence-batched model version, read at scrape time:

        tinyhal_sequences_live{model,version}              sequences started, not ended
        tinyhal_sequences_waiting_for_slot{model,version}  started, no slot free yet
        tinyhal_sequence_slots{model,version}              state slots
        tinyhal_sequence_slots_in_use{model,version}
        tinyhal_sequence_state_bytes{model,version}        state memory of the slots in use
        tinyhal_sequence_state_device_bytes{model,version} device memory the states hold
        tinyhal_sequences_expired_total{model,version}     ended by idle expiry
        tinyhal_sequences_client_gone_total{model,version} ended: a client hung up mid-step
        tinyhal_sequence_batch_size{model,version}         sequences per execution
        tinyhal_sequence_queue_wait_seconds{model,version} a step's wait for its execution
        tinyhal_sequence_host_seconds_total{model,version,phase}  host time of executions
            (gather, invoke, scatter, respond)

    `versions()` yields objects with `name`, `version`, `sequences` (a SequenceBatcher or
    None) and `stats` (stats.ModelStatistics: the executions by batch size)."""

    def __init__(self, versions: Callable[[], Iterable[Any]]) -> None:
        self._versions = versions

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
        from prometheus_client.utils import floatToGoString

        labels = ["model", "version"]
        gauges = {
            "live_sequences": GaugeMetricFamily("tinyhal_sequences_live", "Live sequences",
                                      labels=labels),
            "waiting_for_slot": GaugeMetricFamily(
                "tinyhal_sequences_waiting_for_slot",
                "Sequences started and waiting for a free state slot", labels=labels),
            "slots": GaugeMetricFamily("tinyhal_sequence_slots", "State slots",
                                       labels=labels),
            "slots_in_use": GaugeMetricFamily("tinyhal_sequence_slots_in_use",
                                              "State slots held by live sequences",
                                              labels=labels),
            "state_bytes_in_use": GaugeMetricFamily(
                "tinyhal_sequence_state_bytes", "Bytes of implicit state in the slots in use",
                labels=labels),
            "state_bytes_reserved": GaugeMetricFamily(
                "tinyhal_sequence_state_device_bytes",
                "Device memory the implicit states keep alive (their buffers, the initial "
                "rows)", labels=labels),
        }
        expired = CounterMetricFamily("tinyhal_sequences_expired",
                                      "Sequences ended by max_sequence_idle_microseconds",
                                      labels=labels)
        gone = CounterMetricFamily("tinyhal_sequences_client_gone",
                                   "Sequences ended because a client closed its connection "
                                   "while a step of theirs waited or ran", labels=labels)
        batch = HistogramMetricFamily("tinyhal_sequence_batch_size",
                                      "Sequences per execution", labels=labels)
        wait = HistogramMetricFamily("tinyhal_sequence_queue_wait_seconds",
                                     "Time a step waited for its execution", labels=labels)
        host = CounterMetricFamily("tinyhal_sequence_host_seconds",
                                   "Host time of executions by phase",
                                   labels=[*labels, "phase"])
        for mv in self._versions():
            batcher = mv.sequences
            if batcher is None:
                continue
            names = [mv.name, mv.version]
            st = batcher.sequence_statistics()
            for key, family in gauges.items():
                family.add_metric(names, st[key])
            expired.add_metric(names, batcher.expired_count)
            gone.add_metric(names, batcher.client_gone_count)
            rows = [(r, d.count) for r, d in mv.stats.batches.items()]
            buckets = [(floatToGoString(bound), sum(n for r, n in rows if r <= bound))
                       for bound in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
            buckets.append(("+Inf", sum(n for _, n in rows)))
            batch.add_metric(names, buckets, sum(r * n for r, n in rows))
            latency = batcher.queue_wait
            wait.add_metric(names, [(floatToGoString(b), n) for b, n in latency.cumulative()],
                            latency.ns / 1e9)
            for phase, latency in batcher.host.items():
                host.add_metric([*names, phase], latency.ns / 1e9)
        yield from gauges.values()
        yield from (expired, gone, batch, wait, host)
