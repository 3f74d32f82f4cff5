"""Fault injection for the `emu` driver: which operation fails, and with what.

A fault is armed with a kind, a count of matching operations to let pass, an error and
optionally an export and a queue; the operation that fires it fails its submission, and a
"device_loss" fault also loses the device (the caller does that: `check` says so). While
any fault is armed the device runs operations one at a time so each can be matched;
`armed` is what it tests.
"""

from __future__ import annotations

import threading
from typing import Any

from ...errors import DeviceLostError, Error, InternalError, InvalidArgumentError

FAULT_KINDS = ("fill", "update", "copy", "transfer", "dispatch", "any", "device_loss")


class Faults:
    """The armed faults of one device, fired in the order they were armed."""

    __slots__ = ("queue_count", "armed", "lock", "pending")

    def __init__(self, queue_count: int) -> None:
        self.queue_count = queue_count
        self.armed = False  # any fault pending: read without the lock on the fast path
        self.lock = threading.Lock()
        self.pending: list[list[Any]] = []  # [kind, after, error, export, queue]

    def inject(self, kind: str, after: int, error: Error | None, export: str | None,
               queue: int | None) -> None:
        """Arms a fault (see `EmuDevice.inject_fault`), validating its arguments."""
        if kind not in FAULT_KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}; kinds: {FAULT_KINDS}")
        if not isinstance(after, int) or after < 0:
            raise InvalidArgumentError(f"fault `after` must be an int >= 0, not {after!r}")
        if queue is not None and not (isinstance(queue, int) and 0 <= queue < self.queue_count):
            raise InvalidArgumentError(f"fault queue {queue!r} out of range")
        if error is None:
            error = (DeviceLostError("emulated device lost (injected fault)")
                     if kind == "device_loss" else InternalError(f"injected fault in emulated {kind}"))
        with self.lock:
            self.pending.append([kind, after, error, export, queue])
            self.armed = True

    def check(self, kind: str, export: str | None, queue: int) -> tuple[Error | None, bool]:
        """Counts an operation of `kind` (of `export`, on `queue`) against the armed
        faults: (the error it fails with or None, whether that loses the device)."""
        fired = None
        with self.lock:
            for fault in self.pending:
                fkind, _after, _error, fexport, fqueue = fault
                if fkind == "transfer":
                    match = kind != "dispatch"
                else:
                    match = fkind in (kind, "any", "device_loss")
                if not match or (fexport is not None and fexport != export) or (
                        fqueue is not None and fqueue != queue):
                    continue
                if fault[1] == 0:
                    self.pending.remove(fault)
                    self.armed = bool(self.pending)
                    fired = fault
                    break
                fault[1] -= 1
        if fired is None:
            return None, False
        return fired[2], fired[0] == "device_loss"


__all__ = ["FAULT_KINDS", "Faults"]
