"""tinyhal.hal: the HAL API (devices, memory, command buffers, semaphores, executables)."""

from __future__ import annotations

from typing import Any

from ..errors import Error, InvalidArgumentError, StatusCode
from . import drivers
from .allocator import Allocator, AllocatorStatistics, Heap, HeapStatistics
from .buffer import ALIGNMENT, Buffer
from .buffer_view import BufferView
from .command_buffer import CommandBuffer, CommandBufferMode
from .device import Device
from .drivers import DriverInfo
from .executable import (
    EXECUTABLE_POLICIES,
    FORMATS,
    Executable,
    ExecutableLoader,
    ExportInfo,
    executable_formats,
    register_executable_loader,
)
from .semaphore import Fence, Semaphore, SemaphoreList
from .types import (
    WHOLE_BUFFER,
    BufferUsage,
    ElementType,
    EncodingType,
    MemoryAccess,
    MemoryType,
)


def available_drivers() -> list[str]:
    """Driver names `create_device` accepts."""
    return drivers.names()


def create_device(driver: str = "task", **options: Any) -> Device:
    """Creates a device of the named driver (`sync`, `task`, `emu`, a registered one;
    `local-*` aliases), or of a device URI (`emu://edge-npu?queues=2`): the driver reads
    the part after `://` (`DriverInfo.uri_options`), `options` override it."""
    if not isinstance(driver, str):
        raise InvalidArgumentError(f"create_device takes a driver name, not {driver!r}")
    return drivers.create(driver, **options)


def register_driver(info: DriverInfo) -> None:
    """Registers a driver (one module: its `hal.queue.Driver`, its device class and this
    `DriverInfo`) so `create_device(info.name)` and every driver list accept it."""
    drivers.register(info)


def driver_options(driver: str) -> frozenset[str]:
    """The options `create_device(driver, ...)` takes by name (its device class's
    keyword parameters), so a caller can pass a driver only the options it has."""
    import inspect

    parameters = inspect.signature(drivers.info(drivers.canonical(driver)).create).parameters
    return frozenset(name for name, p in parameters.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def device_uris(driver: str) -> list[str]:
    """The device URIs of `driver` that `--list_devices` shows (`emu://edge-npu`, ...)."""
    return list(drivers.info(drivers.canonical(driver)).device_uris)


def __getattr__(name: str) -> Any:
    # C kernels are built by host apps, never by a module run: `kernels` (which brings in
    # the compiler driver's helpers, tempfile and cffi's builder) loads on first use.
    if name in ("KernelExport", "build_executable"):
        from . import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALIGNMENT", "Allocator", "AllocatorStatistics", "Buffer", "BufferUsage", "BufferView",
    "CommandBuffer", "CommandBufferMode", "Device", "DriverInfo", "ElementType", "EncodingType",
    "Error",
    "EXECUTABLE_POLICIES", "Executable", "ExecutableLoader", "ExportInfo", "FORMATS", "Fence",
    "Heap", "HeapStatistics", "KernelExport", "MemoryAccess", "MemoryType", "Semaphore",
    "SemaphoreList", "StatusCode", "WHOLE_BUFFER", "available_drivers", "build_executable",
    "create_device", "device_uris", "driver_options", "executable_formats", "register_driver",
    "register_executable_loader",
]
