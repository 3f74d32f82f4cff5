"""The emu driver's host cost in fast mode against tinyhal sync, per invocation.

    python bench/emu_overhead.py [--rounds 9] [--models tiny,gpt_step,...] [--preset P]
                                 [--emu_config array.cfg]

For each model of `bench/zoo_vs_iree.py` (tiny, KWS, small CNN, MobileNetV2, BERT-tiny,
GPT step, LSTM, GRU), loads it on `sync` and on `emu` (fast mode, `--preset`), checks
that both give the same bytes, then runs `--rounds` alternating rounds (the order
reversed every other round), each a short median per driver. Reports per model the
median over rounds of emu / sync, each driver's median time, the Python calls and the
bytecode instructions one invocation executes on each (trace `call` and `opcode` events
on the calling thread: deterministic, so unlike times they do not move with the shared
machine's load), and the modelled device time of one invocation on emu, which fast mode
must not change. Writes bench/results/emu_overhead.json and prints a table; note the
machine's load beside it.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import median_seconds, print_table, write_results  # noqa: E402
from zoo_vs_iree import as_arrays, models, python_calls  # noqa: E402

import tinyhal  # noqa: E402
from tinyhal import hal  # noqa: E402

ROUND_SECONDS = 0.04


def bytecodes(fn: Callable[[], Any]) -> int:
    """Bytecode instructions one `fn()` executes in Python frames on this thread."""
    fn()
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        elif event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def run_model(name: str, vmfb: Any, function: str, inputs: tuple, rounds: int,
              preset: str, accelerator: str | None = None) -> dict[str, Any]:
    emu = hal.create_device("emu", preset=preset, accelerator=accelerator)
    modules = {"sync": tinyhal.load(vmfb, device="sync"), "emu": tinyhal.load(vmfb, device=emu)}
    runners = {}
    for driver, module in modules.items():
        fn = getattr(module, function)
        runners[driver] = lambda fn=fn: fn(*inputs)
    try:
        got = {d: [a.tobytes() for a in as_arrays(run())] for d, run in runners.items()}
        assert got["emu"] == got["sync"], f"{name}: emu and sync differ"
        before = emu.summary().modelled_ns
        runners["emu"]()
        modelled_ns = emu.summary().modelled_ns - before
        samples = {}
        for driver, run in runners.items():
            start = time.perf_counter()
            run()
            samples[driver] = max(3, min(400, math.ceil(
                ROUND_SECONDS / max(time.perf_counter() - start, 1e-6))))
        times: dict[str, list[float]] = {d: [] for d in runners}
        order = list(runners)
        for r in range(rounds):
            for driver in (order if r % 2 == 0 else order[::-1]):
                times[driver].append(median_seconds(runners[driver], samples[driver], warmup=1))
        return {
            "model": name, "rounds": rounds, "preset": preset,
            "sync_ms": statistics.median(times["sync"]) * 1e3,
            "emu_ms": statistics.median(times["emu"]) * 1e3,
            "emu/sync": statistics.median(e / s for e, s in zip(times["emu"], times["sync"])),
            "sync_python_calls": python_calls(runners["sync"], set())[0],
            "emu_python_calls": python_calls(runners["emu"], set())[0],
            "sync_bytecodes": bytecodes(runners["sync"]),
            "emu_bytecodes": bytecodes(runners["emu"]),
            "modelled_us": modelled_ns / 1e3,
        }
    finally:
        for module in modules.values():
            module.close()
        emu.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds")
    parser.add_argument("--models", default="", help="comma-separated subset")
    parser.add_argument("--preset", default="generic", help="emu preset")
    parser.add_argument("--emu_config", default=None,
                        help="an accelerator (SCALE-Sim .cfg) priced by its cost model")
    args = parser.parse_args()
    table = models()
    names = [n for n in args.models.split(",") if n] or list(table)
    rows = []
    for name in names:
        make_vmfb, function, make_inputs = table[name]
        rows.append(run_model(name, make_vmfb(), function, make_inputs(), max(3, args.rounds),
                              args.preset, args.emu_config))
        print(f"{name}: emu/sync {rows[-1]['emu/sync']:.2f}x", file=sys.stderr, flush=True)
    load = os.getloadavg()
    path = write_results("emu_overhead", rows, {"loadavg": load})
    print_table(rows, ["model", "sync_ms", "emu_ms", "emu/sync", "sync_python_calls",
                       "emu_python_calls", "sync_bytecodes", "emu_bytecodes", "modelled_us"])
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; results: {path}")


if __name__ == "__main__":
    main()
