"""VMVX executables: tinyhal against iree.runtime on the same VMVX `.vmfb`, per call.

The tests' three-layer MLP (`tests/support/vmvx_programs.py`) compiled to VMVX in each
shape VMVX code comes in (plain VM loops, microkernels, microkernels with data tiling),
run by tinyhal (`sync` and `task`) and by iree.runtime (`local-sync`), in alternating
rounds in one process; each round times `--calls` calls of each and the table shows
medians over the rounds and the tinyhal / IREE ratio. Results must be bit-identical,
checked once before timing. Writes `bench/results/vmvx.json`.

    python bench/vmvx.py [--rounds 5] [--calls 20]
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

from _common import print_table, write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.iree_tools import compile_mlir  # noqa: E402
from support.models import iree_function  # noqa: E402
from support.vmvx_programs import FLAVOURS, mlp_input, mlp_mlir  # noqa: E402


def _per_call(fn, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    x = mlp_input()
    rows = []
    for flavour in ("data-tiling", "ukernels", "loops"):
        vmfb = compile_mlir(mlp_mlir(), FLAVOURS[flavour])
        theirs = iree_function(vmfb, "mlp")
        expected = theirs(x).tobytes()
        for driver in ("sync", "task"):
            with tinyhal.load(vmfb, device=driver) as module:
                ours = module.mlp
                if ours(x).tobytes() != expected:
                    raise SystemExit(f"{flavour} on {driver}: results differ from IREE")
                samples = []
                for _ in range(args.rounds):
                    samples.append((_per_call(ours, x, args.calls),
                                    _per_call(theirs, x, args.calls)))
            tinyhal_ms = statistics.median(s[0] for s in samples) * 1e3
            iree_ms = statistics.median(s[1] for s in samples) * 1e3
            ratio = statistics.median(s[0] / s[1] for s in samples)
            rows.append({"flavour": flavour, "tinyhal device": driver,
                         "tinyhal ms/call": tinyhal_ms, "iree local-sync ms/call": iree_ms,
                         "ratio": ratio})
    load = os.getloadavg()[0]
    path = write_results("vmvx", rows, {"load_average_1min": load, "rounds": args.rounds,
                                        "calls": args.calls})
    print_table(rows, ["flavour", "tinyhal device", "tinyhal ms/call",
                       "iree local-sync ms/call", "ratio"])
    print(f"load average {load:.1f}; written to {path}")


if __name__ == "__main__":
    main()
