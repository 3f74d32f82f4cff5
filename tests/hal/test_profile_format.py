"""Profiles export as Chrome trace JSON and as IREE 3.13's ireeperf-jsonl.

The JSONL is checked three ways: against the fields IREE's own exporter writes for the
same record types (captured here with `iree-run-module --device_profiling_*` and
`iree-profile export`), by IREE's `iree-profile-render` turning it into a Perfetto trace
without error, and by decoding that trace and finding tinyhal's slices in it.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal import hal
from tinyhal.errors import InvalidArgumentError, UnimplementedError
from tinyhal.hal.profile import SCHEMA_VERSION, Profile, parse_modes

ALL_MODES = "queue-events,host-execution,memory-events,dispatch-events,device-queue-events"
TOOL_TIMEOUT = 120

ADD_MLIR = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

# Fields IREE 3.13's exporter writes for record types the local-task capture below does
# not produce (read from its export code); the captured types are compared directly.
IREE_DEVICE_TIME_FIELDS = {
    "dispatch_event": {
        "physical_device_ordinal", "queue_ordinal", "stream_id", "event_id", "submission_id",
        "command_buffer_id", "command_index", "executable_id", "function_ordinal", "key",
        "flags", "workgroup_count", "workgroup_size", "device_tick_domain", "start_tick",
        "end_tick", "duration_ticks", "valid", "derived_time_available",
        "derived_time_domain", "derived_time_basis", "clock_fit_first_sample_id",
        "clock_fit_last_sample_id", "start_driver_host_cpu_time_ns",
        "end_driver_host_cpu_time_ns", "duration_time_domain", "duration_ns",
    },
    "queue_device_event": {
        "physical_device_ordinal", "queue_ordinal", "stream_id", "event_id", "submission_id",
        "command_buffer_id", "allocation_id", "op", "type_value", "flags", "payload_length",
        "operation_count", "device_tick_domain", "start_tick", "end_tick", "duration_ticks",
        "valid", "derived_time_available", "derived_time_domain", "derived_time_basis",
        "clock_fit_first_sample_id", "clock_fit_last_sample_id",
        "start_driver_host_cpu_time_ns", "end_driver_host_cpu_time_ns",
        "duration_time_domain", "duration_ns",
    },
    "clock_correlation": {
        "sample_id", "flags", "physical_device_ordinal", "device_tick_domain", "device_tick",
        "host_cpu_timestamp_domain", "host_cpu_timestamp_ns", "host_system_timestamp_domain",
        "host_system_timestamp", "host_system_frequency_hz", "host_time_domain",
        "host_time_begin_ns", "host_time_end_ns", "host_time_uncertainty_ns",
    },
    "event_relationship": {
        "relationship_id", "kind", "kind_value", "source_type", "source_type_value",
        "target_type", "target_type_value", "physical_device_ordinal", "queue_ordinal",
        "stream_id", "source_id", "source_secondary_id", "target_id", "target_secondary_id",
    },
}


def _iree_tool(name: str) -> str | None:
    """The native IREE tool binary (so a timeout kills the tool itself), else its script."""
    try:
        from iree import _runtime_libs

        native = Path(_runtime_libs.__path__[0]) / name
        if native.exists():
            return str(native)
    except ImportError:
        pass
    script = Path(sys.executable).with_name(name)
    return str(script) if script.exists() else shutil.which(name)


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"{argv[0]} did not finish within {TOOL_TIMEOUT} s") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def render(jsonl: Path) -> tuple[Path, str]:
    """Runs IREE's `iree-profile-render --format=perfetto`; returns the trace and its log."""
    tool = _iree_tool("iree-profile-render")
    if tool is None:
        pytest.skip("iree-profile-render is not installed")
    out = jsonl.with_suffix(".pftrace")
    result = _run([tool, "--format=perfetto", str(jsonl), "-o", str(out)])
    assert result.returncode == 0, f"iree-profile-render failed:\n{result.stdout}\n{result.stderr}"
    assert out.stat().st_size > 0
    return out, result.stderr


def slice_names(pftrace: Path) -> list[str]:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(pftrace.read_bytes())
    return [p.track_event.name for p in trace.packet
            if p.HasField("track_event") and p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]


def render_stats(log: str) -> dict[str, int]:
    """The `name=value` counts iree-profile-render prints after converting."""
    inside = log[log.index("format=perfetto, ") + len("format=perfetto, "):log.rindex(")")]
    return {k: int(v) for k, v in (item.split("=") for item in inside.split(", "))}


class FakeExecutable:
    export_names = ["matmul_dispatch_0", "add_dispatch_1"]


class FakeSemaphore:
    pass


def synthetic_profile(**kwargs) -> Profile:
    """A session with every event family: host and device clocks, two queues, memory."""
    exe, s1, s2 = FakeExecutable(), FakeSemaphore(), FakeSemaphore()
    p = Profile("task", modes=ALL_MODES, queue_count=2, **kwargs).start()
    t = time.monotonic_ns()
    alloca = p.record_queue("alloca", signal=[(s1, 1)], payload_length=256, allocation_id=7,
                            host_time_ns=t)
    p.record_execution("alloca", t + 500, t + 900, alloca, worker="queue[0]")
    p.record_memory("alloca", 256, heap="device", live_bytes=256, peak_bytes=256,
                    allocation_id=7, submission_id=alloca, queue=0, host_time_ns=t + 800)
    cb = p.new_command_buffer_id()
    p.record_command_buffer(cb, [("dispatch", exe, 0, (4, 2, 1), 0),
                                 ("barrier", None, None, (), 0),
                                 ("dispatch", exe, "add_dispatch_1", (1, 1, 1), 0),
                                 ("fill", None, None, (), 64)])
    execute = p.record_queue("execute", wait=[(s1, 1)], signal=[(s2, 1)],
                             command_buffer_id=cb, operation_count=4, host_time_ns=t + 1000)
    p.record_ready(execute, t + 5000)
    p.record_execution("execute", t + 6000, t + 50000, execute, command_buffer_id=cb,
                       worker="queue[0]")
    p.record_dispatch(exe, 0, (4, 2, 1), t + 7000, t + 30000, execute, worker="worker 0",
                      command_buffer_id=cb, command_index=0)
    p.record_dispatch(exe, "add_dispatch_1", (1, 1, 1), t + 8000, t + 20000, execute,
                      worker="worker 1", command_buffer_id=cb, command_index=2)
    copy = p.record_queue("copy", queue=1, payload_length=1024, host_time_ns=t + 2000)
    p.record_clock_correlation(0, t + 2000, t + 2100)
    p.record_execution("copy", 0, 1500, copy, queue=1, worker="dma 0", clock="device",
                       payload_length=1024)
    p.record_dispatch(exe, 1, (8, 1, 1), 1500, 9000, copy, queue=1, worker="compute unit 0",
                      clock="device")
    p.record_memory("allocate", 64, heap="host", live_bytes=320, peak_bytes=320,
                    allocation_id=9, host_time_ns=t + 3000)
    p.record_memory("free", 64, heap="host", live_bytes=256, peak_bytes=320, allocation_id=9,
                    host_time_ns=t + 60000)
    p.record_queue("dealloca", wait=[(s2, 1)], allocation_id=7, host_time_ns=t + 61000)
    p.record_memory("dealloca", 256, heap="device", live_bytes=0, peak_bytes=320,
                    allocation_id=7, queue=0, host_time_ns=t + 62000)
    return p.stop()


def records_of(profile: Profile) -> list[dict]:
    return [json.loads(line) for line in profile.to_ireeperf_jsonl().splitlines()]


def check_chrome_trace(trace: dict) -> list[dict]:
    """Asserts the trace-event JSON is well formed for Perfetto's and Chrome's importers."""
    trace = json.loads(json.dumps(trace))
    assert isinstance(trace["traceEvents"], list)
    named_threads, named_processes = set(), set()
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for event in trace["traceEvents"]:
        assert event["ph"] in {"M", "X", "i", "C"}, event
        assert isinstance(event["name"], str) and event["name"]
        assert isinstance(event["pid"], int) and isinstance(event.get("tid", 0), int)
        if event["ph"] == "M":
            assert isinstance(event["args"]["name" if event["name"].endswith("name")
                                            else "sort_index"], str | int)
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0, event
        assert event["pid"] in named_processes, event
        if event["ph"] == "X":
            assert event["dur"] >= 0
            slices.setdefault((event["pid"], event["tid"]), []).append(
                (event["ts"], event["ts"] + event["dur"]))
        if event["ph"] == "i":
            assert event["s"] in {"t", "p", "g"}
        if event["ph"] == "C":
            assert all(isinstance(v, int | float) for v in event["args"].values())
        if event["ph"] in {"X", "i"}:
            assert (event["pid"], event["tid"]) in named_threads, event
    for spans in slices.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-9, "spans on one track must not overlap"
    return trace["traceEvents"]


# --- modes and session control ---------------------------------------------------------


def test_modes_parse_like_iree_flags():
    assert parse_modes("queue-events,memory-events,host-execution") == {
        "queue-events", "memory-events", "host-execution"}
    with pytest.raises(UnimplementedError, match="counters"):
        parse_modes("queue-events,counters")
    with pytest.raises(InvalidArgumentError, match="queue-event'"):
        parse_modes("queue-event")
    with pytest.raises(InvalidArgumentError, match="empty"):
        parse_modes(" , ")


def test_records_only_while_recording_and_only_requested_families():
    p = Profile("sync", modes="queue-events")
    assert p.record_queue("execute") == 0
    p.start()
    assert p.record_queue("execute") == 1
    p.record_execution("execute", 1, 2, 1)
    p.record_memory("allocate", 64)
    p.stop()
    p.record_queue("execute")
    assert p.event_count == 1
    with pytest.raises(InvalidArgumentError, match="already recording"):
        p.start().start()


def test_bad_arguments_raise_tinyhal_errors():
    p = Profile("sync").start()
    with pytest.raises(InvalidArgumentError, match="frobnicate"):
        p.record_queue("frobnicate")
    with pytest.raises(InvalidArgumentError, match="clock"):
        p.record_execution("copy", 0, 1, clock="wall")
    with pytest.raises(InvalidArgumentError, match="memory event kind 'leak'"):
        p.record_memory("leak", 1)
    with pytest.raises(InvalidArgumentError, match="queue_count"):
        Profile("sync", queue_count=0)
    with pytest.raises(UnimplementedError, match="ireeprof"):
        p.write("run.ireeprof")


def test_concurrent_producers_lose_nothing():
    p = Profile("task", modes="queue-events,host-execution").start()
    per_thread, threads = 2000, 4

    def produce():
        for i in range(per_thread):
            sid = p.record_queue("execute")
            p.record_execution("execute", i, i + 1, sid, worker=threading.current_thread().name)

    workers = [threading.Thread(target=produce) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    p.stop()
    records = records_of(p)
    ids = [r["submission_id"] for r in records if r["record_type"] == "queue_event"]
    assert len(ids) == len(set(ids)) == per_thread * threads
    assert sum(r["record_type"] == "host_execution_event" for r in records) == per_thread * threads


def test_capacity_bounds_memory_and_reports_drops(tmp_path):
    p = Profile("sync", capacity=3).start()
    for _ in range(10):
        p.record_queue("barrier")
    p.stop()
    assert p.dropped_events == 7
    records = records_of(p)
    assert sum(r["record_type"] == "queue_event" for r in records) == 3
    (diag,) = [r for r in records if r["record_type"] == "diagnostic"]
    assert diag["dropped_records"] == 7
    assert p.to_chrome_trace()["otherData"]["dropped_events"] == 7
    path = tmp_path / "dropped.jsonl"
    p.write(path)
    render(path)


# --- the two formats from synthetic events -------------------------------------------------


def test_chrome_trace_structure(tmp_path):
    p = synthetic_profile()
    events = check_chrome_trace(p.to_chrome_trace())
    names = {e["name"] for e in events}
    assert {"matmul_dispatch_0", "add_dispatch_1", "execute", "copy", "queue:execute",
            "queue_ready:execute", "memory:alloca", "device memory"} <= names
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"worker 0", "worker 1", "dma 0", "compute unit 0", "queue[0] submissions"} <= threads
    counters = [e["args"]["live_bytes"] for e in events if e["ph"] == "C"]
    assert counters == [256, 320, 256, 0]
    path = tmp_path / "run.json"
    p.write(path)
    assert json.loads(path.read_text())["traceEvents"]


def test_jsonl_schema_and_ids():
    records = records_of(synthetic_profile())
    assert records[0]["record_type"] == "schema"
    assert records[0]["format"] == "ireeperf-jsonl"
    assert all(r["schema_version"] == SCHEMA_VERSION for r in records)
    assert [r["event"] for r in records if r["record_type"] == "session"] == ["begin", "end"]
    by_type: dict[str, list[dict]] = {}
    for r in records:
        by_type.setdefault(r["record_type"], []).append(r)
    assert [q["queue_ordinal"] for q in by_type["queue"]] == [0, 1]
    functions = {(f["executable_id"], f["function_ordinal"]): f["name"]
                 for f in by_type["executable_function"]}
    assert functions == {(1, 0): "matmul_dispatch_0", (1, 1): "add_dispatch_1"}
    execute = next(q for q in by_type["queue_event"] if q["op"] == "execute")
    assert execute["type_value"] == 3 and execute["wait_count"] == 1
    assert execute["tinyhal_wait_points"] == [[1, 1]]
    assert execute["tinyhal_signal_points"] == [[2, 1]]
    assert execute["ready_host_time_ns"] - execute["host_time_ns"] == 4000
    host_dispatches = [h for h in by_type["host_execution_event"] if h["op"] == "dispatch"]
    assert {h["key"] for h in host_dispatches} == {"matmul_dispatch_0", "add_dispatch_1"}
    assert {h["tile_count"] for h in host_dispatches} == {8, 1}
    (device_dispatch,) = by_type["dispatch_event"]
    assert (device_dispatch["start_tick"], device_dispatch["end_tick"]) == (1500, 9000)
    assert device_dispatch["key"] == "add_dispatch_1"
    assert by_type["queue_device_event"][0]["payload_length"] == 1024
    kinds = [m["event_type"] for m in by_type["memory_event"]]
    assert kinds == ["queue_alloca", "buffer_allocate", "buffer_free", "queue_dealloca"]
    assert by_type["memory_event"][1]["queue_ordinal"] == 0xFFFFFFFF
    assert max(m["tinyhal_peak_bytes"] for m in by_type["memory_event"]) == 320
    ops = [(o["command_index"], o["op"], o["key"]) for o in by_type["command_operation"]]
    assert ops == [(0, "dispatch", "matmul_dispatch_0"), (1, "barrier", "barrier"),
                   (2, "dispatch", "add_dispatch_1"), (3, "fill", "fill")]
    for rel in by_type["event_relationship"]:
        assert rel["source_type"] == "queue_submission"
    for name, fields in IREE_DEVICE_TIME_FIELDS.items():
        for r in by_type[name]:
            assert fields <= r.keys(), (name, fields - r.keys())


def test_summary_totals():
    s = synthetic_profile().summary()
    assert s.queue_operations == {"alloca": 1, "execute": 1, "copy": 1, "dealloca": 1}
    assert s.dispatches == 3 and s.dispatch_ns == 23000 + 12000 + 7500
    assert s.by_export["add_dispatch_1"] == (2, 12000 + 7500)
    assert s.busy_ns_by_worker["dma 0"] == 1500
    assert s.bytes_moved == 1024 and s.peak_bytes == 320


def test_iree_profile_render_accepts_synthetic_jsonl(tmp_path):
    path = tmp_path / "run.ireeperf.jsonl"
    synthetic_profile().write(path)
    pftrace, log = render(path)
    stats = render_stats(log)
    assert stats["host_execution_slices"] == 4
    assert stats["dispatch_slices"] == 1 and stats["queue_device_slices"] == 1
    assert stats["queue_instants"] == 5 and stats["memory_instants"] == 4
    assert stats["relationship_flows"] == 6
    assert stats["command_operation_instants"] == 2  # the two host dispatch spans
    assert stats["skipped_dispatches"] == stats["skipped_host_execution_events"] == 0
    names = slice_names(pftrace)
    assert {"matmul_dispatch_0", "add_dispatch_1", "queue-device:copy"} <= set(names)
    assert any(n.startswith("execute cb#1") for n in names)


def test_device_time_without_correlation_still_renders(tmp_path):
    p = Profile("emu", modes="dispatch-events").start()
    p.record_dispatch(FakeExecutable(), 0, (1, 1, 1), 0, 1000, worker="compute unit 0",
                      clock="device")
    p.stop()
    path = tmp_path / "emu.jsonl"
    p.write(path)
    assert render_stats(render(path)[1])["dispatch_slices"] == 1
    check_chrome_trace(p.to_chrome_trace())


# --- faithfulness to IREE's own export -------------------------------------------------------


@pytest.fixture(scope="module")
def iree_capture(tmp_path_factory) -> list[dict]:
    """ireeperf-jsonl that IREE 3.13 itself writes for a small module on local-task."""
    run_module, profile_tool = _iree_tool("iree-run-module"), _iree_tool("iree-profile")
    if run_module is None or profile_tool is None:
        pytest.skip("IREE's runtime tools are not installed")
    work = tmp_path_factory.mktemp("iree_capture")
    vmfb = compile_mlir(ADD_MLIR, HOST_FLAGS)
    result = _run([run_module, "--device=local-task", f"--module={vmfb}", "--function=main",
                   "--input=4xf32=1,2,3,4", "--input=4xf32=1,1,1,1",
                   "--device_profiling_mode=queue-events,memory-events,host-execution",
                   "--device_profiling_output=run.ireeprof"], cwd=work)
    assert result.returncode == 0, result.stderr
    result = _run([profile_tool, "export", "--format=ireeperf-jsonl", "--output=run.jsonl",
                   "run.ireeprof"], cwd=work)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (work / "run.jsonl").read_text().splitlines()]
    render(work / "run.jsonl")
    return records


def test_every_field_iree_writes_is_present(iree_capture):
    ours: dict[str, set[str]] = {}
    for r in records_of(synthetic_profile()):
        ours.setdefault(r["record_type"], set()).update(r)
    compared = set()
    for r in iree_capture:
        kind = r["record_type"]
        if kind in ours and kind != "schema":
            missing = set(r) - ours[kind]
            assert not missing, f"{kind} lacks IREE's fields {sorted(missing)}"
            compared.add(kind)
    assert {"session", "device", "queue", "executable", "executable_function", "command_buffer",
            "command_operation", "queue_event", "host_execution_event",
            "memory_event"} <= compared
    iree_schema = iree_capture[0]
    assert iree_schema["schema_version"] == SCHEMA_VERSION
    assert iree_schema["time_domains"]["iree_host_time_ns"]


def test_host_times_share_iree_clock(iree_capture):
    """IREE's host times and time.monotonic_ns() are one clock (CLOCK_MONOTONIC)."""
    captured = max(r["host_time_ns"] for r in iree_capture if r["record_type"] == "queue_event")
    now = time.monotonic_ns()
    assert 0 < now - captured < 3600 * 10**9


# --- a real run, recorded through the device and allocator hooks ------------------------------


@pytest.fixture(scope="module")
def mobilenet():
    from support.models import mobilenet_input, mobilenet_v2_vmfb

    return mobilenet_v2_vmfb(), mobilenet_input()


def iree_mobilenet_records(vmfb: Path, x, work: Path) -> list[dict]:
    """IREE's own profile (local-task) of one call of the model, as ireeperf-jsonl."""
    import numpy as np

    np.save(work / "x.npy", x)
    result = _run([_iree_tool("iree-run-module"), "--device=local-task", f"--module={vmfb}",
                   "--function=mobilenet_v2", "--input=@x.npy",
                   "--device_profiling_mode=queue-events,host-execution",
                   "--device_profiling_output=mn.ireeprof"], cwd=work)
    assert result.returncode == 0, result.stderr
    result = _run([_iree_tool("iree-profile"), "export", "--format=ireeperf-jsonl",
                   "--output=mn.jsonl", "mn.ireeprof"], cwd=work)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in (work / "mn.jsonl").read_text().splitlines()]


def queue_shape(records: list[dict]) -> list[tuple]:
    """Each queue operation's kind, size and dependency counts, in submission order."""
    return [(r["op"], r["operation_count"], r["payload_length"], r["wait_count"],
             r["signal_count"]) for r in records if r["record_type"] == "queue_event"]


def command_operations(records: list[dict]) -> list[tuple]:
    return [(r["op"], r["key"], r["workgroup_count"]) for r in records
            if r["record_type"] == "command_operation"]


@pytest.mark.parametrize("driver", hal.available_drivers())
def test_mobilenet_profile_from_a_real_run(driver, mobilenet, tmp_path):
    import tinyhal

    vmfb, x = mobilenet
    module = tinyhal.load(vmfb, device=driver)
    try:
        module.mobilenet_v2(x)
        gc.collect()
        live_before = module.device.allocator.statistics().live_bytes
        profile = Profile(modes="queue-events,host-execution,memory-events").attach(module.device)
        assert module.device.profile is profile
        module.mobilenet_v2(x)
        peak = module.device.allocator.statistics().peak_bytes
        gc.collect()  # the session holds no command buffer or buffer alive
        assert module.device.allocator.statistics().live_bytes == live_before
        profile.detach(module.device)
        assert module.device.profile is None and module.device.allocator.profile is None
        events = profile.event_count
        module.mobilenet_v2(x)
        assert profile.event_count == events
    finally:
        module.close()

    records = records_of(profile)
    queue = [r for r in records if r["record_type"] == "queue_event"]
    host_spans = [r for r in records if r["record_type"] == "host_execution_event"]
    spans = {r["submission_id"]: r for r in host_spans if r["submission_id"]}
    # the driver's own spans: one per dispatch that ran, named by its export
    driver_dispatches = [r for r in host_spans if r["op"] == "dispatch"]
    assert len(driver_dispatches) == 55
    assert all(r["key"].startswith("mobilenet_v2") for r in driver_dispatches)
    ops = collections.Counter(r["op"] for r in queue)
    assert ops["execute"] >= 1 and ops["alloca"] >= 1 and ops["dealloca"] >= 1
    for q in queue:
        assert q["signal_count"] == len(q["tinyhal_signal_points"]) >= 1
        span = spans[q["submission_id"]]
        assert span["status_code"] == 0 and span["valid"]
        assert q["host_time_ns"] <= q["ready_host_time_ns"] <= span["start_host_time_ns"]
    memory = [r for r in records if r["record_type"] == "memory_event"]
    assert {"queue_alloca", "queue_dealloca"} <= {m["event_type"] for m in memory}
    assert max(m["tinyhal_peak_bytes"] for m in memory) == peak
    if driver in ("sync", "task"):  # host-visible memory: the same HAL calls IREE makes
        iree = iree_mobilenet_records(vmfb, x, tmp_path)
        assert queue_shape(records) == queue_shape(iree)
        assert command_operations(records) == command_operations(iree)
    dispatches = [c for c in command_operations(records) if c[0] == "dispatch"]
    assert len(dispatches) == 55 and all(key.startswith("mobilenet_v2") for _, key, _ in dispatches)

    check_chrome_trace(profile.to_chrome_trace())
    path = tmp_path / f"mobilenet_{driver}.ireeperf.jsonl"
    profile.write(path)
    pftrace, log = render(path)
    stats = render_stats(log)
    assert any(n.startswith("execute cb#") and n.endswith("(129 ops, 55 dispatches)")
               for n in slice_names(pftrace))
    assert stats["host_execution_slices"] == len(host_spans)
    assert stats["queue_instants"] >= len(queue)
    assert stats["memory_instants"] == len(memory)
