"""Transient ringbuffer peak: a chain of alloca -> dispatch -> dealloca with a known live set.

Layer i allocates t[i] (size s[i]) with queue_alloca, a dispatch reads t[i-1] and writes
t[i], then t[i-1] is deallocated; everything is queued up front on one timeline semaphore
before any of it runs. At most two transients are live at once, so the bound on live
transient bytes is max(align64(s[i-1]) + align64(s[i])). The peak the allocator reports
for heap "transient" must equal that bound (blocks are rounded up to 64 bytes), on every
driver; the final values are checked too.

Then steady traffic: `--steady` allocas of random sizes up to 64 KiB, each filled (so its
pages are written) while the `--window` newest stay live and the oldest is deallocated in
a shuffled order. The ring's high water (the end of the highest block it ever placed: the
pages it made resident) must stay a small multiple of the live bytes, not the capacity.

    python bench/ringbuffer_peak.py [--layers 64] [--seed 0] [--steady 20000] [--window 24]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from _common import print_table, write_results  # noqa: E402

from tinyhal import hal  # noqa: E402
from tinyhal.hal import build_executable  # noqa: E402

KERNEL = r"""
/* out[i] = in[i % n_in] + 1 over 64 int32 items per workgroup */
static int next_layer(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
                      const tinyhal_workgroup_state_t* w) {
  const int32_t* in = (const int32_t*)d->binding_ptrs[0];
  int32_t* out = (int32_t*)d->binding_ptrs[1];
  uint64_t n_in = d->binding_lengths[0] / 4, n_out = d->binding_lengths[1] / 4;
  for (uint64_t i = (uint64_t)w->workgroup_id_x * 64u, end = i + 64u; i < end && i < n_out; ++i)
    out[i] = in[i % n_in] + 1;
  return 0;
}
"""


def align(n: int) -> int:
    return max(64, (n + 63) // 64 * 64)


def run_chain(driver: str, library: bytes, sizes: list[int]) -> dict:
    device = hal.create_device(driver)
    try:
        exe = device.load_executable(library)
        sem = device.create_semaphore()
        v = 0
        seed = np.arange(sizes[0] // 4, dtype=np.int32)
        device.allocator.reset_peak()
        start = time.perf_counter()
        prev = device.queue_alloca(sizes[0], signal=[(sem, v + 1)])
        v += 1
        device.queue_update(seed, prev, 0, wait=[(sem, v)], signal=[(sem, v + 1)])
        v += 1
        for size in sizes[1:]:
            cur = device.queue_alloca(size, wait=[(sem, v)], signal=[(sem, v + 1)])
            v += 1
            cb = device.create_command_buffer()
            cb.dispatch(exe, "next_layer", (-(-size // 256), 1, 1), bindings=[prev, cur])
            cb.finalize()
            device.submit(cb, wait=[(sem, v)], signal=[(sem, v + 1)])
            v += 1
            device.queue_dealloca(prev, wait=[(sem, v)], signal=[(sem, v + 1)])
            v += 1
            prev = cur
        out = np.zeros(sizes[-1] // 4, np.int32)
        device.queue_write(prev, 0, out, 0, sizes[-1], wait=[(sem, v)], signal=[(sem, v + 1)])
        v += 1
        device.queue_dealloca(prev, wait=[(sem, v)], signal=[(sem, v + 1)])
        v += 1
        queued = time.perf_counter() - start
        sem.wait(v, timeout=120)
        elapsed = time.perf_counter() - start
        stats = device.allocator.statistics()["transient"]
        ring = device.transient.statistics()
    finally:
        device.close()
    # Expected output: element i went through len(sizes)-1 layers of "+1", reading index
    # i % n_in at each step.
    expected_index = np.arange(sizes[-1] // 4)
    for size in reversed(sizes[:-1]):
        expected_index = expected_index % (size // 4)
    expected = expected_index.astype(np.int32) + (len(sizes) - 1)
    bound = max(align(a) + align(b) for a, b in zip(sizes, sizes[1:]))
    return {
        "driver": driver,
        "layers": len(sizes),
        "bound_bytes": bound,
        "peak_bytes": stats.peak_bytes,
        "peak_minus_bound": stats.peak_bytes - bound,
        "live_after": stats.live_bytes,
        "allocations": stats.allocation_count,
        "ring_waits": ring.waits,
        "correct": bool(np.array_equal(out, expected)),
        "queue_ms": queued * 1e3,
        "total_ms": elapsed * 1e3,
    }


def run_steady(driver: str, steps: int, window: int, rng: random.Random) -> dict:
    device = hal.create_device(driver)
    try:
        live: list = []
        widest = 0
        for _ in range(steps):
            size = rng.randint(1, 64 << 10)
            buffer = device.queue_alloca(size)
            device.queue_fill(buffer, 0, size, 0x5A, pattern_length=1)
            live.append(buffer)
            widest = max(widest, device.allocator.statistics()["transient"].live_bytes)
            if len(live) > window:
                device.queue_dealloca(live.pop(rng.randrange(len(live) // 2)))
        ring = device.transient.statistics()
        for buffer in live:
            device.queue_dealloca(buffer)
    finally:
        device.close()
    return {"driver": driver, "steps": steps, "window": window, "max_live_bytes": widest,
            "high_water_bytes": ring.high_water, "capacity": ring.capacity,
            "ring_waits": ring.waits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steady", type=int, default=20000)
    ap.add_argument("--window", type=int, default=24)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = [4 * rng.randint(16, 64 * 1024) for _ in range(args.layers)]
    library = build_executable(KERNEL, [hal.KernelExport("next_layer", binding_count=2)],
                               name="bench_ring_chain")
    rows = [run_chain(driver, library, sizes) for driver in ("sync", "task")]
    steady = [run_steady(driver, args.steady, args.window, random.Random(args.seed))
              for driver in ("sync", "task")]
    path = write_results("ringbuffer_peak", rows, {"sizes": sizes, "seed": args.seed,
                                                   "steady": steady})
    print_table(rows, ["driver", "layers", "bound_bytes", "peak_bytes", "peak_minus_bound",
                       "live_after", "allocations", "ring_waits", "correct", "total_ms"])
    print()
    print_table(steady, ["driver", "steps", "window", "max_live_bytes", "high_water_bytes",
                         "capacity", "ring_waits"])
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
