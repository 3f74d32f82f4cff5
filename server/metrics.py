"""Prometheus metrics of a `tinyhal-serve` process (`GET /metrics`).

Device memory is read from `Allocator.statistics()` at scrape time (exact, no polling):

    tinyhal_device_memory_peak_bytes{device}         peak live bytes, all heaps together
    tinyhal_device_memory_live_bytes{device}         live bytes now, all heaps together
    tinyhal_device_heap_peak_bytes{device,heap}      per heap ("device", "host", "transient")
    tinyhal_device_heap_live_bytes{device,heap}
    tinyhal_device_heap_allocated_bytes_total{device,heap}
    tinyhal_device_heap_allocations_total{device,heap}

Per model version (what one pod needs per model, which the device-wide peak cannot say):

    tinyhal_model_memory_peak_bytes{model,version,device}  most device memory one
        invocation held, transients included (see memory.py)
    tinyhal_model_parameter_bytes{model,version,device}       memory holding the
    tinyhal_model_parameter_peak_bytes{model,version,device}  version's external
        parameters (io_parameters; loaded once, not part of any invocation's peak)

Request series are not prometheus_client metric objects: `ModelSeries` keeps plain
counts and `stats.Latency` buckets, recorded once per request together with the Triton
statistics (one list of phases, `stats.PHASES`), and turned into counter and histogram
families only when scraped (a prometheus_client `Histogram.observe` walks its buckets in
Python under a lock: about 1 us, against 0.3 us for `Latency.add`).

The device-wide figures are separate metrics (not a heap="all" label) so that summing the
per-heap series never double-counts. Peaks are since start (the allocator's own peaks).

Requests and models:

    tinyhal_inference_requests_total{model,version,code}       by HTTP status code
    tinyhal_inference_request_duration_seconds{model,version}  end to end (histogram)
    tinyhal_inference_queue_duration_seconds{model,version}    waiting for a slot / a batch
    tinyhal_inference_compute_input_duration_seconds{model,version}   decoding the request
    tinyhal_inference_compute_infer_duration_seconds{model,version}   the invocation
    tinyhal_inference_compute_output_duration_seconds{model,version}  building the response
        (the four phases of a successful request, as histograms: p99 aggregates across
        replicas)
    tinyhal_inference_count_total{model,version}               inferences (batch rows)
    tinyhal_inference_exec_count_total{model,version}          invocations; with dynamic
        batching inference_count / exec_count is the average batch size
    tinyhal_inference_in_flight{model,version}                 invocations running
    tinyhal_inference_queued{model,version}                    requests waiting for a slot
    tinyhal_inference_detached{model,version}                  running after their 504
    tinyhal_model_info{model,version,function,device,execution}  1 per loaded version
    tinyhal_model_ready{model,version}                         1 ready, 0 not
    tinyhal_model_load_seconds{model,version}
    tinyhal_server_draining                                    1 after SIGTERM

Bytes held on behalf of clients (budget.py):

    tinyhal_client_memory_held_bytes    now
    tinyhal_client_memory_peak_bytes    most at once since start
    tinyhal_client_memory_limit_bytes   --client-memory-limit
    tinyhal_client_memory_refused_total requests refused with 503 for it

Sequence-batched models add live sequences, state slots and their bytes, the sequences
per execution and where an execution's host time goes (`sequences.SequenceCollector`).
"""

from __future__ import annotations

import math
from array import array
from typing import TYPE_CHECKING, Any

import numpy as np
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString

from .sequences import SequenceCollector
from .stats import PHASES, Latency, ModelStatistics, fold_latencies

if TYPE_CHECKING:
    from .app import Server

__all__ = ["Metrics", "ModelSeries"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)
_PHASE_HELP = {
    "queue": "Time an admitted request waited for a slot",
    "compute_input": "Time decoding a request into arrays",
    "compute_infer": "Time of the invocation (with batching, the batch's)",
    "compute_output": "Time building a response",
}


class _StateCollector:
    """Gauges read from live server state at scrape time."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        server = self.server
        peak = GaugeMetricFamily("tinyhal_device_memory_peak_bytes",
                                 "Peak live bytes of the device allocator, all heaps",
                                 labels=["device"])
        live = GaugeMetricFamily("tinyhal_device_memory_live_bytes",
                                 "Live bytes of the device allocator, all heaps",
                                 labels=["device"])
        heap_peak = GaugeMetricFamily("tinyhal_device_heap_peak_bytes",
                                      "Peak live bytes of one device heap",
                                      labels=["device", "heap"])
        heap_live = GaugeMetricFamily("tinyhal_device_heap_live_bytes",
                                      "Live bytes of one device heap", labels=["device", "heap"])
        heap_alloc = CounterMetricFamily("tinyhal_device_heap_allocated_bytes",
                                         "Bytes ever allocated from one device heap",
                                         labels=["device", "heap"])
        heap_count = CounterMetricFamily("tinyhal_device_heap_allocations",
                                         "Allocations ever made from one device heap",
                                         labels=["device", "heap"])
        memory = server.repository.memory
        for name, device in list(server.repository.devices.items()):
            stats = device.allocator.statistics()
            peak_bytes, heap_peaks = memory.device_peaks(name, stats)
            peak.add_metric([name], peak_bytes)
            live.add_metric([name], stats.live_bytes)
            for heap, h in stats.heaps.items():
                heap_peak.add_metric([name, heap], heap_peaks[heap])
                heap_live.add_metric([name, heap], h.live_bytes)
                heap_alloc.add_metric([name, heap], h.allocated_bytes)
                heap_count.add_metric([name, heap], h.allocation_count)
        yield from (peak, live, heap_peak, heap_live, heap_alloc, heap_count)

        in_flight = GaugeMetricFamily("tinyhal_inference_in_flight",
                                      "Invocations running", labels=["model", "version"])
        queued = GaugeMetricFamily("tinyhal_inference_queued",
                                   "Requests waiting for a concurrency slot",
                                   labels=["model", "version"])
        detached = GaugeMetricFamily("tinyhal_inference_detached",
                                     "Invocations still running after their request got 504",
                                     labels=["model", "version"])
        info = GaugeMetricFamily("tinyhal_model_info", "A loaded model version",
                                 labels=["model", "version", "function", "device", "execution"])
        ready = GaugeMetricFamily("tinyhal_model_ready", "1 when the model version is ready",
                                  labels=["model", "version"])
        model_peak = GaugeMetricFamily(
            "tinyhal_model_memory_peak_bytes",
            "Most device memory one invocation of the model version held (transients "
            "included; invocations that ran alone on their device)",
            labels=["model", "version", "device"])
        parameters = GaugeMetricFamily(
            "tinyhal_model_parameter_bytes",
            "Memory holding the model version's external parameters now",
            labels=["model", "version", "device"])
        parameters_peak = GaugeMetricFamily(
            "tinyhal_model_parameter_peak_bytes",
            "Most memory the model version's external parameters held",
            labels=["model", "version", "device"])
        load = GaugeMetricFamily("tinyhal_model_load_seconds",
                                 "Seconds the model version took to load",
                                 labels=["model", "version"])
        for mv in server.repository.all_versions():
            labels = [mv.name, mv.version]
            ready.add_metric(labels, 1 if mv.ready else 0)
            if mv.peak_invocation_bytes is not None:
                model_peak.add_metric([*labels, mv.device_name], mv.peak_invocation_bytes)
            if mv.scheduler is not None:
                st = mv.scheduler.statistics()
                in_flight.add_metric(labels, st.running)
                queued.add_metric(labels, st.queued)
                detached.add_metric(labels, st.detached)
            if mv.ready:
                info.add_metric([mv.name, mv.version, mv.function, mv.device_name,
                                 mv.execution], 1)
                held = mv.module.parameter_statistics()
                if held is not None:
                    parameters.add_metric([*labels, mv.device_name], held.live_bytes)
                    parameters_peak.add_metric([*labels, mv.device_name], held.peak_bytes)
                load.add_metric(labels, mv.load_seconds)
        draining = GaugeMetricFamily("tinyhal_server_draining",
                                     "1 once the server is draining (SIGTERM)")
        draining.add_metric([], 1 if server.draining else 0)
        budget = server.budget
        yield GaugeMetricFamily("tinyhal_client_memory_held_bytes",
                                "Bytes held for clients now (bodies, inflated bodies, parsed "
                                "tensors, unread answers)", value=budget.held)
        yield GaugeMetricFamily("tinyhal_client_memory_peak_bytes",
                                "Most bytes held for clients at once", value=budget.peak)
        yield GaugeMetricFamily("tinyhal_client_memory_limit_bytes",
                                "The budget for bytes held for clients (--client-memory-limit)",
                                value=budget.limit)
        yield CounterMetricFamily("tinyhal_client_memory_refused",
                                  "Requests refused (503) because the client memory budget "
                                  "could not take them", value=budget.refused)
        yield from (in_flight, queued, detached, info, ready, load, draining, model_peak,
                    parameters, parameters_peak)


class ModelSeries:
    """One model version's request series, and the one place a finished request is
    recorded: `finished` counts it by status and times it end to end; `succeeded` and
    `failed` also record it into the version's Triton statistics (stats.py), each of the
    `PHASES` of a success once into both.

    A success costs appending its durations to a flat array: they are folded into the
    histograms and statistics in one array pass over all of them (`fold`,
    `stats.fold_latencies`) every `_FOLD_ROWS` successes and whenever they are read
    (`Metrics.fold`, before a scrape or a statistics answer), so a reader always sees
    every request answered before it. A fold of 512 takes about 0.1 ms of the loop (one
    `Latency` pass each took 0.3 ms for 256: a stall every request in flight felt)."""

    __slots__ = ("by_code", "failures", "success_ns", "duration", "phases", "_rows",
                 "_rows_stats", "_counted", "_earlier", "_retired")

    def __init__(self) -> None:
        self.by_code: dict[int, int] = {200: 0}  # exposed at zero before the first request
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)  # Triton's reasons
        # nanoseconds of the successes, end to end then by phase (`PHASES`)
        self.success_ns = [0] * (1 + len(PHASES))
        self.duration = Latency(_LATENCY_BUCKETS)
        self.phases = tuple(Latency(_LATENCY_BUCKETS) for _ in PHASES)
        self._rows = array("d")  # (seconds, *phases) of each unfolded success, flat
        self._rows_stats: ModelStatistics | None = None  # the statistics they go into
        # the executions counted: the loaded version's statistics, the one it replaced
        # (whose detached executions may still end) and the sum of those before
        self._counted: ModelStatistics | None = None
        self._earlier: ModelStatistics | None = None
        self._retired = (0, 0)

    def count_from(self, stats: ModelStatistics) -> None:
        """Counts the executions of a version (re)loaded under this series' labels on top
        of those counted before: its statistics start from zero, as Triton's, while the
        series' counters never go down in the life of the process."""
        if stats is self._counted:
            return
        earlier = self._earlier
        if earlier is not None:
            self._retired = (self._retired[0] + earlier.inference_count,
                             self._retired[1] + earlier.execution_count)
        self._earlier, self._counted = self._counted, stats

    def executions(self) -> tuple[int, int]:
        """(inferences, executions) under these labels since the process started."""
        inferences, executions = self._retired
        for stats in (self._earlier, self._counted):
            if stats is not None:
                inferences += stats.inference_count
                executions += stats.execution_count
        return inferences, executions

    def finished(self, status: int, seconds: float) -> None:
        """A request answered before it reached the model (counted by status only)."""
        self.by_code[status] = self.by_code.get(status, 0) + 1
        self.duration.add(seconds)

    def succeeded(self, stats: ModelStatistics, phases: tuple[float, ...], seconds: float
                  ) -> None:
        """A 200: `phases` in the order of `PHASES`, `seconds` end to end."""
        if stats is not self._rows_stats:
            self.fold()  # another version's statistics (it was reloaded)
            self._rows_stats = stats
        rows = self._rows
        rows.append(seconds)
        rows.extend(phases)
        if len(rows) >= _FOLD_VALUES:
            self.fold()

    def failed(self, stats: ModelStatistics, status: int, seconds: float, reason: str
               ) -> None:
        """A request the model version admitted and did not answer 200, for `reason`
        (one of `FAILURE_REASONS`)."""
        self.finished(status, seconds)
        stats.fail.add(seconds)
        self.failures[reason] += 1

    def fold(self) -> None:
        """Records the successes kept as rows into the histograms and statistics."""
        rows, self._rows = self._rows, array("d")
        if not rows:
            return
        table = np.frombuffer(rows, np.float64).reshape(-1, 1 + len(PHASES))
        count = len(table)
        ns, buckets = fold_latencies(table, _LATENCY_BUCKETS)
        stats = self._rows_stats
        self.by_code[200] = self.by_code.get(200, 0) + count
        self.success_ns = [a + b for a, b in zip(self.success_ns, ns)]
        for i, (histogram, latency) in enumerate(zip((self.duration, *self.phases),
                                                     (stats.success, *stats.phase_list))):
            histogram.add_counts(count, ns[i], buckets[i])
            latency.add_counts(count, ns[i])


_FOLD_ROWS = 512
_FOLD_VALUES = _FOLD_ROWS * (1 + len(PHASES))


class Metrics:
    """The registry of one server (not the process-global one). Request series are plain
    counters (`ModelSeries`) turned into Prometheus families at scrape time.

    A scrape's cost grows with the models served (about 0.7 s of interpreter time for
    1,000 model versions: 9 MB of text), so `scrape` renders away from the event loop, on
    a worker thread, and bounds what scrapes cost together: one render at a time, and a
    render begins at the earliest `_RENDER_SPACING` times the last one's duration after
    that one began, so rendering takes at most a fifth of the interpreter however many
    clients scrape. A scrape that arrives sooner waits for that render when the wait is
    at most `_RENDER_WAIT` (a server whose render takes under 400 ms, hundreds of models,
    even on a loaded machine, always answers a scrape with a render begun after it
    arrived, which counts every request answered before it), and is answered with the
    last render otherwise (a larger server's scrapes are then at most `_RENDER_SPACING`
    render durations old)."""

    def __init__(self, server: Server) -> None:
        self._series: dict[tuple[str, str], ModelSeries] = {}
        self._unknown_model: dict[int, int] = {}
        self._render_lock = trio.Lock()
        self._rendered = b""
        self._render_began = -math.inf  # trio clock
        self._render_seconds = 0.0
        self.renders = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(server))
        self.registry.register(_RequestCollector(self))
        self.registry.register(SequenceCollector(lambda: server.repository.all_versions()))
        self._server = server

    def series(self, model: str, version: str) -> ModelSeries:
        """The series of one model version, created at zero on first use."""
        key = (model, version)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = ModelSeries()
        return found

    def fold(self) -> None:
        """Brings every series' histograms and the versions' statistics up to date (see
        `ModelSeries`): called before they are read."""
        for series in list(self._series.values()):
            series.fold()

    def unknown_model(self, status: int) -> None:
        """A request for a model or version that does not exist: counted under empty
        labels (names from requests are not labels)."""
        self._unknown_model[status] = self._unknown_model.get(status, 0) + 1

    def _render(self) -> bytes:
        from prometheus_client import generate_latest

        for _ in range(_RENDER_TRIES):
            try:
                return generate_latest(self.registry) + self._triton_families()
            except RuntimeError:  # a dict of the server's changed while it was read
                continue
        return generate_latest(self.registry) + self._triton_families()

    def _triton_families(self) -> bytes:
        """Triton's request metrics under its own names and labels (`nv_inference_*`,
        counters without a `_total` suffix, as Triton's exposition writes them), from the
        same series as ours: dashboards, alerts and tests written against Triton read
        them unchanged. Written here rather than through prometheus_client, which would
        append `_total` to every counter's name."""
        series = dict(self._series)
        pending = {}
        for mv in self._server.repository.all_versions():
            if mv.scheduler is not None:
                pending[(mv.name, mv.version)] = mv.scheduler.statistics().queued
        rows: dict[str, list[str]] = {name: [] for name, _, _ in _TRITON_FAMILIES}
        for (model, version), s in series.items():
            labels = f'model="{_label(model)}",version="{_label(version)}"'
            rows["nv_inference_request_success"].append(f"{{{labels}}} {s.by_code[200]}")
            failure = rows["nv_inference_request_failure"]
            for reason, n in s.failures.items():
                failure.append(f'{{model="{_label(model)}",reason="{reason}",'
                               f'version="{_label(version)}"}} {n}')
            inferences, executions = s.executions()
            rows["nv_inference_count"].append(f"{{{labels}}} {inferences}")
            rows["nv_inference_exec_count"].append(f"{{{labels}}} {executions}")
            for name, ns in zip(_TRITON_DURATIONS, s.success_ns):
                rows[name].append(f"{{{labels}}} {ns // 1000}")
            rows["nv_inference_pending_request_count"].append(
                f"{{{labels}}} {pending.get((model, version), 0)}")
        out = []
        for name, kind, documentation in _TRITON_FAMILIES:
            out.append(f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n")
            out.extend(f"{name}{row}\n" for row in rows[name])
        return "".join(out).encode()

    async def scrape(self) -> bytes:
        """The exposition for a scrape that arrives now (see the class)."""
        arrived = trio.current_time()
        async with self._render_lock:
            if self._render_began >= arrived:
                return self._rendered
            allowed = self._render_began + _RENDER_SPACING * self._render_seconds
            if allowed - trio.current_time() > _RENDER_WAIT:
                return self._rendered
            await trio.sleep_until(allowed)
            began = trio.current_time()
            self.fold()  # on the loop: requests append their rows here
            self._rendered = await trio.to_thread.run_sync(self._render)
            self._render_began = began
            self._render_seconds = trio.current_time() - began
            self.renders += 1
            return self._rendered


# Triton's failure reasons (its `nv_inference_request_failure` label), each series made
# at zero (the app says which a failed request's is)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# Triton's request metric families: (name, type, help), the durations in the order of
# `ModelSeries.success_ns`
_TRITON_DURATIONS = ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_input_duration_us",
                     "nv_inference_compute_infer_duration_us",
                     "nv_inference_compute_output_duration_us")
_TRITON_FAMILIES = (
    ("nv_inference_request_success", "counter", "Inference requests answered 200"),
    ("nv_inference_request_failure", "counter",
     "Inference requests a model version took and failed, by reason"),
    ("nv_inference_count", "counter", "Inferences served (batch rows)"),
    ("nv_inference_exec_count", "counter", "Invocations of the program (one per batch)"),
    *((name, "counter", f"Microseconds of successful requests, {what}") for name, what in
      zip(_TRITON_DURATIONS, ("end to end", "queued", "decoding the request",
                              "in the invocation", "building the response"))),
    ("nv_inference_pending_request_count", "gauge",
     "Requests admitted and waiting for an execution"),
)


def _label(value: str) -> str:
    """A label value as the exposition format escapes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


_RENDER_SPACING = 5.0
_RENDER_WAIT = 2.0  # well inside Prometheus' default 10 s scrape timeout
_RENDER_TRIES = 3


def _histogram(name: str, documentation: str, series: dict[tuple[str, str], ModelSeries],
               pick: Any) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=["model", "version"])
    for labels, s in series.items():
        latency: Latency = pick(s)
        buckets = [(floatToGoString(bound), n) for bound, n in latency.cumulative()]
        family.add_metric(list(labels), buckets, latency.ns / 1e9)
    return family


class _RequestCollector:
    """The request series of every model version, read at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        series = dict(self.metrics._series)
        requests = CounterMetricFamily("tinyhal_inference_requests",
                                       "Inference requests by status",
                                       labels=["model", "version", "code"])
        for (model, version), s in series.items():
            for code, n in sorted(s.by_code.items()):
                requests.add_metric([model, version, str(code)], n)
        for code, n in sorted(self.metrics._unknown_model.items()):
            requests.add_metric(["", "", str(code)], n)
        yield requests
        inferences = CounterMetricFamily("tinyhal_inference_count",
                                         "Inferences served (batch rows)",
                                         labels=["model", "version"])
        executions = CounterMetricFamily("tinyhal_inference_exec_count",
                                         "Invocations of the program (one per batch)",
                                         labels=["model", "version"])
        for labels, s in series.items():
            counts = s.executions()
            inferences.add_metric(list(labels), counts[0])
            executions.add_metric(list(labels), counts[1])
        yield from (inferences, executions)
        yield _histogram("tinyhal_inference_request_duration_seconds",
                         "Inference request latency, end to end", series,
                         lambda s: s.duration)
        for i, phase in enumerate(PHASES):
            yield _histogram(f"tinyhal_inference_{phase}_duration_seconds",
                             _PHASE_HELP[phase], series, lambda s, i=i: s.phases[i])
