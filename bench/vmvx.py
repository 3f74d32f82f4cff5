"""VMVX executables: tinyhal against iree.runtime on the same VMVX `.vmfb`, per call.

Two programs: the tests' three-layer MLP (`tests/support/vmvx_programs.py`) and the tests'
small CNN (three strided conv + ReLU layers, global pool, dense; from ONNX, on a
1x3x64x64 input), each compiled to VMVX in the shapes VMVX code comes in (plain VM loops,
microkernels, microkernels with data tiling; the CNN without the microkernel-only shape
unless `--all`), run by tinyhal (`sync` and `task`) and by iree.runtime (`local-sync`),
in alternating rounds in one process; each round times `--calls` calls of each and the
table shows medians over the rounds, the median tinyhal / IREE ratio of wall time and of
process CPU time (every thread's), and how many of the program's workgroup functions
tinyhal runs natively. Results must be bit-identical on
`sync`, `task` and `emu`, checked once before timing. Writes `bench/results/vmvx.json`.

    python bench/vmvx.py [--rounds 5] [--calls 20] [--all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from _common import print_table, write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.iree_tools import compile_mlir  # noqa: E402
from support.models import iree_function  # noqa: E402
from support.vmvx_programs import FLAVOURS, mlp_input, mlp_mlir  # noqa: E402
from tinyhal.vm import vmvx  # noqa: E402


def _per_call(fn, x, calls: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) per call: CPU time counts every thread's work
    and is steadier than wall time on a shared machine."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn(x)
    return ((time.perf_counter() - start) / calls, (time.process_time() - start_cpu) / calls)


def _programs(everything: bool) -> list[tuple[str, str, str, np.ndarray]]:
    """(program, flavour, MLIR, input) to measure."""
    from support.models import import_onnx, small_cnn_onnx

    cnn = import_onnx(small_cnn_onnx())
    image = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    cnn_flavours = ("data-tiling", "ukernels", "loops") if everything else (
        "data-tiling", "loops")
    return ([("mlp", f, mlp_mlir(), mlp_input()) for f in ("data-tiling", "ukernels", "loops")]
            + [("small_cnn", f, cnn, image) for f in cnn_flavours])


class _NativeCount:
    """Counts the workgroup functions the VMVX executables loaded meanwhile run natively."""

    def __enter__(self):
        self.native, self.total = set(), set()
        self._init = vmvx.VMVXExecutable.__init__

        def init(executable, *args, **kwargs):
            self._init(executable, *args, **kwargs)
            self.native.update(executable.native_exports)
            self.total.update(executable.export_names)

        vmvx.VMVXExecutable.__init__ = init
        return self

    def __exit__(self, *exc):
        vmvx.VMVXExecutable.__init__ = self._init


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--all", action="store_true",
                        help="also the CNN with microkernels and no data tiling (slow)")
    args = parser.parse_args(argv)
    rows = []
    for program, flavour, source, x in _programs(args.all):
        vmfb = compile_mlir(source, FLAVOURS[flavour])
        theirs = iree_function(vmfb, program)
        expected = theirs(x).tobytes()
        calls = max(1, args.calls // 10) if program == "small_cnn" else args.calls
        for driver in ("emu", "sync", "task"):
            with _NativeCount() as count, tinyhal.load(vmfb, device=driver) as module:
                ours = getattr(module, program)
                if ours(x).tobytes() != expected:
                    raise SystemExit(f"{program} {flavour} on {driver}: results differ "
                                     "from IREE")
                if driver == "emu":  # checked for bits only: emu models a device's timing
                    continue
                samples = []
                for _ in range(args.rounds):
                    samples.append((_per_call(ours, x, calls), _per_call(theirs, x, calls)))
            tinyhal_ms = statistics.median(s[0][0] for s in samples) * 1e3
            iree_ms = statistics.median(s[1][0] for s in samples) * 1e3
            ratio = statistics.median(s[0][0] / s[1][0] for s in samples)
            cpu_ratio = statistics.median(s[0][1] / max(s[1][1], 1e-9) for s in samples)
            rows.append({"program": program, "flavour": flavour, "tinyhal device": driver,
                         "native": f"{len(count.native)}/{len(count.total)}",
                         "tinyhal ms/call": tinyhal_ms, "iree local-sync ms/call": iree_ms,
                         "ratio": ratio, "cpu ratio": cpu_ratio})
    load = os.getloadavg()[0]
    path = write_results("vmvx", rows, {"load_average_1min": load, "rounds": args.rounds,
                                        "calls": args.calls})
    print_table(rows, ["program", "flavour", "tinyhal device", "native", "tinyhal ms/call",
                       "iree local-sync ms/call", "ratio", "cpu ratio"])
    print(f"load average {load:.1f}; bit-identical to iree.runtime on emu, sync and task; "
          f"written to {path}")


if __name__ == "__main__":
    main()
