"""Buffers: 64-byte-aligned device memory with subspans and zero-copy host mapping.

A `Buffer` is a window (`byte_offset`, `byte_length`) onto a `Storage` block. Subspans
share the block, so a mapping or a kernel binding of any of them addresses the same bytes.
The block returns its bytes to the allocator's statistics when the last buffer over it is
gone (CPython frees promptly, so the live/peak figures are exact) or when it is released
explicitly (transient buffers, `queue_dealloca`).
"""

from __future__ import annotations

import gc
import mmap
from collections.abc import Callable
from sys import getrefcount
from typing import TYPE_CHECKING, Any

from ..errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfRangeError,
    PermissionDeniedError,
)
from .native import core as _core
from .native import ffi
from .types import WHOLE_BUFFER, BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    pass

ALIGNMENT = 64
"""Every buffer's base address is a multiple of this: IREE kernels use aligned vector loads."""


_cast = ffi.cast
_from_buffer = ffi.from_buffer
_memmove = ffi.memmove


def host_block(byte_length: int) -> tuple[memoryview, int]:
    """A new zero-filled block of `byte_length` host bytes, aligned to `ALIGNMENT`: a
    writable unsigned-byte memoryview of it and its address. Plain Python memory (a
    bytearray: the C heap, whose freed blocks the next allocation reuses), so the HAL
    needs no numpy (whose import alone is ~60 ms and 15 MiB) to hold bytes."""
    raw = bytearray(byte_length + ALIGNMENT)
    base = int(_cast("uintptr_t", _from_buffer(raw)))
    start = (-base) % ALIGNMENT
    return memoryview(raw)[start : start + byte_length], base + start


def mapped_block(byte_length: int, filled: bool = False) -> tuple[memoryview, int]:
    """Like `host_block`, for a large block made once and kept (the transient ring, a
    module file's bytes): an anonymous memory map, whose zero pages cost nothing until
    first written, so a ring of 256 MiB of which a program uses 1 MiB costs 1 MiB. Not
    for blocks made per call: each map and its first touches are system calls and page
    faults where the heap would reuse memory. `filled`: the caller writes all of it at
    once (a file read into it), so it asks for huge pages where the kernel has them:
    2 MiB pages fault 512 times less often (a 14 MiB module reads in half the time)."""
    raw = mmap.mmap(-1, max(byte_length, 1),  # page-aligned; private: no shared memory file
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if filled and byte_length >= 1 << 21 and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            raw.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: small pages, as asked
            pass
    return memoryview(raw)[:byte_length], int(_cast("uintptr_t", _from_buffer(raw)))


def as_byte_view(data: Any) -> memoryview:
    """`data` (any buffer-protocol object: bytes, bytearray, memoryview, a numpy array)
    as a flat unsigned-byte memoryview over the same memory; INVALID_ARGUMENT when it is
    not C-contiguous or not a buffer."""
    try:
        view = memoryview(data)
    except TypeError:
        raise InvalidArgumentError(
            f"expected a file, path or bytes-like host memory, not {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise InvalidArgumentError("host memory must be C-contiguous")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


_referents = gc.get_referents


def views_of_block(array: memoryview) -> int:
    """How many memoryviews share `array`'s memory, `array` included: every slice or
    mapping of it, and every numpy array made over it, is a memoryview registered with
    the same managed buffer, which counts them (they hold no reference to each other)."""
    return getrefcount(_referents(array)[0]) - 1


class Storage(_core.StorageCore):
    """One aligned block of host memory backing one or more buffers. `array` is the
    block as a flat unsigned-byte `memoryview` (numpy views of it are made where numpy
    is used, zero-copy); `address`, when given with `array`, is taken as its address
    instead of reading it. A new block is zero-filled, or holds a copy of the first
    `byte_length` bytes of `initial` (any C-contiguous buffer-protocol object).
    `on_release` is for `CountedStorage`. `release()` marks the block dead now (use
    after release is then refused).

    Its fields live in the C base (`hal/native/core.c`), which `RingStorage` (a transient
    buffer's storage) extends. It has no finalizer, so a storage nobody counts
    (transient, imported) dies without running Python code."""

    __slots__ = ()

    def __init__(
        self,
        byte_length: int,
        on_release: Callable[[int], None] | None = None,
        array: memoryview | None = None,
        address: int | None = None,
        initial: Any = None,
    ) -> None:
        if array is None:
            array, address = host_block(byte_length)
            if initial is not None:
                _memmove(array, initial, byte_length)
        elif address is None:
            address = int(_cast("uintptr_t", _from_buffer(array)))
        self.array: memoryview = array
        self.address: int = address
        self.byte_length = byte_length
        self.released = False
        if on_release is not None and type(self) is Storage:
            raise InvalidArgumentError("on_release is called only for a CountedStorage")
        self._on_release = on_release


class CountedStorage(Storage):
    """A storage whose bytes an allocator counts: `on_release(byte_length)` runs when it
    dies (CPython frees promptly, so live and peak statistics stay exact)."""

    __slots__ = ()

    def __del__(self) -> None:
        on_release = self._on_release
        if on_release is not None:
            self._on_release = None
            try:
                on_release(self.byte_length)
            except Exception:  # noqa: BLE001 - interpreter shutdown; nothing to report to
                pass


_HOST_VISIBLE = int(MemoryType.HOST_VISIBLE)
_MAPPING = int(BufferUsage.MAPPING_SCOPED | BufferUsage.MAPPING_PERSISTENT)
ACCESS_ALL = int(MemoryAccess.ALL)
_WRITE = int(MemoryAccess.WRITE)


class Buffer(_core.BufferCore):
    """A range of device memory with a memory type, allowed usage and allowed access.

    `Buffer(allocator, storage, byte_offset, byte_length, memory_type, allowed_usage,
    allowed_access=MemoryAccess.ALL)`: the window [byte_offset, byte_offset +
    byte_length) of `storage`. Its fields are set once, by that constructor (in the C
    base, `hal/native/core.c`, which the transient ring's ready alloca also builds
    through), and are read-only after. The three bit sets are kept as plain ints
    (`*_bits`) for the checks on hot paths; the properties give them back as IREE-valued
    flags.
    """

    __slots__ = ()

    @property
    def memory_type(self) -> MemoryType:
        return MemoryType(self.memory_type_bits)

    @property
    def allowed_usage(self) -> BufferUsage:
        return BufferUsage(self.usage_bits)

    @property
    def allowed_access(self) -> MemoryAccess:
        return MemoryAccess(self.access_bits)

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
        return bool(self.memory_type_bits & _HOST_VISIBLE) and bool(self.usage_bits & _MAPPING)

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

    def validate_usage(self, required: BufferUsage | int, what: str) -> None:
        required = int(required)
        if (self.usage_bits & required) != required:
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
            self.memory_type_bits,
            self.usage_bits,
            self.access_bits,
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
        if not self.memory_type_bits & _HOST_VISIBLE:
            raise PermissionDeniedError(
                f"{self!r} is not host-visible memory and cannot be mapped"
            )
        if not self.usage_bits & _MAPPING:
            raise PermissionDeniedError(
                f"{self!r} was allocated without MAPPING usage and cannot be mapped"
            )
        access = int(access)
        if access & ACCESS_ALL & ~self.access_bits:
            raise PermissionDeniedError(
                f"mapping access {MemoryAccess(access)!r} exceeds the buffer's allowed "
                f"{self.allowed_access!r}"
            )
        offset, length = self.resolve_range(offset, length, "mapping")
        start = self.byte_offset + offset
        view = memoryview(self.storage.array[start : start + length])
        if not access & _WRITE:
            view = view.toreadonly()
        return view

    def host_bytes(self) -> memoryview:
        """The buffer's bytes as a byte memoryview, bypassing mapping checks (HAL-internal)."""
        return self.storage.array[self.byte_offset : self.byte_offset + self.byte_length]



RingStorage = _core.RingStorage
"""`RingStorage(byte_length)`: the storage of a transient buffer: no memory until its
`queue_alloca` runs, then a block of a transient ring (`hal.ringbuffer`), which sets `ring`
and `block` while the storage holds it. A storage that dies still holding its block hands
it back (`ring.collected(block)`), so a transient buffer dropped without `queue_dealloca`
cannot wedge the ring; one released first costs nothing more when it dies. A
`StorageCore` like `Storage` (C, `hal/native/core.c`)."""


def pending_buffer(allocator: Any, size: int, memory_type_bits: int, usage_bits: int) -> Buffer:
    """A buffer of `size` bytes over a `RingStorage` with no memory yet (address 0),
    which a `queue_alloca` commits when its ring space is granted."""
    return Buffer(allocator, RingStorage(size), 0, size, memory_type_bits, usage_bits)


_core.register(buffer=Buffer)
