"""The device allocator: heaps, aligned allocations, host import and exact statistics."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, ResourceExhaustedError
from .buffer import ALIGNMENT, Buffer, CountedStorage, Storage
from .native import core as _core
from .types import BufferUsage, MemoryAccess, MemoryType


def physical_memory() -> int | None:
    """Bytes of memory of this machine; None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


class Heap:
    """A memory heap the allocator can place buffers in. (A plain class with slots:
    defined at every start-up, which a dataclass makes slower, and read per allocation.)"""

    __slots__ = ("name", "memory_type", "allowed_usage", "max_allocation_size",
                 "min_alignment")

    def __init__(self, name: str, memory_type: MemoryType, allowed_usage: BufferUsage,
                 max_allocation_size: int, min_alignment: int = ALIGNMENT) -> None:
        self.name = name
        self.memory_type = memory_type
        self.allowed_usage = allowed_usage
        self.max_allocation_size = max_allocation_size
        self.min_alignment = min_alignment

    def __repr__(self) -> str:
        return f"Heap({self.name!r}, {self.memory_type!r}, {self.max_allocation_size})"


class _Snapshot:
    """Value semantics over `__slots__` (equality, repr) for the statistics records: plain
    classes, which define at start-up much faster than dataclasses."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"


class HeapStatistics(_Snapshot):
    """A snapshot of one heap's byte counts."""

    __slots__ = ("live_bytes", "peak_bytes", "allocated_bytes", "freed_bytes",
                 "allocation_count")

    def __init__(self, live_bytes: int, peak_bytes: int, allocated_bytes: int,
                 freed_bytes: int, allocation_count: int) -> None:
        self.live_bytes = live_bytes
        self.peak_bytes = peak_bytes
        self.allocated_bytes = allocated_bytes
        self.freed_bytes = freed_bytes
        self.allocation_count = allocation_count


class AllocatorStatistics(_Snapshot):
    """A snapshot of every heap plus device-wide live and peak bytes."""

    __slots__ = ("heaps", "live_bytes", "peak_bytes")

    def __init__(self, heaps: dict[str, HeapStatistics], live_bytes: int,
                 peak_bytes: int) -> None:
        self.heaps = heaps
        self.live_bytes = live_bytes
        self.peak_bytes = peak_bytes

    def __getitem__(self, heap: str) -> HeapStatistics:
        return self.heaps[heap]


HeapCounter = _core.HeapCounter
"""The bytes of one heap, or of all of them (`Allocator.total`): live, peak, allocated,
freed, and the count of allocations. Changed only under `Allocator.lock`. In C
(`hal/native/core.c`), so the transient ring counts without Python frames."""


_ALL_USAGE = BufferUsage(0x1FFFFFFF)
_HOST_HEAP_USAGE = int(
    BufferUsage.MAPPING_SCOPED
    | BufferUsage.MAPPING_PERSISTENT
    | BufferUsage.MAPPING_ACCESS_RANDOM
    | BufferUsage.TRANSFER
)


class Allocator:
    """Allocates 64-byte-aligned buffers from a device's heaps and counts every byte.

    Statistics are per allocator (that is, per device), exact on every driver: a buffer's
    bytes are live from `allocate` until its memory is freed. Other memory sources (the
    transient ringbuffer) count through `track`, or their `HeapCounter` under `lock`, so
    one snapshot covers the device.

    `device_memory` counts the heaps named in `device_memory_heaps` together (live and
    peak of their sum): the memory of a device that has its own (emu: its device heap
    and the transient ring), which a capacity bounds; no heaps on the drivers whose
    device memory is host memory. A memory source counting a heap directly adds to it
    too when the heap is one of them (`device_memory_of`).
    """

    device_memory_heaps: frozenset[str] = frozenset()

    def __init__(self, device_name: str, heaps: list[Heap] | None = None) -> None:
        self.device_name = device_name
        self.device_ref: Callable[[], Any] = lambda: None
        limit = 1 << 40
        self.heaps: list[Heap] = heaps or [
            Heap(
                "device",
                MemoryType.OPTIMAL
                | MemoryType.DEVICE_LOCAL
                | MemoryType.HOST_VISIBLE
                | MemoryType.HOST_COHERENT,
                _ALL_USAGE,
                limit,
            ),
            Heap("host", MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE, _ALL_USAGE, limit),
        ]
        # Re-entrant: a garbage collection inside a locked section (an allocation there)
        # may free a buffer, whose storage reports its bytes back through `track`.
        # Public so a memory source counting through the allocator (the transient ring)
        # can keep its own state under the same lock and update `HeapCounter`s directly.
        self.lock = self._lock = threading.RLock()
        self.device_memory = HeapCounter()  # of the `device_memory_heaps` together
        self._counters: dict[str, HeapCounter] = {h.name: HeapCounter() for h in self.heaps}
        self._releasers = {h.name: self._releaser(h.name) for h in self.heaps}
        self._heap_bits = {h.name: int(h.memory_type) for h in self.heaps}
        # The heaps are fixed: per-request answers are cached (memory type -> heap,
        # (memory type, usage) -> coerced usage) so hot paths skip the search.
        self._heap_for: dict[int, Heap] = {}
        self._coerced: dict[tuple[int, int], int] = {}
        self.total = HeapCounter()  # live and peak bytes of every heap together
        self.profile: Any = None  # a hal.profile.Profile while one records (Profile.attach)

    def __repr__(self) -> str:
        return f"<Allocator of {self.device_name}>"

    def select_heap(self, memory_type: MemoryType) -> Heap:
        """The first heap whose memory type includes every requested bit."""
        heap = self._heap_for.get(memory_type)
        if heap is not None:
            return heap
        wanted = int(memory_type) & ~int(MemoryType.OPTIMAL)
        for heap in self.heaps:
            if int(heap.memory_type) & wanted == wanted:
                if type(memory_type) is int or isinstance(memory_type, MemoryType):
                    self._heap_for[memory_type] = heap
                return heap
        raise InvalidArgumentError(
            f"{self.device_name} has no heap with memory type {MemoryType(memory_type)!r}"
        )

    def coerce_usage(self, memory_type: MemoryType | int, usage: BufferUsage | int) -> int:
        """`usage` plus mapping and transfer when the heap for `memory_type` is host memory.

        IREE's heap allocator (local-sync/local-task) grants these to every buffer because
        the host reads and writes its memory directly; modules rely on it when reading
        results. `allocate` itself grants exactly what it is asked for.
        """
        key = (memory_type, usage)
        coerced = self._coerced.get(key)
        if coerced is None:
            heap = self.select_heap(memory_type)
            coerced = int(usage)
            if heap.memory_type & MemoryType.HOST_VISIBLE:
                coerced |= _HOST_HEAP_USAGE
            if type(memory_type) is int or isinstance(memory_type, MemoryType):
                self._coerced[key] = coerced
        return coerced

    def allocate(
        self,
        size: int,
        memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
        usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
        access: MemoryAccess = MemoryAccess.ALL,
        initial: Any = None,
    ) -> Buffer:
        """A new zero-filled buffer of `size` bytes whose address is 64-byte aligned;
        with `initial` (a C-contiguous buffer of at least `size` bytes, on a host-visible
        heap) it holds a copy of those bytes instead, in the same step."""
        if not isinstance(size, int) or size < 0:
            raise InvalidArgumentError(f"allocation size must be a non-negative int, not {size!r}")
        heap = self._heap_for.get(memory_type) or self.select_heap(memory_type)
        if type(access) is not int:
            access = int(access)
        if size > heap.max_allocation_size:
            raise ResourceExhaustedError(
                f"allocation of {size} bytes exceeds heap '{heap.name}' maximum of "
                f"{heap.max_allocation_size} bytes"
            )
        try:
            storage = CountedStorage(size, on_release=self._releasers[heap.name],
                                     initial=initial)
        except MemoryError:
            raise ResourceExhaustedError(
                f"out of host memory allocating {size} bytes on {self.device_name}"
            ) from None
        self.track(heap.name, size)
        return Buffer(self, storage, 0, size, self._heap_bits[heap.name], usage, access)

    def import_host(
        self,
        array: Any,
        memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
        usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING,
        access: MemoryAccess = MemoryAccess.ALL,
    ) -> Buffer | None:
        """Wraps host memory as a buffer without copying, or returns None when it cannot.

        The memory must be C-contiguous and 64-byte aligned. Read-only memory is imported
        with READ access only. Imported bytes do not count as allocated.
        """
        view = memoryview(array)
        if not view.c_contiguous:
            return None
        flat = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        storage = Storage(flat.nbytes, array=flat)
        if storage.address % ALIGNMENT:
            return None
        heap = self.select_heap(memory_type)
        if flat.readonly:
            access = MemoryAccess(access) & ~(MemoryAccess.WRITE | MemoryAccess.DISCARD)
        return Buffer(self, storage, 0, flat.nbytes, heap.memory_type, usage, access)

    def add_heap_statistics(self, heap: str) -> HeapCounter:
        """Makes `heap` (a memory source other than the allocator's own heaps, such as
        the transient ringbuffer) appear in `statistics()`, at zero until it counts
        bytes (`track`, or by changing the returned counter and `total` under `lock`)."""
        with self._lock:
            return self._counters.setdefault(heap, HeapCounter())

    def device_memory_of(self, heap: str) -> HeapCounter | None:
        """`device_memory` if `heap`'s bytes count in it, else None."""
        return self.device_memory if heap in self.device_memory_heaps else None

    def track(self, heap: str, delta: int) -> None:
        """Adds `delta` bytes (negative to free) to a heap's counters."""
        with self._lock:
            counter = self._counters.get(heap)
            if counter is None:
                counter = self._counters[heap] = HeapCounter()
            counter.live += delta
            if delta >= 0:
                counter.allocated += delta
                counter.count += 1
                if counter.live > counter.peak:
                    counter.peak = counter.live
            else:
                counter.freed -= delta
            total = self.total
            total.live += delta
            if total.live > total.peak:
                total.peak = total.live
            if heap in self.device_memory_heaps:
                memory = self.device_memory
                memory.live += delta
                if memory.live > memory.peak:
                    memory.peak = memory.live
            if self.profile is not None:
                self.profile.record_heap_change(heap, delta, total.live, total.peak)

    def _releaser(self, heap: str):
        """What a storage of `heap` calls with its size when freed: `track(heap, -size)`,
        inline (one frame per freed buffer instead of two)."""
        lock = self._lock
        memory = self.device_memory_of(heap)

        def release(size: int) -> None:
            if not size:  # `track` counts a zero delta as an allocation; kept as it was
                self.track(heap, 0)
                return
            with lock:
                counter = self._counters[heap]
                counter.live -= size
                counter.freed += size
                total = self.total
                total.live -= size
                if memory is not None:
                    memory.live -= size
                if self.profile is not None:
                    self.profile.record_heap_change(heap, -size, total.live, total.peak)

        return release

    def statistics(self) -> AllocatorStatistics:
        """A consistent snapshot of live, peak, allocated and freed bytes per heap."""
        with self._lock:
            heaps = {
                name: HeapStatistics(c.live, c.peak, c.allocated, c.freed, c.count)
                for name, c in self._counters.items()
            }
            return AllocatorStatistics(heaps, self.total.live, self.total.peak)

    def reset_peak(self) -> None:
        """Restarts peak tracking from the current live bytes (e.g. between benchmark runs)."""
        with self._lock:
            for c in self._counters.values():
                c.peak = c.live
            self.total.peak = self.total.live
            self.device_memory.peak = self.device_memory.live
