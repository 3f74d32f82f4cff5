"""The `emu` driver: an emulated accelerator for hardware research.

What it models:
- **Its own memory.** The "device" heap is DEVICE_LOCAL only: the host cannot map it and
  its capacity (`memory_size`) is enforced (RESOURCE_EXHAUSTED past it). Host-visible
  memory comes from the "host" heap; data moves between the two by DMA (queue transfers).
- **A command processor.** One thread takes ready submissions in order and executes their
  commands; kernels run for real on the host CPU, so results are exact.
- **Two engines on a simulated clock.** DMA (fill/update/copy: `dma_latency` + bytes /
  `dma_bandwidth`) and compute (dispatch: `launch_latency` + workgroups *
  `workgroup_time` / `compute_units`). Commands between barriers overlap across engines;
  a barrier joins them. `clock_ns` is the device's simulated time.
- **A trace.** Every command is an event (engine, start, duration, size) exportable as
  Chrome/Perfetto trace JSON with `export_trace(path)`.
- **Fault injection.** `inject_fault(kind, after, error)` makes the `after`-th next
  command of that kind fail with `error`, which then reaches the submission's signals.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...errors import (
    Error,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    ResourceExhaustedError,
)
from ..allocator import Allocator, Heap
from ..buffer import Buffer
from ..device import Completion, Device, run_capturing
from ..execution import Barrier, Dispatch, Operation, Submission, run_transfer
from ..types import BufferUsage, MemoryAccess, MemoryType

_ALL_USAGE = BufferUsage(0x1FFFFFFF)


@dataclass(frozen=True)
class TraceEvent:
    """One command as the emulated device ran it, in simulated nanoseconds."""

    name: str
    engine: str
    start_ns: int
    duration_ns: int
    size: int


class EmuAllocator(Allocator):
    """Allocator whose device heap has a fixed capacity and is not host-visible."""

    def __init__(self, device_name: str, memory_size: int) -> None:
        super().__init__(device_name, [
            Heap("device", MemoryType.OPTIMAL | MemoryType.DEVICE_LOCAL, _ALL_USAGE, memory_size),
            Heap("host", MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE, _ALL_USAGE,
                 1 << 40),
        ])
        self.memory_size = memory_size
        self._capacity_lock = threading.Lock()

    def allocate(self, size: int, memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                 usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
                 access: MemoryAccess = MemoryAccess.ALL) -> Buffer:
        heap = self.select_heap(memory_type)
        if heap.name == "device":
            with self._capacity_lock:
                live = self.statistics()["device"].live_bytes
                if isinstance(size, int) and live + size > self.memory_size:
                    raise ResourceExhaustedError(
                        f"emulated device memory exhausted: {live} of {self.memory_size} bytes "
                        f"live, {size} more requested"
                    )
                return super().allocate(size, memory_type, usage, access)
        return super().allocate(size, memory_type, usage, access)


class EmuDevice(Device):
    driver_name = "emu"
    identifier = "local-emu"

    def __init__(self, memory_size: int = 1 << 30, dma_bandwidth: float = 16e9,
                 dma_latency: float = 2e-6, launch_latency: float = 5e-6,
                 workgroup_time: float = 1e-7, compute_units: int = 8,
                 trace_capacity: int = 100_000, **options: Any) -> None:
        for name, value in (("memory_size", memory_size), ("dma_bandwidth", dma_bandwidth),
                            ("compute_units", compute_units)):
            if value <= 0:
                raise InvalidArgumentError(f"emu option {name} must be positive, not {value}")
        self.memory_size = memory_size
        super().__init__(**options)
        self.dma_bandwidth = dma_bandwidth
        self.dma_latency_ns = int(dma_latency * 1e9)
        self.launch_latency_ns = int(launch_latency * 1e9)
        self.workgroup_time_ns = workgroup_time * 1e9
        self.compute_units = compute_units
        self.clock_ns = 0
        self._engine_free = {"dma": 0, "compute": 0}
        self._trace: list[TraceEvent] = []
        self._trace_capacity = trace_capacity
        self._faults: list[list[Any]] = []
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._processor = threading.Thread(target=self._command_processor,
                                           name="tinyhal-emu-cp", daemon=True)
        self._processor.start()

    def _create_allocator(self) -> Allocator:
        return EmuAllocator(self.identifier, self.memory_size)

    # -- public extras ------------------------------------------------------------------

    def inject_fault(self, kind: str = "dispatch", after: int = 0,
                     error: Error | None = None) -> None:
        """Fails the (`after`+1)-th next command of `kind` (fill, update, copy, dispatch,
        any) with `error` (INTERNAL by default)."""
        if kind not in ("fill", "update", "copy", "dispatch", "any"):
            raise InvalidArgumentError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._faults.append([kind, after, error or InternalError(
                f"injected fault in emulated {kind}")])

    def trace(self) -> list[TraceEvent]:
        with self._lock:
            return list(self._trace)

    def export_trace(self, path: str) -> None:
        """Writes the trace as Chrome trace-event JSON (open in Perfetto)."""
        events = [{"name": e.name, "cat": e.engine, "ph": "X", "pid": 0,
                   "tid": 0 if e.engine == "compute" else 1, "ts": e.start_ns / 1000,
                   "dur": e.duration_ns / 1000, "args": {"size": e.size}}
                  for e in self.trace()]
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)

    # -- driver contract ----------------------------------------------------------------

    def _execute(self, ops: Submission, done: Completion) -> None:
        self._queue.put((lambda: self._run_commands(ops.operations()), done))

    def _call(self, work: Callable[[], None], done: Completion) -> None:
        self._queue.put((work, done))

    def _stop(self, timeout: float | None) -> None:
        self._queue.put(None)
        self._processor.join(timeout)

    # -- the command processor ----------------------------------------------------------

    def _command_processor(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, done = item
            item = None  # an idle processor must not keep finished work's captures
            error = run_capturing(work)
            work = None
            done(error)

    def _run_commands(self, ops: list[Operation]) -> None:
        """Runs a submission's operations, advancing the engines' simulated clocks."""
        with self._lock:
            segment_start = self.clock_ns
        for op in ops:
            if type(op) is Barrier:
                with self._lock:
                    segment_start = max(self._engine_free.values())
                continue
            self._check_fault(op.name)
            if type(op) is Dispatch:
                prepared = op.prepared
                prepared.raise_for_status(prepared.run())
                engine, size = "compute", prepared.total
                name = prepared.export.name
                cost = self.launch_latency_ns + int(
                    size * self.workgroup_time_ns / self.compute_units)
            else:
                if not _device_visible(op):
                    raise FailedPreconditionError("transfer touches memory the device cannot see")
                run_transfer(op)
                engine, name, size = "dma", op.name, op.target.length
                cost = self.dma_latency_ns + int(size * 1e9 / self.dma_bandwidth)
            with self._lock:
                start = max(segment_start, self._engine_free[engine])
                self._engine_free[engine] = start + cost
                self.clock_ns = max(self.clock_ns, start + cost)
                if len(self._trace) < self._trace_capacity:
                    self._trace.append(TraceEvent(name, engine, start, cost, size))
        with self._lock:
            self.clock_ns = max(self._engine_free.values())

    def _check_fault(self, kind: str) -> None:
        with self._lock:
            for fault in self._faults:
                if fault[0] in (kind, "any"):
                    if fault[1] == 0:
                        self._faults.remove(fault)
                        raise fault[2]
                    fault[1] -= 1


def _device_visible(op: Operation) -> bool:
    ranges = (op.source, op.target) if hasattr(op, "source") else (op.target,)
    for r in ranges:
        if not r.buffer.memory_type_bits & MemoryType.DEVICE_VISIBLE:
            return False
    return True


__all__ = ["EmuDevice", "EmuAllocator", "TraceEvent"]
