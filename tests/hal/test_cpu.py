"""Executables see this CPU as IREE's runtime describes it: processor data word 0 in
IREE's feature-bit layout, and `hal.cpu` queries answered by IREE's feature names."""

import platform

import pytest

from tinyhal import errors
from tinyhal.hal import BufferView, KernelExport, build_executable
from tinyhal.hal.cpu import FEATURE_BITS, PROCESSOR_DATA, cpu_feature

x86_64_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                 reason="IREE fills processor data from CPUID on x86-64")

READ_PROCESSOR_DATA = r"""
static int read_processor_data(const tinyhal_environment_t* env,
                               const tinyhal_dispatch_state_t* d,
                               const tinyhal_workgroup_state_t* w) {
  uint64_t* out = (uint64_t*)d->binding_ptrs[0];
  for (int i = 0; i < 8; ++i) out[i] = env->processor_data[i];
  return 0;
}
"""

LINUX_NAMES = {"sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2",
               "avx512vpopcntdq": "avx512_vpopcntdq", "avx512vnni": "avx512_vnni",
               "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg",
               "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
               "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16"}


def _linux_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_kernels_receive_the_processor_data(device):
    exe = device.load_executable(build_executable(
        READ_PROCESSOR_DATA, [KernelExport("read_processor_data", binding_count=1)],
        name="processor_data"))
    out = device.allocator.allocate(64)
    cb = device.create_command_buffer()
    cb.dispatch(exe, "read_processor_data", (1, 1, 1), bindings=[out])
    cb.finalize()
    sem = device.create_semaphore()
    device.submit(cb, signal=[(sem, 1)])
    sem.wait(1, timeout=60)
    assert tuple(BufferView(out, (8,), 0x11000040).to_numpy().tolist()) == PROCESSOR_DATA


@x86_64_only
def test_feature_bits_agree_with_the_kernel_where_it_names_them():
    """Each of IREE's x86-64 features the kernel lists is set exactly when the kernel lists
    it (the AVX families also need their register state, which Linux reports as well)."""
    linux = _linux_flags()
    assert PROCESSOR_DATA[1:] == (0,) * 7
    for name in FEATURE_BITS:
        assert cpu_feature(name) == (LINUX_NAMES.get(name, name) in linux), name
    known = sum(1 << bit for bit in FEATURE_BITS.values())
    assert PROCESSOR_DATA[0] & ~known == 0


@x86_64_only
def test_hal_cpu_queries_use_iree_feature_names(device):
    assert device.query("hal.cpu", "sse4.1") == int("sse4_1" in _linux_flags())
    assert device.query("hal.cpu", "avx2") == int("avx2" in _linux_flags())
    for unknown in ("sse4_1", "AVX2", "no-such-feature"):
        with pytest.raises(errors.NotFoundError, match="unknown device query"):
            device.query("hal.cpu", unknown)
