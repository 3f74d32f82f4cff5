"""tinyhal vs IREE's runtime on the same .vmfb, side by side in one process run.

Median latency of one invocation (numpy in, numpy out) for a tiny module (elementwise
on 4 floats), the keyword-spotting DS-CNN (1x1x49x10 MFCC in, 12 keywords out), a small
CNN and MobileNetV2 on sync/task (IREE: local-sync/local-task); the Python function calls
one invocation makes on the calling thread (`sys.setprofile` call events; deterministic,
unlike the timings on a shared machine); VM instructions per CPU second of the calling
thread on a pure-VM loop (and per wall second). Each row runs alone in 15 short rounds,
tinyhal and IREE back to back, and reports its median round; a round of the loop follows
every round of every row, so its rounds spread over the whole run. Last, the peak device memory of one MobileNetV2 invocation (tinyhal
`allocator.statistics()`, IREE's allocator statistics on local-sync).
Writes bench/results/vm_vs_iree.json and prints a table.

    python bench/vm_vs_iree.py [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import median_seconds, write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.iree_tools import HOST_FLAGS, compile_mlir  # noqa: E402
from support.models import (  # noqa: E402
    VM_LOOP_MLIR,
    ds_cnn_kws_vmfb,
    kws_input,
    mobilenet_input,
    mobilenet_v2_vmfb,
    small_cnn_vmfb,
)

ROUNDS = 15

TINY = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def iree_module(vmfb, driver):
    import iree.runtime as rt

    config = rt.Config(driver)
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    return config, ctx.modules.module


def python_calls(fn) -> int:
    """Python function calls (profile `call` events) one `fn()` makes on this thread."""
    fn()
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count - 1  # the profile hook sees fn's own frame


def cpu_seconds(fn) -> float:
    """CPU time of this thread that one `fn()` takes."""
    start = time.thread_time()
    fn()
    return time.thread_time() - start


def loop_instructions_per_iteration(vmfb) -> int:
    """Instructions executed per loop trip, counted from iree-dump-module's disassembly."""
    dump = subprocess.run([os.path.join(os.path.dirname(sys.executable), "iree-dump-module"),
                           str(vmfb)], capture_output=True, text=True).stdout
    body = dump[dump.index("vm.func @loop"):]
    body = body[: body.index("\n}")]
    blocks = re.split(r"\n\^bb\d+:", body)
    # blocks[2] is the loop header (compare, branch), blocks[3] the loop body
    return sum(1 for blk in blocks[2:4] for line in blk.strip().splitlines()
               if line.strip() and not line.strip().startswith("//"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=0, help="samples per row (0: auto)")
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()

    tiny = compile_mlir(TINY, HOST_FLAGS)
    loop = compile_mlir(VM_LOOP_MLIR, HOST_FLAGS)
    models = {
        "tiny (4xf32 add)": (tiny, "main", lambda: (np.arange(4, dtype=np.float32),
                                                    np.ones(4, np.float32)), 2800),
        "KWS DS-CNN (1x1x49x10)": (ds_cnn_kws_vmfb(), "ds_cnn_kws", lambda: (kws_input(),), 700),
        "small CNN (1x3x64x64)": (small_cnn_vmfb(), "small_cnn",
                                  lambda: (np.random.default_rng(0).standard_normal(
                                      (1, 3, 64, 64)).astype(np.float32),), 350),
        "MobileNetV2 (1x3x224x224)": (mobilenet_v2_vmfb(), "mobilenet_v2",
                                      lambda: (mobilenet_input(),), 70),
    }
    # VM instructions per CPU second on a pure-VM loop (no HAL calls at all): both VMs run
    # it on this thread, so its CPU time is their instruction throughput. One round of it
    # follows each round of every row, so its rounds spread over the whole run.
    per_iter = loop_instructions_per_iteration(loop)
    n = 200_000 if not args.quick else 50_000
    loop_module = tinyhal.load(loop, device="sync")
    _, iree_loop = iree_module(loop, "local-sync")
    assert loop_module.loop(1000) == iree_loop["loop"](1000)
    loops = {"tinyhal": loop_module.loop, "iree": iree_loop["loop"]}
    per_cpu: dict[str, list[float]] = {name: [] for name in loops}
    per_wall: dict[str, list[float]] = {name: [] for name in loops}

    def loop_round() -> None:
        for name, run in loops.items():
            base = min(cpu_seconds(lambda run=run: run(0)) for _ in range(5))
            start = time.perf_counter()
            used = cpu_seconds(lambda run=run: run(n))
            per_wall[name].append(per_iter * n / max(time.perf_counter() - start, 1e-9))
            per_cpu[name].append(per_iter * n / max(used - base, 1e-9))

    # Each row alone (one model on one driver, as a user runs it), in ROUNDS short rounds
    # with tinyhal and IREE back to back, so a slow spell of the shared machine costs
    # both runtimes alike and only some rounds; the median round is reported.
    rows = []
    for label, (vmfb, fn, make_args, repeat) in models.items():
        repeat = args.repeat or (max(5, repeat // 5) if args.quick else repeat)
        samples = max(1, repeat // ROUNDS)
        inputs = make_args()
        for ours, theirs in (("sync", "local-sync"), ("task", "local-task")):
            module = tinyhal.load(vmfb, device=ours)
            f = getattr(module, fn)
            _, iree_mod = iree_module(vmfb, theirs)
            g = iree_mod[fn]

            def call_ours(f=f, inputs=inputs):
                return f(*inputs)

            def call_iree(g=g, inputs=inputs):
                r = g(*inputs)
                return r.to_host() if hasattr(r, "to_host") else r

            assert np.array_equal(call_ours(), call_iree())  # bit-exact
            t_ours, t_iree = [], []
            for _ in range(ROUNDS):
                t_ours.append(median_seconds(call_ours, samples, warmup=1))
                t_iree.append(median_seconds(call_iree, samples, warmup=1))
                loop_round()
            ours_s, iree_s = statistics.median(t_ours), statistics.median(t_iree)
            rows.append({"model": label, "driver": ours, "iree_driver": theirs,
                         "tinyhal_ms": ours_s * 1e3, "iree_ms": iree_s * 1e3,
                         "ratio": ours_s / iree_s,
                         "tinyhal_python_calls": python_calls(call_ours),
                         "iree_python_calls": python_calls(call_iree)})
            module.close()
            del iree_mod, g
    loop_module.close()
    vm = {"instructions_per_iteration": per_iter, "iterations": n,
          "tinyhal_instr_per_s": statistics.median(per_cpu["tinyhal"]),
          "iree_instr_per_s": statistics.median(per_cpu["iree"]),
          "measure": (f"median of {len(per_cpu['tinyhal'])} rounds spread over the run, "
                      "per CPU second of the calling thread"),
          "tinyhal_instr_per_wall_s": statistics.median(per_wall["tinyhal"]),
          "iree_instr_per_wall_s": statistics.median(per_wall["iree"])}

    # Peak device memory of one MobileNetV2 invocation.
    vmfb = mobilenet_v2_vmfb()
    x = mobilenet_input()
    module = tinyhal.load(vmfb, device="sync")
    module.mobilenet_v2(x)
    module.device.allocator.reset_peak()
    module.mobilenet_v2(x)
    ours_peak = module.statistics().peak_bytes
    module.close()
    config, iree_mn = iree_module(vmfb, "local-sync")
    iree_mn["mobilenet_v2"](x).to_host()
    iree_stats = config.device.allocator.statistics
    iree_peak = iree_stats["device_bytes_peak"] + iree_stats["host_bytes_peak"]
    memory = {"tinyhal_peak_bytes": ours_peak, "iree_peak_bytes": iree_peak,
              "note": "IREE's peak is its allocator's since process start (two runs here)"}

    path = write_results("vm_vs_iree", rows, {"vm_loop": vm, "mobilenet_peak_memory": memory})
    print(f"{'model':28} {'driver':6} {'tinyhal':>11} {'IREE':>11} {'ratio':>7} "
          f"{'py calls':>9} {'IREE py':>8}")
    for r in rows:
        fmt = (lambda ms: f"{ms * 1e3:8.1f} us") if r["iree_ms"] < 1 else (
            lambda ms: f"{ms:8.2f} ms")
        print(f"{r['model']:28} {r['driver']:6} {fmt(r['tinyhal_ms']):>11} "
              f"{fmt(r['iree_ms']):>11} {r['ratio']:6.2f}x {r['tinyhal_python_calls']:9d} "
              f"{r['iree_python_calls']:8d}")
    print(f"VM loop: tinyhal {vm['tinyhal_instr_per_s'] / 1e6:.1f} M instr/s, "
          f"IREE {vm['iree_instr_per_s'] / 1e6:.1f} M instr/s per CPU second "
          f"({per_iter} instructions per trip; wall clock: tinyhal "
          f"{vm['tinyhal_instr_per_wall_s'] / 1e6:.1f} M, IREE "
          f"{vm['iree_instr_per_wall_s'] / 1e6:.1f} M)")
    print(f"MobileNetV2 peak device memory: tinyhal {ours_peak / 1e6:.2f} MB, "
          f"IREE local-sync {iree_peak / 1e6:.2f} MB")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
