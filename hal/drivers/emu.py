"""The `emu` driver: an emulated accelerator for hardware research.

Kernels run for real on the host CPU (results are exact); time is modelled. What it
models:

- **Its own memory.** The "device" heap is DEVICE_LOCAL only: the host cannot map it.
  Its capacity (`memory_size`) bounds the device heap plus the live transient
  (`queue_alloca`) bytes; past it allocation fails with RESOURCE_EXHAUSTED.
  Host-visible memory comes from the "host" heap; data moves by DMA (queue transfers).
- **Queues.** `queues` command processors, one thread each. A submission goes to the
  queue named by the `queue=` argument of `submit` / `queue_*` (default 0). A queue
  runs its submissions one after another; different queues run at once.
- **Engines.** `dma_engines` DMA engines (fill/update/copy) and a compute engine of
  `compute_units` units (dispatches), each engine served by its own worker threads, so
  a transfer and a dispatch with no barrier between them (or on two queues) overlap in
  modelled time and in wall time. A barrier joins everything before it.
- **A cost model** (`CostModel`, from a preset plus overrides): a transfer costs
  `dma_latency + bytes / dma_bandwidth`; a dispatch `launch_latency + waves *
  per-workgroup cost` (waves = workgroups over the units it occupies; per-workgroup cost
  from `export_costs[name]` or `workgroup_time`), never less than its bound bytes over
  `memory_bandwidth` (a roofline). A submission starts at the later of its queue's
  modelled clock and the modelled times its waits were signalled (by this device).
- **Modes.** `mode="fast"` runs as fast as the host can while keeping modelled time:
  an item for an idle queue runs on the thread that made it ready (as `sync` runs it),
  and transfers and small dispatches run on the command processor's thread rather than
  an engine's, so only large dispatches use the engines' threads; `mode="paced"` makes
  each operation take its modelled time in wall time too, every operation on its
  engine.
- **Calibration.** `calibrate=True` runs each dispatch on one host thread and measures
  its CPU time; `fit_calibration()` fits per-export per-workgroup costs to the measurements and
  `calibration_report()` compares prediction with measurement per dispatch.
- **Faults.** `inject_fault(kind, after, error, export=, queue=)` fails the (after+1)-th
  matching operation; kind `"device_loss"` (or `lose_device()`) loses the device: every
  pending and later operation fails with `DeviceLostError` (UNAVAILABLE), every waiter
  wakes.
- **Results.** `trace()` (every operation with engine, queue, modelled start and
  duration), `summary()` (modelled total, per-engine utilisation, bytes moved, peak
  memory, calibration error), spans into an attached `hal.profile.Profile` in device
  time (dispatch-events / device-queue-events) and host time (host-execution).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import math
import os
import queue as queue_module
import statistics
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ...errors import (
    DeviceLostError,
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
)
from ..allocator import Allocator, Heap
from ..buffer import Buffer
from ..device import Device
from ..execution import Barrier, Dispatch, Operation, Submission, run_transfer
from ..profile import DEVICE, HOST
from ..queue import DEFAULT_PROFILING_MODES, Completion, Driver, run_capturing
from ..ringbuffer import HEAP_NAME as TRANSIENT_HEAP
from ..types import BufferUsage, MemoryAccess, MemoryType

_ALL_USAGE = BufferUsage(0x1FFFFFFF)
MODES = ("fast", "paced")
# In fast mode, transfers and dispatches of at most this many workgroups run on the
# command processor's thread: a hand-off to an engine thread costs more than they do.
INLINE_WORKGROUPS = 4
FAULT_KINDS = ("fill", "update", "copy", "transfer", "dispatch", "any", "device_loss")


@dataclass(frozen=True)
class CostModel:
    """The modelled device. Times in seconds, bandwidths in bytes per second.

    `memory_bandwidth` 0 means unbounded (no roofline); `export_costs` maps an export
    name to its per-workgroup time, overriding `workgroup_time` for that export.
    """

    memory_size: int = 1 << 30
    memory_bandwidth: float = 0.0
    dma_engines: int = 1
    dma_bandwidth: float = 16e9
    dma_latency: float = 2e-6
    launch_latency: float = 5e-6
    compute_units: int = 8
    workgroup_time: float = 1e-7
    export_costs: dict[str, float] = field(default_factory=dict)

    def validate(self) -> None:
        for name in ("memory_size", "dma_engines", "dma_bandwidth", "compute_units"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgumentError(f"emu option {name} must be positive, not {value!r}")
        for name in ("memory_bandwidth", "dma_latency", "launch_latency", "workgroup_time"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise InvalidArgumentError(f"emu option {name} must be >= 0, not {value!r}")
        for name in ("dma_engines", "compute_units", "memory_size"):
            if not isinstance(getattr(self, name), int):
                raise InvalidArgumentError(f"emu option {name} must be an int")
        for name, cost in self.export_costs.items():
            if not isinstance(cost, (int, float)) or cost < 0:
                raise InvalidArgumentError(f"emu export cost of {name!r} must be >= 0")

    def transfer_ns(self, size: int) -> int:
        return round(self.dma_latency * 1e9) + round(size * 1e9 / self.dma_bandwidth)

    def dispatch_ns(self, export: str, workgroups: int, units: int, bound_bytes: int) -> int:
        per_workgroup = self.export_costs.get(export, self.workgroup_time)
        waves = math.ceil(workgroups / units) if units else 0
        compute = waves * per_workgroup * 1e9
        memory = bound_bytes * 1e9 / self.memory_bandwidth if self.memory_bandwidth else 0.0
        return round(self.launch_latency * 1e9) + round(max(compute, memory))


PRESETS: dict[str, CostModel] = {
    # The defaults (what `emu` was before presets): a generic accelerator.
    "generic": CostModel(),
    # A microcontroller-class NPU: little SRAM, one slow DMA, few units.
    "mcu-npu": CostModel(memory_size=8 << 20, memory_bandwidth=2e9, dma_engines=1,
                         dma_bandwidth=400e6, dma_latency=5e-6, launch_latency=20e-6,
                         compute_units=2, workgroup_time=4e-6),
    # An edge NPU (phone / embedded SoC class): shared LPDDR, two DMA engines.
    "edge-npu": CostModel(memory_size=512 << 20, memory_bandwidth=25e9, dma_engines=2,
                          dma_bandwidth=8e9, dma_latency=2e-6, launch_latency=8e-6,
                          compute_units=16, workgroup_time=1e-6),
    # A datacenter-class accelerator: HBM, many DMA engines and units.
    "datacenter": CostModel(memory_size=16 << 30, memory_bandwidth=2e12, dma_engines=4,
                            dma_bandwidth=50e9, dma_latency=1e-6, launch_latency=3e-6,
                            compute_units=128, workgroup_time=2e-7),
}
"""Named cost models. The figures are illustrative of each class of device, not any
product's datasheet; override any field with the option of the same name."""


@dataclass(frozen=True)
class TraceEvent:
    """One operation as the emulated device ran it, in modelled nanoseconds.

    `engine` is "compute" or "dma<i>"; `units` how many compute units a dispatch took.
    """

    name: str
    engine: str
    start_ns: int
    duration_ns: int
    size: int
    queue: int = 0
    units: int = 0
    host_ns: int = 0


@dataclass(frozen=True)
class DispatchSample:
    """One dispatch measured in calibration mode, run on one host thread: `measured_ns`
    is that thread's CPU time (what the kernels cost, not what other processes on a
    shared host took from it), `wall_ns` the wall time."""

    export: str
    workgroups: int
    measured_ns: int
    wall_ns: int = 0


@dataclass(frozen=True)
class CalibrationReport:
    """Predicted against measured host time per dispatch, and the relative errors."""

    rows: list[tuple[str, int, int, int, float]]  # export, workgroups, predicted, measured, err
    mean_abs_error: float
    median_abs_error: float
    max_abs_error: float
    total_error: float  # |sum predicted - sum measured| / sum measured

    def format(self) -> str:
        return (f"calibration: {len(self.rows)} dispatches, per-dispatch |error| mean "
                f"{self.mean_abs_error:.1%}, median {self.median_abs_error:.1%}, max "
                f"{self.max_abs_error:.1%}; total {self.total_error:.1%}")


@dataclass(frozen=True)
class EmuSummary:
    """One run at a glance (modelled times in nanoseconds)."""

    preset: str
    modelled_ns: int
    wall_ns: int
    utilisation: dict[str, float]
    busy_ns: dict[str, int]
    dispatches: int
    transfers: int
    bytes_moved: int
    peak_device_bytes: int
    memory_size: int
    calibration_error: float | None

    def format(self) -> str:
        lines = [f"emu ({self.preset}): modelled {self.modelled_ns / 1e6:.3f} ms, wall "
                 f"{self.wall_ns / 1e6:.3f} ms, {self.dispatches} dispatches, "
                 f"{self.transfers} transfers, {self.bytes_moved} bytes moved",
                 f"  peak device memory {self.peak_device_bytes} of {self.memory_size} bytes"]
        for engine, share in self.utilisation.items():
            lines.append(f"  {engine:<10} {share:6.1%} busy ({self.busy_ns[engine] / 1e6:.3f} ms)")
        if self.calibration_error is not None:
            lines.append(f"  calibration: mean per-dispatch |error| {self.calibration_error:.1%}")
        return "\n".join(lines) + "\n"


class EmuAllocator(Allocator):
    """Allocator whose device memory (device heap + live transients) has a capacity
    and is not host-visible. `device_live` / `device_peak` count both."""

    def __init__(self, device_name: str, memory_size: int) -> None:
        super().__init__(device_name, [
            Heap("device", MemoryType.OPTIMAL | MemoryType.DEVICE_LOCAL, _ALL_USAGE, memory_size),
            Heap("host", MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE, _ALL_USAGE,
                 1 << 40),
        ])
        self.memory_size = memory_size
        self.device_live = 0
        self.device_peak = 0
        self._capacity_lock = threading.Lock()  # one allocation's check-and-take
        self._counter_lock = threading.Lock()  # a leaf: taken under the ring's lock too

    def allocate(self, size: int, memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                 usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
                 access: MemoryAccess = MemoryAccess.ALL, initial: Any = None) -> Buffer:
        heap = self.select_heap(memory_type)
        if heap.name == "device":
            with self._capacity_lock:
                self.check_capacity(size)
                return super().allocate(size, memory_type, usage, access, initial)
        return super().allocate(size, memory_type, usage, access, initial)

    def check_capacity(self, size: int) -> None:
        """Raises RESOURCE_EXHAUSTED if `size` more device bytes would not fit."""
        if isinstance(size, int) and self.device_live + size > self.memory_size:
            raise ResourceExhaustedError(
                f"emulated device memory exhausted: {self.device_live} of {self.memory_size} "
                f"bytes live, {size} more requested")

    def track(self, heap: str, delta: int) -> None:
        if heap in ("device", TRANSIENT_HEAP):
            with self._counter_lock:
                self.device_live += delta
                self.device_peak = max(self.device_peak, self.device_live)
        super().track(heap, delta)


class _Batch:
    """The operations of one submission in flight on the engines."""

    def __init__(self) -> None:
        self.outstanding = 0
        self.error: Error | None = None
        self.cond = threading.Condition()

    def add(self) -> None:
        with self.cond:
            self.outstanding += 1

    def finish(self, error: Error | None) -> None:
        with self.cond:
            if error is not None and self.error is None:
                self.error = error
            self.outstanding -= 1
            if not self.outstanding:
                self.cond.notify_all()

    def join(self) -> Error | None:
        with self.cond:
            while self.outstanding:
                self.cond.wait()
            return self.error


class _Job:
    """One operation handed to an engine's workers."""

    __slots__ = ("op", "batch", "queue", "not_before", "not_until", "left", "lock",
                 "error", "host_start", "event", "calibrate", "seq", "submission_id")

    def __init__(self, op: Operation, batch: _Batch, queue: int, not_before: int,
                 not_until: int, workers: int, event: TraceEvent, calibrate: bool) -> None:
        self.op = op
        self.batch = batch
        self.queue = queue
        self.not_before = not_before
        self.not_until = not_until
        self.left = workers
        self.lock = threading.Lock()
        self.error: Error | None = None
        self.host_start = 0
        self.event = event
        self.calibrate = calibrate
        self.seq = 0
        self.submission_id = 0


def _sleep_until(deadline_ns: int) -> None:
    while True:
        left = deadline_ns - time.monotonic_ns()
        if left <= 0:
            return
        time.sleep(left / 1e9)


class EmuDriver(Driver):
    """How an `EmuDevice` plugs into its queue: submissions and host work go to the
    queue's command processor (`queue`), an alloca checks the modelled memory first."""

    name = "emu"
    identifier = "local-emu"
    places_ready_allocas = False  # each alloca checks the modelled memory's capacity
    default_profiling_modes = DEFAULT_PROFILING_MODES + ("dispatch-events",
                                                         "device-queue-events")

    def __init__(self, device: EmuDevice, queue_count: int) -> None:
        self.device = device
        self.queue_count = queue_count

    def create_allocator(self) -> Allocator:
        return EmuAllocator(self.identifier, self.device.memory_size)

    def perform(self, operation: str, payload: Any, done: Completion, submission_id: int,
                wait: Any, signal: Any, queue: int) -> None:
        if operation == "execute":
            self.device._enqueue((wait, signal, queue), (payload, submission_id), done)
        elif operation == "call":
            self.device._enqueue((wait, signal, queue), payload, done)
        elif operation == "alloca":
            try:
                # As the ring counts it: rounded up to its 64-byte blocks.
                self.device.allocator.check_capacity((payload.size + 63) & ~63)
            except Error as exc:
                done(exc)
                return
            payload(done)
        else:
            payload(done)

    def stop(self, timeout: float | None) -> None:
        self.device._stop_threads(timeout)


class EmuDevice(Device):
    def __init__(self, preset: str = "generic", *, queues: int = 1, mode: str = "fast",
                 memory_size: int | None = None, memory_bandwidth: float | None = None,
                 dma_engines: int | None = None, dma_bandwidth: float | None = None,
                 dma_latency: float | None = None, launch_latency: float | None = None,
                 compute_units: int | None = None, workgroup_time: float | None = None,
                 export_costs: dict[str, float] | None = None, calibrate: bool = False,
                 host_workers: int | None = None, trace_capacity: int = 100_000,
                 **options: Any) -> None:
        if preset not in PRESETS:
            raise InvalidArgumentError(
                f"unknown emu preset {preset!r}; presets: {', '.join(PRESETS)}")
        overrides = {k: v for k, v in (
            ("memory_size", memory_size), ("memory_bandwidth", memory_bandwidth),
            ("dma_engines", dma_engines), ("dma_bandwidth", dma_bandwidth),
            ("dma_latency", dma_latency), ("launch_latency", launch_latency),
            ("compute_units", compute_units), ("workgroup_time", workgroup_time))
            if v is not None}
        model = replace(PRESETS[preset], **overrides)
        if export_costs is not None:
            if not isinstance(export_costs, dict):
                raise InvalidArgumentError("emu option export_costs must be a dict")
            model = replace(model, export_costs={**model.export_costs, **export_costs})
        model.validate()
        if not isinstance(queues, int) or not 1 <= queues <= 64:
            raise InvalidArgumentError(f"emu option queues must be an int in [1, 64], not {queues!r}")
        if mode not in MODES:
            raise InvalidArgumentError(f"emu option mode must be one of {MODES}, not {mode!r}")
        if host_workers is not None and (not isinstance(host_workers, int) or host_workers < 1):
            raise InvalidArgumentError("emu option host_workers must be an int >= 1")
        self.preset = preset
        self.model = model
        self.memory_size = model.memory_size
        self.mode = mode
        self.calibrating = bool(calibrate)
        self._queue_count = queues
        super().__init__(EmuDriver(self, queues), **options)
        self.clock_ns = 0
        self._lock = threading.Lock()
        self._queue_clock = [0] * queues
        self._dma_free = [0] * model.dma_engines
        self._unit_free = [0] * model.compute_units
        self._busy: dict[str, int] = {}
        self._bytes_moved = 0
        self._dispatch_count = 0
        self._transfer_count = 0
        self._trace: list[tuple[int, TraceEvent, int]] = []  # (seq, event, host ns)
        self._issued = itertools.count()
        self._trace_capacity = trace_capacity
        self._faults: list[list[Any]] = []
        self._signal_times: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._samples: list[DispatchSample] = []
        self._calibration_error: float | None = None
        self._wall_begin = 0
        self._wall_end = 0
        self._threads: list[threading.Thread] = []
        self._command_queues = [queue_module.SimpleQueue() for _ in range(queues)]
        # Per queue: items accepted and not yet done, and a lock held while one runs, so
        # that in fast mode an idle queue's item can run on the thread that made it ready
        # (as sync does) and still strictly before the queue's next.
        self._queue_pending = [0] * queues
        self._queue_running = [threading.Lock() for _ in range(queues)]
        for q, cq in enumerate(self._command_queues):
            self._spawn(self._command_processor, cq, f"tinyhal-emu-cp{q}")
        self._dma_queues = [queue_module.SimpleQueue() for _ in range(model.dma_engines)]
        for i, dq in enumerate(self._dma_queues):
            self._spawn(self._dma_worker, dq, f"tinyhal-emu-dma{i}")
        workers = host_workers or max(1, min(model.compute_units, os.cpu_count() or 1))
        self._compute_queues = [queue_module.SimpleQueue() for _ in range(workers)]
        for i, wq in enumerate(self._compute_queues):
            self._spawn(self._compute_worker, wq, f"tinyhal-emu-cu{i}", i)
        self.driver.concurrency = len(self._compute_queues)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        name = args[1]
        thread = threading.Thread(target=target, args=(args[0],) + args[2:], name=name,
                                  daemon=True)
        thread.start()
        self._threads.append(thread)

    def __repr__(self) -> str:
        return f"<Device {self.identifier} {self.preset} queues={self._queue_count}>"

    def queue_for_affinity(self, affinity: int) -> int:
        """IREE's accelerator rule (its amdgpu driver): the mask ANDed with the device's
        queues, the first set bit, so ANY (-1) is queue 0. A mask naming none of this
        device's queues (a program placed for more queues than the model has) falls back
        to IREE's CPU rule rather than failing, so every program IREE's CPU devices run
        also runs here."""
        mask = affinity & ((1 << self._queue_count) - 1)
        if not mask:
            return super().queue_for_affinity(affinity)
        return (mask & -mask).bit_length() - 1

    # -- public extras ------------------------------------------------------------------

    def inject_fault(self, kind: str = "dispatch", after: int = 0,
                     error: Error | None = None, export: str | None = None,
                     queue: int | None = None) -> None:
        """Fails the (`after`+1)-th next operation of `kind` (fill, update, copy,
        transfer, dispatch, any, device_loss), optionally only those of export `export`
        or on queue `queue`, with `error` (INTERNAL by default; `DeviceLostError` and a
        lost device for "device_loss")."""
        if kind not in FAULT_KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}; kinds: {FAULT_KINDS}")
        if not isinstance(after, int) or after < 0:
            raise InvalidArgumentError(f"fault `after` must be an int >= 0, not {after!r}")
        if queue is not None and not (isinstance(queue, int) and 0 <= queue < self._queue_count):
            raise InvalidArgumentError(f"fault queue {queue!r} out of range")
        if error is None:
            error = (DeviceLostError("emulated device lost (injected fault)")
                     if kind == "device_loss" else InternalError(f"injected fault in emulated {kind}"))
        with self._lock:
            self._faults.append([kind, after, error, export, queue])

    def lose_device(self, error: Error | None = None) -> None:
        """Loses the device now: pending and later work fails with `error`."""
        self.work_queue.lose(error or DeviceLostError("emulated device lost"))

    def trace(self) -> list[TraceEvent]:
        """The operations run so far, in the order their queues issued them."""
        with self._lock:
            return [replace(event, host_ns=host_ns)
                    for _seq, event, host_ns in sorted(self._trace, key=lambda t: t[0])]

    def export_trace(self, path: str) -> None:
        """Writes the trace as Chrome trace-event JSON (open in Perfetto): one track per
        engine and one per queue (the queue's submissions), in modelled time."""
        events = []
        tids: dict[str, int] = {}
        for e in self.trace():
            for track in (e.engine, f"queue {e.queue}"):
                tid = tids.setdefault(track, len(tids))
                events.append({"name": e.name, "cat": e.engine, "ph": "X", "pid": 0,
                               "tid": tid, "ts": e.start_ns / 1000, "dur": e.duration_ns / 1000,
                               "args": {"size": e.size, "queue": e.queue, "engine": e.engine}})
                if track.startswith("queue"):
                    break
        for track, tid in tids.items():
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                           "args": {"name": track}})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)

    def summary(self) -> EmuSummary:
        """Modelled total, per-engine utilisation, bytes moved, peak device memory."""
        with self._lock:
            total = max(self._queue_clock + [self.clock_ns])
            busy = dict(self._busy)
            units = self.model.compute_units
            util = {}
            busy["compute"] = busy.get("compute", 0) // units  # unit-ns as whole-engine ns
            for engine in [f"dma{i}" for i in range(len(self._dma_free))] + ["compute"]:
                b = busy.setdefault(engine, 0)
                util[engine] = b / total if total else 0.0
            for q in range(self._queue_count):
                b = busy.setdefault(f"queue{q}", 0)
                util[f"queue{q}"] = b / total if total else 0.0
            return EmuSummary(self.preset, total, max(0, self._wall_end - self._wall_begin),
                              util, busy, self._dispatch_count, self._transfer_count,
                              self._bytes_moved, self.allocator.device_peak, self.memory_size,
                              self._calibration_error)

    def calibration_samples(self) -> list[DispatchSample]:
        with self._lock:
            return list(self._samples)

    def fit_calibration(self, samples: list[DispatchSample] | None = None) -> dict[str, float]:
        """Fits each export's per-workgroup cost (seconds) to measured samples (default:
        all so far): the median over its samples of measured time per workgroup (robust
        to a sample the host preempted), and makes the model use it. Returns the costs."""
        samples = self.calibration_samples() if samples is None else samples
        if not samples:
            raise FailedPreconditionError("no calibration samples: create the device with "
                                          "calibrate=True and run dispatches first")
        per_export: dict[str, list[float]] = {}
        for s in samples:
            if s.workgroups:
                per_export.setdefault(s.export, []).append(s.measured_ns / s.workgroups)
        costs = {name: statistics.median(values) / 1e9 for name, values in per_export.items()}
        with self._lock:
            self.model = replace(self.model, export_costs={**self.model.export_costs, **costs})
        return costs

    def calibration_report(self, samples: list[DispatchSample] | None = None) -> CalibrationReport:
        """Predicted (the fitted model, one unit) against measured host time per dispatch."""
        samples = self.calibration_samples() if samples is None else samples
        rows = []
        costs = self.model.export_costs
        for s in samples:
            per = costs.get(s.export, self.model.workgroup_time)
            predicted = int(per * s.workgroups * 1e9)
            err = abs(predicted - s.measured_ns) / s.measured_ns if s.measured_ns else 0.0
            rows.append((s.export, s.workgroups, predicted, s.measured_ns, err))
        if not rows:
            raise FailedPreconditionError("no calibration samples to report on")
        errors = sorted(r[4] for r in rows)
        measured = sum(r[3] for r in rows)
        report = CalibrationReport(rows, sum(errors) / len(errors), errors[len(errors) // 2],
                                   errors[-1], abs(sum(r[2] for r in rows) - measured) / measured)
        self._calibration_error = report.mean_abs_error
        return report

    # -- the command processors' queues --------------------------------------------------

    def _stop_threads(self, timeout: float | None) -> None:
        for q in self._command_queues + self._dma_queues + self._compute_queues:
            q.put(None)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _enqueue(self, context: Any, work: Any, done: Completion) -> None:
        wait, signal, q = context if context is not None else ((), (), 0)
        if not self._wall_begin:
            self._wall_begin = time.monotonic_ns()
        item = (work, done, wait, signal, q)
        running = self._queue_running[q]
        with self._lock:
            inline = (self.mode == "fast" and not self.calibrating
                      and not self._queue_pending[q] and running.acquire(False))
            self._queue_pending[q] += 1
        if inline:
            self._process(item, running)
        else:
            self._command_queues[q].put(item)

    # -- the command processors -----------------------------------------------------------

    def _command_processor(self, commands: queue_module.SimpleQueue) -> None:
        while True:
            item = commands.get()
            if item is None:
                return
            running = self._queue_running[item[4]]
            running.acquire()
            self._process(item, running)
            item = None

    def _process(self, item: tuple, running: threading.Lock) -> None:
        """Runs one queue item, then releases `running` (held by the caller) and calls
        the item's `done`."""
        work, done, wait, signal, q = item
        item = ()
        error = self.work_queue.lost
        if error is None:
            if type(work) is tuple:
                error = run_capturing(functools.partial(
                    self._run_submission, work[0], wait, signal, q, work[1]))
            else:
                error = run_capturing(work)
                with self._lock:
                    start = max([self._queue_clock[q]] + self._wait_times(wait))
                    self._queue_clock[q] = start
                    self._record_signals(signal, start)
        work = None
        self._wall_end = time.monotonic_ns()
        running.release()
        with self._lock:
            self._queue_pending[q] -= 1
        done(error)

    def _wait_times(self, wait: Any) -> list[int]:
        times = []
        for sem, value in wait:
            history = self._signal_times.get(sem)
            if history:
                i = bisect.bisect_left(history, (value, -1))
                if i < len(history):
                    times.append(history[i][1])
        return times

    def _record_signals(self, signal: Any, at: int) -> None:
        for sem, value in signal:
            try:
                history = self._signal_times.setdefault(sem, [])
            except TypeError:
                continue
            bisect.insort(history, (value, at))
            if len(history) > 64:
                del history[:-64]

    def _run_submission(self, submission: Submission, wait: Any, signal: Any, q: int,
                        submission_id: int = 0) -> None:
        ops = submission.operations()
        model = self.model
        profile = self.profile
        with self._lock:
            start = max([self._queue_clock[q]] + self._wait_times(wait))
        wall_anchor = time.monotonic_ns()
        if profile is not None:
            profile.record_clock_correlation(start, wall_anchor, wall_anchor)
        paced = self.mode == "paced"
        # fast mode: small operations run here, on the command processor, instead of being
        # handed to an engine's threads (modelled time is the same either way)
        inline = not paced and not self.calibrating
        batch = _Batch()
        segment_start = end = start
        for op in ops:
            if type(op) is Barrier:
                error = batch.join()
                if error is not None:
                    break
                segment_start = end
                continue
            if self.work_queue.lost is not None:
                break
            fault = self._check_fault(op, q)
            if fault is not None:
                batch.add()
                batch.finish(fault)
                break
            if type(op) is Dispatch:
                prepared = op.prepared
                name = prepared.export.name
                workgroups = prepared.total
                bound = sum(prepared.binding_lengths[i]
                            for i in range(prepared.state.binding_count))
                with self._lock:
                    units = max(1, min(workgroups, model.compute_units))
                    order = sorted(range(len(self._unit_free)), key=self._unit_free.__getitem__)
                    chosen = order[:units]
                    op_start = max([segment_start] + [self._unit_free[u] for u in chosen])
                    cost = model.dispatch_ns(name, workgroups, units, bound)
                    for u in chosen:
                        self._unit_free[u] = op_start + cost
                    engine = "compute"
                    self._busy["compute"] = self._busy.get("compute", 0) + cost * units
                    self._dispatch_count += 1
                    event = TraceEvent(name, engine, op_start, cost, workgroups, q, units)
                workers = 1 if self.calibrating else len(self._compute_queues)
                targets = self._compute_queues[:workers]
            else:
                if not _device_visible(op):  # fail after what was issued has finished
                    batch.add()
                    batch.finish(FailedPreconditionError(
                        "transfer touches memory the device cannot see"))
                    break
                size = op.target.length
                with self._lock:
                    engine_index = min(range(len(self._dma_free)), key=lambda i: (
                        max(segment_start, self._dma_free[i]), self._dma_free[i], i))
                    op_start = max(segment_start, self._dma_free[engine_index])
                    cost = model.transfer_ns(size)
                    self._dma_free[engine_index] = op_start + cost
                    engine = f"dma{engine_index}"
                    self._busy[engine] = self._busy.get(engine, 0) + cost
                    self._bytes_moved += size
                    self._transfer_count += 1
                    event = TraceEvent(op.name, engine, op_start, cost, size, q)
                workers = 1
                targets = [self._dma_queues[engine_index]]
            end = max(end, op_start + cost)
            not_before = not_until = 0
            if paced:
                not_before = wall_anchor + (op_start - start)
                not_until = wall_anchor + (op_start + cost - start)
            job = _Job(op, batch, q, not_before, not_until, workers, event, self.calibrating)
            job.seq = next(self._issued)
            job.submission_id = submission_id
            batch.add()
            if inline and (type(op) is not Dispatch or op.prepared.total <= INLINE_WORKGROUPS):
                self._run_inline(job)
                continue
            for target in targets:
                target.put(job)
        error = batch.join()
        with self._lock:
            self._queue_clock[q] = end
            self._busy[f"queue{q}"] = self._busy.get(f"queue{q}", 0) + (end - start)
            self.clock_ns = max(self.clock_ns, end)
            if error is None:
                self._record_signals(signal, end)
        if paced:
            _sleep_until(wall_anchor + (end - start))
        if error is not None:
            raise error
        if self.work_queue.lost is not None:
            raise self.work_queue.lost

    # -- the engines ------------------------------------------------------------------------

    def _run_inline(self, job: _Job) -> None:
        """Runs a job on this thread as its engine would (fast mode, small operations)."""
        op = job.op
        host_start = time.monotonic_ns()
        error = self.work_queue.lost
        if error is None:
            if type(op) is Dispatch:
                rc = op.prepared.run(0, 0)
                if rc:
                    error = _dispatch_error(op.prepared, rc)
            else:
                error = run_capturing(functools.partial(run_transfer, op))
        self._finish_job(job, host_start, time.monotonic_ns(), error or self.work_queue.lost)

    def _dma_worker(self, jobs: queue_module.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            if job.not_before:
                _sleep_until(job.not_before)
            host_start = time.monotonic_ns()
            error = self.work_queue.lost or run_capturing(functools.partial(run_transfer, job.op))
            if job.not_until:
                _sleep_until(job.not_until)
            self._finish_job(job, host_start, time.monotonic_ns(), error)
            job = None

    def _compute_worker(self, jobs: queue_module.SimpleQueue, index: int) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            if job.not_before:
                _sleep_until(job.not_before)
            now = time.monotonic_ns()
            with job.lock:
                if not job.host_start:
                    job.host_start = now
            prepared = job.op.prepared
            tile = 0 if job.calibrate else max(1, prepared.total // (4 * len(self._compute_queues)))
            cpu_start = time.thread_time_ns()
            rc = 0 if self.work_queue.lost is not None else prepared.run(index, tile)
            cpu_ns = time.thread_time_ns() - cpu_start
            with job.lock:
                if rc and job.error is None:
                    job.error = _dispatch_error(prepared, rc)
                job.left -= 1
                last = not job.left
            if last:
                end = time.monotonic_ns()
                if job.calibrate and job.error is None:
                    with self._lock:
                        self._samples.append(DispatchSample(prepared.export.name, prepared.total,
                                                            cpu_ns, end - job.host_start))
                if job.not_until:
                    _sleep_until(job.not_until)
                    end = time.monotonic_ns()
                self._finish_job(job, job.host_start, end, job.error or self.work_queue.lost)
            job = None

    def _finish_job(self, job: _Job, host_start: int, host_end: int, error: Error | None) -> None:
        event = job.event  # its host time is added when the trace is read
        with self._lock:
            if len(self._trace) < self._trace_capacity:
                self._trace.append((job.seq, event, host_end - host_start))
        profile = self.profile
        if profile is not None:
            status = 0 if error is None else int(getattr(error, "code", 2))
            op = job.op
            end_tick = event.start_ns + event.duration_ns
            sid, q = job.submission_id, job.queue
            if type(op) is Dispatch:
                prepared = op.prepared
                s = prepared.state
                groups = (s.workgroup_count_x, s.workgroup_count_y, s.workgroup_count_z)
                exe, name = prepared.executable, prepared.export.name
                profile.record_dispatch(exe, name, groups, event.start_ns, end_tick, sid, queue=q,
                                        worker="compute", clock=DEVICE, status_code=status)
                profile.record_dispatch(exe, name, groups, host_start, host_end, sid, queue=q,
                                        worker="compute workers", clock=HOST, status_code=status)
            else:
                profile.record_execution(op.name, event.start_ns, end_tick, sid, queue=q,
                                         worker=event.engine, clock=DEVICE, status_code=status,
                                         payload_length=event.size)
                profile.record_execution(op.name, host_start, host_end, sid, queue=q,
                                         worker=event.engine, clock=HOST, status_code=status,
                                         payload_length=event.size)
        job.batch.finish(error)

    def _check_fault(self, op: Operation, q: int) -> Error | None:
        kind = op.name
        export = op.prepared.export.name if type(op) is Dispatch else None
        fired = None
        with self._lock:
            for fault in self._faults:
                fkind, _after, _error, fexport, fqueue = fault
                if fkind == "transfer":
                    match = kind != "dispatch"
                else:
                    match = fkind in (kind, "any", "device_loss")
                if not match or (fexport is not None and fexport != export) or (
                        fqueue is not None and fqueue != q):
                    continue
                if fault[1] == 0:
                    self._faults.remove(fault)
                    fired = fault
                    break
                fault[1] -= 1
        if fired is None:
            return None
        if fired[0] == "device_loss":
            self.work_queue.lose(fired[2])
        return fired[2]


def _dispatch_error(prepared: Any, rc: int) -> Error:
    try:
        prepared.raise_for_status(rc)
    except Error as exc:
        return exc
    return InternalError(f"dispatch failed with status {rc}")


def _device_visible(op: Operation) -> bool:
    ranges = (op.source, op.target) if hasattr(op, "source") else (op.target,)
    for r in ranges:
        if not r.buffer.memory_type_bits & MemoryType.DEVICE_VISIBLE:
            return False
    return True


def preset_fields() -> list[str]:
    """The cost-model fields a preset sets (each is also an `EmuDevice` option)."""
    return [f.name for f in fields(CostModel)]


__all__ = ["CalibrationReport", "CostModel", "DeviceLostError", "DispatchSample", "EmuAllocator",
           "EmuDevice", "EmuSummary", "PRESETS", "TraceEvent", "preset_fields"]
