"""Many command buffers with multi-workgroup dispatches in flight at once: streams led and
helped by different workers, independent chains interleaving, on every driver."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tinyhal.hal import KernelExport, build_executable

ADD_ONE = r"""
/* dst[i] = src[i] + 1 over 64 elements per workgroup. */
static int add_one(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
                   const tinyhal_workgroup_state_t* w) {
  const float* src = (const float*)d->binding_ptrs[0];
  float* dst = (float*)d->binding_ptrs[1];
  uint32_t base = w->workgroup_id_x * 64u;
  for (uint32_t i = 0; i < 64u; ++i) dst[base + i] = src[base + i] + 1.0f;
  return 0;
}
"""

CHAINS, LINKS, GROUPS = 24, 6, 96


@pytest.fixture(scope="module")
def add_one() -> bytes:
    return build_executable(ADD_ONE, [KernelExport("add_one", binding_count=2)],
                            name="stress_add_one")


@pytest.mark.parametrize("round_", range(2))
def test_interleaved_chains_of_streams(device, add_one, round_):
    exe = device.load_executable(add_one)
    n = GROUPS * 64
    rng = random.Random(round_)
    chains = []
    for c in range(CHAINS):
        x = device.allocator.allocate(4 * n)
        y = device.allocator.allocate(4 * n)
        device.write_bytes(x, np.full(n, c, np.float32))
        chains.append((x, y, device.create_semaphore()))
    submissions = []
    for x, y, sem in chains:
        for link in range(LINKS):
            cb = device.create_command_buffer()
            cb.dispatch(exe, "add_one", (GROUPS, 1, 1), bindings=[x, y])
            cb.barrier()
            cb.fill(x, 0, 4, 0)  # clobbered, then restored by the next dispatch
            cb.barrier()
            cb.dispatch(exe, "add_one", (GROUPS, 1, 1), bindings=[y, x])
            cb.finalize()
            submissions.append((cb, [(sem, link)] if link else [], [(sem, link + 1)]))
    rng.shuffle(submissions)  # waits are often queued before their signals
    for cb, wait, signal in submissions:
        device.submit(cb, wait=wait, signal=signal)
    for c, (x, _y, sem) in enumerate(chains):
        sem.wait(LINKS, timeout=60)
        got = np.frombuffer(device.read_bytes(x), np.float32)
        assert np.array_equal(got, np.full(n, c + 2 * LINKS, np.float32)), c
