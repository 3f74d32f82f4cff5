"""Buffers: 64-byte-aligned device memory with subspans and zero-copy host mapping.

A `Buffer` is a window (`byte_offset`, `byte_length`) onto a `Storage` block. Subspans
share the block, so a mapping or a kernel binding of any of them addresses the same bytes.
The block returns its bytes to the allocator's statistics when the last buffer over it is
gone (CPython frees promptly, so the live/peak figures are exact) or when it is released
explicitly (transient buffers, `queue_dealloca`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FailedPreconditionError, OutOfRangeError, PermissionDeniedError
from .types import WHOLE_BUFFER, BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    from .allocator import Allocator

ALIGNMENT = 64
"""Every buffer's base address is a multiple of this: IREE kernels use aligned vector loads."""


class Storage:
    """One aligned block of host memory backing one or more buffers."""

    __slots__ = ("array", "address", "byte_length", "released", "_on_release", "__weakref__")

    def __init__(
        self,
        byte_length: int,
        on_release: Callable[[int], None] | None = None,
        array: np.ndarray | None = None,
    ) -> None:
        if array is None:
            raw = np.zeros(byte_length + ALIGNMENT, dtype=np.uint8)
            start = (-raw.ctypes.data) % ALIGNMENT
            array = raw[start : start + byte_length]
            address = raw.ctypes.data + start  # also right for empty buffers
        else:
            address = array.ctypes.data
        self.array: np.ndarray = array
        self.address: int = address
        self.byte_length = byte_length
        self.released = False
        self._on_release = on_release
        if on_release is not None:
            weakref.finalize(self, on_release, byte_length)

    def release(self) -> None:
        """Marks the block dead now (use-after-release is then rejected)."""
        if not self.released:
            self.released = True


class Buffer:
    """A range of device memory with a memory type, allowed usage and allowed access."""

    __slots__ = (
        "allocator",
        "memory_type",
        "allowed_usage",
        "allowed_access",
        "storage",
        "byte_offset",
        "byte_length",
        "__weakref__",
    )

    def __init__(
        self,
        allocator: Allocator | None,
        storage: Storage,
        byte_offset: int,
        byte_length: int,
        memory_type: MemoryType,
        allowed_usage: BufferUsage,
        allowed_access: MemoryAccess = MemoryAccess.ALL,
    ) -> None:
        self.allocator = allocator
        self.storage = storage
        self.byte_offset = byte_offset
        self.byte_length = byte_length
        self.memory_type = MemoryType(memory_type)
        self.allowed_usage = BufferUsage(allowed_usage)
        self.allowed_access = MemoryAccess(allowed_access)

    def __repr__(self) -> str:
        return (
            f"<Buffer {self.byte_length} bytes at +{self.byte_offset} "
            f"{self.memory_type!r} {self.allowed_usage!r}>"
        )

    @property
    def address(self) -> int:
        """Host address of the first byte (only meaningful on host-visible memory)."""
        return self.storage.address + self.byte_offset

    @property
    def mappable(self) -> bool:
        """Whether `map()` is allowed: host-visible memory with a MAPPING usage bit."""
        return bool(self.memory_type & MemoryType.HOST_VISIBLE) and bool(
            self.allowed_usage & (BufferUsage.MAPPING_SCOPED | BufferUsage.MAPPING_PERSISTENT))

    def check_live(self) -> None:
        if self.storage.released:
            raise FailedPreconditionError(f"{self!r} was deallocated; it may not be used")

    def resolve_range(self, offset: int, length: int, what: str = "range") -> tuple[int, int]:
        """Validates [offset, offset+length) against this buffer; resolves WHOLE_BUFFER."""
        if offset < 0 or offset > self.byte_length:
            raise OutOfRangeError(
                f"{what} offset {offset} is outside the buffer of {self.byte_length} bytes"
            )
        if length == WHOLE_BUFFER:
            length = self.byte_length - offset
        if length < 0 or offset + length > self.byte_length:
            raise OutOfRangeError(
                f"{what} [{offset}, {offset + length}) overruns the buffer of "
                f"{self.byte_length} bytes"
            )
        return offset, length

    def validate_usage(self, required: BufferUsage, what: str) -> None:
        if (self.allowed_usage & required) != required:
            raise PermissionDeniedError(
                f"{what} needs buffer usage {BufferUsage(required)!r} but {self!r} allows "
                f"only {self.allowed_usage!r}"
            )

    def subspan(self, offset: int, length: int = WHOLE_BUFFER) -> Buffer:
        """A buffer over [offset, offset+length) of this one, sharing its memory."""
        offset, length = self.resolve_range(offset, length, "subspan")
        return Buffer(
            self.allocator,
            self.storage,
            self.byte_offset + offset,
            length,
            self.memory_type,
            self.allowed_usage,
            self.allowed_access,
        )

    def map(
        self,
        access: MemoryAccess = MemoryAccess.ALL,
        offset: int = 0,
        length: int = WHOLE_BUFFER,
    ) -> memoryview:
        """Maps [offset, offset+length) into host memory, zero-copy.

        The result is a byte `memoryview` (writable unless `access` lacks WRITE); use it as a
        context manager to release it. Needs HOST_VISIBLE memory and a MAPPING usage bit.
        """
        self.check_live()
        if not self.memory_type & MemoryType.HOST_VISIBLE:
            raise PermissionDeniedError(
                f"{self!r} is not host-visible memory and cannot be mapped"
            )
        if not self.allowed_usage & (BufferUsage.MAPPING_SCOPED | BufferUsage.MAPPING_PERSISTENT):
            raise PermissionDeniedError(
                f"{self!r} was allocated without MAPPING usage and cannot be mapped"
            )
        access = MemoryAccess(access)
        if (access & MemoryAccess.ALL) & ~self.allowed_access & MemoryAccess.ALL:
            raise PermissionDeniedError(
                f"mapping access {access!r} exceeds the buffer's allowed {self.allowed_access!r}"
            )
        offset, length = self.resolve_range(offset, length, "mapping")
        start = self.byte_offset + offset
        view = memoryview(self.storage.array[start : start + length])
        if not access & MemoryAccess.WRITE:
            view = view.toreadonly()
        return view

    def host_bytes(self) -> np.ndarray:
        """The buffer's bytes as a uint8 numpy view, bypassing mapping checks (HAL-internal)."""
        return self.storage.array[self.byte_offset : self.byte_offset + self.byte_length]

