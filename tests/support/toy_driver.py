"""A driver in one file, built only on the public driver protocol (`tinyhal.hal.queue`):
the whole of what adding a driver takes. It runs every queue operation on one thread of
its own, in the order the operations became ready, like a device with one in-order
queue and its own command processor; memory is host-visible (it uses the default
allocator), so it has no direct host transfers (`read_direct` / `write_direct` None).

`DRIVER` registers it: `tinyhal.hal.register_driver(DRIVER)` in a process, or
`TINYHAL_DRIVER_MODULES=support.toy_driver` for every process started with it, so
`TINYHAL_DRIVER_MODULES=support.toy_driver TINYHAL_TEST_DRIVERS=toy pytest tests/hal`
runs the HAL conformance suite on it."""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tinyhal import hal
from tinyhal.hal.execution import Submission
from tinyhal.hal.queue import (
    Capabilities,
    Completion,
    Driver,
    run_capturing,
    run_device_work,
)
from tinyhal.hal.semaphore import SemaphorePoint
from tinyhal.hal.stream import lead

NAME = "toy"


class ToyDriver(Driver):
    name = NAME
    identifier = "local-toy"
    capabilities = Capabilities()
    create_allocator = Driver.create_allocator
    attach = Driver.attach

    def __init__(self) -> None:
        self.ready: queue_module.SimpleQueue[Callable[[], None] | None] = (
            queue_module.SimpleQueue())
        self.thread = threading.Thread(target=self._run, name="toy-driver", daemon=True)
        self.thread.start()

    def execute(self, payload: Submission, done: Completion, submission_id: int,
                wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                queue: int) -> None:
        self.ready.put(lambda: done(run_capturing(lambda: lead(payload))))

    fill = update = copy = execute

    def host_call(self, payload: Callable[[], None], done: Completion, submission_id: int,
                  wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                  queue: int) -> None:
        self.ready.put(lambda: done(run_capturing(payload)))

    def alloca(self, payload: Callable[[Completion], None], done: Completion,
               submission_id: int, wait: Sequence[SemaphorePoint],
               signal: Sequence[SemaphorePoint], queue: int) -> None:
        self.ready.put(lambda: payload(done))  # places its block now or when there is room

    dealloca = barrier = run_device_work
    queue_for_affinity = Driver.queue_for_affinity
    check_alloca = read_direct = write_direct = None

    def stop(self, timeout: float | None) -> None:
        self.ready.put(None)
        self.thread.join(timeout)

    def _run(self) -> None:
        while (work := self.ready.get()) is not None:
            work()
            work = None  # holds nothing of the operation while it waits for the next


class ToyDevice(hal.Device):
    """A device run by the toy driver."""

    def __init__(self, **options: Any) -> None:
        super().__init__(ToyDriver(), **options)


DRIVER = hal.DriverInfo(NAME, ToyDevice)
