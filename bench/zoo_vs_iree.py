"""The model zoo on tinyhal's drivers vs IREE's runtime, on the same .vmfb, in one run.

Models: tiny (4xf32 add), the KWS DS-CNN, a small CNN, MobileNetV2 (`tests/support/
models.py`), and the zoo of programs with many small dispatches per call (`tests/support/
zoo.py`): a 2-layer BERT-tiny encoder with an attention mask (hidden 128, seq 24), a
GPT-style decoder step with its KV cache in and out, a 2-layer LSTM over 16 steps and a
GRU over 16 steps, all with seeded weights, compiled by the pinned iree-compile.

Each model is loaded on tinyhal sync, task and emu (fast mode) and on iree.runtime
local-sync and local-task; every runtime's outputs are checked bit for bit against
local-sync first. Then `--rounds` rounds (at least 7): in each, every runtime in turn
runs the model for a short median, the order reversed every other round, so a slow
spell of the shared machine costs them alike. Reported per model: the median over rounds
of each round's ratio (sync / local-sync, task / local-task, emu / local-task, emu /
tinyhal sync) and of each runtime's time; for sync / local-sync also the ratio of the
calling thread's CPU time (column `cpu`: both run every kernel on the calling thread, so it
leaves out the time the shared machine gave the core to other processes, which the wall
ratio does not); the Python calls one sync invocation makes
(profile `call` events on the calling thread, deterministic) and how many of them are
calls of `hal` module imports or recording-block sites (`vm/record_blocks.py`: one call
for a command buffer's run of record operations), so calls per HAL operation.

Writes bench/results/zoo_vs_iree.json and prints a table.

    python bench/zoo_vs_iree.py [--rounds N] [--models bert_tiny,lstm,...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.iree_tools import HOST_FLAGS, compile_mlir  # noqa: E402
from support.models import (  # noqa: E402
    ds_cnn_kws_vmfb,
    kws_input,
    mobilenet_input,
    mobilenet_v2_vmfb,
    small_cnn_vmfb,
)
from support.zoo import ZOO, zoo_inputs, zoo_vmfb  # noqa: E402

ROUND_SECONDS = 0.04  # per runtime per round: enough calls for a stable median

TINY = """
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

OURS = ("sync", "task", "emu")
THEIRS = ("local-sync", "local-task")
RATIOS = (("sync", "local-sync"), ("task", "local-task"), ("emu", "local-task"),
          ("emu", "sync"))


def models() -> dict[str, tuple[Callable[[], Any], str, Callable[[], tuple]]]:
    """Name -> (vmfb maker, function, inputs maker)."""
    out: dict[str, tuple[Callable[[], Any], str, Callable[[], tuple]]] = {
        "tiny": (lambda: compile_mlir(TINY, HOST_FLAGS), "main",
                 lambda: (np.arange(4, dtype=np.float32), np.ones(4, np.float32))),
        "kws": (ds_cnn_kws_vmfb, "ds_cnn_kws", lambda: (kws_input(),)),
        "small_cnn": (small_cnn_vmfb, "small_cnn",
                      lambda: (np.random.default_rng(0).standard_normal((1, 3, 64, 64))
                               .astype(np.float32),)),
        "mobilenet_v2": (mobilenet_v2_vmfb, "mobilenet_v2", lambda: (mobilenet_input(),)),
    }
    for name, model in ZOO.items():
        out[name] = (lambda name=name: zoo_vmfb(name), model.function,
                     lambda name=name: zoo_inputs(name))
    return out


def as_arrays(result: Any) -> list[np.ndarray]:
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    return [r.to_host() if hasattr(r, "to_host") else np.asarray(r) for r in items]


def iree_function(vmfb: Any, function: str, driver: str) -> tuple[Any, Callable[..., Any]]:
    import iree.runtime as rt

    ctx = rt.SystemContext(config=rt.Config(driver))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    return ctx, ctx.modules.module[function]


def hal_import_codes() -> set[Any]:
    """The code objects of the `hal` module's imports (the shims generated code calls)
    and of its recording-block sites (one call for a run of record operations)."""
    from tinyhal.hal import create_device
    from tinyhal.vm.hal_module import create_hal_module
    from tinyhal.vm.record_blocks import RecordBlock

    device = create_device("sync")
    try:
        module = create_hal_module(device)
        codes = {getattr(f.fn, "func", f.fn).__code__ for f in module.functions.values()}
        site = module.block_recorder([], RecordBlock((), 0), [])
        return codes | {site.__code__}
    finally:
        device.close()


def python_calls(fn: Callable[[], Any], hal_codes: set[Any]) -> tuple[int, int]:
    """(Python calls, of which `hal` imports) one `fn()` makes on this thread."""
    fn()
    calls = hal = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls, hal
        if event == "call":
            calls += 1
            if frame.f_code in hal_codes:
                hal += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls - 1, hal  # the hook sees fn's own frame


def median_wall_and_cpu(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Medians of `repeat` calls of `fn` (after one unmeasured call): wall seconds, and
    seconds of CPU the calling thread spent. The CPU time leaves out the time others'
    processes held the core; it is only whole for runtimes that run everything on the
    calling thread (tinyhal sync and IREE local-sync)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeat):
        cpu_start = time.thread_time()
        start = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - cpu_start)
    return statistics.median(wall), statistics.median(cpu)


def run_model(name: str, vmfb: Any, function: str, inputs: tuple, rounds: int,
              hal_codes: set[Any]) -> dict[str, Any]:
    runners: dict[str, Callable[[], Any]] = {}
    keep: list[Any] = []
    for driver in OURS:
        module = tinyhal.load(vmfb, device=driver)
        keep.append(module)
        fn = getattr(module, function)
        runners[driver] = lambda fn=fn: fn(*inputs)
    for driver in THEIRS:
        ctx, fn = iree_function(vmfb, function, driver)
        keep.append(ctx)
        runners[driver] = lambda fn=fn: as_arrays(fn(*inputs))
    expected = [a.tobytes() for a in as_arrays(runners["local-sync"]())]
    for driver, run in runners.items():
        got = [a.tobytes() for a in as_arrays(run())]
        assert got == expected, f"{name} on {driver} is not bit-exact with IREE local-sync"
    samples = {}
    for driver, run in runners.items():
        start = time.perf_counter()
        run()
        once = time.perf_counter() - start
        samples[driver] = max(3, min(400, math.ceil(ROUND_SECONDS / max(once, 1e-6))))
    times: dict[str, list[float]] = {d: [] for d in runners}
    cpu_times: dict[str, list[float]] = {d: [] for d in runners}
    order = list(runners)
    for r in range(rounds):
        for driver in (order if r % 2 == 0 else order[::-1]):
            wall, cpu = median_wall_and_cpu(runners[driver], samples[driver])
            times[driver].append(wall)
            cpu_times[driver].append(cpu)
    calls, hal = python_calls(runners["sync"], hal_codes)
    row: dict[str, Any] = {"model": name, "rounds": rounds,
                           "python_calls_per_invocation": calls,
                           "hal_ops_per_invocation": hal,
                           "python_calls_per_hal_op": (calls / hal) if hal else None}
    for driver in runners:
        row[f"{driver}_ms"] = statistics.median(times[driver]) * 1e3
    for ours, theirs in RATIOS:
        row[f"{ours}/{theirs}"] = statistics.median(
            a / b for a, b in zip(times[ours], times[theirs]))
    row["sync/local-sync cpu"] = statistics.median(
        a / b for a, b in zip(cpu_times["sync"], cpu_times["local-sync"]))
    for item in keep:
        if hasattr(item, "close"):
            item.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (>= 7)")
    parser.add_argument("--models", default="", help="comma-separated subset")
    args = parser.parse_args()
    table = models()
    names = [n for n in args.models.split(",") if n] or list(table)
    hal_codes = hal_import_codes()
    rows = []
    for name in names:
        make_vmfb, function, make_inputs = table[name]
        rows.append(run_model(name, make_vmfb(), function, make_inputs(),
                              max(7, args.rounds), hal_codes))
        r = rows[-1]
        print(f"{name}: sync {r['sync/local-sync']:.2f}x", file=sys.stderr, flush=True)
    load = os.getloadavg()
    path = write_results("zoo_vs_iree", rows, {"loadavg": load})
    print(f"{'model':13} {'sync ms':>8} {'IREE ms':>8} {'sync/ls':>8} {'cpu':>6} {'task/lt':>8} "
          f"{'emu/lt':>7} {'emu/sync':>8} {'py calls':>9} {'hal ops':>8} {'calls/op':>8}")
    for r in rows:
        per_op = r["python_calls_per_hal_op"]
        print(f"{r['model']:13} {r['sync_ms']:8.3f} {r['local-sync_ms']:8.3f} "
              f"{r['sync/local-sync']:7.2f}x {r['sync/local-sync cpu']:5.2f}x "
              f"{r['task/local-task']:7.2f}x "
              f"{r['emu/local-task']:6.2f}x {r['emu/sync']:7.2f}x "
              f"{r['python_calls_per_invocation']:9d} {r['hal_ops_per_invocation']:8d} "
              f"{per_op if per_op is None else round(per_op, 1)!s:>8}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; results: {path}")


if __name__ == "__main__":
    main()
