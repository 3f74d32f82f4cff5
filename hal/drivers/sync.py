"""The `sync` driver: work runs inline on the thread that makes it ready.

A submission whose waits are already reached runs on the submitting thread before
`submit` returns; one that waits runs on whichever thread signals its last wait. There are
no threads of its own, which makes it the embedded-systems path and the reference for the
other drivers.
"""

from __future__ import annotations

from ..device import Device


class SyncDevice(Device):
    driver_name = "sync"
    identifier = "local-sync"
