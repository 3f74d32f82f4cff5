"""Allocator, buffer and mapping conformance, on every driver."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal import ALIGNMENT, BufferUsage, BufferView, MemoryAccess, MemoryType


@pytest.mark.parametrize("size", [0, 1, 3, 63, 64, 65, 4096, 100_003])
def test_allocations_are_aligned_and_sized(device, size):
    buf = device.allocator.allocate(size)
    assert buf.byte_length == size
    assert buf.address % ALIGNMENT == 0
    assert device.read_bytes(buf) == bytes(size)
    mappable = device.allocator.allocate(size, MemoryType.HOST_VISIBLE)
    assert mappable.address % ALIGNMENT == 0
    with mappable.map() as view:
        assert len(view) == size


def test_statistics_live_peak_allocated_freed(device):
    alloc = device.allocator
    before = alloc.statistics()
    a = alloc.allocate(1000)
    b = alloc.allocate(3000)
    mid = alloc.statistics()
    assert mid.live_bytes - before.live_bytes == 4000
    assert mid["device"].allocated_bytes - before["device"].allocated_bytes == 4000
    del a
    gc.collect()
    after = alloc.statistics()
    assert after.live_bytes - before.live_bytes == 3000
    assert after.peak_bytes >= before.live_bytes + 4000
    assert after["device"].freed_bytes - before["device"].freed_bytes == 1000
    del b


def test_statistics_are_per_device(driver):
    from tinyhal import hal

    d1, d2 = hal.create_device(driver), hal.create_device(driver)
    try:
        keep = d1.allocator.allocate(12345)
        assert d2.allocator.statistics().live_bytes == 0
        assert d1.allocator.statistics().live_bytes == 12345
        del keep
    finally:
        d1.close()
        d2.close()


def test_host_heap_selected_by_memory_type(device):
    buf = device.allocator.allocate(64, MemoryType.HOST_LOCAL)
    assert buf.memory_type & MemoryType.HOST_LOCAL == MemoryType.HOST_LOCAL
    assert device.allocator.statistics()["host"].live_bytes >= 64


def test_map_is_zero_copy_and_shared_by_subspans(device):
    buf = device.allocator.allocate(256, MemoryType.HOST_VISIBLE)
    sub = buf.subspan(64, 128)
    with sub.map() as view:
        np.frombuffer(view, np.uint8)[:] = 7
    with buf.map() as whole:
        data = np.frombuffer(whole, np.uint8)
        assert data[:64].sum() == 0 and (data[64:192] == 7).all() and data[192:].sum() == 0


def test_map_without_mapping_usage_is_rejected(device):
    buf = device.allocator.allocate(64, MemoryType.HOST_VISIBLE, usage=BufferUsage.DEFAULT)
    with pytest.raises(errors.PermissionDeniedError, match="without MAPPING usage"):
        buf.map()


def test_read_only_mapping(device):
    buf = device.allocator.allocate(16, MemoryType.HOST_VISIBLE)
    view = buf.map(MemoryAccess.READ)
    assert view.readonly
    ro = device.allocator.allocate(16, MemoryType.HOST_VISIBLE, access=MemoryAccess.READ)
    with pytest.raises(errors.PermissionDeniedError):
        ro.map(MemoryAccess.WRITE)


@pytest.mark.parametrize("offset,length", [(-1, 4), (0, 65), (60, 8), (65, 0)])
def test_out_of_range_subspans_and_mappings(device, offset, length):
    buf = device.allocator.allocate(64, MemoryType.HOST_VISIBLE)
    with pytest.raises(errors.OutOfRangeError, match="buffer of 64 bytes"):
        buf.subspan(offset, length)
    with pytest.raises(errors.OutOfRangeError):
        buf.map(offset=offset, length=length)


def test_bad_allocation_requests(device):
    with pytest.raises(errors.InvalidArgumentError):
        device.allocator.allocate(-5)


def test_import_host_memory_zero_copy(device):
    raw = np.zeros(1024 + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    aligned = raw[start : start + 1024]
    buf = device.allocator.import_host(aligned, MemoryType.HOST_VISIBLE)
    assert buf is not None and buf.address == aligned.ctypes.data
    assert device.allocator.import_host(raw[start + 1 : start + 65]) is None
    ro = device.allocator.import_host(bytes(aligned), MemoryType.HOST_VISIBLE)
    if ro is not None:
        with pytest.raises(errors.PermissionDeniedError):
            ro.map(MemoryAccess.WRITE)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int8, np.uint16, np.int32, np.int64, np.bool_]
)
def test_buffer_view_roundtrip(device, dtype):
    arr = (np.arange(24) % 5).astype(dtype).reshape(2, 3, 4)
    view = BufferView.from_numpy(device, arr)
    assert view.shape == (2, 3, 4)
    out = view.to_numpy()
    assert out.dtype == arr.dtype and np.array_equal(out, arr)


def test_buffer_view_element_type_codes():
    from tinyhal.hal import ElementType

    assert ElementType.FLOAT_32 == 0x21000020
    assert ElementType.SINT_32 == 0x11000020
    assert ElementType.BOOL_8 == 0x13000008
    assert ElementType.BFLOAT_16 == 0x22000010


def test_buffer_view_too_small(device):
    buf = device.allocator.allocate(8)
    with pytest.raises(errors.OutOfRangeError, match="needs 12 bytes"):
        BufferView(buf, (3,), 0x21000020)
