"""Command buffer conformance: transfer commands, recording state, binding tables."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinyhal import errors, hal
from tinyhal.hal import BufferUsage


def run(device, cb, binding_table=None):
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)], binding_table=binding_table)
    sem.wait(1, timeout=30)


def contents(buf) -> np.ndarray:
    device = buf.allocator.device_ref()
    return np.frombuffer(device.read_bytes(buf), np.uint8).copy()


@pytest.mark.parametrize("pattern,length", [(b"\xab", 1), (b"\x01\x02", 2), (b"\x01\x02\x03\x04", 4)])
@pytest.mark.parametrize("offset,count", [(0, 1), (4, 3), (12, 7), (0, 16)])
def test_fill_patterns_and_odd_ranges(device, pattern, length, offset, count):
    buf = device.allocator.allocate(128)
    cb = device.create_command_buffer()
    cb.fill(buf, offset * length, count * length, pattern)
    cb.finalize()
    run(device, cb)
    expected = np.zeros(128, np.uint8)
    expected[offset * length : (offset + count) * length] = np.frombuffer(pattern * count, np.uint8)
    assert np.array_equal(contents(buf), expected)


def test_fill_int_pattern_and_misaligned(device):
    buf = device.allocator.allocate(16)
    cb = device.create_command_buffer()
    with pytest.raises(errors.InvalidArgumentError, match="multiples"):
        cb.fill(buf, 2, 4, 0x01020304, pattern_length=4)
    with pytest.raises(errors.InvalidArgumentError, match="1, 2 or 4"):
        cb.fill(buf, 0, 3, b"abc")
    cb.fill(buf, 0, 16, 0xDEADBEEF)
    cb.finalize()
    run(device, cb)
    assert np.array_equal(np.frombuffer(contents(buf), np.uint32), [0xDEADBEEF] * 4)
    typed = device.allocator.allocate(16)
    cb = device.create_command_buffer()
    cb.fill(typed, 0, 8, np.float32(1.5))
    cb.fill(typed, 8, 8, np.uint16(7))
    cb.finalize()
    run(device, cb)
    data = contents(typed)
    assert np.array_equal(data[:8].view(np.float32), [1.5, 1.5])
    assert np.array_equal(data[8:].view(np.uint16), [7] * 4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(1, 300), data=st.data())
def test_update_and_copy_odd_sizes(driver, size, data):
    device = hal.create_device(driver)
    try:
        src_off = data.draw(st.integers(0, 37))
        dst_off = data.draw(st.integers(0, 41))
        payload = data.draw(st.binary(min_size=size, max_size=size))
        a = device.allocator.allocate(size + 37)
        b = device.allocator.allocate(size + 41)
        cb = device.create_command_buffer()
        cb.update(payload, a, src_off)
        cb.barrier()
        cb.copy(a, src_off, b, dst_off, size)
        cb.finalize()
        run(device, cb)
        assert bytes(contents(b)[dst_off : dst_off + size]) == payload
        assert contents(b)[:dst_off].sum() == 0
    finally:
        device.close()


def test_overlapping_copy_within_one_buffer(device):
    buf = device.allocator.allocate(64)
    device.write_bytes(buf, np.arange(64, dtype=np.uint8))
    cb = device.create_command_buffer()
    cb.copy(buf, 0, buf, 8, 32)
    cb.finalize()
    run(device, cb)
    expected = np.arange(64, dtype=np.uint8)
    expected[8:40] = np.arange(32, dtype=np.uint8)
    assert np.array_equal(contents(buf), expected)


def test_update_captures_source_at_record(device):
    buf = device.allocator.allocate(4)
    src = bytearray(b"abcd")
    cb = device.create_command_buffer()
    cb.update(src, buf, 0)
    src[:] = b"zzzz"
    cb.finalize()
    run(device, cb)
    assert bytes(contents(buf)) == b"abcd"


@pytest.mark.parametrize(
    "args",
    [(0, 8, 65), (60, 0, 8), (0, 60, 8), (-1, 0, 4)],
)
def test_out_of_range_copy_is_rejected(device, args):
    src_off, dst_off, length = args
    a = device.allocator.allocate(64)
    b = device.allocator.allocate(64)
    cb = device.create_command_buffer()
    with pytest.raises(errors.OutOfRangeError, match="64 bytes"):
        cb.copy(a, src_off, b, dst_off, length)


def test_transfer_usage_is_checked(device):
    a = device.allocator.allocate(64, usage=BufferUsage.DISPATCH_STORAGE | BufferUsage.MAPPING)
    b = device.allocator.allocate(64)
    cb = device.create_command_buffer()
    with pytest.raises(errors.PermissionDeniedError, match="TRANSFER_SOURCE"):
        cb.copy(a, 0, b, 0, 4)


def test_submitting_unfinalized_is_rejected(device):
    cb = device.create_command_buffer()
    cb.fill(device.allocator.allocate(4), 0, 4, 1)
    with pytest.raises(errors.FailedPreconditionError, match="must be finalized"):
        device.submit(cb)


def test_recording_after_finalize_and_double_finalize(device):
    cb = device.create_command_buffer()
    cb.finalize()
    with pytest.raises(errors.FailedPreconditionError, match="finalized"):
        cb.barrier()
    with pytest.raises(errors.FailedPreconditionError):
        cb.finalize()


def test_one_shot_resubmission_is_rejected(device):
    cb = device.create_command_buffer("one_shot")
    cb.finalize()
    run(device, cb)
    with pytest.raises(errors.FailedPreconditionError, match="one-shot"):
        device.submit(cb)


def test_bad_mode_and_binding_capacity(device):
    with pytest.raises(errors.InvalidArgumentError):
        device.create_command_buffer("sometimes")
    with pytest.raises(errors.InvalidArgumentError):
        device.create_command_buffer(binding_capacity=-1)


def test_concurrent_recording_is_detected(device):
    cb = device.create_command_buffer()
    buf = device.allocator.allocate(4)
    cb._recording_lock.acquire()  # another thread is mid-record
    try:
        with pytest.raises(errors.FailedPreconditionError, match="another thread"):
            cb.fill(buf, 0, 4, 0)
    finally:
        cb._recording_lock.release()
    errs = []

    def record():
        try:
            for _ in range(200):
                cb.fill(buf, 0, 4, 1)
        except errors.FailedPreconditionError as exc:
            errs.append(exc)

    threads = [threading.Thread(target=record) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all("another thread" in str(e) for e in errs)


def test_reusable_with_binding_table(device):
    cb = device.create_command_buffer("reusable", binding_capacity=2)
    cb.copy(0, 0, 1, 4, 8)
    cb.finalize()
    for round_ in range(3):
        src = device.allocator.allocate(8)
        dst = device.allocator.allocate(16)
        device.write_bytes(src, bytes([round_ + 1]) * 8)
        run(device, cb, binding_table=[src, dst])
        assert bytes(contents(dst)) == bytes(4) + bytes([round_ + 1]) * 8 + bytes(4)
    # a binding table entry may itself be a sub-range
    big = device.allocator.allocate(64)
    device.write_bytes(big, bytes(range(64)))
    dst = device.allocator.allocate(16)
    run(device, cb, binding_table=[(big, 32, 8), dst])
    assert bytes(contents(dst))[4:12] == bytes(range(32, 40))


def test_binding_table_errors(device):
    cb = device.create_command_buffer("reusable", binding_capacity=2)
    with pytest.raises(errors.OutOfRangeError, match="binding capacity is 2"):
        cb.copy(0, 0, 2, 0, 8)
    cb.copy(0, 0, 1, 0, 8)
    cb.finalize()
    small = device.allocator.allocate(4)
    big = device.allocator.allocate(64)
    with pytest.raises(errors.InvalidArgumentError, match="binding table has 1"):
        device.submit(cb, binding_table=[big])
    with pytest.raises(errors.OutOfRangeError, match="overruns binding slot 0"):
        device.submit(cb, binding_table=[small, big])


def test_multiple_command_buffers_in_one_batch_run_in_order(device):
    buf = device.allocator.allocate(4)
    cbs = []
    for value in (1, 2, 3):
        cb = device.create_command_buffer()
        cb.fill(buf, 0, 4, value)
        cb.finalize()
        cbs.append(cb)
    run(device, cbs)
    assert bytes(contents(buf)) == b"\x03" * 4


@pytest.mark.parametrize("finalized", [True, False])
def test_an_adopted_command_buffer_sets_every_slot_as_init_does(device, finalized):
    """`CommandBuffer.adopted` builds without `__init__` (one per step of a program that
    re-records); a slot added later must not be left unset there, and the adopted buffer
    runs what the original recorded."""
    src = device.allocator.allocate(64)
    dst = device.allocator.allocate(64)
    device.write_bytes(src, bytes(range(64)))
    original = device.create_command_buffer()
    original.copy(src, 0, dst, 0, 64)
    original.finalize()
    recording = None
    if finalized:
        run(device, original)  # submitting builds the recording the adopted one shares
        device.write_bytes(dst, bytes(64))
        recording = original.recording
    cb = hal.CommandBuffer.adopted(device, original.mode, original.binding_capacity,
                                   original.commands, original.direct, 0, recording)
    unset = [slot for slot in hal.CommandBuffer.__slots__
             if slot != "__weakref__" and not hasattr(cb, slot)]
    assert not unset
    assert cb.finalized is finalized
    if not finalized:
        cb.finalize()
    run(device, cb)
    assert bytes(contents(dst)) == bytes(range(64))
