"""Dispatch conformance: IREE-compiled executables and host C kernels through submit."""

from __future__ import annotations

import numpy as np
import pytest

from tinyhal import errors
from tinyhal.hal import BufferView, KernelExport, build_executable


def run(device, cb, binding_table=None):
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)], binding_table=binding_table)
    sem.wait(1, timeout=60)


def f32_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


@pytest.mark.parametrize("grid", [(1, 1, 1), (7, 3, 2), (64, 32, 4), (1000, 3, 1), (5, 1, 300)])
def test_iree_executable_matches_numpy(device, elementwise_executable_bytes, grid):
    exe = device.load_executable(elementwise_executable_bytes)
    n = 4 * grid[0] * grid[1] * grid[2]
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    va, vb = BufferView.from_numpy(device, a), BufferView.from_numpy(device, b)
    out = device.allocator.allocate(4 * n)
    cb = device.create_command_buffer()
    cb.dispatch(exe, "fma_3d", grid, constants=[f32_bits(2.0), 3], bindings=[va.buffer, vb.buffer, out])
    cb.finalize()
    run(device, cb)
    expected = (a * np.float32(2.0) + b) + np.float32(3)  # exact product: fused or not
    got = BufferView(out, (n,), 0x21000020).to_numpy()
    assert np.array_equal(got, expected)


def test_reusable_dispatch_with_different_bindings(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    cb = device.create_command_buffer("reusable", binding_capacity=3)
    cb.dispatch(exe, 0, (16, 1, 1), constants=[f32_bits(2.0), 0], bindings=[0, 1, 2])
    cb.finalize()
    for seed in range(3):
        a = np.full(64, seed + 1, np.float32)
        b = np.arange(64, dtype=np.float32)
        out = device.allocator.allocate(256)
        run(device, cb, [BufferView.from_numpy(device, a).buffer,
                         BufferView.from_numpy(device, b).buffer, out])
        assert np.array_equal(BufferView(out, (64,), 0x21000020).to_numpy(), a * 2 + b)


def test_bindings_at_aligned_offsets(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    pool = device.allocator.allocate(3 * 256)
    init = np.zeros(192, np.float32)
    init[:64] = 1
    init[64:128] = np.arange(64)
    device.write_bytes(pool, init)
    cb = device.create_command_buffer()
    cb.dispatch(exe, "fma_3d", (16, 1, 1), constants=[f32_bits(1.0), 0],
                bindings=[(pool, 0, 256), (pool, 256, 256), (pool, 512, 256)])
    cb.finalize()
    run(device, cb)
    result = np.frombuffer(device.read_bytes(pool), np.float32)
    assert np.array_equal(result[128:], np.arange(64) + 1)


def test_misaligned_binding_offset_is_rejected(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    buf = device.allocator.allocate(1024)
    cb = device.create_command_buffer()
    with pytest.raises(errors.InvalidArgumentError, match="not 64-byte aligned"):
        cb.dispatch(exe, 0, (1, 1, 1), constants=[0, 0], bindings=[(buf, 16, 64), buf, buf])
    cb2 = device.create_command_buffer("reusable", binding_capacity=3)
    cb2.dispatch(exe, 0, (1, 1, 1), constants=[0, 0], bindings=[0, 1, 2])
    cb2.finalize()
    with pytest.raises(errors.InvalidArgumentError, match="not 64-byte aligned"):
        device.submit(cb2, binding_table=[(buf, 4, 64), buf, buf])


def test_dispatch_signature_checks(device, elementwise_executable_bytes):
    exe = device.load_executable(elementwise_executable_bytes)
    buf = device.allocator.allocate(64)
    cb = device.create_command_buffer()
    with pytest.raises(errors.NotFoundError, match="no export 'nope'"):
        cb.dispatch(exe, "nope", (1, 1, 1))
    with pytest.raises(errors.NotFoundError):
        cb.dispatch(exe, 5, (1, 1, 1))
    with pytest.raises(errors.InvalidArgumentError, match="takes 2 constants"):
        cb.dispatch(exe, 0, (1, 1, 1), constants=[1], bindings=[buf, buf, buf])
    with pytest.raises(errors.InvalidArgumentError, match="takes 3 bindings"):
        cb.dispatch(exe, 0, (1, 1, 1), constants=[1, 2], bindings=[buf])
    with pytest.raises(errors.OutOfRangeError, match="workgroup count"):
        cb.dispatch(exe, 0, (1, 1, 70000), constants=[1, 2], bindings=[buf, buf, buf])
    assert exe.lookup("fma_3d") == 0


def test_executable_load_formats(device, elementwise_executable_bytes, tmp_path):
    exe = device.load_executable(elementwise_executable_bytes)
    assert exe.format in ("embedded-elf-x86_64", "system-elf-x86_64")
    assert exe.export_names == ["fma_3d"]
    path = tmp_path / "exe.so"
    path.write_bytes(elementwise_executable_bytes)
    assert device.load_executable(path) is exe  # cached by content
    assert device.query("hal.executable.format", exe.format) == 1
    import tinyhal.vm  # noqa: F401 - registers the VMVX loader with the HAL

    assert device.query("hal.executable.format", "vmvx-bytecode-fb") == 1
    assert device.query("hal.executable.format", "spirv-fb") == 0


def test_truncated_and_non_elf_executables(device, elementwise_executable_bytes):
    with pytest.raises(errors.InvalidArgumentError, match="not an ELF"):
        device.load_executable(b"this is not an executable")
    with pytest.raises(errors.InvalidArgumentError):
        device.load_executable(b"")
    for cut in (10, 100, len(elementwise_executable_bytes) // 2):
        with pytest.raises((errors.DataLossError, errors.InvalidArgumentError)):
            device.load_executable(elementwise_executable_bytes[:cut])


def test_device_queries(device):
    assert device.query("hal.device.id", "local*") == 1
    assert device.query("hal.device.id", "cuda*") == 0
    assert device.query("hal.device", "concurrency") >= 1
    with pytest.raises(errors.NotFoundError, match="unknown device query"):
        device.query("hal.nope", "x")


HOST_KERNELS = r"""
#include <string.h>
/* out[i] = a[i] * k + i over a 2D grid; each workgroup handles workgroup_size_x items. */
static int saxpy_2d(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                    const tinyhal_workgroup_state_t* w) {
  const float* a = (const float*)d->binding_ptrs[0];
  float* out = (float*)d->binding_ptrs[1];
  float k; memcpy(&k, &d->constants[0], 4);
  uint32_t n = (uint32_t)(d->binding_lengths[1] / 4);
  uint32_t row = w->workgroup_id_y * d->workgroup_count_x + w->workgroup_id_x;
  for (uint32_t j = 0; j < d->workgroup_size_x; ++j) {
    uint32_t i = row * d->workgroup_size_x + j;
    if (i < n) out[i] = a[i] * k + (float)i;
  }
  return 0;
}
/* Uses workgroup local memory, then fails in workgroup (2, 0, 0). */
static int scratch_then_fail(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                             const tinyhal_workgroup_state_t* w) {
  int* out = (int*)d->binding_ptrs[0];
  memset(w->local_memory, 1, w->local_memory_size);
  out[w->workgroup_id_x] = (int)w->local_memory_size;
  return w->workgroup_id_x == 2 ? 3 : 0;
}
"""


@pytest.fixture(scope="module")
def host_kernels() -> bytes:
    return build_executable(HOST_KERNELS, [
        KernelExport("saxpy_2d", workgroup_size=(8, 1, 1), constant_count=1, binding_count=2),
        KernelExport("scratch_then_fail", binding_count=1, local_memory_pages=1),
    ], name="test_kernels")


def test_host_c_kernel(device, host_kernels):
    exe = device.load_executable(host_kernels)
    assert exe.export_names == ["saxpy_2d", "scratch_then_fail"]
    n = 1000
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = device.allocator.allocate(4 * n)
    cb = device.create_command_buffer()
    cb.dispatch(exe, "saxpy_2d", (25, 5, 1), constants=[f32_bits(0.5)],
                bindings=[BufferView.from_numpy(device, a).buffer, out])
    cb.finalize()
    run(device, cb)
    assert np.array_equal(BufferView(out, (n,), 0x21000020).to_numpy(),
                          a * np.float32(0.5) + np.arange(n, dtype=np.float32))


def test_kernel_failure_fails_the_submission(device, host_kernels):
    exe = device.load_executable(host_kernels)
    out = device.allocator.allocate(64)
    cb = device.create_command_buffer()
    cb.dispatch(exe, "scratch_then_fail", (4, 1, 1), bindings=[out])
    cb.finalize()
    sem, after = device.create_semaphore(), device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)])
    device.queue_barrier(wait=[(sem, 1)], signal=[(after, 1)])
    with pytest.raises(errors.Error, match=r"workgroup \(2, 0, 0\)"):
        sem.wait(1, timeout=30)
    with pytest.raises(errors.Error, match="scratch_then_fail"):
        after.wait(1, timeout=30)
    local_sizes = np.frombuffer(device.read_bytes(out), np.int32)
    assert local_sizes[0] == 4096  # local memory pages were provided


def test_host_kernel_build_errors():
    with pytest.raises(errors.InvalidArgumentError, match="failed to compile"):
        build_executable("this is not C;", ["k"], name="broken")
    with pytest.raises(errors.InvalidArgumentError):
        build_executable("", ["not an identifier"])


def test_mixed_commands_run_in_order_within_one_submission(device, host_kernels):
    """Transfers and multi-workgroup dispatches interleaved in one command buffer: each
    command sees every earlier command's results (barriers as IREE records them)."""
    exe = device.load_executable(host_kernels)
    n = 4096
    x = device.allocator.allocate(4 * n)
    y = device.allocator.allocate(4 * n)
    z = device.allocator.allocate(4 * n)
    cb = device.create_command_buffer()
    cb.fill(x, 0, 4 * n, int(np.float32(1.0).view(np.uint32)), pattern_length=4)
    cb.barrier()
    cb.dispatch(exe, "saxpy_2d", (64, 8, 1), constants=[f32_bits(3.0)], bindings=[x, y])
    cb.barrier()
    cb.copy(y, 0, z, 0, 4 * n)
    cb.barrier()
    cb.update(np.full(16, 7.0, np.float32), z, 0)
    cb.barrier()
    cb.dispatch(exe, "saxpy_2d", (64, 8, 1), constants=[f32_bits(2.0)], bindings=[z, x])
    cb.finalize()
    run(device, cb)
    i = np.arange(n, dtype=np.float32)
    first = np.float32(3.0) + i
    second_in = first.copy()
    second_in[:16] = 7.0
    expected = second_in * np.float32(2.0) + i
    assert np.array_equal(np.frombuffer(device.read_bytes(x), np.float32), expected)
