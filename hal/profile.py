"""Device profiling sessions: queue, execution and memory events, exported two ways.

A `Profile` is one profiling session of one device. Hook sites in the HAL call its
`record_*` functions while it is recording; afterwards it exports

- **Chrome trace-event JSON** (`to_chrome_trace`, `.json`), which Perfetto and
  chrome://tracing open, and
- **IREE's ireeperf-jsonl interchange stream** (`to_ireeperf_jsonl`, `.jsonl`), the
  format `iree-profile export --format=ireeperf-jsonl` writes and IREE 3.13's
  `iree-profile-render --format=perfetto` turns into a native Perfetto trace.

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

Facts about ireeperf-jsonl (schema version 15, as IREE 3.13.0's exporter writes it and
its renderer reads it) that this module relies on:

- One JSON object per line. Every line has `schema_version` (15) and `record_type`.
  The renderer refuses a stream whose first `schema` line lacks
  `format == "ireeperf-jsonl"` or has another version; other lines it does not know
  it ignores, and unknown fields of known lines become debug annotations in Perfetto
  (scalars and lists only), which is where tinyhal's extra fields (`tinyhal_*`) show.
- Times are nanoseconds. `iree_host_time_ns` is IREE's `iree_time_now()`, which on
  Linux is CLOCK_MONOTONIC, the clock of Python's `time.monotonic_ns()`; host events
  from tinyhal and from IREE's own runtime in the same boot therefore share a clock.
- Ordinals absent in IREE's structs are written as 4294967295 (UINT32_MAX); the
  renderer reads that as "none" (for `queue_ordinal`, a device-scope track).
- Metadata lines: `session` (`event` begin/end, `session_status`), `device`
  (`physical_device_ordinal`, `queue_count`), `queue` (device, queue ordinal,
  `stream_id`), `executable` (`executable_id`, `function_count`) and
  `executable_function` (`executable_id`, `function_ordinal`, `name`). The renderer
  creates a track per device and per queue from `device`/`queue` lines.
- `queue_event`: one host-timestamped record per queue operation: `event_id`, `op`
  (barrier, dispatch, execute, copy, fill, update, read, write, alloca, dealloca,
  host_call) with its numeric `type_value`, `dependency_strategy` (none, inline,
  device_barrier, software_defer), `submission_id`, `command_buffer_id`,
  `allocation_id`, `host_time_ns` (submit) and `ready_host_time_ns` (waits met; the
  renderer draws a second instant when it differs), `wait_count`, `signal_count`,
  `barrier_count`, `operation_count`, `payload_length` (bytes moved). IREE records
  only counts of waits and signals; tinyhal adds the points themselves as
  `tinyhal_wait_points` / `tinyhal_signal_points` (`[semaphore, value]` pairs, the
  semaphore numbered by first appearance in the session).
- `host_execution_event`: a span of host work (IREE's local drivers write one per
  dispatch, with `op` "dispatch" and `key` the export name, and one per command-buffer
  `execute`): `start_host_time_ns`, `end_host_time_ns`, `duration_ns`, `valid`,
  `status_code`, `workgroup_count`, `workgroup_size`, `tile_count`,
  `tile_duration_sum_ns`, plus the ids above and `executable_id`/`function_ordinal`.
  The renderer puts these on "host execution" lanes per queue, giving overlapping
  spans separate lanes.
- `command_buffer` (`command_buffer_id`, `command_categories`) and `command_operation`
  (`command_buffer_id`, `command_index`, `op` barrier/dispatch/fill/copy/update, `key`,
  `executable_id`, `function_ordinal`, `workgroup_count`, `length`): what a command
  buffer holds. The renderer names an `execute` span "execute cb#N (ops, dispatches)"
  from them, and marks a `host_execution_event` carrying a `command_index` with an
  instant on the queue's "command buffer operations" track. For MobileNetV2 on sync and
  task tinyhal's list equals the one IREE's local-task profile holds, command by command.
- `dispatch_event` / `queue_device_event`: spans in device ticks (`start_tick`,
  `end_tick`). The renderer maps ticks to host time by a straight line through the
  first and last `clock_correlation` samples of the device (`device_tick` against the
  midpoint of `host_time_begin_ns`/`host_time_end_ns`); with one sample the map is a
  pure offset at one tick per nanosecond. Without any sample the span is dropped
  unless `derived_time_available` is true. tinyhal's modelled device time (emu) is in
  nanosecond ticks and goes here.
- `memory_event`: `event_type` (queue_alloca, queue_dealloca, buffer_allocate,
  buffer_free, buffer_import, ... with `event_type_value`), `host_time_ns`,
  `allocation_id`, `length`, `offset`, `memory_type`, `buffer_usage`, pool fields.
  The renderer draws instants and keeps a per-queue counter of queue_alloca minus
  queue_dealloca bytes. tinyhal adds `tinyhal_heap`, `tinyhal_live_bytes` and
  `tinyhal_peak_bytes` (the allocator's device-wide counts after the event).
- `event_relationship`: `kind`, `source_type`/`source_id`, `target_type`/`target_id`
  on a (device, queue, stream); the renderer turns relationships whose target is an
  execution span into Perfetto flow arrows. tinyhal links each queue submission to its
  execution spans (kind `queue_submission_host_execution_event`, or
  `queue_submission_dispatch` / `queue_submission_queue_device_event` for device time).
- `diagnostic` (`severity`, `category`, `message`): tinyhal writes one of category
  `truncated_chunk` with `dropped_records` when a session hit its event capacity.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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

_HOST_EXECUTION_FLAG_COMMAND_BUFFER = 1


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
                        status_code: int = 0) -> None:
        """Records one dispatch that ran.

        `executable` is the executable object (its `export_names`, if any, name the
        functions in the export); `export` is the export ordinal or name.
        """
        self._span(clock, "dispatch", queue, submission_id, start, end, executable, export,
                   tuple(workgroups), worker, command_buffer_id, command_index, status_code, 0)

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

        The device's hook sites test `device.profile is not None`; the allocator's test
        `allocator.profile is not None`.
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
        device.profile = self
        return self

    def detach(self, device: Any) -> Profile:
        """Stops the device reporting and closes the session."""
        if getattr(device, "profile", None) is self:
            device.profile = None
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
                name = self._export_name(span[6], span[7])
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

    @staticmethod
    def _export_name(executable: Any, export: Any) -> str:
        if isinstance(export, str):
            return export
        names = getattr(executable, "export_names", None)
        if names is not None and isinstance(export, int) and 0 <= export < len(names):
            return str(names[export])
        return f"export[{export}]"

    # Export: shared numbering ----------------------------------------------------------

    def _numbering(self) -> _Numbering:
        numbering = _Numbering(self._spans, self._queue)
        for _, ops in self._command_buffers:
            for op, executable, export, _, _ in ops:
                if op == "dispatch" and executable is not None:
                    numbering.function(executable, export)
        return numbering

    def _clock_samples(self) -> list[tuple[int, int, int]]:
        samples = list(self._clock)
        if not samples and any(s[0] == DEVICE for s in self._spans):
            start = self.begin_ns or min(s[4] for s in self._spans)
            samples.append((0, start, start))
        return samples

    def write(self, path: str | os.PathLike) -> None:
        """Writes the profile; the extension picks the format.

        `.json` is Chrome trace-event JSON; `.jsonl` (e.g. `run.ireeperf.jsonl`) is
        IREE's ireeperf-jsonl. IREE's binary `.ireeprof` is not written by tinyhal.
        """
        name = os.fspath(path)
        if name.endswith(".jsonl"):
            self.write_ireeperf_jsonl(name)
        elif name.endswith(".json"):
            self.write_chrome_trace(name)
        else:
            raise UnimplementedError(
                f"cannot write profile '{name}': tinyhal writes .json (Chrome trace) and "
                ".jsonl (ireeperf-jsonl), not IREE's binary .ireeprof"
            )

    # Export: ireeperf-jsonl -------------------------------------------------------------

    def write_ireeperf_jsonl(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            for line in self.ireeperf_lines():
                f.write(line)
                f.write("\n")

    def to_ireeperf_jsonl(self) -> str:
        return "".join(line + "\n" for line in self.ireeperf_lines())

    def ireeperf_records(self) -> Iterator[dict[str, Any]]:
        """The session as ireeperf-jsonl records (dicts), in the exporter's order."""
        numbering = self._numbering()
        index = itertools.count()
        device_ordinal = self.physical_device_ordinal

        def record(record_type: str, **fields: Any) -> dict[str, Any]:
            return {"schema_version": SCHEMA_VERSION, "record_type": record_type,
                    "source_record_index": next(index), **fields}

        yield {
            "schema_version": SCHEMA_VERSION, "record_type": "schema",
            "format": "ireeperf-jsonl", "contract": "schema_versioned_interchange",
            "row_key": "record_type", "source_format": "tinyhal", "source_version_major": 0,
            "source_version_minor": 1,
            "time_domains": {
                "iree_host_time_ns": "CLOCK_MONOTONIC nanoseconds (time.monotonic_ns)",
                "device_tick": "modelled device nanoseconds (emu) or raw device ticks",
            },
            "clock_fit": {"basis": "first_last_clock_correlation",
                          "rounding": "nearest_integer_nanosecond"},
        }
        yield record("session", event="begin", session_id=1, stream_id=0, event_id=0,
                     session_status_code=0, session_status="OK")
        yield record("device", physical_device_ordinal=device_ordinal, flags=0,
                     queue_count=self.queue_count,
                     physical_device_uuid_present=False, physical_device_uuid=None,
                     tinyhal_device=self.device_name)
        for q in range(self.queue_count):
            yield record("queue", physical_device_ordinal=device_ordinal, queue_ordinal=q,
                         stream_id=0)
        for executable_id, (executable, functions) in enumerate(numbering.executables, 1):
            names = getattr(executable, "export_names", None)
            count = len(names) if names is not None else max(functions, default=-1) + 1
            yield record("executable", executable_id=executable_id, flags=0,
                         function_count=count, code_object_hash_present=False,
                         code_object_hash=None)
            for ordinal in range(count) if names is not None else sorted(functions):
                yield record("executable_function", executable_id=executable_id,
                             function_ordinal=ordinal, flags=0,
                             name=numbering.function_names[(executable_id, ordinal)]
                             if (executable_id, ordinal) in numbering.function_names
                             else self._export_name(executable, ordinal),
                             constant_count=0, binding_count=0, parameter_count=0,
                             workgroup_size=[0, 0, 0], function_hash_present=False,
                             function_hash=None)
        for command_buffer_id, commands in sorted(self._command_buffer_table().items()):
            categories = 0
            for op, *_ in commands.values():
                categories |= 2 if op == "dispatch" else 1 if op != "barrier" else 0
            yield record("command_buffer", command_buffer_id=command_buffer_id, flags=0,
                         physical_device_ordinal=device_ordinal, mode=0,
                         command_categories=categories,
                         queue_affinity=(1 << 64) - 1)
            for command_index, (op, executable, export, workgroups, length) in sorted(
                    commands.items()):
                executable_id, ordinal = numbering.function(executable, export) \
                    if op == "dispatch" and executable is not None else (0, -1)
                name = numbering.function_names.get((executable_id, ordinal), op) \
                    if executable_id else op
                yield record(
                    "command_operation", command_buffer_id=command_buffer_id,
                    command_index=command_index, op=op, key=name, flags=0,
                    block_structure=False, block_ordinal=NO_ORDINAL,
                    block_command_ordinal=NO_ORDINAL, executable_id=executable_id,
                    function_ordinal=ordinal if executable_id else NO_ORDINAL, binding_count=0,
                    workgroup_count=list(workgroups) if workgroups else [0, 0, 0],
                    workgroup_size=[0, 0, 0], source_ordinal=NO_ORDINAL,
                    target_ordinal=NO_ORDINAL, source_offset=0, target_offset=0,
                    length=length, target_block_ordinal=NO_ORDINAL,
                    alternate_block_ordinal=NO_ORDINAL,
                )
        for tick, begin, end in self._clock_samples():
            yield record("clock_correlation", sample_id=next(numbering.clock_ids), flags=0,
                         physical_device_ordinal=device_ordinal, device_tick_domain="device_tick",
                         device_tick=tick,
                         host_cpu_timestamp_domain="driver_host_cpu_timestamp_ns",
                         host_cpu_timestamp_ns=begin,
                         host_system_timestamp_domain="driver_host_system_timestamp",
                         host_system_timestamp=begin, host_system_frequency_hz=1_000_000_000,
                         host_time_domain="iree_host_time_ns", host_time_begin_ns=begin,
                         host_time_end_ns=end, host_time_uncertainty_ns=max(0, end - begin))
        ready = dict(self._ready)
        for (submission_id, op, queue, host_ns, wait, signal, command_buffer_id, allocation_id,
             operation_count, payload_length, strategy) in self._queue:
            yield record(
                "queue_event", event_id=submission_id, op=op, type_value=QUEUE_OPS[op],
                flags=0, dependency_strategy=strategy if wait else "none",
                submission_id=submission_id, command_buffer_id=command_buffer_id,
                allocation_id=allocation_id, physical_device_ordinal=device_ordinal,
                queue_ordinal=queue,
                stream_id=0, host_time_ns=host_ns, ready_host_time_ns=ready.get(submission_id, 0),
                host_time_domain="iree_host_time_ns", wait_count=len(wait),
                signal_count=len(signal), barrier_count=1 if op == "barrier" else 0,
                operation_count=operation_count, payload_length=payload_length,
                tinyhal_wait_points=numbering.points(wait),
                tinyhal_signal_points=numbering.points(signal),
            )
        relationships: list[tuple[str, str, int, int, int]] = []
        for event_id, span in enumerate(self._spans, 1):
            yield self._span_record(record, event_id, span, numbering)
            clock, op, queue, submission_id = span[0], span[1], span[2], span[3]
            if submission_id:
                if clock == HOST:
                    kind, target = "queue_submission_host_execution_event", "host_execution_event"
                elif op == "dispatch":
                    kind, target = "queue_submission_dispatch", "dispatch_event"
                else:
                    kind, target = ("queue_submission_queue_device_event",
                                    "queue_device_event")
                relationships.append((kind, target, queue, submission_id, event_id))
        for event_id, (kind, host_ns, heap, length, live, peak, allocation_id, submission_id,
                       queue, memory_type, usage, offset) in enumerate(self._memory, 1):
            event_type, type_value = MEMORY_KINDS[kind]
            yield record(
                "memory_event", event_id=event_id, event_type=event_type,
                event_type_value=type_value, flags=1 if queue >= 0 else 0, result=1,
                host_time_ns=host_ns, allocation_id=allocation_id,
                host_time_domain="iree_host_time_ns", pool_id=0, backing_id=0,
                submission_id=submission_id, physical_device_ordinal=device_ordinal,
                queue_ordinal=queue if queue >= 0 else NO_ORDINAL, frontier_entry_count=0,
                memory_type=memory_type, buffer_usage=usage, offset=offset, length=length,
                alignment=1, externally_owned=kind in ("import", "unimport"),
                pool_stats_available=False, pool_bytes_reserved=0, pool_bytes_free=0,
                pool_bytes_committed=0, pool_budget_limit=0, pool_reservation_count=0,
                pool_slab_count=0, tinyhal_heap=heap, tinyhal_live_bytes=live,
                tinyhal_peak_bytes=peak,
            )
        for relationship_id, (kind, target, queue, submission_id, event_id) in enumerate(
                relationships, 1):
            yield record(
                "event_relationship", relationship_id=relationship_id, kind=kind,
                kind_value=_RELATIONSHIP_KINDS[kind], source_type="queue_submission",
                source_type_value=1, target_type=target,
                target_type_value=_ENDPOINT_TYPES[target], physical_device_ordinal=device_ordinal,
                queue_ordinal=queue, stream_id=0, source_id=submission_id,
                source_secondary_id=0, target_id=event_id, target_secondary_id=0,
            )
        if self._dropped:
            yield record("diagnostic", severity="warning", category="truncated_chunk",
                         content_type="tinyhal-profile",
                         message=f"session capacity of {self.capacity} events per family "
                                 "was reached; later events were dropped",
                         dropped_records=self._dropped)
        yield record("session", event="end", session_id=1, stream_id=0, event_id=0,
                     session_status_code=0, session_status="OK")

    def _span_record(self, record: Any, event_id: int, span: tuple,
                     numbering: _Numbering) -> dict[str, Any]:
        (clock, op, queue, submission_id, start, end, executable, export, workgroups, worker,
         command_buffer_id, command_index, status_code, payload_length) = span
        executable_id, ordinal = numbering.function(executable, export)
        key = numbering.function_names.get((executable_id, ordinal)) if executable_id else None
        common = dict(
            physical_device_ordinal=self.physical_device_ordinal, queue_ordinal=queue,
            stream_id=0, event_id=event_id,
            submission_id=submission_id, command_buffer_id=command_buffer_id,
            command_index=command_index if command_index >= 0 else NO_ORDINAL,
            executable_id=executable_id,
            function_ordinal=ordinal if executable_id else NO_ORDINAL,
        )
        valid = end >= start >= 0
        duration = end - start if valid else 0
        if clock == HOST:
            tiles = _product(workgroups) if op == "dispatch" else 0
            return record(
                "host_execution_event", **common, allocation_id=0, op=op, key=key,
                type_value=QUEUE_OPS[op],
                flags=_HOST_EXECUTION_FLAG_COMMAND_BUFFER if command_buffer_id else 0,
                status_code=status_code, workgroup_count=list(workgroups),
                workgroup_size=[0, 0, 0], host_time_domain="iree_host_time_ns",
                start_host_time_ns=start, end_host_time_ns=end, duration_ns=duration,
                valid=valid, payload_length=payload_length, tile_count=tiles,
                tile_duration_sum_ns=duration if tiles else 0, operation_count=1,
                tinyhal_worker=worker,
            )
        device_time = dict(
            device_tick_domain="device_tick", start_tick=start, end_tick=end,
            duration_ticks=duration, valid=valid, derived_time_available=False,
            derived_time_domain="driver_host_cpu_timestamp_ns",
            derived_time_basis="first_last_clock_correlation", clock_fit_first_sample_id=0,
            clock_fit_last_sample_id=0, start_driver_host_cpu_time_ns=0,
            end_driver_host_cpu_time_ns=0, duration_time_domain="device_tick_duration_ns",
            duration_ns=duration, tinyhal_worker=worker,
        )
        if op == "dispatch":
            return record("dispatch_event", **common, key=key, flags=0,
                          workgroup_count=list(workgroups), workgroup_size=[0, 0, 0],
                          **device_time)
        del common["command_index"], common["executable_id"], common["function_ordinal"]
        return record("queue_device_event", **common, allocation_id=0, op=op,
                      type_value=QUEUE_OPS[op], flags=0, payload_length=payload_length,
                      operation_count=1, **device_time)

    def ireeperf_lines(self) -> Iterator[str]:
        for rec in self.ireeperf_records():
            yield json.dumps(rec, separators=(",", ":"))

    # Export: Chrome trace-event JSON -------------------------------------------------------

    def write_chrome_trace(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_chrome_trace(), f, separators=(",", ":"))

    def _chrome_epoch(self) -> int:
        to_host = _tick_mapper(self._clock_samples())
        starts = [e[3] for e in self._queue] + [m[1] for m in self._memory]
        starts += [s[4] if s[0] == HOST else to_host(s[4]) for s in self._spans]
        epoch = min(starts, default=self.begin_ns)
        return min(epoch, self.begin_ns) if self.begin_ns else epoch

    def to_chrome_trace(self, first_pid: int = 1, epoch: int | None = None) -> dict[str, Any]:
        """The session as a Chrome trace-event JSON object (`{"traceEvents": [...]}`).

        Process `first_pid` is the device in host time: per queue a track of submissions
        (instants), tracks of execution spans per worker (lanes where spans overlap),
        and memory counters. Process `first_pid + 1` holds device-time spans (emu's
        modelled clock), mapped onto host time the way IREE's renderer maps device
        ticks. `ts` and `dur` are microseconds from `epoch` (default: the session start;
        `write_profiles` passes one epoch for all devices of a run).
        """
        numbering = self._numbering()
        to_host = _tick_mapper(self._clock_samples())
        if epoch is None:
            epoch = self._chrome_epoch()
        host_pid, device_pid = first_pid, first_pid + 1

        def us(ns: int) -> float:
            return (ns - epoch) / 1000.0

        events: list[dict[str, Any]] = []
        tracks = _ChromeTracks(events)
        tracks.process(host_pid, f"{self.device_name} (host time)")
        ready = dict(self._ready)
        for (submission_id, op, queue, host_ns, wait, signal, command_buffer_id, allocation_id,
             _count, payload_length, _strategy) in self._queue:
            tid = tracks.thread(host_pid, f"queue[{queue}] submissions", 10 * queue)
            args = {"submission_id": submission_id, "wait": numbering.points(wait),
                    "signal": numbering.points(signal), "payload_length": payload_length}
            if command_buffer_id:
                args["command_buffer_id"] = command_buffer_id
            if allocation_id:
                args["allocation_id"] = allocation_id
            events.append({"name": f"queue:{op}", "cat": "queue", "ph": "i", "s": "t",
                           "pid": host_pid, "tid": tid, "ts": us(host_ns), "args": args})
            ready_ns = ready.get(submission_id)
            if ready_ns is not None and ready_ns != host_ns:
                events.append({"name": f"queue_ready:{op}", "cat": "queue", "ph": "i", "s": "t",
                               "pid": host_pid, "tid": tid, "ts": us(ready_ns),
                               "args": {"submission_id": submission_id}})
        lanes: dict[tuple[int, str], _Lanes] = {}
        spans = sorted(
            ((s[4] if s[0] == HOST else to_host(s[4]), s[5] if s[0] == HOST else to_host(s[5]), i, s)
             for i, s in enumerate(self._spans)),
            key=lambda item: (item[0], item[1], item[2]),
        )
        for start, end, _, span in spans:
            (clock, op, queue, submission_id, raw_start, raw_end, executable, export, workgroups,
             worker, command_buffer_id, command_index, status_code, payload_length) = span
            pid = host_pid if clock == HOST else device_pid
            if pid == device_pid:
                tracks.process(device_pid, f"{self.device_name} (device time)")
            group = worker if worker is not None else f"queue[{queue}] execution"
            lane = lanes.setdefault((pid, group), _Lanes()).place(start, end)
            label = group if lane == 0 else f"{group} #{lane}"
            tid = tracks.thread(pid, label, 10 * queue + 1)
            name = self._export_name(executable, export) if op == "dispatch" else op
            args: dict[str, Any] = {"submission_id": submission_id, "queue": queue}
            if op == "dispatch":
                args["workgroup_count"] = list(workgroups)
                args["executable_id"] = numbering.function(executable, export)[0]
            if command_buffer_id:
                args["command_buffer_id"] = command_buffer_id
                if command_index >= 0:
                    args["command_index"] = command_index
            if payload_length:
                args["payload_length"] = payload_length
            if status_code:
                args["status_code"] = status_code
            if clock == DEVICE:
                args["start_tick"] = raw_start
                args["end_tick"] = raw_end
            events.append({"name": name, "cat": op, "ph": "X", "pid": pid, "tid": tid,
                           "ts": us(start), "dur": max(0, end - start) / 1000.0, "args": args})
        for (kind, host_ns, heap, length, live, peak, allocation_id, submission_id, queue,
             _type, _usage, _offset) in self._memory:
            tid = tracks.thread(host_pid, "memory", 1_000_000)
            events.append({"name": f"memory:{kind}", "cat": "memory", "ph": "i", "s": "t",
                           "pid": host_pid, "tid": tid, "ts": us(host_ns),
                           "args": {"length": length, "heap": heap, "allocation_id": allocation_id,
                                    "submission_id": submission_id, "queue": queue}})
            events.append({"name": "device memory", "cat": "memory", "ph": "C",
                           "pid": host_pid, "tid": tid, "ts": us(host_ns), "args": {"live_bytes": live, "peak_bytes": peak}})
        other = {"device": self.device_name, "modes": sorted(self.modes),
                 "dropped_events": self._dropped, "clock": "CLOCK_MONOTONIC"}
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def ireeperf_records_of(profiles: Sequence[Profile]) -> Iterator[dict[str, Any]]:
    """One ireeperf-jsonl stream for the sessions of several devices of one run, as IREE
    writes one profile for a device list: one schema and session, then each device's
    records in device order, told apart by `physical_device_ordinal` (the profile's
    position). Executable and command-buffer ids are made unique across devices; event
    and submission ids count per device, as their records carry the ordinal."""
    index = itertools.count()
    end: dict[str, Any] | None = None
    offsets = {"executable_id": 0, "command_buffer_id": 0}
    for ordinal, profile in enumerate(profiles):
        profile.physical_device_ordinal = ordinal
        highest = dict(offsets)
        for rec in profile.ireeperf_records():
            kind = rec["record_type"]
            if ordinal and (kind == "schema" or (kind == "session" and rec["event"] == "begin")):
                continue
            if kind == "session" and rec["event"] == "end":
                end = rec
                continue
            if kind != "schema":
                rec["source_record_index"] = next(index)
            for key, offset in offsets.items():
                if rec.get(key):
                    rec[key] += offset
                    highest[key] = max(highest[key], rec[key])
            yield rec
        offsets = highest
    if end is not None:
        yield {**end, "source_record_index": next(index)}


def chrome_trace_of(profiles: Sequence[Profile]) -> dict[str, Any]:
    """One Chrome trace for several devices of one run: device i is processes 2i+1 (host
    time) and 2i+2 (device time), all on one time axis from the earliest event."""
    epoch = min((p._chrome_epoch() for p in profiles), default=0)
    events: list[dict[str, Any]] = []
    for ordinal, profile in enumerate(profiles):
        for event in profile.to_chrome_trace(2 * ordinal + 1, epoch)["traceEvents"]:
            if event["name"] == "process_name":  # two devices of one driver share a name
                event["args"]["name"] = f"[{ordinal}] {event['args']['name']}"
            events.append(event)
    other = {"devices": [p.device_name for p in profiles],
             "modes": sorted(set().union(*(p.modes for p in profiles))),
             "dropped_events": sum(p.dropped_events for p in profiles), "clock": "CLOCK_MONOTONIC"}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def write_profiles(profiles: Sequence[Profile], path: str | os.PathLike) -> None:
    """Writes the sessions of a run's devices to one file (`Profile.write`'s formats);
    one profile is written exactly as `Profile.write` writes it."""
    if len(profiles) == 1:
        profiles[0].write(path)
        return
    name = os.fspath(path)
    if name.endswith(".jsonl"):
        text = "".join(json.dumps(rec, separators=(",", ":")) + "\n"
                       for rec in ireeperf_records_of(profiles))
    elif name.endswith(".json"):
        text = json.dumps(chrome_trace_of(profiles), separators=(",", ":"))
    else:
        raise UnimplementedError(f"cannot write profile '{name}': tinyhal writes .json "
                                 "(Chrome trace) and .jsonl (ireeperf-jsonl)")
    with open(name, "w", encoding="utf-8") as f:
        f.write(text)


_RELATIONSHIP_KINDS = {
    "queue_submission_dispatch": 1,
    "queue_submission_queue_device_event": 2,
    "queue_event_host_execution_event": 3,
    "queue_submission_host_execution_event": 4,
}
_ENDPOINT_TYPES = {
    "queue_submission": 1, "queue_event": 2, "dispatch_event": 3, "command_operation": 4,
    "memory_event": 5, "artifact": 6, "queue_device_event": 7, "host_execution_event": 8,
}


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


def _product(values: Sequence[int]) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result


class _Numbering:
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
            name = Profile._export_name(executable, ordinal)
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


def _tick_mapper(samples: list[tuple[int, int, int]]):
    """Device tick -> host ns through the first and last samples (IREE's renderer's fit)."""
    if not samples:
        return lambda tick: tick
    ordered = sorted(samples)
    first_tick, b0, e0 = ordered[0]
    last_tick, b1, e1 = ordered[-1]
    first_host, last_host = (b0 + e0) // 2, (b1 + e1) // 2
    ticks = last_tick - first_tick
    if ticks == 0:
        return lambda tick: first_host + (tick - first_tick)
    span = last_host - first_host
    return lambda tick: first_host + round((tick - first_tick) * span / ticks)


class _Lanes:
    """Gives spans that overlap in time separate lanes (lowest free lane first)."""

    def __init__(self) -> None:
        self._ends: list[int] = []

    def place(self, start: int, end: int) -> int:
        for lane, lane_end in enumerate(self._ends):
            if lane_end <= start:
                self._ends[lane] = end
                return lane
        self._ends.append(end)
        return len(self._ends) - 1


class _ChromeTracks:
    """Numbers Chrome trace threads and writes their name metadata once."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events
        self._tids: dict[tuple[int, str], int] = {}
        self._pids: set[int] = set()

    def process(self, pid: int, name: str) -> None:
        if pid not in self._pids:
            self._pids.add(pid)
            self._events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                 "args": {"name": name}})
            self._events.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                                 "tid": 0, "args": {"sort_index": pid}})

    def thread(self, pid: int, name: str, sort_index: int) -> int:
        key = (pid, name)
        tid = self._tids.get(key)
        if tid is None:
            tid = self._tids[key] = len(self._tids) + 1
            self._events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                                 "args": {"name": name}})
            self._events.append({"name": "thread_sort_index", "ph": "M", "pid": pid,
                                 "tid": tid, "args": {"sort_index": sort_index}})
        return tid
