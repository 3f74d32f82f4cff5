"""Drivers: each is a `Device` subclass in its own module, imported lazily.

The driver contract. The public `Device` layer validates every call, holds the resource
set of each queue entry until it retires, waits on the entry's wait semaphores, and owns
completion (signalling or failing the signal semaphores, aborting on `close()`). A
driver only runs work whose waits are already reached, through three methods, defined in
this order in every driver module:

- `_execute(ops, done)`: run a submission's resolved operations (`hal.execution`) in
  order, then call `done(error)` exactly once, on any thread (`error` is None on
  success). Operations may overlap only where no barrier separates them.
- `_call(work, done)`: run host work (a `queue_read` / `queue_write` transfer, a
  callable taking no arguments), then call `done(error)` exactly once.
- `_stop(timeout)`: release the driver's threads; `close()` calls it once no work is
  running. Optional (the default does nothing).

Optional capabilities: `concurrency` (workers a dispatch may spread over, default 1),
`queue_count` (queues the `queue=` argument of queue operations may name, default 1; the
device validates it), `_driver_start(method, payload, wait, signal, queue)` (how an entry
calls `_execute` / `_call`: a driver that models queues or dependencies passes them on),
`_create_allocator()` (a driver with its own memory model), `statistics()`,
`completes_inline` (True when `_execute` always calls `done` before it returns, as
`sync`'s does: the device then runs a ready submission without a queue entry). While a
profiling session is attached (`device.profile is not None`) drivers record their own
spans into it (per dispatch and transfer); when it is None that costs one attribute test. Drivers keep
nothing alive for the work's sake: the device's resource sets do that (and a
submission or stream a driver still holds after calling `done` no longer holds buffers). A driver that
lacks `_execute` or `_call` fails such work with UNIMPLEMENTED (the `Device` defaults).

`sync` runs both inline on the thread that readies the work; `task` leads a command
stream on the thread that readies it with native helper threads joining its dispatches
(a `tinyhal.scheduler.Executor` worker leads on what outlasts a budget, and runs host
work); `emu` runs them
on a command-processor thread per queue that feeds DMA-engine and compute-unit worker
threads, on a modelled clock (see `docs/emu.md`).
"""

from __future__ import annotations

import importlib
from typing import Any

from ...errors import InvalidArgumentError

_DRIVERS = {
    "sync": ("sync", "SyncDevice"),
    "task": ("task", "TaskDevice"),
    "emu": ("emu", "EmuDevice"),
}


def names() -> list[str]:
    available = []
    for name, (module, _) in _DRIVERS.items():
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ImportError:
            continue
        available.append(name)
    return available


def create(name: str, **options: Any) -> Any:
    try:
        module_name, class_name = _DRIVERS[name]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown driver {name!r}; drivers: {', '.join(_DRIVERS)}"
        ) from None
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        from ...errors import UnimplementedError

        raise UnimplementedError(f"driver {name!r} is not available: {exc}") from None
    return getattr(module, class_name)(**options)
