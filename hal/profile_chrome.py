"""The Chrome trace-event exporter: a profiling session as JSON that Perfetto and
chrome://tracing open.

`trace(profile)` is one session; `merged_trace(profiles)` the sessions of a run's
devices on one time axis; `write(profiles, path)` writes either. A device is two
processes: its host-time events (per queue a track of submissions, execution spans per
worker in lanes where they overlap, memory counters) and its device-time spans (emu's
modelled clock), mapped onto host time as IREE's renderer maps device ticks. The
session's events come from `Profile.recorded()` and its object ids from
`Profile.numbering()`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .profile import DEVICE, HOST, Profile, export_name

__all__ = ["epoch", "merged_trace", "trace", "write"]


def write(profiles: Sequence[Profile], path: str | os.PathLike) -> None:
    """Writes the sessions to `path` as one trace: one session's, or `merged_trace`."""
    document = trace(profiles[0]) if len(profiles) == 1 else merged_trace(profiles)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"))


def epoch(profile: Profile) -> int:
    """Where the session's trace's time axis begins: its earliest event, or its start."""
    recorded = profile.recorded()
    to_host = _tick_mapper(recorded.clock_samples)
    starts = [e[3] for e in recorded.queue] + [m[1] for m in recorded.memory]
    starts += [s[4] if s[0] == HOST else to_host(s[4]) for s in recorded.spans]
    first = min(starts, default=profile.begin_ns)
    return min(first, profile.begin_ns) if profile.begin_ns else first


def trace(profile: Profile, first_pid: int = 1, origin: int | None = None) -> dict[str, Any]:
    """The session as a Chrome trace-event JSON object (`{"traceEvents": [...]}`).

    Process `first_pid` is the device in host time: per queue a track of submissions
    (instants), tracks of execution spans per worker (lanes where spans overlap),
    and memory counters. Process `first_pid + 1` holds device-time spans (emu's
    modelled clock), mapped onto host time the way IREE's renderer maps device
    ticks. `ts` and `dur` are microseconds from `origin` (default: `epoch(profile)`;
    `merged_trace` passes one origin for all devices of a run).
    """
    recorded = profile.recorded()
    numbering = profile.numbering()
    to_host = _tick_mapper(recorded.clock_samples)
    if origin is None:
        origin = epoch(profile)
    host_pid, device_pid = first_pid, first_pid + 1

    def us(ns: int) -> float:
        return (ns - origin) / 1000.0

    events: list[dict[str, Any]] = []
    tracks = _ChromeTracks(events)
    tracks.process(host_pid, f"{profile.device_name} (host time)")
    ready = dict(recorded.ready)
    for (submission_id, op, queue, host_ns, wait, signal, command_buffer_id, allocation_id,
         _count, payload_length, _strategy) in recorded.queue:
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
         for i, s in enumerate(recorded.spans)),
        key=lambda item: (item[0], item[1], item[2]),
    )
    for start, end, index, span in spans:
        (clock, op, queue, submission_id, raw_start, raw_end, executable, export, workgroups,
         worker, command_buffer_id, command_index, status_code, payload_length) = span
        pid = host_pid if clock == HOST else device_pid
        if pid == device_pid:
            tracks.process(device_pid, f"{profile.device_name} (device time)")
        group = worker if worker is not None else f"queue[{queue}] execution"
        lane = lanes.setdefault((pid, group), _Lanes()).place(start, end)
        label = group if lane == 0 else f"{group} #{lane}"
        tid = tracks.thread(pid, label, 10 * queue + 1)
        name = export_name(executable, export) if op == "dispatch" else op
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
            args.update(recorded.span_costs.get(index, ()))
        events.append({"name": name, "cat": op, "ph": "X", "pid": pid, "tid": tid,
                       "ts": us(start), "dur": max(0, end - start) / 1000.0, "args": args})
    for (kind, host_ns, heap, length, live, peak, allocation_id, submission_id, queue,
         _type, _usage, _offset) in recorded.memory:
        tid = tracks.thread(host_pid, "memory", 1_000_000)
        events.append({"name": f"memory:{kind}", "cat": "memory", "ph": "i", "s": "t",
                       "pid": host_pid, "tid": tid, "ts": us(host_ns),
                       "args": {"length": length, "heap": heap, "allocation_id": allocation_id,
                                "submission_id": submission_id, "queue": queue}})
        events.append({"name": "device memory", "cat": "memory", "ph": "C",
                       "pid": host_pid, "tid": tid, "ts": us(host_ns),
                       "args": {"live_bytes": live, "peak_bytes": peak}})
    other = {"device": profile.device_name, "modes": sorted(profile.modes),
             "dropped_events": profile.dropped_events, "clock": "CLOCK_MONOTONIC"}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


def merged_trace(profiles: Sequence[Profile]) -> dict[str, Any]:
    """One Chrome trace for several devices of one run: device i is processes 2i+1 (host
    time) and 2i+2 (device time), all on one time axis from the earliest event."""
    first = min((epoch(p) for p in profiles), default=0)
    events: list[dict[str, Any]] = []
    for ordinal, profile in enumerate(profiles):
        for event in trace(profile, 2 * ordinal + 1, first)["traceEvents"]:
            if event["name"] == "process_name":  # two devices of one driver share a name
                event["args"]["name"] = f"[{ordinal}] {event['args']['name']}"
            events.append(event)
    other = {"devices": [p.device_name for p in profiles],
             "modes": sorted(set().union(*(p.modes for p in profiles))),
             "dropped_events": sum(p.dropped_events for p in profiles),
             "clock": "CLOCK_MONOTONIC"}
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}


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
