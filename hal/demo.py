"""`tinyhal-demo`: builds a C kernel, dispatches it over a 3D grid on each driver, and
prints the result check, the timing and the allocator statistics."""

from __future__ import annotations

import argparse
import time

import numpy as np

from . import BufferView, KernelExport, available_drivers, build_executable, create_device

KERNEL = r"""
/* y[i] = a * x[i] + y[i]; one workgroup per 256 elements, grid laid out in 3D. */
static int saxpy(const tinyhal_environment_t* env, const tinyhal_dispatch_state_t* d,
                 const tinyhal_workgroup_state_t* w) {
  const float* x = (const float*)d->binding_ptrs[0];
  float* y = (float*)d->binding_ptrs[1];
  float a = *(const float*)&d->constants[0];
  size_t n = d->binding_lengths[1] / sizeof(float);
  size_t wg = ((size_t)w->workgroup_id_z * d->workgroup_count_y + w->workgroup_id_y)
              * d->workgroup_count_x + w->workgroup_id_x;
  for (size_t i = wg * 256; i < (wg + 1) * 256 && i < n; ++i) y[i] = a * x[i] + y[i];
  return 0;
}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--elements", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    n = args.elements
    library = build_executable(KERNEL, [KernelExport("saxpy", constant_count=1, binding_count=2)],
                               name="demo")
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y0 = np.arange(n, dtype=np.float32)
    groups = -(-n // 256)
    grid = (64, max(1, -(-groups // (64 * 4))), 4)
    for driver in available_drivers():
        device = create_device(driver)
        exe = device.load_executable(library)
        xv, yv = BufferView.from_numpy(device, x), BufferView.from_numpy(device, y0)
        cb = device.create_command_buffer()
        a_bits = int(np.float32(2.0).view(np.uint32))
        cb.dispatch(exe, "saxpy", grid, constants=[a_bits], bindings=[xv.buffer, yv.buffer])
        cb.finalize()
        sem = device.create_semaphore()
        start = time.perf_counter()
        device.submit(cb, signal=[(sem, 1)])
        sem.wait(1, timeout=60)
        elapsed = time.perf_counter() - start
        ok = np.array_equal(yv.to_numpy(), np.float32(2.0) * x + y0)
        stats = device.allocator.statistics()
        print(f"{driver:>5}: {n} elements, grid {grid}: {'ok' if ok else 'MISMATCH'} "
              f"in {elapsed * 1e3:.2f} ms; device memory live {stats.live_bytes} B, "
              f"peak {stats.peak_bytes} B")
        device.close()
        if not ok:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
