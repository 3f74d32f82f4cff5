"""The emulated accelerator: private memory, DMA/compute engines, clock, trace, faults."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tinyhal import errors, hal
from tinyhal.hal import BufferView, MemoryType


@pytest.fixture
def emu():
    device = hal.create_device("emu", memory_size=1 << 20, dma_bandwidth=1e9,
                               dma_latency=1e-6, launch_latency=2e-6, workgroup_time=1e-6,
                               compute_units=4)
    yield device
    device.close()


def wait(device, cb):
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)])
    sem.wait(1, timeout=30)


def test_device_memory_is_not_host_mappable(emu):
    buf = emu.allocator.allocate(64)
    assert not buf.memory_type & MemoryType.HOST_VISIBLE
    with pytest.raises(errors.PermissionDeniedError, match="not host-visible"):
        buf.map()
    staging = emu.allocator.allocate(64, MemoryType.HOST_VISIBLE)
    assert staging.mappable
    view = BufferView.from_numpy(emu, np.arange(16, dtype=np.int32))
    assert np.array_equal(view.to_numpy(), np.arange(16))


def test_device_memory_capacity(emu):
    keep = emu.allocator.allocate(1 << 19)
    with pytest.raises(errors.ResourceExhaustedError, match="emulated device memory"):
        emu.allocator.allocate((1 << 19) + 64)
    emu.allocator.allocate(1 << 10, MemoryType.HOST_LOCAL)  # host memory is not capped
    del keep


def test_freed_device_memory_is_free_again(emu):
    """Device-heap buffers give their bytes back when freed: allocating and dropping
    more than the capacity in all never exhausts it; the peak is of what was live at
    once, transients included."""
    for _ in range(8):
        buffer = emu.allocator.allocate(1 << 18)
        del buffer
    assert emu.allocator.device_live == 0
    keep = emu.allocator.allocate(1 << 19)
    transient = emu.queue_alloca(1 << 18)
    assert emu.allocator.device_live == (1 << 19) + (1 << 18)
    emu.queue_dealloca(transient)
    del keep
    assert emu.allocator.device_live == 0
    assert emu.allocator.device_peak == (1 << 19) + (1 << 18)
    assert emu.summary().peak_device_bytes == (1 << 19) + (1 << 18)


def test_ready_alloca_checks_the_modelled_memory(emu):
    """A ready `queue_alloca` on emu takes the ring space without a queue entry when the
    modelled memory has room (`EmuDriver.check_alloca`), and past the capacity fails its
    signal with RESOURCE_EXHAUSTED, as a queued one does."""
    keep = emu.allocator.allocate((1 << 20) - 4096)
    live = emu.allocator.device_live
    fits = emu.create_semaphore()
    buffer = emu.queue_alloca(4000, signal=[(fits, 1)])
    assert fits.query() == 1 and emu.in_flight == 0
    assert emu.allocator.device_live == live + 4032  # the ring's 64-byte blocks
    refused = emu.create_semaphore()
    emu.queue_alloca(128, signal=[(refused, 1)])
    with pytest.raises(errors.ResourceExhaustedError, match="emulated device memory"):
        refused.wait(1, timeout=30)
    emu.queue_dealloca(buffer, signal=[(fits, 2)])
    assert fits.query() == 2 and emu.allocator.device_live == live
    gate, queued = emu.create_semaphore(), emu.create_semaphore()
    emu.queue_alloca(8192, wait=[(gate, 1)], signal=[(queued, 1)])  # refused when run
    gate.signal(1)
    with pytest.raises(errors.ResourceExhaustedError, match="emulated device memory"):
        queued.wait(1, timeout=30)
    assert emu.wait_idle(30)
    del keep


def test_cost_model_trace_and_clock(emu, tmp_path):
    src = emu.allocator.allocate(1000)
    dst = emu.allocator.allocate(1000)
    cb = emu.create_command_buffer()
    cb.fill(src, 0, 1000, 0x5A)
    cb.barrier()
    cb.copy(src, 0, dst, 0, 1000)
    cb.finalize()
    wait(emu, cb)
    events = emu.trace()
    assert [(e.name, e.engine) for e in events] == [("fill", "dma0"), ("copy", "dma0")]
    # 1 µs latency + 1000 B at 1 GB/s = 2 µs each, the copy after the barrier
    assert [e.duration_ns for e in events] == [2000, 2000]
    assert events[1].start_ns == events[0].start_ns + 2000
    assert emu.clock_ns == events[1].start_ns + 2000
    assert emu.read_bytes(dst) == b"\x5a" * 1000
    path = tmp_path / "trace.json"
    emu.export_trace(str(path))
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # each operation on its engine's track and on its queue's track
    assert len(spans) == 4 and {e["name"] for e in spans} == {"fill", "copy"}


def test_host_writes_are_modelled_as_updates_before_what_follows(emu):
    """Fast mode copies a host write into device memory at once and models the update
    it stands for later: the clock, the trace and the summary see it, and the next
    submission starts after it."""
    a = emu.allocator.allocate(1000)
    emu.write_bytes(a, bytes(range(200)) * 5)
    assert emu.clock_ns == 2000  # 1 µs latency + 1000 B at 1 GB/s
    emu.write_bytes(a, b"\x07" * 1000)
    cb = emu.create_command_buffer()
    cb.fill(a, 0, 500, 0x5A)
    cb.finalize()
    wait(emu, cb)
    events = emu.trace()
    assert [(e.name, e.start_ns, e.duration_ns) for e in events] == [
        ("update", 0, 2000), ("update", 2000, 2000), ("fill", 4000, 1500)]
    summary = emu.summary()
    assert (summary.transfers, summary.bytes_moved, summary.modelled_ns) == (3, 2500, 5500)
    assert emu.read_bytes(a) == b"\x5a" * 500 + b"\x07" * 500


def test_engines_overlap_between_barriers(emu):
    library = hal.build_executable(
        "static int k(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,"
        " const tinyhal_workgroup_state_t* w) { return 0; }", ["k"], name="emu_noop")
    exe = emu.load_executable(library)
    a = emu.allocator.allocate(4000)
    cb = emu.create_command_buffer()
    cb.dispatch(exe, "k", (400, 1, 1))
    cb.fill(a, 0, 4000, 1)  # no barrier: runs on the DMA engine alongside the dispatch
    cb.finalize()
    start = emu.clock_ns
    wait(emu, cb)
    dispatch, fill = emu.trace()[-2:]
    assert dispatch.engine == "compute" and dispatch.duration_ns == 2000 + 100_000
    assert fill.start_ns == dispatch.start_ns == start
    assert emu.clock_ns == start + dispatch.duration_ns


def test_fault_injection_fails_the_submission(emu):
    buf = emu.allocator.allocate(64)
    emu.inject_fault("copy", after=1, error=errors.DataLossError("bus error"))
    for expect_failure in (False, True, False):
        cb = emu.create_command_buffer()
        cb.copy(buf, 0, buf, 32, 32)
        cb.finalize()
        sem = emu.create_semaphore()
        emu.submit(cb, signal=[(sem, 1)])
        if expect_failure:
            with pytest.raises(errors.DataLossError, match="bus error"):
                sem.wait(1, timeout=30)
        else:
            sem.wait(1, timeout=30)
    with pytest.raises(errors.InvalidArgumentError):
        emu.inject_fault("teleport")


def test_bad_options():
    with pytest.raises(errors.InvalidArgumentError, match="memory_size"):
        hal.create_device("emu", memory_size=0)
    with pytest.raises(errors.InvalidArgumentError, match="does not take options"):
        hal.create_device("emu", warp_drive=True)


def test_ready_work_on_another_queue_starts_after_what_it_waited_for_in_modelled_time():
    # The wait is already reached when the second fill is submitted (it takes the ready
    # path, no queue entry), yet its modelled start is still the first fill's end.
    device = hal.create_device("emu", queues=2)
    try:
        buffer = device.allocator.allocate(1 << 20)
        first, second = device.create_semaphore(), device.create_semaphore()
        device.queue_fill(buffer, 0, 1 << 20, b"\x01", signal=[(first, 1)], queue=0)
        first.wait(1, timeout=30)
        device.queue_fill(buffer, 0, 1 << 20, b"\x02", wait=[(first, 1)],
                          signal=[(second, 1)], queue=1)
        second.wait(1, timeout=30)
        a, b = device.trace()
        assert (a.queue, b.queue) == (0, 1)
        assert b.start_ns == a.start_ns + a.duration_ns > 0
    finally:
        device.close()
