"""CPU cost of building the HAL's hot objects, ns per object, each the way a call makes it:
a `Buffer` and a subspan, a `BufferView` (public and through the VM's
`hal.buffer_view.create`), a `Semaphore`, a `Fence` (public, `single`, `pending`, `join`),
and a ready `queue_alloca` + `queue_dealloca` pair on `sync`.

Process CPU time (not wall time) over `--count` calls, median of `--repeat` runs, so a
loaded machine adds little noise; for an A/B, alternate runs of two trees.

    python bench/hot_objects.py [--count 200000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import print_table, write_results  # noqa: E402

from tinyhal.hal import Buffer, BufferView, Fence, Semaphore, create_device  # noqa: E402
from tinyhal.vm.hal_module import buffer_view_create  # noqa: E402

F32 = 0x21000020


def cpu_ns_per_call(fn: Callable[[], object], count: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.process_time_ns()
        for _ in range(count):
            fn()
        runs.append((time.process_time_ns() - start) / count)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    device = create_device("sync")
    allocator = device.allocator
    buffer = allocator.allocate(4096)
    storage, mt, usage = buffer.storage, buffer.memory_type_bits, buffer.usage_bits
    sem = Semaphore()
    one, two = Fence.pending(), Fence.pending()
    shape = [(16,), (16,)]

    def alloca_dealloca() -> None:
        device.queue_dealloca(device.queue_alloca(256))

    cases: dict[str, Callable[[], object]] = {
        "Buffer(...)": lambda: Buffer(allocator, storage, 0, 4096, mt, usage),
        "buffer.subspan": lambda: buffer.subspan(64, 1024),
        "BufferView(...)": lambda: BufferView(buffer, (16, 16), F32),
        "hal.buffer_view.create": lambda: buffer_view_create(None, buffer, 0, 4096, F32, 1,
                                                             shape),
        "Semaphore()": Semaphore,
        "Fence([(s, v)])": lambda: Fence([(sem, 1)]),
        "Fence.single": lambda: Fence.single(sem, 1),
        "Fence.pending": Fence.pending,
        "Fence.join": lambda: Fence.join([one, two]),
        "queue_alloca+dealloca": alloca_dealloca,
    }
    rows = []
    for name, fn in cases.items():
        count = args.count // 10 if name.startswith("queue") else args.count
        rows.append({"object": name,
                     "cpu_ns": round(cpu_ns_per_call(fn, count, args.repeat), 1)})
    device.close()
    print_table(rows, ["object", "cpu_ns"])
    write_results("hot_objects", rows, {"count": args.count, "repeat": args.repeat})


if __name__ == "__main__":
    main()
