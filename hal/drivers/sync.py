"""The `sync` driver: work runs inline on the thread that makes it ready.

A submission whose waits are already reached runs on the submitting thread before
`submit` returns; one that waits runs on whichever thread signals its last wait. There are
no threads of its own, which makes it the embedded-systems path and the reference for the
other drivers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import as_error
from ..device import Device
from ..queue import Completion, Driver, run_capturing
from ..semaphore import SemaphorePoint
from ..stream import lead


class SyncDriver(Driver):
    name = "sync"
    identifier = "local-sync"
    completes_inline = True

    def perform(self, operation: str, payload: Any, done: Completion, submission_id: int,
                wait: Sequence[SemaphorePoint], signal: Sequence[SemaphorePoint],
                queue: int) -> None:
        if operation == "execute":
            try:
                lead(payload)
            except BaseException as exc:  # noqa: BLE001 - becomes the submission's error
                done(as_error(exc))
                return
            done(None)
        elif operation == "call":
            done(run_capturing(payload))
        else:
            payload(done)


class SyncDevice(Device):
    """A device run by the `sync` driver."""

    def __init__(self, **options: Any) -> None:
        super().__init__(SyncDriver(), **options)
