"""Task-driver scaling: a compute-bound IREE dispatch on `task` (N workers) vs `sync`,
side by side in one run; µs per empty submit round trip; ns per workgroup for tiny
workgroups.

The dispatch is the 512x512x512 f32 matmul that `iree-compile` 3.13.0 produces for
`linalg.matmul`: the module is compiled once to dump its executable source, which is then
compiled on its own with `--compile-mode=hal-executable` (for this host's CPU); its
workgroup count is read from the module's lowered dispatch. Results are checked against
numpy.

    python bench/task_scaling.py [--workers 2] [--repeat 20]

IREE's own runtime runs the same module (local-sync vs local-task with as many workers)
in the same process as the reference: on a loaded or SMT-shared machine neither scales,
and the IREE rows say so. Writes bench/results/task_scaling.json and prints a table. Targets: matmul speed-up of
task(2) over sync >= 1.7x; empty submit round trip on task <= 100 µs.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from _common import median_seconds, print_table, write_results  # noqa: E402

from tinyhal import hal  # noqa: E402
from tinyhal.hal import BufferView, build_executable  # noqa: E402

N = 512
MATMUL_MLIR = f"""
func.func @mm(%a: tensor<{N}x{N}xf32>, %b: tensor<{N}x{N}xf32>) -> tensor<{N}x{N}xf32> {{
  %cst = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<{N}x{N}xf32>
  %f = linalg.fill ins(%cst : f32) outs(%e : tensor<{N}x{N}xf32>) -> tensor<{N}x{N}xf32>
  %r = linalg.matmul ins(%a, %b : tensor<{N}x{N}xf32>, tensor<{N}x{N}xf32>)
                     outs(%f : tensor<{N}x{N}xf32>) -> tensor<{N}x{N}xf32>
  return %r : tensor<{N}x{N}xf32>
}}
"""
TARGET_FLAGS = ["--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=host"]

TINY = r"""
static int tiny(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
                const tinyhal_workgroup_state_t* w) {
  ((uint32_t*)d->binding_ptrs[0])[w->workgroup_id_x & 1023u] = w->workgroup_id_x;
  return 0;
}
"""


def _iree_compile() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "iree-compile")
    return exe if os.path.exists(exe) else "iree-compile"


def _cache_paths() -> tuple[str, str, str]:
    cache = os.path.join(os.path.expanduser("~"), ".cache", "tinyhal-bench")
    key = hashlib.sha256((MATMUL_MLIR + "".join(TARGET_FLAGS) + "3.13.0").encode()).hexdigest()[:16]
    lib_path = os.path.join(cache, f"matmul-{key}.so")
    return lib_path, lib_path + ".meta", os.path.join(cache, f"matmul-{key}.vmfb")


def compile_matmul() -> tuple[bytes, tuple[int, int, int], str]:
    """(executable bytes, workgroup count, export name), cached by content hash."""
    lib_path, meta_path, _vmfb = _cache_paths()
    os.makedirs(os.path.dirname(lib_path), exist_ok=True)
    if not all(os.path.exists(p) for p in _cache_paths()):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "mm.mlir")
            with open(src, "w") as f:
                f.write(MATMUL_MLIR)
            dump = os.path.join(tmp, "sources")
            vm = subprocess.run(
                [_iree_compile(), src, "--compile-to=vm", *TARGET_FLAGS,
                 f"--iree-hal-dump-executable-sources-to={dump}"],
                check=True, capture_output=True, text=True).stdout
            m = re.search(r"@hal\.command_buffer\.dispatch\(%\w+, %\w+, %\w+, (%\w+), (%\w+), (%\w+),", vm)
            if not m:
                raise RuntimeError("could not find the matmul dispatch in the lowered module")

            def const(name: str) -> int:
                c = re.search(rf"{re.escape(name)} = vm\.const\.i32 (\d+)", vm)
                if c:
                    return int(c.group(1))
                if name.startswith("%zero"):
                    return 0
                raise RuntimeError(f"no constant {name}")

            wg = tuple(const(g) for g in m.groups())
            (source,) = glob.glob(os.path.join(dump, "*.mlir"))
            subprocess.run([_iree_compile(), "--compile-mode=hal-executable", source,
                            "-o", lib_path + ".tmp", *TARGET_FLAGS], check=True)
            os.replace(lib_path + ".tmp", lib_path)
            with open(source) as f:
                export = re.search(r"hal\.executable\.export public @(\w+)", f.read()).group(1)
            subprocess.run([_iree_compile(), src, "-o", _cache_paths()[2], *TARGET_FLAGS],
                           check=True)
            with open(meta_path, "w") as f:
                f.write(f"{wg[0]} {wg[1]} {wg[2]} {export}")
    with open(meta_path) as f:
        x, y, z, export = f.read().split()
    with open(lib_path, "rb") as f:
        return f.read(), (int(x), int(y), int(z)), export


def run_and_wait(device, cb, sem, state):
    state[0] += 1
    device.submit(cb, signal=[(sem, state[0])])
    sem.wait(state[0], timeout=60)


def matmul_runner(device, library, workgroups, export, a, b):
    """(one submit+wait of the matmul, a correctness check) on a tinyhal device."""
    exe = device.load_executable(library)
    va, vb = BufferView.from_numpy(device, a), BufferView.from_numpy(device, b)
    out = device.allocator.allocate(4 * N * N)
    cb = device.create_command_buffer("reusable")
    cb.dispatch(exe, export, workgroups, bindings=[va.buffer, vb.buffer, out])
    cb.finalize()
    sem, state = device.create_semaphore(), [0]

    def check() -> bool:
        got = BufferView(out, (N, N), 0x21000020).to_numpy()
        return bool(np.allclose(got, a @ b, rtol=1e-3, atol=1e-3))

    return (lambda: run_and_wait(device, cb, sem, state)), check


def interleaved_medians(runners: dict, repeat: int, warmup: int = 3, rounds: int = 4) -> dict:
    """Median seconds per runner, sampled in alternating blocks.

    Blocks (not single samples) alternate so that background load hits every runner
    alike, while a runner never pays for the previous one's threads: IREE's workers spin
    for a while after their work, so sample-by-sample round-robin charges that spinning to
    whoever runs next. Each block starts with its own warm-up calls.
    """
    samples: dict = {name: [] for name in runners}
    per_block = max(1, repeat // rounds)
    for _ in range(rounds):
        for name, fn in runners.items():
            for _ in range(warmup):
                fn()
            for _ in range(per_block):
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
    return {name: float(np.median(v)) for name, v in samples.items()}


def bench_empty_round_trip(device, repeat: int) -> dict:
    empty = device.create_command_buffer("reusable")
    empty.finalize()
    sem, state = device.create_semaphore(), [0]
    inline = median_seconds(lambda: run_and_wait(device, empty, sem, state), repeat * 20, 50)
    # A host thread signals the wait: the submission runs on the signalling thread.
    gate = device.create_semaphore()
    done = device.create_semaphore()
    counter = [0]

    def cross_thread() -> None:
        counter[0] += 1
        v = counter[0]
        device.submit(empty, wait=[(gate, v)], signal=[(done, v)])
        t = threading.Thread(target=gate.signal, args=(v,))
        t.start()
        done.wait(v, timeout=60)
        t.join()

    cross = median_seconds(cross_thread, repeat * 5, 10)
    return {"inline_us": inline * 1e6, "cross_thread_us": cross * 1e6}


def bench_worker_round_trip(device, repeat: int) -> float:
    """Round trip of a submission that must run on a worker (a 1-workgroup dispatch)."""
    lib = build_executable(TINY, ["tiny"], name="bench_tiny")
    exe = device.load_executable(lib)
    out = device.allocator.allocate(4096)
    cb = device.create_command_buffer("reusable")
    cb.dispatch(exe, "tiny", (1, 1, 1), bindings=[out])
    cb.finalize()
    sem, state = device.create_semaphore(), [0]
    return median_seconds(lambda: run_and_wait(device, cb, sem, state), repeat * 10, 20)


def bench_tiny_workgroups(device, count: int, repeat: int) -> float:
    lib = build_executable(TINY, ["tiny"], name="bench_tiny")
    exe = device.load_executable(lib)
    out = device.allocator.allocate(4096)
    cb = device.create_command_buffer("reusable")
    cb.dispatch(exe, "tiny", (count, 1, 1), bindings=[out])
    cb.finalize()
    sem, state = device.create_semaphore(), [0]
    return median_seconds(lambda: run_and_wait(device, cb, sem, state), repeat) / count


def iree_runners(workers: int, a: np.ndarray, b: np.ndarray) -> dict:
    """IREE's own runtime on the same matmul module (the whole `mm` call, including
    the invocation and reading the result back), local-sync and local-task."""
    try:
        import iree.runtime as rt
    except ImportError:
        return {}
    with open(_cache_paths()[2], "rb") as f:
        data = f.read()
    runners = {}
    for label, driver, flags in (
        ("iree local-sync", "local-sync", []),
        (f"iree local-task({workers})", "local-task",
         [f"--task_topology_max_group_count={workers}"]),
    ):
        if flags:
            rt.flags.parse_flags(*flags)
        config = rt.Config(driver)
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, data))
        fn = ctx.modules.module["mm"]
        da, db = rt.asdevicearray(config.device, a), rt.asdevicearray(config.device, b)
        runners[label] = lambda fn=fn, da=da, db=db, ctx=ctx: fn(da, db).to_host()
    return runners


SPIN = r"""
static int spin(const tinyhal_environment_t* e, const tinyhal_dispatch_state_t* d,
                const tinyhal_workgroup_state_t* w) {
  volatile uint32_t s = 0;
  for (uint32_t i = 0; i < 100000u; ++i) s += i;
  ((uint32_t*)d->binding_ptrs[0])[w->workgroup_id_x & 1023u] = s;
  return 0;
}
"""


def probe_parallelism(threads: int, repeat: int) -> float:
    """Speed-up of `threads` plain threads running one C workgroup loop over 1 thread,
    without any scheduler: what the machine offers right now (other load included)."""
    from tinyhal.hal.execution import resolve_commands

    device = hal.create_device("sync")
    exe = device.load_executable(build_executable(SPIN, ["spin"], name="bench_spin"))
    out = device.allocator.allocate(4096)
    cb = device.create_command_buffer("reusable")
    cb.dispatch(exe, "spin", (128, 1, 1), bindings=[out])
    cb.finalize()

    def run(n: int) -> None:
        prepared = resolve_commands(cb, None, n).operations()[0].prepared
        pool = [threading.Thread(target=prepared.run, args=(i, 4)) for i in range(n)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    one = median_seconds(lambda: run(1), repeat)
    many = median_seconds(lambda: run(threads), repeat)
    device.close()
    return one / many


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--workgroups", type=int, default=1 << 20, help="tiny-workgroup grid")
    args = ap.parse_args()

    library, workgroups, export = compile_matmul()
    probe = probe_parallelism(args.workers, max(5, args.repeat // 2))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = rng.standard_normal((N, N)).astype(np.float32)

    devices = {"sync": hal.create_device("sync"),
               f"task({args.workers})": hal.create_device("task", workers=args.workers)}
    rows = []
    try:
        runners, checks = {}, {}
        for name, device in devices.items():
            runners[name], checks[name] = matmul_runner(device, library, workgroups, export,
                                                        a, b)
        runners.update(iree_runners(args.workers, a, b))
        medians = interleaved_medians(runners, args.repeat)
        for name, device in devices.items():
            rt = bench_empty_round_trip(device, args.repeat)
            worker_rt = bench_worker_round_trip(device, args.repeat)
            ns_wg = bench_tiny_workgroups(device, args.workgroups, max(5, args.repeat // 4))
            rows.append({
                "device": name,
                "matmul_ms": medians[name] * 1e3,
                "matmul_correct": checks[name](),
                "empty_submit_us": rt["inline_us"],
                "host_signalled_submit_us": rt["cross_thread_us"],
                "worker_submit_us": worker_rt * 1e6,
                "tiny_wg_ns": ns_wg * 1e9,
            })
        for name in runners:
            if name.startswith("iree"):
                rows.append({"device": name, "matmul_ms": medians[name] * 1e3})
    finally:
        for device in devices.values():
            device.close()
    for r in rows:
        base = "iree local-sync" if r["device"].startswith("iree") else "sync"
        r["speedup_vs_sync"] = medians[base] * 1e3 / r["matmul_ms"]
        r["matmul_gflops"] = 2 * N**3 / (r["matmul_ms"] / 1e3) / 1e9
    extra = {
        "matmul": {"shape": [N, N, N], "workgroups": list(workgroups), "export": export,
                   "compile": "iree-compile --compile-mode=hal-executable (3.13.0), cpu=host"},
        "targets": {"speedup_task2_vs_sync": 1.7, "empty_submit_us_task": 100},
        "machine_parallel_speedup": probe,
        "timestamp": time.time(),
    }
    path = write_results("task_scaling", rows, extra)
    print_table(rows, ["device", "matmul_ms", "matmul_gflops", "speedup_vs_sync",
                       "matmul_correct", "empty_submit_us", "host_signalled_submit_us",
                       "worker_submit_us", "tiny_wg_ns"])
    print(f"\nmatmul {N}x{N}x{N} f32, workgroups {workgroups}; machine parallelism now: "
          f"{probe:.2f}x with {args.workers} plain threads (no scheduler); results: {path}")


if __name__ == "__main__":
    main()
