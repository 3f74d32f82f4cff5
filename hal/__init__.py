"""tinyhal.hal: the HAL API (devices, memory, command buffers, semaphores, executables)."""

from __future__ import annotations

from typing import Any

from ..errors import Error, StatusCode
from .allocator import Allocator, AllocatorStatistics, Heap, HeapStatistics
from .buffer import ALIGNMENT, Buffer
from .buffer_view import BufferView
from .command_buffer import CommandBuffer, CommandBufferMode
from .device import Device
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

_DRIVER_ALIASES = {"local-sync": "sync", "local-task": "task", "local-emu": "emu"}


def available_drivers() -> list[str]:
    """Driver names `create_device` accepts."""
    from . import drivers

    return drivers.names()


def create_device(driver: str = "task", **options: Any) -> Device:
    """Creates a device of the named driver (`sync`, `task`, `emu`; `local-*` aliases)."""
    from . import drivers

    return drivers.create(_DRIVER_ALIASES.get(driver, driver), **options)


def __getattr__(name: str) -> Any:
    # C kernels are built by host apps, never by a module run: `kernels` (which brings in
    # the compiler driver's helpers, tempfile and cffi's builder) loads on first use.
    if name in ("KernelExport", "build_executable"):
        from . import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ALIGNMENT", "Allocator", "AllocatorStatistics", "Buffer", "BufferUsage", "BufferView",
    "CommandBuffer", "CommandBufferMode", "Device", "ElementType", "EncodingType", "Error",
    "EXECUTABLE_POLICIES", "Executable", "ExecutableLoader", "ExportInfo", "FORMATS", "Fence",
    "Heap", "HeapStatistics", "KernelExport", "MemoryAccess", "MemoryType", "Semaphore",
    "SemaphoreList", "StatusCode", "WHOLE_BUFFER", "available_drivers", "build_executable", "create_device",
    "executable_formats", "register_executable_loader",
]
