"""Drivers: each is one module holding its driver (`tinyhal.hal.queue.Driver`), the
`Device` class built on it, and `DRIVER`, the `DriverInfo` that registers it.

A driver implements the protocol `tinyhal.hal.queue` documents: one method per queue
operation (execute, fill, update, copy, host call, alloca, dealloca, barrier), its
capabilities, and the host hooks (queue affinity, alloca check, direct host reads and
writes); the device holds it (`Device.driver`) and its `WorkQueue` calls it. The device
class of each module (`SyncDevice`, `TaskDevice`, `EmuDevice`) only builds its driver
and adds public extras (`TaskDevice.executor`, `EmuDevice.trace()`, ...); no driver
overrides or reads anything of the device or the queue beyond the protocol.

The built-in drivers are imported on first use; `register` adds one at run time (a
host app's, or a test's), and so does naming its module in the environment variable
`TINYHAL_DRIVER_MODULES` (comma-separated importable modules, each defining `DRIVER`),
which reaches fresh processes too (`tinyhal-run --device=NAME`, `tinyhal-serve`, a
test's child process). `sync` performs everything inline on the thread that readies
the work; `task` leads a command stream on the thread that readies it with native helper
threads joining its dispatches (a `tinyhal.scheduler.Executor` worker leads on what
outlasts a budget, and runs host work); `emu` gives submissions and host work to a
command-processor thread per queue that feeds DMA-engine and compute-unit worker
threads, on a modelled clock (see `docs/emu.md`), and checks its modelled memory before
each alloca.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...errors import InvalidArgumentError, UnimplementedError

_BUILT_IN = {"sync": "sync", "task": "task", "emu": "emu"}  # name -> module of this package
_ALIASES = {"local-sync": "sync", "local-task": "task", "local-emu": "emu"}  # IREE's ids
_registered: dict[str, DriverInfo] = {}


class DriverInfo(NamedTuple):
    """How `tinyhal.hal.create_device` finds a driver: its `name`, `create(**options)`
    (its device class), and what a device URI (`NAME://PATH?QUERY`, as
    `--device=emu://edge-npu?queues=2`) means to it: `uri_options(rest)` turns the part
    after `://` into options (None: the driver takes none, and ignores it, as IREE's
    local drivers ignore a device path), `device_uris` what `--list_devices` shows."""

    name: str
    create: Callable[..., Any]
    uri_options: Callable[[str], dict[str, Any]] | None = None
    device_uris: Sequence[str] = ()


def register(info: DriverInfo) -> None:
    """Makes `info.name` a driver `create_device` accepts (replacing one of that name)."""
    if not isinstance(info, DriverInfo) or not info.name or "://" in info.name:
        raise InvalidArgumentError(f"register takes a DriverInfo with a plain name, not {info!r}")
    _registered[info.name] = info


def _register_named_modules() -> None:
    """Registers the `DRIVER` of each module `TINYHAL_DRIVER_MODULES` names (once each);
    INVALID_ARGUMENT naming a module that does not import or defines no `DriverInfo`."""
    for module_name in os.environ.get("TINYHAL_DRIVER_MODULES", "").split(","):
        module_name = module_name.strip()
        if not module_name or module_name in _imported_modules:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise InvalidArgumentError(
                f"TINYHAL_DRIVER_MODULES: cannot import {module_name!r}: {exc}") from None
        found = getattr(module, "DRIVER", None)
        if not isinstance(found, DriverInfo):
            raise InvalidArgumentError(
                f"TINYHAL_DRIVER_MODULES: {module_name!r} defines no DRIVER (a DriverInfo)")
        register(found)
        _imported_modules.add(module_name)


_imported_modules: set[str] = set()


def info(name: str) -> DriverInfo:
    """The `DriverInfo` of driver `name`: INVALID_ARGUMENT naming the drivers for an
    unknown name, UNIMPLEMENTED for a built-in one that cannot be imported here."""
    found = _registered.get(name)
    if found is not None:
        return found
    if name not in _BUILT_IN:
        _register_named_modules()
        found = _registered.get(name)
        if found is not None:
            return found
    module_name = _BUILT_IN.get(name)
    if module_name is None:
        raise InvalidArgumentError(f"unknown driver {name!r}; drivers: {', '.join(names())}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        raise UnimplementedError(f"driver {name!r} is not available: {exc}") from None
    return module.DRIVER


def names() -> list[str]:
    """The drivers that can be created here: built-in ones that import, then registered
    ones (with those of `TINYHAL_DRIVER_MODULES`)."""
    _register_named_modules()
    available = []
    for name in _BUILT_IN:
        if name in _registered:
            continue
        try:
            info(name)
        except UnimplementedError:
            continue
        available.append(name)
    return available + list(_registered)


def canonical(name: str) -> str:
    """The driver a name or an IREE device id names (`local-task` -> `task`)."""
    return _ALIASES.get(name, name)


def create(uri: str, **options: Any) -> Any:
    """A device of the driver a name or device URI (`emu://edge-npu?queues=2`) names."""
    name, sep, rest = uri.strip().partition("://")
    found = info(canonical(name))
    if sep and rest and found.uri_options is not None:
        options = {**found.uri_options(rest), **options}
    return found.create(**options)
