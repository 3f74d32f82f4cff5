"""queue_alloca / queue_dealloca on the transient ringbuffer, on every driver."""

from __future__ import annotations

import pytest

from tinyhal import errors, hal

T = 30


@pytest.fixture
def small_device(driver):
    dev = hal.create_device(driver, transient_capacity=4096)
    yield dev
    dev.close()


def test_alloca_is_aligned_and_usable_after_signal(device):
    s = device.create_semaphore()
    bufs = [device.queue_alloca(size, signal=[(s, i + 1)]) for i, size in enumerate((1, 100, 64, 3))]
    s.wait(4, timeout=T)
    for i, b in enumerate(bufs):
        assert b.address % 64 == 0
        device.queue_fill(b, 0, b.byte_length, b"\xff", signal=[(s, 5 + i)])
    s.wait(8, timeout=T)


def test_alloca_waits_for_its_wait_semaphores(device):
    gate, s = device.create_semaphore(), device.create_semaphore()
    buf = device.queue_alloca(128, wait=[(gate, 1)], signal=[(s, 1)])
    assert device.allocator.statistics()["transient"].live_bytes == 0
    with pytest.raises(errors.DeadlineExceededError):
        s.wait(1, timeout=0.02)
    gate.signal(1)
    s.wait(1, timeout=T)
    assert device.allocator.statistics()["transient"].live_bytes == 128
    device.queue_fill(buf, 0, 128, b"\x05", signal=[(s, 2)])
    device.queue_dealloca(buf, wait=[(s, 2)], signal=[(s, 3)])
    s.wait(3, timeout=T)
    assert device.allocator.statistics()["transient"].live_bytes == 0


def test_full_ring_makes_alloca_wait_for_a_dealloca(small_device):
    dev = small_device
    s, t, u = dev.create_semaphore(), dev.create_semaphore(), dev.create_semaphore()
    a = dev.queue_alloca(4096, signal=[(s, 1)])
    b = dev.queue_alloca(4096, signal=[(t, 1)])  # the ring is full: waits, does not fail
    s.wait(1, timeout=T)
    with pytest.raises(errors.DeadlineExceededError):
        t.wait(1, timeout=0.05)
    dev.queue_dealloca(a, wait=[(u, 1)], signal=[(s, 2)])
    u.signal(1)
    t.wait(1, timeout=T)
    assert b.address == a.storage.address or b.address % 64 == 0
    st = dev.allocator.statistics()["transient"]
    assert st.live_bytes == 4096 and st.peak_bytes == 4096
    dev.queue_dealloca(b, signal=[(t, 2)])
    t.wait(2, timeout=T)


def test_allocas_are_granted_in_order(small_device):
    dev = small_device
    s = dev.create_semaphore()
    first = dev.queue_alloca(4096, signal=[(s, 1)])
    sems = [dev.create_semaphore() for _ in range(3)]
    bufs = []
    for sem in sems:
        bufs.append(dev.queue_alloca(1024, signal=[(sem, 1)]))
        dev.queue_barrier(wait=[(sem, 1)], signal=[(sem, 2)])
    s.wait(1, timeout=T)
    for sem in sems:
        assert sem.query() == 0
    dev.queue_dealloca(first, signal=[(s, 2)])
    for sem in sems:
        sem.wait(2, timeout=T)
    assert dev.allocator.statistics()["transient"].live_bytes == 3 * 1024
    assert [b.address - bufs[0].address for b in bufs] == [0, 1024, 2048]


def test_a_dropped_transient_buffer_returns_its_space(small_device):
    dev = small_device
    s, t = dev.create_semaphore(), dev.create_semaphore()
    dev.queue_alloca(4096, signal=[(s, 1)])  # result dropped without queue_dealloca
    keep = dev.queue_alloca(4096, signal=[(t, 1)])
    t.wait(1, timeout=T)
    assert keep.address % 64 == 0


def test_larger_than_the_ring_fails_at_once(small_device):
    with pytest.raises(errors.ResourceExhaustedError, match="exceeds the whole ringbuffer"):
        small_device.queue_alloca(4097)
    with pytest.raises(errors.InvalidArgumentError):
        small_device.queue_alloca(-1)


def test_use_after_dealloca_is_rejected(device):
    s = device.create_semaphore()
    buf = device.queue_alloca(256, signal=[(s, 1)])
    device.queue_dealloca(buf, wait=[(s, 1)], signal=[(s, 2)])
    s.wait(2, timeout=T)
    cb = device.create_command_buffer()
    with pytest.raises(errors.FailedPreconditionError, match="deallocated"):
        cb.fill(buf, 0, 256, b"\x01")
    with pytest.raises(errors.FailedPreconditionError):
        buf.map()
    with pytest.raises(errors.FailedPreconditionError):
        device.queue_dealloca(buf)
    with pytest.raises(errors.FailedPreconditionError):
        device.queue_fill(buf, 0, 4, b"\x00")


def test_failed_wait_does_not_dealloca(device):
    s, gate, done = (device.create_semaphore() for _ in range(3))
    buf = device.queue_alloca(512, signal=[(s, 1)])
    s.wait(1, timeout=T)
    device.queue_dealloca(buf, wait=[(gate, 1)], signal=[(done, 1)])
    gate.fail(errors.AbortedError("producer crashed"))
    with pytest.raises(errors.AbortedError, match="producer crashed"):
        done.wait(1, timeout=T)
    # Whoever still uses the buffer is safe: it was not freed.
    assert device.allocator.statistics()["transient"].live_bytes == 512
    device.queue_update(b"live", buf, 0, signal=[(s, 2)])
    s.wait(2, timeout=T)
    device.queue_dealloca(buf, signal=[(s, 3)])
    s.wait(3, timeout=T)
    assert device.allocator.statistics()["transient"].live_bytes == 0


def test_failed_alloca_wait_fails_its_signal(device):
    gate, s = device.create_semaphore(), device.create_semaphore()
    buf = device.queue_alloca(64, wait=[(gate, 1)], signal=[(s, 1)])
    gate.fail("no")
    with pytest.raises(errors.Error, match="no"):
        s.wait(1, timeout=T)
    assert device.allocator.statistics()["transient"].live_bytes == 0
    del buf


def test_peak_follows_the_live_set(device):
    s = device.create_semaphore()
    device.allocator.reset_peak()
    bufs = [device.queue_alloca(1000, signal=[(s, i + 1)]) for i in range(4)]
    s.wait(4, timeout=T)
    for i, b in enumerate(bufs):
        device.queue_dealloca(b, signal=[(s, 5 + i)])
    s.wait(8, timeout=T)
    st = device.allocator.statistics()["transient"]
    assert st.live_bytes == 0 and st.peak_bytes == 4 * 1024


def test_parked_alloca_fails_when_the_device_closes(driver):
    dev = hal.create_device(driver, transient_capacity=128)
    s, t = dev.create_semaphore(), dev.create_semaphore()
    first = dev.queue_alloca(128, signal=[(s, 1)])
    dev.queue_alloca(128, signal=[(t, 1)])
    s.wait(1, timeout=T)
    dev.close()
    with pytest.raises(errors.AbortedError):
        t.wait(1, timeout=T)
    assert first.byte_length == 128


def test_transient_bytes_count_in_the_allocator_and_in_emus_device_memory(driver):
    """The ring counts its blocks in the allocator's statistics (live, peak, allocated,
    freed, the total), and on `emu`, whose allocator watches transients in `track`, in
    the modelled device memory as well."""
    dev = hal.create_device(driver)
    try:
        s = dev.create_semaphore()
        before = dev.allocator.statistics()
        a = dev.queue_alloca(100, signal=[(s, 1)])
        b = dev.queue_alloca(64, signal=[(s, 2)])
        s.wait(2, timeout=T)
        held = dev.allocator.statistics()
        ring = held["transient"]
        assert ring.live_bytes - before["transient"].live_bytes == 128 + 64
        assert held.live_bytes - before.live_bytes == 128 + 64
        assert held.peak_bytes >= held.live_bytes
        if driver == "emu":
            assert dev.allocator.device_live >= 128 + 64
            modelled = dev.allocator.device_live
        dev.queue_dealloca(a, signal=[(s, 3)])
        dev.queue_dealloca(b, signal=[(s, 4)])
        s.wait(4, timeout=T)
        after = dev.allocator.statistics()
        assert after["transient"].live_bytes == before["transient"].live_bytes
        assert after["transient"].freed_bytes - held["transient"].freed_bytes == 128 + 64
        assert after["transient"].peak_bytes >= 128 + 64
        if driver == "emu":
            assert dev.allocator.device_live == modelled - (128 + 64)
    finally:
        dev.close()
