"""The `sync` driver: work runs inline on the thread that makes it ready.

A submission whose waits are already reached runs on the submitting thread before
`submit` returns; one that waits runs on whichever thread signals its last wait. There are
no threads of its own, which makes it the embedded-systems path and the reference for the
other drivers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...errors import as_error
from ..device import Device
from ..execution import Submission
from ..queue import Capabilities, Completion, Driver, run_capturing, run_device_work
from ..semaphore import SemaphorePoint
from ..stream import lead
from . import DriverInfo


class SyncDriver(Driver):
    name = "sync"
    identifier = "local-sync"
    capabilities = Capabilities(completes_inline=True)
    create_allocator = Driver.create_allocator
    attach = Driver.attach

    def execute(self, payload: Submission, done: Completion, submission_id: int,
                wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                queue: int) -> None:
        try:
            lead(payload)
        except BaseException as exc:  # noqa: BLE001 - becomes the submission's error
            done(as_error(exc))
            return
        done(None)

    fill = update = copy = execute

    def host_call(self, payload: Callable[[], None], done: Completion, submission_id: int,
                  wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                  queue: int) -> None:
        done(run_capturing(payload))

    alloca = dealloca = barrier = run_device_work
    queue_for_affinity = Driver.queue_for_affinity
    check_alloca = read_direct = write_direct = None
    stop = Driver.stop


class SyncDevice(Device):
    """A device run by the `sync` driver."""

    def __init__(self, **options: Any) -> None:
        super().__init__(SyncDriver(), **options)


DRIVER = DriverInfo("sync", SyncDevice)
