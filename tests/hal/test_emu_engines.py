"""The emulated accelerator's engines, queues, cost model, modes and calibration."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from tinyhal import errors, hal
from tinyhal.hal.drivers.emu import PRESETS, CostModel, EmuDevice

pytestmark = pytest.mark.timeout(120)

NOOP = ("static int k(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,"
        " const tinyhal_workgroup_state_t* w) { return 0; }")


@pytest.fixture(scope="module")
def noop_library():
    return hal.build_executable(NOOP, ["k"], name="emu_engines_noop")


def make(**options) -> EmuDevice:
    base = dict(memory_size=1 << 24, dma_engines=1, dma_bandwidth=1e9, dma_latency=0.0,
                launch_latency=0.0, workgroup_time=1e-6, compute_units=4)
    base.update(options)
    return hal.create_device("emu", **base)


def run(device, cb, queue=0, wait=()):
    sem = device.create_semaphore()
    device.submit(cb, wait=wait, signal=[(sem, 1)], queue=queue)
    return sem


def overlaps(a, b) -> bool:
    return a.start_ns < b.start_ns + b.duration_ns and b.start_ns < a.start_ns + a.duration_ns


def test_dma_and_compute_overlap_below_the_serial_sum(noop_library):
    with make() as emu:
        exe = emu.load_executable(noop_library)
        buf = emu.allocator.allocate(400_000)
        cb = emu.create_command_buffer()
        cb.dispatch(exe, "k", (400, 1, 1))  # 100 waves of 1 µs: 100 µs of compute
        cb.fill(buf, 0, 400_000, 7)  # 400 µs of DMA, no barrier: independent
        cb.finalize()
        run(emu, cb).wait(1, timeout=30)
        dispatch, fill = emu.trace()
        assert (dispatch.engine, fill.engine) == ("compute", "dma0")
        serial = dispatch.duration_ns + fill.duration_ns
        total = emu.summary().modelled_ns
        assert total < serial and total == max(dispatch.duration_ns, fill.duration_ns)
        assert overlaps(dispatch, fill)
        # and a barrier between them serializes
        cb = emu.create_command_buffer()
        cb.dispatch(exe, "k", (400, 1, 1))
        cb.barrier()
        cb.fill(buf, 0, 400_000, 7)
        cb.finalize()
        run(emu, cb).wait(1, timeout=30)
        dispatch, fill = emu.trace()[2:]
        assert fill.start_ns == dispatch.start_ns + dispatch.duration_ns
        assert emu.read_bytes(buf, 0, 8) == b"\x07" * 8


def test_overlap_shows_in_the_profile_and_in_wall_time(noop_library, tmp_path):
    """Paced: each engine takes its modelled time in wall time, so the host spans of the
    independent fill and dispatch overlap too (structure, not speed)."""
    with make(mode="paced", workgroup_time=1e-3, dma_bandwidth=1e7) as emu:
        exe = emu.load_executable(noop_library)
        buf = emu.allocator.allocate(400_000)
        cb = emu.create_command_buffer()
        cb.dispatch(exe, "k", (400, 1, 1))  # 100 ms
        cb.fill(buf, 0, 400_000, 1)  # 40 ms
        cb.finalize()
        with emu.profiling() as profile:
            run(emu, cb).wait(1, timeout=30)
        trace = profile.to_chrome_trace()["traceEvents"]
        path = tmp_path / "overlap.jsonl"
        profile.write(path)
    spans = [e for e in trace if e.get("ph") == "X"]
    host = {e["name"]: e for e in spans if e.get("cat") == "host_execution"
            and e["name"] in ("k", "fill")} or {
        e["name"]: e for e in spans if e["name"] in ("k", "fill")}
    assert set(host) == {"k", "fill"}
    k, fill = host["k"], host["fill"]
    assert k["ts"] < fill["ts"] + fill["dur"] and fill["ts"] < k["ts"] + k["dur"]
    records = [line for line in path.read_text().splitlines() if '"dispatch_event"' in line]
    assert records, "device-time dispatch spans (dispatch-events) are exported"


def test_two_queues_run_independent_submissions_at_once(noop_library):
    def spans(queues):
        with make(queues=queues) as emu:
            exe = emu.load_executable(noop_library)
            sems = []
            for q in (0, 1):
                cb = emu.create_command_buffer()
                cb.dispatch(exe, "k", (2, 1, 1))  # 2 of the 4 units, 1 µs
                cb.finalize()
                sems.append(run(emu, cb, queue=q % queues))
            for s in sems:
                s.wait(1, timeout=30)
            return sorted(emu.trace(), key=lambda e: e.queue), emu.summary()

    (a, b), summary = spans(2)
    assert (a.queue, b.queue) == (0, 1) and overlaps(a, b)
    assert summary.modelled_ns == a.duration_ns
    (a, b), summary = spans(1)  # one queue runs its submissions one after another
    assert not overlaps(a, b) and summary.modelled_ns == 2 * a.duration_ns


def test_semaphores_order_work_across_queues(noop_library):
    with make(queues=2) as emu:
        exe = emu.load_executable(noop_library)
        buf = emu.allocator.allocate(1 << 20)
        first = emu.create_command_buffer()
        first.dispatch(exe, "k", (64, 1, 1))
        first.finalize()
        second = emu.create_command_buffer()
        second.fill(buf, 0, 1 << 20, 3)
        second.finalize()
        gate = emu.create_semaphore()
        done = emu.create_semaphore()
        emu.submit(second, wait=[(gate, 1)], signal=[(done, 1)], queue=1)
        emu.submit(first, signal=[(gate, 1)], queue=0)
        done.wait(1, timeout=30)
        dispatch, fill = sorted(emu.trace(), key=lambda e: e.queue)
        assert fill.start_ns >= dispatch.start_ns + dispatch.duration_ns


def test_queue_affinity_is_validated_in_the_public_layer():
    with make(queues=2) as emu:
        buf = emu.allocator.allocate(64)
        with pytest.raises(errors.InvalidArgumentError, match="queue 2 out of range"):
            emu.queue_fill(buf, 0, 64, 1, queue=2)
        assert emu.queue_count == 2
    for driver in ("sync", "task"):
        with hal.create_device(driver) as device:
            buf = device.allocator.allocate(64)
            with pytest.raises(errors.InvalidArgumentError, match="1 queue"):
                device.queue_fill(buf, 0, 64, 1, queue=1)
            sem = device.create_semaphore()
            device.queue_fill(buf, 0, 64, 1, signal=[(sem, 1)], queue=0)
            sem.wait(1, timeout=30)


def test_presets_and_overrides():
    for name, model in PRESETS.items():
        with hal.create_device("emu", preset=name) as emu:
            assert emu.model == model and emu.memory_size == model.memory_size
    with hal.create_device("emu", preset="edge-npu", dma_engines=3, compute_units=2,
                           export_costs={"k": 5e-6}) as emu:
        assert emu.model.dma_engines == 3 and emu.model.compute_units == 2
        assert emu.model.memory_bandwidth == PRESETS["edge-npu"].memory_bandwidth
        assert emu.model.dispatch_ns("k", 4, 2, 0) == PRESETS["edge-npu"].launch_latency * 1e9 + 10_000
        assert emu.summary().utilisation.keys() >= {"dma0", "dma1", "dma2", "compute", "queue0"}
    with pytest.raises(errors.InvalidArgumentError, match="preset"):
        hal.create_device("emu", preset="quantum")
    with pytest.raises(errors.InvalidArgumentError, match="dma_engines"):
        hal.create_device("emu", dma_engines=0)
    with pytest.raises(errors.InvalidArgumentError, match="mode"):
        hal.create_device("emu", mode="warp")
    # the roofline: memory-bound dispatches cost bytes over bandwidth
    model = CostModel(memory_bandwidth=1e9, launch_latency=0.0, workgroup_time=0.0)
    assert model.dispatch_ns("x", 1, 1, 1000) == 1000


def test_paced_mode_takes_the_modelled_time(noop_library):
    """Wall time follows modelled time: a ~0.6 s modelled submission takes 0.6 s ± 10%
    (best of three tries, since the machine is shared; pacing never runs early)."""
    results = []
    for _ in range(3):
        with make(mode="paced", workgroup_time=0.1, compute_units=4, dma_bandwidth=1e7) as emu:
            exe = emu.load_executable(noop_library)
            buf = emu.allocator.allocate(1_000_000)
            cb = emu.create_command_buffer()
            cb.dispatch(exe, "k", (12, 1, 1))  # 3 waves of 0.1 s = 0.3 s
            cb.barrier()
            cb.fill(buf, 0, 1_000_000, 0)  # 0.1 s on DMA
            cb.barrier()
            cb.dispatch(exe, "k", (8, 1, 1))  # 0.2 s
            cb.finalize()
            start = time.monotonic()
            run(emu, cb).wait(1, timeout=30)
            wall = time.monotonic() - start
            modelled = emu.summary().modelled_ns / 1e9
        assert wall >= modelled * 0.99
        results.append(abs(wall - modelled) / modelled)
        if results[-1] <= 0.10:
            break
    assert math.isclose(modelled, 0.6, rel_tol=1e-6)
    assert min(results) <= 0.10, results


def test_fast_mode_keeps_modelled_time(noop_library):
    with make(workgroup_time=10.0) as emu:  # 10 s per wave, modelled only
        exe = emu.load_executable(noop_library)
        cb = emu.create_command_buffer()
        cb.dispatch(exe, "k", (8, 1, 1))
        cb.finalize()
        run(emu, cb).wait(1, timeout=30)  # returns long before 20 s
        assert emu.summary().modelled_ns == 20 * 10**9


def test_summary_reports_engines_bytes_and_peak(noop_library):
    with make(dma_engines=2) as emu:
        exe = emu.load_executable(noop_library)
        a = emu.allocator.allocate(1 << 16)
        b = emu.allocator.allocate(1 << 16)
        cb = emu.create_command_buffer()
        cb.fill(a, 0, 1 << 16, 1)
        cb.fill(b, 0, 1 << 16, 2)  # the second DMA engine takes it
        cb.dispatch(exe, "k", (4, 1, 1))
        cb.finalize()
        run(emu, cb).wait(1, timeout=30)
        s = emu.summary()
        assert s.bytes_moved == 2 << 16 and s.transfers == 2 and s.dispatches == 1
        assert s.busy_ns["dma0"] == s.busy_ns["dma1"] > 0
        assert all(0.0 <= u <= 1.0 for u in s.utilisation.values())
        assert s.peak_device_bytes >= 2 << 16
        text = s.format()
        assert "dma1" in text and "peak device memory" in text
        assert np.array_equal(np.frombuffer(emu.read_bytes(b, 0, 4), np.uint8), [2, 2, 2, 2])


def test_timeline_script_draws_an_exported_trace(noop_library, tmp_path):
    pytest.importorskip("matplotlib")
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "emu_timeline.py"
    spec = importlib.util.spec_from_file_location("emu_timeline", script)
    timeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(timeline)
    with make(queues=2, dma_engines=2) as emu:
        exe = emu.load_executable(noop_library)
        buf = emu.allocator.allocate(1 << 16)
        for q in (0, 1):
            cb = emu.create_command_buffer()
            cb.fill(buf, 0, 1 << 16, q)
            cb.dispatch(exe, "k", (8, 1, 1))
            cb.finalize()
            run(emu, cb, queue=q).wait(1, timeout=30)
        emu.export_trace(str(tmp_path / "t.json"))
    events, title = timeline.trace_events(str(tmp_path / "t.json"))
    assert len(events) == 4 and {e["queue"] for e in events} == {0, 1}
    timeline.plot(events, title, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
