"""Drivers: each module holds a driver object and the `Device` class built on it.

A driver implements the one operation `tinyhal.hal.queue` documents, `perform` (run one
ready queue operation: execute a submission, run host work, or the queue work of an
alloca, dealloca or barrier, given its submission id, waits, signals and queue), plus
`stop`; the device holds it (`Device.driver`) and its `WorkQueue` calls it. The device
class of each module (`SyncDevice`, `TaskDevice`, `EmuDevice`) only builds its driver
and adds public extras (`TaskDevice.executor`, `EmuDevice.trace()`, ...); no driver
overrides or reads anything private of the device or the queue.

`sync` performs everything inline on the thread that readies the work; `task` leads a
command stream on the thread that readies it with native helper threads joining its
dispatches (a `tinyhal.scheduler.Executor` worker leads on what outlasts a budget, and
runs host work); `emu` gives submissions and host work to a command-processor thread
per queue that feeds DMA-engine and compute-unit worker threads, on a modelled clock
(see `docs/emu.md`), and checks its modelled memory before each alloca.
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
