"""The ireeperf-jsonl exporter: a profiling session as IREE 3.13's interchange stream.

`iree-profile export --format=ireeperf-jsonl` writes this format and IREE 3.13's
`iree-profile-render --format=perfetto` turns it into a native Perfetto trace.
`records(profile)` is one session in the exporter's order; `merged_records(profiles)`
the sessions of a run's devices as one stream, as IREE writes one profile for a device
list; `write(profiles, path)` writes either. The session's events come from
`Profile.recorded()` and its object ids from `Profile.numbering()`.

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
- A `dispatch_event` of emu's modelled time carries what its cost model said, as
  `tinyhal_compute_cycles`, `tinyhal_stall_cycles`, `tinyhal_dram_read_bytes`,
  `tinyhal_dram_write_bytes`, `tinyhal_utilisation` and `tinyhal_work_source`
  (unknown fields of a known line: Perfetto debug annotations, as above).
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
from collections.abc import Iterator, Sequence
from typing import Any

from .profile import (
    HOST,
    MEMORY_KINDS,
    NO_ORDINAL,
    QUEUE_OPS,
    SCHEMA_VERSION,
    Numbering,
    Profile,
    export_name,
)

__all__ = ["merged_records", "records", "write"]

HOST_EXECUTION_FLAG_COMMAND_BUFFER = 1
RELATIONSHIP_KINDS = {
    "queue_submission_dispatch": 1,
    "queue_submission_queue_device_event": 2,
    "queue_event_host_execution_event": 3,
    "queue_submission_host_execution_event": 4,
}
ENDPOINT_TYPES = {
    "queue_submission": 1, "queue_event": 2, "dispatch_event": 3, "command_operation": 4,
    "memory_event": 5, "artifact": 6, "queue_device_event": 7, "host_execution_event": 8,
}


def write(profiles: Sequence[Profile], path: str | os.PathLike) -> None:
    """Writes the sessions to `path`: one session's records, or the merged stream of
    several (`merged_records`), one JSON object per line."""
    stream = records(profiles[0]) if len(profiles) == 1 else merged_records(profiles)
    with open(path, "w", encoding="utf-8") as f:
        for rec in stream:
            f.write(json.dumps(rec, separators=(",", ":")))
            f.write("\n")


def records(profile: Profile) -> Iterator[dict[str, Any]]:
    """One session as ireeperf-jsonl records (dicts), in the order IREE's exporter writes."""
    recorded = profile.recorded()
    numbering = profile.numbering()
    index = itertools.count()
    device_ordinal = profile.physical_device_ordinal

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
                 queue_count=profile.queue_count,
                 physical_device_uuid_present=False, physical_device_uuid=None,
                 tinyhal_device=profile.device_name)
    for q in range(profile.queue_count):
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
                         else export_name(executable, ordinal),
                         constant_count=0, binding_count=0, parameter_count=0,
                         workgroup_size=[0, 0, 0], function_hash_present=False,
                         function_hash=None)
    for command_buffer_id, commands in sorted(recorded.command_buffers.items()):
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
    for tick, begin, end in recorded.clock_samples:
        yield record("clock_correlation", sample_id=next(numbering.clock_ids), flags=0,
                     physical_device_ordinal=device_ordinal, device_tick_domain="device_tick",
                     device_tick=tick,
                     host_cpu_timestamp_domain="driver_host_cpu_timestamp_ns",
                     host_cpu_timestamp_ns=begin,
                     host_system_timestamp_domain="driver_host_system_timestamp",
                     host_system_timestamp=begin, host_system_frequency_hz=1_000_000_000,
                     host_time_domain="iree_host_time_ns", host_time_begin_ns=begin,
                     host_time_end_ns=end, host_time_uncertainty_ns=max(0, end - begin))
    ready = dict(recorded.ready)
    for (submission_id, op, queue, host_ns, wait, signal, command_buffer_id, allocation_id,
         operation_count, payload_length, strategy) in recorded.queue:
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
    for event_id, span in enumerate(recorded.spans, 1):
        rec = _span_record(record, event_id, span, numbering, device_ordinal)
        cost = recorded.span_costs.get(event_id - 1)
        if cost:
            rec.update({f"tinyhal_{name}": value for name, value in cost.items()})
        yield rec
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
                   queue, memory_type, usage, offset) in enumerate(recorded.memory, 1):
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
            kind_value=RELATIONSHIP_KINDS[kind], source_type="queue_submission",
            source_type_value=1, target_type=target,
            target_type_value=ENDPOINT_TYPES[target], physical_device_ordinal=device_ordinal,
            queue_ordinal=queue, stream_id=0, source_id=submission_id,
            source_secondary_id=0, target_id=event_id, target_secondary_id=0,
        )
    if profile.dropped_events:
        yield record("diagnostic", severity="warning", category="truncated_chunk",
                     content_type="tinyhal-profile",
                     message=f"session capacity of {profile.capacity} events per family "
                             "was reached; later events were dropped",
                     dropped_records=profile.dropped_events)
    yield record("session", event="end", session_id=1, stream_id=0, event_id=0,
                 session_status_code=0, session_status="OK")


def _span_record(record: Any, event_id: int, span: tuple, numbering: Numbering,
                 device_ordinal: int) -> dict[str, Any]:
    """One span as a `host_execution_event`, `dispatch_event` or `queue_device_event`."""
    (clock, op, queue, submission_id, start, end, executable, export, workgroups, worker,
     command_buffer_id, command_index, status_code, payload_length) = span
    executable_id, ordinal = numbering.function(executable, export)
    key = numbering.function_names.get((executable_id, ordinal)) if executable_id else None
    common = dict(
        physical_device_ordinal=device_ordinal, queue_ordinal=queue,
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
            flags=HOST_EXECUTION_FLAG_COMMAND_BUFFER if command_buffer_id else 0,
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


def merged_records(profiles: Sequence[Profile]) -> Iterator[dict[str, Any]]:
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
        for rec in records(profile):
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


def _product(values: Sequence[int]) -> int:
    result = 1
    for v in values:
        result *= int(v)
    return result
