"""What device profiling costs on MobileNetV2: off (no session) and on (all host modes).

Off, every hook site is one `profile is not None` test: one per public queue operation
and one per allocator byte-count change. That cost is bounded deterministically: the
number of hook-site tests one invocation makes (counted from a recorded session: one
per queue event, one per memory event) times the measured cost of one such test,
divided by the invocation's median time. On is measured as wall time, in alternating
rounds with off in the same process, with IREE's runtime (local-task) on the same
module as the reference; wall-clock figures on a shared 2-core machine are noisy.

    python bench/profile_overhead.py [--rounds 8] [--calls 5] [--drivers sync,task,emu]

Writes bench/results/profile_overhead.json and prints a table. Target: off <= 2%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from _common import print_table, write_results  # noqa: E402

import tinyhal  # noqa: E402
from support.models import mobilenet_input, mobilenet_v2_vmfb  # noqa: E402
from tinyhal.hal.profile import Profile  # noqa: E402

MODES = "queue-events,host-execution,memory-events"


def hook_test_ns() -> float:
    """Nanoseconds for one hook-site test (`self.profile is not None` on a plain object)."""

    class Site:
        profile = None

    site = Site()
    number = 2_000_000
    best = min(timeit.repeat("site.profile is not None", globals={"site": site},
                             number=number, repeat=5))
    empty = min(timeit.repeat("site", globals={"site": site}, number=number, repeat=5))
    return max(0.0, best - empty) / number * 1e9


def time_calls(fn, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def iree_reference(vmfb, x, rounds: int, calls: int) -> float | None:
    try:
        import iree.runtime as rt
    except ImportError:
        return None
    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))
    fn = ctx.modules.module["mobilenet_v2"]
    fn(x).to_host()
    return statistics.median(
        t for _ in range(rounds) for t in time_calls(lambda: fn(x).to_host(), calls))


def measure(driver: str, vmfb, x, rounds: int, calls: int, test_ns: float) -> dict:
    module = tinyhal.load(vmfb, device=driver)
    try:
        call = lambda: module.mobilenet_v2(x)  # noqa: E731
        for _ in range(3):
            call()
        counter = Profile(modes=MODES).attach(module.device)
        call()
        counter.detach(module.device)
        # At most one hook-site test per recorded event: the device layer tests once per
        # queue operation and allocator change, the drivers once per submission (sync,
        # task) or per operation (emu), each of which records at least one span.
        tests_per_call = counter.event_count
        off: list[float] = []
        on: list[float] = []
        for _ in range(rounds):
            off += time_calls(call, calls)
            profile = Profile(modes=MODES).attach(module.device)
            on += time_calls(call, calls)
            profile.detach(module.device)
    finally:
        module.close()
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    return {
        "driver": driver,
        "off_ms": off_ms,
        "on_ms": on_ms,
        "on_overhead_pct": (on_ms / off_ms - 1.0) * 100.0,
        "hook_tests_per_call": tests_per_call,
        "off_bound_pct": tests_per_call * test_ns / (off_ms * 1e6) * 100.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--drivers", default="sync,task,emu")
    args = parser.parse_args()
    vmfb, x = mobilenet_v2_vmfb(), mobilenet_input()
    test_ns = hook_test_ns()
    rows = [measure(d, vmfb, x, args.rounds, args.calls, test_ns)
            for d in args.drivers.split(",")]
    iree_ms = iree_reference(vmfb, x, args.rounds, args.calls)
    if iree_ms is not None:
        rows.append({"driver": "IREE local-task", "off_ms": iree_ms * 1e3})
    print(f"one hook-site test: {test_ns:.1f} ns (timeit, minimum of 5)")
    print_table(rows, ["driver", "off_ms", "on_ms", "on_overhead_pct", "hook_tests_per_call",
                       "off_bound_pct"])
    path = write_results("profile_overhead", rows, {
        "hook_test_ns": test_ns, "modes": MODES, "rounds": args.rounds, "calls": args.calls,
        "note": "off_bound_pct is deterministic (count x cost of one test); on/off wall "
                "times are medians of alternating rounds on a shared machine (noisy)",
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
