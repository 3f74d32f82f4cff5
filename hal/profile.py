"""Device profiling sessions: queue, execution and memory events, recorded for export.

A `Profile` is one profiling session of one device. Hook sites in the HAL call its
`record_*` functions while it is recording; afterwards two exporters, each its own
module, read what it recorded (`recorded()`, with object ids from `numbering()`):

- `profile_chrome`: **Chrome trace-event JSON** (`.json`), which Perfetto and
  chrome://tracing open, and
- `profile_ireeperf`: **IREE's ireeperf-jsonl interchange stream** (`.jsonl`), the
  format `iree-profile export --format=ireeperf-jsonl` writes and IREE 3.13's
  `iree-profile-render --format=perfetto` turns into a native Perfetto trace (the
  format's facts are in that module).

`Profile.write(path)` and `write_profiles(profiles, path)` pick the exporter by the
file's extension; an exporter is imported only when a profile is written.

Hooks. `Profile.attach(device)` sets `device.profile` and `device.allocator.profile`;
the device's public queue entry points call `record_submission` (one queue event, then
the ready time when the waits are reached and an execution span from ready to signal,
watched through the semaphores), and `Allocator.track` calls `record_heap_change` (the
transient ringbuffer's heap as queue alloca/dealloca, other heaps as buffer
allocate/free, with the allocator's live and peak bytes). Drivers add per-dispatch and
device-time spans with `record_dispatch` / `record_execution`.

Cost. A device holds `profile = None` while no session runs, so a hook site costs one
attribute test. While recording, each event is one tuple appended to a list (atomic
under CPython's GIL, so producers on any thread need no lock); names, ids and JSON are
produced only at export. Executables and semaphores named by events are kept alive by
the session; command buffers are held weakly, so a session never keeps device memory
alive.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import Error, InvalidArgumentError, UnimplementedError
from .ringbuffer import HEAP_NAME as TRANSIENT_HEAP
from .semaphore import when_all_reached

SCHEMA_VERSION = 15
NO_ORDINAL = 0xFFFFFFFF

# Queue operation kinds with IREE's `iree_hal_profile_queue_event_type_t` values.
QUEUE_OPS: dict[str, int] = {
    "barrier": 1, "dispatch": 2, "execute": 3, "copy": 4, "fill": 5, "update": 6,
    "read": 7, "write": 8, "alloca": 9, "dealloca": 10, "host_call": 11,
}
# Command-buffer operation kinds with IREE's `iree_hal_profile_command_operation_type_t`.
COMMAND_OPS: dict[str, int] = {"barrier": 1, "dispatch": 2, "fill": 3, "copy": 4, "update": 5}
TRANSFER_OPS = frozenset({"copy", "fill", "update", "read", "write"})

# tinyhal's memory event kinds and the IREE `memory_event.event_type` each becomes.
MEMORY_KINDS: dict[str, tuple[str, int]] = {
    "alloca": ("queue_alloca", 7),
    "dealloca": ("queue_dealloca", 8),
    "allocate": ("buffer_allocate", 9),
    "free": ("buffer_free", 10),
    "import": ("buffer_import", 11),
    "unimport": ("buffer_unimport", 12),
}

# `--device_profiling_mode` names. tinyhal records the first group; the second is
# IREE's too but asks for data no tinyhal driver has, so asking for it is UNIMPLEMENTED.
SUPPORTED_MODES = frozenset({
    "queue-events", "host-execution", "dispatch-events", "device-queue-events",
    "memory-events", "executable-metadata",
})
UNSUPPORTED_MODES = frozenset({"device-metrics", "counters", "executable-traces"})
DEFAULT_MODES = frozenset({"queue-events", "host-execution", "memory-events"})
# Modes timed on a device clock: only a driver with one (emu, whose default modes list
# them) records them; IREE's local-sync and local-task answer UNIMPLEMENTED, and so do ours.
DEVICE_TIME_MODES = frozenset({"dispatch-events", "device-queue-events"})

HOST = "host"
DEVICE = "device"


def parse_modes(text: str | Iterable[str]) -> frozenset[str]:
    """The set of modes in a comma-separated `--device_profiling_mode` value."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    if not names:
        raise InvalidArgumentError("device profiling mode is empty")
    for name in names:
        if name in UNSUPPORTED_MODES:
            raise UnimplementedError(f"device profiling mode '{name}' is not supported by tinyhal")
        if name not in SUPPORTED_MODES:
            raise InvalidArgumentError(
                f"unknown device profiling mode '{name}' (known: "
                f"{', '.join(sorted(SUPPORTED_MODES | UNSUPPORTED_MODES))})"
            )
    return frozenset(names)


@dataclass(frozen=True)
class ProfileSummary:
    """Totals over one session, for a glance at a run."""

    queue_operations: dict[str, int]
    dispatches: int
    dispatch_ns: int
    busy_ns_by_worker: dict[str, int]
    bytes_moved: int
    peak_bytes: int
    dropped_events: int
    duration_ns: int
    by_export: dict[str, tuple[int, int]] = field(default_factory=dict)


class Profile:
    """One profiling session of one device: records events, exports two formats.

    `start()` opens the session and `stop()` closes it; `record_*` calls outside an open
    session are ignored. The device (not this class) decides whether to call the hooks,
    so an idle device pays one `is None` test per hook site.

    Times are `time.monotonic_ns()` nanoseconds (`clock="host"`) or device ticks in
    nanoseconds of modelled time (`clock="device"`, e.g. the emu driver), tied to host
    time by `record_clock_correlation`. `capacity` bounds the events kept per family
    (give or take one per producer thread racing at the bound); the rest are counted as
    dropped and reported in both exports.
    """

    def __init__(self, device_name: str = "device", modes: str | Iterable[str] = DEFAULT_MODES,
                 queue_count: int = 1, capacity: int = 1_000_000) -> None:
        if not isinstance(queue_count, int) or queue_count < 1:
            raise InvalidArgumentError(f"profile queue_count must be an int >= 1, not {queue_count!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"profile capacity must be an int >= 1, not {capacity!r}")
        self.device_name = device_name
        self.modes = parse_modes(modes)
        self.queue_count = queue_count
        self.capacity = capacity
        self.physical_device_ordinal = 0
        self.recording = False
        self.begin_ns = 0
        self.end_ns = 0
        self._queue_on = "queue-events" in self.modes
        self._host_on = "host-execution" in self.modes
        self._dispatch_on = "dispatch-events" in self.modes
        self._device_queue_on = "device-queue-events" in self.modes
        self._memory_on = "memory-events" in self.modes
        self._submission_ids = itertools.count(1)
        # (submission_id, op, queue, host_ns, wait, signal, command_buffer_id,
        #  allocation_id, operation_count, payload_length, strategy)
        self._queue: list[tuple] = []
        # (submission_id, host_ns)
        self._ready: list[tuple[int, int]] = []
        # (clock, op, queue, submission_id, start, end, executable, export, workgroups,
        #  worker, command_buffer_id, command_index, status_code, payload_length)
        self._spans: list[tuple] = []
        # span index -> a modelled dispatch's cost fields (`record_dispatch`'s `cost`)
        self._span_costs: dict[int, dict[str, Any]] = {}
        # (kind, host_ns, heap, length, live, peak, allocation_id, submission_id, queue,
        #  memory_type, usage, offset)
        self._memory: list[tuple] = []
        # (device_tick, host_begin_ns, host_end_ns)
        self._clock: list[tuple[int, int, int]] = []
        # (command_buffer_id, ((op, executable, export, workgroups, length), ...))
        self._command_buffers: list[tuple[int, tuple]] = []
        self._command_buffer_ids = itertools.count(1)
        self._command_buffer_objects: dict[int, tuple[weakref.ref, int]] = {}
        self._dropped = 0
        self._drop_lock = threading.Lock()

    def __repr__(self) -> str:
        state = "recording" if self.recording else "stopped"
        return f"<Profile of {self.device_name}, {state}, {self.event_count} events>"

    # Session control --------------------------------------------------------------

    def start(self) -> Profile:
        """Opens the session; events recorded from now on are kept."""
        if self.recording:
            raise InvalidArgumentError(f"profile of {self.device_name} is already recording")
        self.begin_ns = time.monotonic_ns()
        self.recording = True
        return self

    def stop(self) -> Profile:
        """Closes the session; later `record_*` calls are ignored."""
        if self.recording:
            self.recording = False
            self.end_ns = time.monotonic_ns()
        return self

    def __enter__(self) -> Profile:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def event_count(self) -> int:
        return len(self._queue) + len(self._spans) + len(self._memory)

    @property
    def dropped_events(self) -> int:
        return self._dropped

    def _drop(self) -> None:
        with self._drop_lock:  # only once full, so the common path takes no lock
            self._dropped += 1

    # Recording (the hook API) ------------------------------------------------------

    def record_queue(self, op: str, wait: Sequence[tuple[Any, int]] = (),
                     signal: Sequence[tuple[Any, int]] = (), queue: int = 0,
                     command_buffer_id: int = 0, allocation_id: int = 0,
                     operation_count: int = 1, payload_length: int = 0,
                     strategy: str = "software_defer", host_time_ns: int | None = None) -> int:
        """Records a queue operation as submitted; returns its submission id (0 if off).

        `wait` and `signal` are `(semaphore, value)` pairs. Pass the returned id to
        `record_ready` when the waits are met and to `record_execution` for the work.
        """
        if not self.recording:
            return 0
        if op not in QUEUE_OPS:
            raise InvalidArgumentError(f"unknown queue operation '{op}' (known: {', '.join(QUEUE_OPS)})")
        submission_id = next(self._submission_ids)
        if not self._queue_on:
            return submission_id
        if len(self._queue) >= self.capacity:
            self._drop()
            return submission_id
        self._queue.append((
            submission_id, op, queue,
            time.monotonic_ns() if host_time_ns is None else host_time_ns,
            tuple(wait), tuple(signal), command_buffer_id, allocation_id, operation_count,
            payload_length, strategy,
        ))
        return submission_id

    def record_ready(self, submission_id: int, host_time_ns: int | None = None) -> None:
        """Records when a submission's waits were met (it became ready to run)."""
        if self.recording and submission_id and self._queue_on:
            self._ready.append(
                (submission_id, time.monotonic_ns() if host_time_ns is None else host_time_ns))

    def record_execution(self, op: str, start: int, end: int, submission_id: int = 0,
                         queue: int = 0, worker: str | None = None, clock: str = HOST,
                         command_buffer_id: int = 0, command_index: int = -1,
                         status_code: int = 0, payload_length: int = 0) -> None:
        """Records a span of work that ran: a command-buffer execute, a transfer, ...

        `start`/`end` are host nanoseconds, or device ticks with `clock="device"`.
        `worker` names the thread, worker or engine that ran it.
        """
        self._span(clock, op, queue, submission_id, start, end, None, None, (0, 0, 0), worker,
                   command_buffer_id, command_index, status_code, payload_length)

    def record_dispatch(self, executable: Any, export: int | str, workgroups: Sequence[int],
                        start: int, end: int, submission_id: int = 0, queue: int = 0,
                        worker: str | None = None, clock: str = HOST,
                        command_buffer_id: int = 0, command_index: int = -1,
                        status_code: int = 0, cost: dict[str, Any] | None = None) -> None:
        """Records one dispatch that ran.

        `executable` is the executable object (its `export_names`, if any, name the
        functions in the export); `export` is the export ordinal or name. `cost` is
        what a device model says the dispatch cost (emu: compute and stall cycles,
        DRAM bytes read and written, utilisation, work source), JSON scalars by name;
        exporters write it beside the span (ireeperf: `tinyhal_<name>` fields).
        """
        kept = len(self._spans)
        self._span(clock, "dispatch", queue, submission_id, start, end, executable, export,
                   tuple(workgroups), worker, command_buffer_id, command_index, status_code, 0)
        if cost is not None and len(self._spans) > kept:
            self._span_costs[kept] = cost

    def _span(self, clock: str, op: str, queue: int, submission_id: int, start: int, end: int,
              executable: Any, export: Any, workgroups: tuple, worker: str | None,
              command_buffer_id: int, command_index: int, status_code: int,
              payload_length: int) -> None:
        if not self.recording:
            return
        if clock == HOST:
            if not self._host_on:
                return
        elif clock == DEVICE:
            if not (self._dispatch_on if op == "dispatch" else self._device_queue_on):
                return
        else:
            raise InvalidArgumentError(f"profile clock must be 'host' or 'device', not {clock!r}")
        if op not in QUEUE_OPS:
            raise InvalidArgumentError(f"unknown operation '{op}' (known: {', '.join(QUEUE_OPS)})")
        if len(self._spans) >= self.capacity:
            self._drop()
            return
        self._spans.append((clock, op, queue, submission_id, start, end, executable, export,
                            workgroups, worker, command_buffer_id, command_index, status_code,
                            payload_length))

    def record_memory(self, kind: str, length: int, heap: str = "", live_bytes: int = 0,
                      peak_bytes: int = 0, allocation_id: int = 0, submission_id: int = 0,
                      queue: int = -1, memory_type: int = 0, usage: int = 0, offset: int = 0,
                      host_time_ns: int | None = None) -> None:
        """Records a memory event: alloca, dealloca, allocate, free, import or unimport.

        `queue` is -1 for memory that no queue operation owns (plain allocations).
        `live_bytes`/`peak_bytes` are the allocator's device-wide counts after the event.
        """
        if not (self.recording and self._memory_on):
            return
        if kind not in MEMORY_KINDS:
            raise InvalidArgumentError(
                f"unknown memory event kind '{kind}' (known: {', '.join(MEMORY_KINDS)})")
        if len(self._memory) >= self.capacity:
            self._drop()
            return
        self._memory.append((
            kind, time.monotonic_ns() if host_time_ns is None else host_time_ns, heap, length,
            live_bytes, peak_bytes, allocation_id, submission_id, queue, int(memory_type),
            int(usage), offset,
        ))

    def new_command_buffer_id(self) -> int:
        """A fresh command-buffer id for `record_command_buffer` and the execution hooks."""
        return next(self._command_buffer_ids)

    def record_command_buffer(self, command_buffer_id: int,
                              operations: Sequence[tuple[str, Any, Any, Sequence[int], int]]
                              ) -> None:
        """Records what a command buffer contains: `(op, executable, export, workgroups,
        length)` per command, `op` one of barrier, dispatch, fill, copy, update.

        Optional: command buffers never described here are described at export from the
        dispatches recorded with their id and command index.
        """
        if not self.recording:
            return
        ops = tuple(operations)
        for operation in ops:
            if operation[0] not in COMMAND_OPS:
                raise InvalidArgumentError(
                    f"unknown command '{operation[0]}' (known: {', '.join(COMMAND_OPS)})")
        self._command_buffers.append((command_buffer_id, ops))

    def _command_buffer_table(self) -> dict[int, dict[int, tuple]]:
        """Every command buffer's operations by command index, described or inferred."""
        table: dict[int, dict[int, tuple]] = {}
        for command_buffer_id, ops in self._command_buffers:
            table[command_buffer_id] = dict(enumerate(ops))
        described = set(table)
        for span in self._spans:
            command_buffer_id, command_index = span[10], span[11]
            if command_buffer_id and command_buffer_id not in described:
                commands = table.setdefault(command_buffer_id, {})
                if span[1] == "dispatch" and command_index >= 0:
                    commands.setdefault(command_index, ("dispatch", span[6], span[7], span[8], 0))
        return table

    def record_clock_correlation(self, device_tick: int, host_begin_ns: int | None = None,
                                 host_end_ns: int | None = None) -> None:
        """Ties a device tick to host time (sampled between `host_begin_ns` and `host_end_ns`)."""
        if not self.recording:
            return
        begin = time.monotonic_ns() if host_begin_ns is None else host_begin_ns
        self._clock.append((device_tick, begin, begin if host_end_ns is None else host_end_ns))

    # The device layer's hooks ---------------------------------------------------------

    def attach(self, device: Any) -> Profile:
        """Starts the session and makes `device` (and its allocator) report to it.

        The device's hook sites test `device.profile is not None`; the allocator's and
        the driver's (its `profile`, for device-time spans) test theirs.
        """
        without_clock = (self.modes & DEVICE_TIME_MODES) - set(
            getattr(device, "default_profiling_modes", ()))
        if without_clock:
            raise UnimplementedError(
                f"device profiling mode {', '.join(sorted(without_clock))} is not supported "
                f"by driver {getattr(device, 'driver_name', '?')!r}: it has no device clock "
                "(host-execution records the CPU time of dispatches)")
        self.device_name = getattr(device, "identifier", self.device_name)
        self.start()
        device.allocator.profile = self
        device.driver.profile = self
        device.profile = self
        return self

    def detach(self, device: Any) -> Profile:
        """Stops the device reporting and closes the session."""
        if getattr(device, "profile", None) is self:
            device.profile = None
            device.driver.profile = None
        if getattr(device.allocator, "profile", None) is self:
            device.allocator.profile = None
        return self.stop()

    @property
    def records_host_execution(self) -> bool:
        """True while the session records host-execution spans (per operation, from the
        native stream's timestamps or a driver's own hooks)."""
        return self.recording and self._host_on

    def record_submission(self, op: str, wait: Sequence[tuple[Any, int]],
                          signal: Sequence[tuple[Any, int]], command_buffers: Sequence[Any] = (),
                          payload_length: int = 0, queue: int = 0) -> int:
        """Records a queue operation at the device's public layer; returns its submission id.

        Call it before the operation is handed to the driver. Besides the queue event it
        watches the semaphores: when `wait` is reached it records the ready time, and
        when every `signal` point is reached (or one fails) it records an execution span
        from ready to signal, with the failure's status code. An operation with no signal
        points gets no span. The span covers scheduling as well as running; per-dispatch
        spans come from driver hooks (`record_dispatch`).
        """
        if not self.recording:
            return 0
        command_buffer_id = operation_count = 0
        for command_buffer in command_buffers:
            cb_id = self.command_buffer_id(command_buffer)
            command_buffer_id = command_buffer_id or cb_id
            operation_count += len(getattr(command_buffer, "commands", ()))
        submitted = time.monotonic_ns()
        # [ready ns, submission id once recorded]; the ready callback may run at once
        # (waits already reached: IREE's "inline" strategy) or later on another thread.
        state = [0, 0]

        def ready(error: Error | None) -> None:
            state[0] = now = time.monotonic_ns()
            if state[1]:
                self.record_ready(state[1], now)

        when_all_reached(list(wait), ready)
        inline = state[0] != 0
        submission_id = self.record_queue(
            op, wait, signal, queue=queue, command_buffer_id=command_buffer_id,
            operation_count=max(1, operation_count), payload_length=payload_length,
            strategy="inline" if inline else "software_defer", host_time_ns=submitted)
        if not submission_id:
            return 0
        state[1] = submission_id
        if inline:
            self.record_ready(submission_id, state[0])

        def finished(error: Error | None) -> None:
            end = time.monotonic_ns()
            status = 0 if error is None else int(getattr(error, "code", 2))
            self.record_execution(op, state[0] or end, end, submission_id, queue=queue,
                                  worker=f"queue[{queue}]", command_buffer_id=command_buffer_id,
                                  status_code=status, payload_length=payload_length)

        if signal and self._host_on:
            when_all_reached(list(signal), finished)
        return submission_id

    def command_buffer_id(self, command_buffer: Any) -> int:
        """The command buffer's id in this session, describing it when first seen.

        Drivers pass it (with the command's index) to `record_dispatch`, so the renderer
        ties each dispatch span to its command. Held by weak reference: a profile must not keep a command buffer (and the
        buffers it binds) alive, or profiling would change the allocator's live bytes.
        """
        ids = self._command_buffer_objects
        entry = ids.get(id(command_buffer))
        if entry is not None and entry[0]() is command_buffer:
            return entry[1]
        command_buffer_id = self.new_command_buffer_id()
        try:
            ids[id(command_buffer)] = (weakref.ref(command_buffer), command_buffer_id)
        except TypeError:
            pass  # not weakly referenceable: described again on every submit
        commands = getattr(command_buffer, "commands", None)
        if commands is not None:
            self.record_command_buffer(command_buffer_id, [_describe(c) for c in commands])
        return command_buffer_id

    def record_heap_change(self, heap: str, delta: int, live_bytes: int, peak_bytes: int) -> None:
        """The allocator's hook: `delta` bytes came to (or, negative, left) `heap`.

        The transient ringbuffer's heap reports queue alloca/dealloca; other heaps
        report buffer allocate/free.
        """
        if delta >= 0:
            kind = "alloca" if heap == TRANSIENT_HEAP else "allocate"
        else:
            kind = "dealloca" if heap == TRANSIENT_HEAP else "free"
        self.record_memory(kind, abs(delta), heap, live_bytes, peak_bytes,
                           queue=0 if heap == TRANSIENT_HEAP else -1)

    # Views --------------------------------------------------------------------------

    def summary(self) -> ProfileSummary:
        """Operation counts, dispatch time, busy time per worker, bytes moved, peak bytes."""
        ops: dict[str, int] = {}
        for event in self._queue:
            ops[event[1]] = ops.get(event[1], 0) + 1
        busy: dict[str, int] = {}
        by_export: dict[str, tuple[int, int]] = {}
        dispatches = dispatch_ns = 0
        for span in self._spans:
            duration = max(0, span[5] - span[4])
            if span[1] == "dispatch":
                dispatches += 1
                dispatch_ns += duration
                name = export_name(span[6], span[7])
                count, total = by_export.get(name, (0, 0))
                by_export[name] = (count + 1, total + duration)
            if span[9] is not None:
                busy[span[9]] = busy.get(span[9], 0) + duration
        moved = sum(e[9] for e in self._queue if e[1] in TRANSFER_OPS)
        if not self._queue:
            moved = sum(s[13] for s in self._spans if s[1] in TRANSFER_OPS)
        peak = max((m[5] for m in self._memory), default=0)
        end = self.end_ns or time.monotonic_ns()
        return ProfileSummary(ops, dispatches, dispatch_ns, busy, moved, peak, self._dropped,
                              max(0, end - self.begin_ns) if self.begin_ns else 0, by_export)


    # Export (`profile_chrome`, `profile_ireeperf`) ------------------------------------

    def recorded(self) -> Recorded:
        """What the session recorded, as the exporters read it (see `Recorded`)."""
        samples = list(self._clock)
        if not samples and any(s[0] == DEVICE for s in self._spans):
            start = self.begin_ns or min(s[4] for s in self._spans)
            samples.append((0, start, start))
        return Recorded(self._queue, self._ready, self._spans, self._memory, samples,
                        self._command_buffer_table(), self._span_costs)

    def numbering(self) -> Numbering:
        """Small ids for the executables, functions and semaphores the session saw."""
        numbering = Numbering(self._spans, self._queue)
        for _, ops in self._command_buffers:
            for op, executable, export, _, _ in ops:
                if op == "dispatch" and executable is not None:
                    numbering.function(executable, export)
        return numbering

    def write(self, path: str | os.PathLike) -> None:
        """Writes the profile; the extension picks the format.

        `.json` is Chrome trace-event JSON; `.jsonl` (e.g. `run.ireeperf.jsonl`) is
        IREE's ireeperf-jsonl. IREE's binary `.ireeprof` is not written by tinyhal.
        """
        write_profiles([self], path)

    def to_chrome_trace(self) -> dict[str, Any]:
        """The session as a Chrome trace-event JSON object (`profile_chrome.trace`)."""
        from . import profile_chrome

        return profile_chrome.trace(self)

    def to_ireeperf_jsonl(self) -> str:
        """The session as ireeperf-jsonl text (`profile_ireeperf.records`, a line each)."""
        import json

        from . import profile_ireeperf

        return "".join(json.dumps(rec, separators=(",", ":")) + "\n"
                       for rec in profile_ireeperf.records(self))


class Recorded(NamedTuple):
    """A session's events, as tuples in the order they were recorded (the lists
    themselves, not copies: read them once recording has stopped).

    - `queue`: (submission_id, op, queue, host_ns, wait, signal, command_buffer_id,
      allocation_id, operation_count, payload_length, dependency strategy);
    - `ready`: (submission_id, host_ns) when a submission's waits were reached;
    - `spans`: (clock, op, queue, submission_id, start, end, executable, export,
      workgroups, worker, command_buffer_id, command_index, status_code,
      payload_length), `start`/`end` host ns or device ticks by `clock`;
    - `memory`: (kind, host_ns, heap, length, live_bytes, peak_bytes, allocation_id,
      submission_id, queue, memory_type, usage, offset);
    - `clock_samples`: (device_tick, host_begin_ns, host_end_ns); one at the session's
      start when device-time spans came without any;
    - `command_buffers`: command_buffer_id -> {command index: (op, executable, export,
      workgroups, length)}, described or inferred from the dispatches recorded;
    - `span_costs`: index in `spans` -> a dispatch's modelled cost fields, by name.
    """

    queue: list[tuple]
    ready: list[tuple[int, int]]
    spans: list[tuple]
    memory: list[tuple]
    clock_samples: list[tuple[int, int, int]]
    command_buffers: dict[int, dict[int, tuple]]
    span_costs: dict[int, dict[str, Any]] = {}


def export_name(executable: Any, export: Any) -> str:
    """The name of an executable's export given by name or ordinal."""
    if isinstance(export, str):
        return export
    names = getattr(executable, "export_names", None)
    if names is not None and isinstance(export, int) and 0 <= export < len(names):
        return str(names[export])
    return f"export[{export}]"


def write_profiles(profiles: Sequence[Profile], path: str | os.PathLike) -> None:
    """Writes the sessions of a run's devices to one file (`Profile.write`'s formats);
    one profile is written exactly as `Profile.write` writes it."""
    name = os.fspath(path)
    if name.endswith(".jsonl"):
        from . import profile_ireeperf as exporter
    elif name.endswith(".json"):
        from . import profile_chrome as exporter
    else:
        raise UnimplementedError(
            f"cannot write profile '{name}': tinyhal writes .json (Chrome trace) and "
            ".jsonl (ireeperf-jsonl), not IREE's binary .ireeprof")
    exporter.write(list(profiles), name)


def _describe(command: Any) -> tuple[str, Any, Any, tuple, int]:
    """A recorded command as `(op, executable, export, workgroups, length)`."""
    op = getattr(command, "op", None)
    if op == "dispatch":
        return ("dispatch", command.executable, command.ordinal, tuple(command.workgroups), 0)
    if op == "update":
        return ("update", None, None, (), len(command.source))
    if op in COMMAND_OPS:
        operands = command.operands
        return (op, None, None, (), max(0, operands[-1][0].length) if operands else 0)
    raise InvalidArgumentError(f"cannot profile command {command!r}")


class Numbering:
    """Stable small ids for the objects a session saw, by first appearance."""

    def __init__(self, spans: list[tuple], queue_events: list[tuple]) -> None:
        self.executables: list[tuple[Any, set[int]]] = []
        self.function_names: dict[tuple[int, int], str] = {}
        self._executable_ids: dict[int, int] = {}
        self._semaphore_ids: dict[int, int] = {}
        self._ordinals: dict[tuple[int, str], int] = {}
        self.clock_ids = itertools.count(1)
        for span in spans:
            if span[6] is not None:
                self.function(span[6], span[7])
        for event in queue_events:
            self.points(event[4])
            self.points(event[5])

    def function(self, executable: Any, export: Any) -> tuple[int, int]:
        """(executable id, function ordinal) of a dispatch; (0, -1) when it has none."""
        if executable is None:
            return 0, -1
        executable_id = self._executable_ids.get(id(executable))
        if executable_id is None:
            self.executables.append((executable, set()))
            executable_id = self._executable_ids[id(executable)] = len(self.executables)
        functions = self.executables[executable_id - 1][1]
        names = getattr(executable, "export_names", None)
        if isinstance(export, str):
            ordinal = self._ordinals.get((executable_id, export), -1)
            if ordinal < 0:
                if names is not None and export in names:
                    ordinal = list(names).index(export)
                else:
                    ordinal = max(functions, default=-1) + 1
                self._ordinals[(executable_id, export)] = ordinal
            name = export
        else:
            ordinal = int(export)
            name = export_name(executable, ordinal)
        functions.add(ordinal)
        self.function_names.setdefault((executable_id, ordinal), name)
        return executable_id, ordinal

    def points(self, points: Iterable[tuple[Any, int]]) -> list[list[int]]:
        out = []
        for semaphore, value in points:
            sid = self._semaphore_ids.get(id(semaphore))
            if sid is None:
                sid = self._semaphore_ids[id(semaphore)] = len(self._semaphore_ids) + 1
            out.append([sid, int(value)])
        return out
