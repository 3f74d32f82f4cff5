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
  modelled time (and, placed one at a time, in wall time). A barrier joins everything
  before it.
- **A cost model** (`CostModel`, from a preset plus overrides): a transfer costs
  `dma_latency + bytes / dma_bandwidth`; a dispatch `launch_latency + waves *
  per-workgroup cost` (waves = workgroups over the units it occupies; per-workgroup cost
  from `export_costs[name]` or `workgroup_time`), never less than its bound bytes over
  `memory_bandwidth` (a roofline). With `accelerator=` (an `AcceleratorConfig`, a
  dict of its fields or a SCALE-Sim `.cfg` path) a dispatch is priced from its work
  (`hal.dispatch_work`) by the accelerator's cost model (`hal.emu_cost`: a systolic
  array with SRAMs and DRAM bandwidth, or one registered from Python); `cost_file=`
  gives measured per-export cycles. A submission starts at the later of its queue's
  modelled clock and the modelled times its waits were signalled (by this device).
- **Modes.** `mode="fast"` runs as fast as the host can while keeping modelled time:
  an item for an idle queue runs on the thread that made it ready (as `sync` runs it),
  a submission runs as one native stream (as `sync` and `task` run it) and is modelled
  by replaying the plan of its recorded content (`emu_engines`), and host reads and
  writes of device memory skip the queue when it is idle (a write's update is modelled
  in one plan with the submission that follows it); `mode="paced"` makes each
  operation take its modelled time in wall time too, every operation on its engine.
  Operations are also placed one at a time while a profile is attached, faults are
  armed or the device calibrates.
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

The parts: `emu_model` (the cost model and presets), `emu_engines` (placement on the
modelled engines, plans, clocks, trace and summary), `emu_workers` (the host threads
behind the engines), `emu_faults` and `emu_calibration`; this module is the driver
(`EmuDriver`: its memory, its queues' command processors, the protocol's operations and
host hooks), its `EmuDevice`, and `DRIVER` (the `emu://PRESET?queues=N` device URIs).
"""

from __future__ import annotations

import queue as queue_module
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...errors import (
    DeviceLostError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    as_error,
)
from ..allocator import Allocator, Heap
from ..buffer import Buffer
from ..device import Device
from ..dispatch_work import dispatch_work
from ..execution import Barrier, Dispatch, Submission
from ..profile import DEVICE, HOST
from ..queue import (
    DEFAULT_PROFILING_MODES,
    Alloca,
    Capabilities,
    Completion,
    Driver,
    WorkQueue,
    cpu_queue_for_affinity,
    run_capturing,
    run_device_work,
)
from ..ringbuffer import HEAP_NAME as TRANSIENT_HEAP
from ..stream import lead
from ..types import BufferUsage, MemoryAccess, MemoryType
from . import DriverInfo
from .emu_calibration import (
    CalibrationReport,
    DispatchSample,
    calibration_report,
    fit_costs,
)
from .emu_engines import (
    EmuSummary,
    Engines,
    Steps,
    TraceEvent,
    device_visible,
    profile_cost,
)
from .emu_faults import FAULT_KINDS, Faults
from .emu_model import PRESETS, CostModel, cost_model, preset_fields
from .emu_workers import Batch, Job, Workers, run_each_inline, sleep_until

_ALL_USAGE = BufferUsage(0x1FFFFFFF)
_TRANSFER_SOURCE = int(BufferUsage.TRANSFER_SOURCE)
_TRANSFER_TARGET = int(BufferUsage.TRANSFER_TARGET)
_DEVICE_VISIBLE = int(MemoryType.DEVICE_VISIBLE)
_HOST_OR_DEVICE_VISIBLE = int(MemoryType.HOST_VISIBLE | MemoryType.DEVICE_VISIBLE)
MODES = ("fast", "paced")
# In fast mode, transfers and dispatches of at most this many workgroups run on the
# command processor's thread when operations run one at a time: a hand-off to an
# engine thread costs more than they do.
INLINE_WORKGROUPS = 4
# In fast mode, a replayed submission whose steps took longer than this on one thread
# runs with the compute workers' native helpers joining its dispatches.
SPREAD_NS = 2_000_000


class EmuAllocator(Allocator):
    """Allocator whose device memory (device heap + live transients) has a capacity
    and is not host-visible. `device_live` / `device_peak` count both (the allocator's
    `device_memory`)."""

    device_memory_heaps = frozenset(("device", TRANSIENT_HEAP))

    def __init__(self, device_name: str, memory_size: int) -> None:
        super().__init__(device_name, [
            Heap("device", MemoryType.OPTIMAL | MemoryType.DEVICE_LOCAL, _ALL_USAGE, memory_size),
            Heap("host", MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE, _ALL_USAGE,
                 1 << 40),
        ])
        self.memory_size = memory_size
        self._capacity_lock = threading.Lock()  # one allocation's check-and-take

    @property
    def device_live(self) -> int:
        """Device memory in use: device-heap buffers and transient ring blocks."""
        return self.device_memory.live

    @property
    def device_peak(self) -> int:
        """The most device memory in use at once so far."""
        return self.device_memory.peak

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
        live = self.device_memory.live
        if isinstance(size, int) and live + size > self.memory_size:
            raise _exhausted(live, self.memory_size, size)


def _exhausted(live: int, capacity: int, size: int) -> ResourceExhaustedError:
    return ResourceExhaustedError(f"emulated device memory exhausted: {live} of {capacity} "
                                  f"bytes live, {size} more requested")


class EmuDriver(Driver):
    """The emulated accelerator behind an `EmuDevice`: its memory model, its queues'
    command processors and engines. Submissions and host work go to the queue's command
    processor (or run on the readying thread while that queue is idle, in fast mode); an
    alloca checks the modelled memory first (`check_alloca`, also for the ready allocas
    the device places without an entry); host reads and writes of device memory skip the
    queue while queue 0 is idle, in fast mode (`read_direct`, `write_direct`)."""

    name = "emu"
    identifier = "local-emu"
    capabilities: Capabilities  # queues and concurrency as configured; no host-visible memory

    def __init__(self, preset: str = "generic", *, queues: int = 1, mode: str = "fast",
                 memory_size: int | None = None, memory_bandwidth: float | None = None,
                 dma_engines: int | None = None, dma_bandwidth: float | None = None,
                 dma_latency: float | None = None, launch_latency: float | None = None,
                 compute_units: int | None = None, workgroup_time: float | None = None,
                 export_costs: dict[str, float] | None = None, accelerator: Any = None,
                 cost_file: str | None = None, calibrate: bool = False,
                 host_workers: int | None = None, trace_capacity: int = 100_000) -> None:
        model = cost_model(preset, export_costs, accelerator, cost_file, memory_size=memory_size,
                           memory_bandwidth=memory_bandwidth, dma_engines=dma_engines,
                           dma_bandwidth=dma_bandwidth, dma_latency=dma_latency,
                           launch_latency=launch_latency, compute_units=compute_units,
                           workgroup_time=workgroup_time)
        if not isinstance(queues, int) or not 1 <= queues <= 64:
            raise InvalidArgumentError(f"emu option queues must be an int in [1, 64], not {queues!r}")
        if mode not in MODES:
            raise InvalidArgumentError(f"emu option mode must be one of {MODES}, not {mode!r}")
        if host_workers is not None and (not isinstance(host_workers, int) or host_workers < 1):
            raise InvalidArgumentError("emu option host_workers must be an int >= 1")
        self.preset = preset
        self.memory_size = model.memory_size
        self.mode = mode
        self.calibrating = bool(calibrate)
        self._queue_count = queues
        self._fast = mode == "fast" and not self.calibrating
        self.work_queue: WorkQueue | None = None  # the queue that calls it (`attach`)
        self.allocator: EmuAllocator | None = None  # its allocator (`create_allocator`)
        self._engines = Engines(model, queues, trace_capacity)
        # a host write in fast mode is modelled later, in one step with what follows it
        self._defer_host_write = self._engines.host_writes.append
        self._faults = Faults(queues)
        self._alone_ns: dict[int, int] = {}  # id of replayed steps -> host ns run alone
        self._samples: list[DispatchSample] = []
        self._calibration_error: float | None = None
        self._wall_begin = 0
        self._wall_end = 0
        self._workers = Workers(model.dma_engines, model.compute_units, host_workers,
                                self._finish_job, self._lost_error, self._samples.append)
        self.capabilities = Capabilities(
            queue_count=queues, concurrency=self._workers.concurrency,
            host_visible_memory=False, modelled_time=True,
            default_profiling_modes=DEFAULT_PROFILING_MODES + ("dispatch-events",
                                                               "device-queue-events"))
        self._command_queues = [queue_module.SimpleQueue() for _ in range(queues)]
        # Per queue: items accepted and not yet done, and a lock held while one runs, so
        # that in fast mode an idle queue's item can run on the thread that made it ready
        # (as sync does) and still strictly before the queue's next.
        self._queue_lock = threading.Lock()
        self._queue_pending = [0] * queues
        self._queue_running = [threading.Lock() for _ in range(queues)]
        self._processors = []
        for q, commands in enumerate(self._command_queues):
            thread = threading.Thread(target=self._command_processor, args=(commands,),
                                      name=f"tinyhal-emu-cp{q}", daemon=True)
            thread.start()
            self._processors.append(thread)

    def create_allocator(self) -> Allocator:
        self.allocator = EmuAllocator(self.identifier, self.memory_size)
        return self.allocator

    def attach(self, queue: WorkQueue) -> None:
        self.work_queue = queue

    # -- queue operations ---------------------------------------------------------------

    def execute(self, payload: Submission, done: Completion, submission_id: int,
                wait: Any, signal: Any, queue: int) -> None:
        self._enqueue(payload, submission_id, done, wait, signal, queue)

    fill = update = copy = execute

    def host_call(self, payload: Callable[[], None], done: Completion, submission_id: int,
                  wait: Any, signal: Any, queue: int) -> None:
        self._enqueue(payload, 0, done, wait, signal, queue)

    def alloca(self, payload: Alloca, done: Completion, submission_id: int,
               wait: Any, signal: Any, queue: int) -> None:
        refused = self.check_alloca(payload.size)
        if refused is not None:
            done(refused)
            return
        payload(done)

    dealloca = barrier = run_device_work

    # -- host hooks ---------------------------------------------------------------------

    def queue_for_affinity(self, affinity: int) -> int:
        """IREE's accelerator rule (its amdgpu driver): the mask ANDed with the device's
        queues, the first set bit, so ANY (-1) is queue 0. A mask naming none of this
        device's queues (a program placed for more queues than the model has) falls back
        to IREE's CPU rule rather than failing, so every program IREE's CPU devices run
        also runs here."""
        mask = affinity & ((1 << self._queue_count) - 1)
        if not mask:
            return cpu_queue_for_affinity(affinity, self._queue_count)
        return (mask & -mask).bit_length() - 1

    def check_alloca(self, size: int) -> Error | None:
        """RESOURCE_EXHAUSTED when `size` more transient bytes (as the ring counts them:
        rounded up to its 64-byte blocks) would not fit the modelled memory."""
        allocator = self.allocator
        live = allocator.device_memory.live
        size = (size + 63) & ~63
        if live + size <= allocator.memory_size:
            return None
        return _exhausted(live, allocator.memory_size, size)

    def read_direct(self, buffer: Buffer, offset: int, length: int) -> bytearray | None:
        """Device memory is read by a queue transfer to host memory (host work: no device
        time, and with no waits or signals nothing to model). In fast mode, when queue 0
        is idle, the bytes are copied here."""
        running = self._host_transfer(buffer, _TRANSFER_SOURCE)
        if running is None:
            return None
        try:
            start = buffer.byte_offset + offset
            return bytearray(buffer.storage.array[start : start + length])
        finally:
            running.release()

    def write_direct(self, buffer: Buffer, data: memoryview, offset: int) -> bool:
        """Device memory is written by a queue update. In fast mode, when queue 0 is
        idle, the bytes are copied here and modelled as that update."""
        length = len(data)
        if not length:
            return False
        running = self._host_transfer(buffer, _TRANSFER_TARGET)
        if running is None:
            return False
        try:
            start = buffer.byte_offset + offset
            buffer.storage.array[start : start + length] = data
            self._defer_host_write(length)
            return True
        finally:
            running.release()

    def stop(self, timeout: float | None) -> None:
        for commands in self._command_queues:
            commands.put(None)
        self._workers.stop(timeout, self._processors)

    # -- public extras (`EmuDevice` exposes them) ----------------------------------------

    @property
    def model(self) -> CostModel:
        """The cost model in use (`fit_calibration` replaces it)."""
        return self._engines.model

    @property
    def clock_ns(self) -> int:
        """The latest modelled time any submission ended at."""
        return self._engines.clock()

    def inject_fault(self, kind: str = "dispatch", after: int = 0,
                     error: Error | None = None, export: str | None = None,
                     queue: int | None = None) -> None:
        """Fails the (`after`+1)-th next operation of `kind` (fill, update, copy,
        transfer, dispatch, any, device_loss), optionally only those of export `export`
        or on queue `queue`, with `error` (INTERNAL by default; `DeviceLostError` and a
        lost device for "device_loss")."""
        self._faults.inject(kind, after, error, export, queue)

    def lose_device(self, error: Error | None = None) -> None:
        """Loses the device now: pending and later work fails with `error`."""
        self.work_queue.lose(error or DeviceLostError("emulated device lost"))

    def trace(self) -> list[TraceEvent]:
        """The operations run so far, in the order their queues issued them."""
        return self._engines.events()

    def export_trace(self, path: str) -> None:
        """Writes the trace as Chrome trace-event JSON (open in Perfetto): one track per
        engine and one per queue (the queue's submissions), in modelled time."""
        self._engines.export_trace(path)

    def summary(self) -> EmuSummary:
        """Modelled total, per-engine utilisation, bytes moved, peak device memory."""
        return self._engines.summary(self.preset, max(0, self._wall_end - self._wall_begin),
                                     self.allocator.device_peak, self.memory_size,
                                     self._calibration_error)

    def calibration_samples(self) -> list[DispatchSample]:
        return list(self._samples)

    def fit_calibration(self, samples: list[DispatchSample] | None = None) -> dict[str, float]:
        """Fits each export's per-workgroup cost (seconds) to measured samples (default:
        all so far): the median over its samples of measured time per workgroup (robust
        to a sample the host preempted), and makes the model use it. Returns the costs."""
        costs = fit_costs(self.calibration_samples() if samples is None else samples)
        model = self.model
        self._engines.set_model(replace(model, export_costs={**model.export_costs, **costs}))
        return costs

    def calibration_report(self, samples: list[DispatchSample] | None = None) -> CalibrationReport:
        """Predicted (the fitted model, one unit) against measured host time per dispatch."""
        report = calibration_report(self.calibration_samples() if samples is None else samples,
                                    self.model)
        self._calibration_error = report.mean_abs_error
        return report

    # -- host transfers ----------------------------------------------------------------

    def _host_transfer(self, buffer: Buffer, usage: int) -> threading.Lock | None:
        """Queue 0's `running` lock, held, when a host transfer with `buffer` may skip
        the queue, else None. It may in fast mode, for memory only the device sees with
        the usage bit the transfer needs, while nothing watches operations one at a time
        (a profile, armed faults), the device is neither lost nor closed (the queued
        path reports those) and nothing runs or waits on queue 0 (an item queued
        meanwhile waits for the lock, so runs after)."""
        if not (self._fast and type(buffer) is Buffer
                and buffer.memory_type_bits & _HOST_OR_DEVICE_VISIBLE == _DEVICE_VISIBLE
                and buffer.usage_bits & usage and not buffer.storage.released
                and self.profile is None and not self._faults.armed
                and self.work_queue.lost is None and not self.work_queue.closed):
            return None
        running = self._queue_running[0]
        if not running.acquire(False):
            return None
        if self._queue_pending[0]:  # queued before: it goes first
            running.release()
            return None
        return running

    def _lost_error(self) -> Error | None:
        return self.work_queue.lost

    # -- the command processors -----------------------------------------------------------

    def _enqueue(self, work: Submission | Any, submission_id: int, done: Completion, wait: Any,
                 signal: Any, q: int) -> None:
        """Runs `work` (a submission, or host work) for queue `q` on this thread when the
        queue is idle in fast mode (as `sync` runs it), else hands it to the queue's
        command processor. Only items handed over count as pending (under
        `_queue_lock`); an item runs here only with the queue's `running` lock taken and
        nothing pending, and holding that lock makes a later item wait or queue behind
        it."""
        if not self._wall_begin:
            self._wall_begin = time.monotonic_ns()
        running = self._queue_running[q]
        if self._fast and running.acquire(False):
            if not self._queue_pending[q]:
                error = self._process(work, submission_id, wait, signal, q)
                work = None
                self._wall_end = time.monotonic_ns()
                running.release()
                done(error)
                return
            running.release()  # queued before: it goes first
        with self._queue_lock:
            self._queue_pending[q] += 1
        self._command_queues[q].put((work, submission_id, done, wait, signal, q))

    def _command_processor(self, commands: queue_module.SimpleQueue) -> None:
        while True:
            item = commands.get()
            if item is None:
                return
            work, submission_id, done, wait, signal, q = item
            item = None
            running = self._queue_running[q]
            running.acquire()
            error = self._process(work, submission_id, wait, signal, q)
            work = None
            self._wall_end = time.monotonic_ns()
            running.release()
            with self._queue_lock:
                self._queue_pending[q] -= 1
            done(error)
            done = None

    def _process(self, work: Submission | Any, submission_id: int, wait: Any, signal: Any,
                 q: int) -> Error | None:
        """Runs one queue item (its caller holds the queue's `running` lock); returns
        its error. In fast mode a submission runs whole and is modelled from its plan
        (`Engines.replay`; one that fails is modelled whole and signals nothing), else
        it runs operation by operation (`_run_each`)."""
        error = self.work_queue.lost
        if error is not None:
            return error
        if type(work) is not Submission:
            error = run_capturing(work)
            self._engines.host_work(q, wait, signal)
            return error
        submission = work
        try:
            steps = None
            if self._fast and self.profile is None and not self._faults.armed:
                steps = self._engines.steps_of(submission)
            if steps is None:
                self._run_each(submission, wait, signal, q, submission_id)
                return None
            try:
                if steps.widest <= 1 and steps.ops is None:  # nothing to spread or measure
                    lead(submission)
                else:
                    self._run_whole(submission, steps)
            except Error as exc:
                self._engines.replay(q, wait, (), steps)
                return exc
            self._engines.replay(q, wait, signal, steps)
        except BaseException as exc:  # noqa: BLE001 - becomes the item's error
            return as_error(exc)
        return None

    def _run_whole(self, submission: Submission, steps: Steps) -> None:
        """Fast mode, for a submission with a dispatch of several workgroups or
        recordings not shared (`_process` leads the others itself): runs it whole at
        once, on this thread as one native stream (as `sync` runs it). The compute
        workers' native helper threads join its dispatches once the same steps took
        longer than `SPREAD_NS` alone the last time (waking helpers costs more than small
        submissions take; the first run, which builds the native program, is not
        counted). A submission whose recordings are not shared (large captured updates)
        runs its operations one by one instead of building a native program for one
        use."""
        if steps.ops is not None:
            run_each_inline(steps.ops)
            return
        key = id(steps.steps)  # a stale entry only misguides this choice
        helpers = None
        if self._alone_ns.get(key, 0) > SPREAD_NS:
            helpers = self._workers.stream_helpers()
        if helpers is not None:
            lead(submission, helpers)
        else:
            began = time.monotonic_ns()
            lead(submission)
            if len(self._alone_ns) >= 1024:
                self._alone_ns.clear()
            # the first run also builds the native program: not a measure
            self._alone_ns[key] = (time.monotonic_ns() - began
                                   if key in self._alone_ns else 0)

    def _run_each(self, submission: Submission, wait: Any, signal: Any, q: int,
                  submission_id: int) -> None:
        """Runs a submission operation by operation, each placed on its engine as it is
        issued (paced mode, calibration, profiling, armed faults)."""
        ops = submission.operations()
        engines = self._engines
        workers = self._workers
        profile = self.profile
        start = engines.start(q, wait)
        wall_anchor = time.monotonic_ns()
        if profile is not None:
            profile.record_clock_correlation(start, wall_anchor, wall_anchor)
        paced = self.mode == "paced"
        # fast mode: small operations run here, on the command processor, instead of being
        # handed to an engine's threads (modelled time is the same either way)
        inline = not paced and not self.calibrating
        batch = Batch()
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
                workgroups = prepared.total
                bound = sum(prepared.binding_lengths[i]
                            for i in range(prepared.state.binding_count))
                event, seq = engines.issue_dispatch(prepared.export.name, workgroups, bound,
                                                    segment_start, q, dispatch_work(prepared))
                engine = -1
                count = 1 if self.calibrating else workers.concurrency
            else:
                if not device_visible(op):  # fail after what was issued has finished
                    batch.add()
                    batch.finish(FailedPreconditionError(
                        "transfer touches memory the device cannot see"))
                    break
                event, engine, seq = engines.issue_transfer(op.name, op.target.length,
                                                            segment_start, q)
                count = 1
            op_end = event.start_ns + event.duration_ns
            end = max(end, op_end)
            not_before = not_until = 0
            if paced:
                not_before = wall_anchor + (event.start_ns - start)
                not_until = wall_anchor + (op_end - start)
            job = Job(op, batch, q, not_before, not_until, count, event, self.calibrating,
                      seq, submission_id)
            batch.add()
            if inline and (engine >= 0 or op.prepared.total <= INLINE_WORKGROUPS):
                workers.run_inline(job)
            elif engine >= 0:
                workers.post_transfer(engine, job)
            else:
                workers.post_dispatch(job)
        error = batch.join()
        engines.end(q, start, end, signal if error is None else ())
        if paced:
            sleep_until(wall_anchor + (end - start))
        if error is not None:
            raise error
        if self.work_queue.lost is not None:
            raise self.work_queue.lost

    def _finish_job(self, job: Job, host_start: int, host_end: int, error: Error | None) -> None:
        event = job.event
        self._engines.record(job.seq, event, host_end - host_start)
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
                                        worker="compute", clock=DEVICE, status_code=status,
                                        cost=profile_cost(event.cost, event.work_source))
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

    def _check_fault(self, op: Any, q: int) -> Error | None:
        export = op.prepared.export.name if type(op) is Dispatch else None
        error, loses_device = self._faults.check(op.name, export, q)
        if loses_device:
            self.work_queue.lose(error)
        return error



class EmuDevice(Device):
    """A device run by the `emu` driver (`EmuDriver`; its options are the driver's, see
    the module docstring), with the emulator's results and controls as public extras:
    `model`, `clock_ns`, and the driver's `inject_fault`, `lose_device`, `trace`,
    `export_trace`, `summary`, `calibration_samples`, `fit_calibration` and
    `calibration_report`."""

    def __init__(self, preset: str = "generic", *, queues: int = 1, mode: str = "fast",
                 memory_size: int | None = None, memory_bandwidth: float | None = None,
                 dma_engines: int | None = None, dma_bandwidth: float | None = None,
                 dma_latency: float | None = None, launch_latency: float | None = None,
                 compute_units: int | None = None, workgroup_time: float | None = None,
                 export_costs: dict[str, float] | None = None, accelerator: Any = None,
                 cost_file: str | None = None, calibrate: bool = False,
                 host_workers: int | None = None, trace_capacity: int = 100_000,
                 **options: Any) -> None:
        driver = EmuDriver(preset, queues=queues, mode=mode, memory_size=memory_size,
                           memory_bandwidth=memory_bandwidth, dma_engines=dma_engines,
                           dma_bandwidth=dma_bandwidth, dma_latency=dma_latency,
                           launch_latency=launch_latency, compute_units=compute_units,
                           workgroup_time=workgroup_time, export_costs=export_costs,
                           accelerator=accelerator, cost_file=cost_file, calibrate=calibrate, host_workers=host_workers,
                           trace_capacity=trace_capacity)
        self.preset = preset
        self.memory_size = driver.memory_size
        self.mode = mode
        self.calibrating = driver.calibrating
        try:
            super().__init__(driver, **options)
        except BaseException:
            driver.stop(None)
            raise
        self.inject_fault = driver.inject_fault
        self.lose_device = driver.lose_device
        self.trace = driver.trace
        self.export_trace = driver.export_trace
        self.summary = driver.summary
        self.calibration_samples = driver.calibration_samples
        self.fit_calibration = driver.fit_calibration
        self.calibration_report = driver.calibration_report

    def __repr__(self) -> str:
        return f"<Device {self.identifier} {self.preset} queues={self.queue_count}>"

    @property
    def model(self) -> CostModel:
        """The cost model in use (`fit_calibration` replaces it)."""
        return self.driver.model

    @property
    def clock_ns(self) -> int:
        """The latest modelled time any submission ended at."""
        return self.driver.clock_ns


def _uri_options(rest: str) -> dict[str, Any]:
    """`emu://PRESET` picks an emulator preset (e.g. `--device=emu://edge-npu`) and
    `emu://PRESET?queues=N` its queue count (`emu://?queues=2` on the default preset)."""
    path, _, query = rest.partition("?")
    options: dict[str, Any] = {"preset": path.strip("/")} if path.strip("/") else {}
    for key, _, value in (item.partition("=") for item in query.split("&") if item):
        if key != "queues" or not value.isdigit():
            raise InvalidArgumentError(
                f"--device=emu://{rest}: the emu device takes `?queues=N` (N >= 1), not `{key}`")
        options["queues"] = int(value)
    return options


DRIVER = DriverInfo("emu", EmuDevice, _uri_options,
                    tuple(f"emu://{preset}" for preset in PRESETS))


__all__ = ["CalibrationReport", "CostModel", "DeviceLostError", "DispatchSample", "EmuAllocator",
           "EmuDevice", "EmuSummary", "FAULT_KINDS", "PRESETS", "TraceEvent", "preset_fields"]
