"""A sequence step's fixed invocation cost: the server's `gru_step` sample on tinyhal sync
against iree.runtime local-sync, on the same .vmfb, at batch 1 and 16.

`gru_step` is one GRU cell step (`server/models/build_samples.py`): the call every step of
a served sequence pays, whose kernels are a few microseconds, so its time is nearly all
the runtime's fixed cost per invocation. Both runtimes run everything on the calling
thread, so each call is measured by the thread's CPU time (what the shared machine's
other processes took from the core is left out) as well as by wall time. Outputs are
checked bit for bit first. Then `--rounds` rounds (at least 7), each runtime a short
median per round, the order reversed every other round. Reported per batch: the median
over rounds of each round's ratio (CPU and wall), each runtime's median CPU microseconds
per call, and for tinyhal the Python calls and bytecode instructions one call executes
(deterministic: they do not move with the machine's load).

Writes bench/results/gru_step_vs_iree.json and prints a table with the load average.

    python bench/gru_step_vs_iree.py [--rounds N] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import write_results  # noqa: E402
from emu_overhead import bytecodes  # noqa: E402
from zoo_vs_iree import (  # noqa: E402
    as_arrays,
    hal_import_codes,
    iree_function,
    median_wall_and_cpu,
    python_calls,
)

import tinyhal  # noqa: E402

VMFB = os.path.join(HERE, "..", "server", "models", "gru_step", "1", "model.vmfb")
CALLS_PER_ROUND = 200


def run_batch(batch: int, rounds: int, hal_codes: set[Any]) -> dict[str, Any]:
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    state = rng.standard_normal((batch, 16)).astype(np.float32)
    module = tinyhal.load(VMFB, device="sync")
    context, step = iree_function(VMFB, "step", "local-sync")
    runners = {"tinyhal": lambda: module.step(x, state),
               "iree": lambda: as_arrays(step(x, state))}
    ours = [a.tobytes() for a in as_arrays(runners["tinyhal"]())]
    theirs = [a.tobytes() for a in runners["iree"]()]
    assert ours == theirs, f"gru_step at batch {batch} is not bit-exact with IREE local-sync"
    wall: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            w, c = median_wall_and_cpu(runners[name], CALLS_PER_ROUND)
            wall[name].append(w)
            cpu[name].append(c)
    calls, hal_ops = python_calls(runners["tinyhal"], hal_codes)
    row = {
        "batch": batch, "rounds": rounds,
        "tinyhal_cpu_us": statistics.median(cpu["tinyhal"]) * 1e6,
        "iree_cpu_us": statistics.median(cpu["iree"]) * 1e6,
        "cpu_ratio": statistics.median(a / b for a, b in zip(cpu["tinyhal"], cpu["iree"])),
        "wall_ratio": statistics.median(a / b for a, b in zip(wall["tinyhal"], wall["iree"])),
        "python_calls": calls, "hal_ops": hal_ops,
        "bytecodes": bytecodes(runners["tinyhal"]),
    }
    module.close()
    del context
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds (>= 7)")
    parser.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    args = parser.parse_args()
    hal_codes = hal_import_codes()
    rows = [run_batch(int(b), max(7, args.rounds), hal_codes)
            for b in args.batches.split(",") if b]
    load = os.getloadavg()
    path = write_results("gru_step_vs_iree", rows, {"loadavg": load})
    print(f"{'batch':>5} {'tinyhal us':>10} {'IREE us':>8} {'cpu ratio':>9} {'wall ratio':>10} "
          f"{'py calls':>8} {'hal ops':>7} {'bytecodes':>9}")
    for r in rows:
        print(f"{r['batch']:5d} {r['tinyhal_cpu_us']:10.1f} {r['iree_cpu_us']:8.1f} "
              f"{r['cpu_ratio']:8.2f}x {r['wall_ratio']:9.2f}x {r['python_calls']:8d} "
              f"{r['hal_ops']:7d} {r['bytecodes']:9d}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; results: {path}")


if __name__ == "__main__":
    main()
