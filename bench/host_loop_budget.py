"""Where a model's host code spends one sync invocation, import by import.

For a model of `zoo_vs_iree.models()` loaded on tinyhal `sync`, this reports per `hal`
import and per recording-block site (`_blk<n>`): calls per invocation, the median wall
nanoseconds of one call (each import wrapped in a timer; the wrapper's own cost, measured
on an empty function, taken off), and the Python frames and bytecode instructions one
invocation executes under each (counted by a trace of one call: deterministic). What is
left is the VM function's own code. A recurrent model's per-step budget is its rows
divided by its steps.

    python bench/host_loop_budget.py [--model gru] [--calls 2000]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from zoo_vs_iree import models  # noqa: E402

import tinyhal  # noqa: E402
from tinyhal.vm import codegen  # noqa: E402


def _timed(times: list[int], fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` timed into `times` (each row's list: the trace below tells rows by it)."""
    clock = time.perf_counter_ns

    def timed(*args: Any) -> Any:
        start = clock()
        result = fn(*args)
        times.append(clock() - start)
        return result

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gru")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    make_vmfb, function, make_inputs = models()[args.model]

    times: dict[str, list[int]] = collections.defaultdict(list)
    instantiate = codegen.instantiate
    names: list[str] = []  # the import names of the module being instantiated

    def instantiate_timed(program: Any, linkage: Any) -> Any:
        linkage.imports = [_timed(times[names[k]], fn)
                           for k, fn in enumerate(linkage.imports)]
        linkage.record_sites = [_timed(times[f"_blk{n}"], fn)
                                for n, fn in enumerate(linkage.record_sites)]
        return instantiate(program, linkage)

    from tinyhal.vm import context

    instantiate_module = context.Context._instantiate

    def instantiate_named(self: Any, module: Any) -> Any:
        names[:] = [imp.full_name for imp in module.imports]
        return instantiate_module(self, module)

    codegen.instantiate = instantiate_timed
    context.Context._instantiate = instantiate_named
    try:
        module = tinyhal.load(make_vmfb(), device="sync")
    finally:
        codegen.instantiate = instantiate
        context.Context._instantiate = instantiate_module
    fn, inputs = getattr(module, function), make_inputs()
    for _ in range(200):
        fn(*inputs)
    for samples in times.values():
        samples.clear()
    for _ in range(args.calls):
        fn(*inputs)
    empty: list[int] = []
    nothing = _timed(empty, lambda *a: None)
    for _ in range(20000):
        nothing(1, 2, 3)
    wrapper = statistics.median(empty)

    # frames and bytecodes under each row, from a trace of one call
    rest = "(VM code, marshalling)"
    frames: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[str] = collections.Counter()
    stack: list[str] = []
    row_of = {id(samples): name for name, samples in times.items()}

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is nothing.__code__:
            stack.append(row_of.get(id(frame.f_locals["times"]), "?"))

            def leave(frame: Any, event: str, arg: Any) -> Any:
                if event == "return":
                    stack.pop()
                return leave
            return leave
        row = stack[-1] if stack else rest
        frames[row] += 1
        frame.f_trace_opcodes = True

        def count(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                codes[row] += 1
            return count
        return count

    sys.settrace(trace)
    try:
        fn(*inputs)
    finally:
        sys.settrace(None)

    print(f"{'row':36} {'calls':>6} {'ns/call':>8} {'us/inv':>7} {'frames':>7} "
          f"{'bytecodes':>9}")
    rows = [(name, samples) for name, samples in times.items() if samples]
    rows.sort(key=lambda row: -statistics.median(row[1]) * len(row[1]))
    for name, samples in rows:
        per = len(samples) / args.calls
        ns = max(statistics.median(samples) - wrapper, 0)
        print(f"{name:36} {per:6.1f} {ns:8.0f} {ns * per / 1e3:7.1f} {frames[name]:7d} "
              f"{codes[name]:9d}")
    print(f"{rest:36} {'':6} {'':8} {'':7} {frames[rest]:7d} {codes[rest]:9d}")
    load = os.getloadavg()
    print(f"wrapper {wrapper:.0f} ns taken off; load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}")


if __name__ == "__main__":
    main()
