"""Dispatch overhead: ns per workgroup of a trivial kernel over a 100k-workgroup grid, and
µs per empty submit round trip (submit + wait), per driver; IREE's local-sync invocation of
a tiny module is measured in the same run as the reference point.

    python bench/dispatch_overhead.py [--workgroups 100000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import median_seconds, print_table, write_results  # noqa: E402

from tinyhal import hal  # noqa: E402

TRIVIAL = r"""
static int nothing(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
                   const tinyhal_workgroup_state_t* w) { return 0; }
"""

TINY_MLIR = """
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def bench_driver(driver: str, library: bytes, workgroups: int, repeat: int) -> dict:
    device = hal.create_device(driver)
    exe = device.load_executable(library)
    cb = device.create_command_buffer("reusable")
    cb.dispatch(exe, "nothing", (workgroups, 1, 1))
    cb.finalize()
    empty = device.create_command_buffer("reusable")
    empty.finalize()
    sem = device.create_semaphore()
    state = {"v": 0}

    def round_trip(batch) -> None:
        state["v"] += 1
        device.submit(batch, signal=[(sem, state["v"])])
        sem.wait(state["v"], timeout=60)

    grid_s = median_seconds(lambda: round_trip(cb), repeat)
    empty_s = median_seconds(lambda: round_trip(empty), repeat * 20)
    device.close()
    return {
        "runtime": "tinyhal", "driver": driver, "workgroups": workgroups,
        "ns_per_workgroup": (grid_s - empty_s) * 1e9 / workgroups,
        "grid_ms": grid_s * 1e3, "empty_submit_us": empty_s * 1e6,
    }


def bench_iree(repeat: int) -> dict | None:
    try:
        import numpy as np
        from iree import runtime as ireert

        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
        from support.iree_tools import HOST_FLAGS, compile_mlir
    except Exception as exc:  # iree not installed: report only tinyhal
        print(f"(IREE reference skipped: {exc})")
        return None
    vmfb = compile_mlir(TINY_MLIR, HOST_FLAGS).read_bytes()
    config = ireert.Config("local-sync")
    ctx = ireert.SystemContext(config=config)
    ctx.add_vm_module(ireert.VmModule.copy_buffer(ctx.instance, vmfb))
    fn = ctx.modules.module["add"]
    a = np.ones(4, np.float32)
    seconds = median_seconds(lambda: fn(a, a), repeat * 20)
    return {"runtime": "iree", "driver": "local-sync", "invoke_tiny_module_us": seconds * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workgroups", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    library = hal.build_executable(TRIVIAL, ["nothing"], name="bench_trivial")
    rows = [bench_driver(d, library, args.workgroups, args.repeat)
            for d in hal.available_drivers()]
    iree = bench_iree(args.repeat)
    if iree:
        rows.append(iree)
    path = write_results("dispatch_overhead", rows, {
        "targets": {"ns_per_workgroup": 50, "sync_empty_submit_us": 30}})
    print_table(rows, ["runtime", "driver", "workgroups", "ns_per_workgroup", "grid_ms",
                       "empty_submit_us", "invoke_tiny_module_us"])
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
