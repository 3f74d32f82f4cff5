"""The transient ringbuffer behind `queue_alloca` / `queue_dealloca`.

One preallocated block of `capacity` bytes (64-byte aligned, allocated lazily on first
use) is handed out in allocation order: each reservation bumps a write head, each
retirement (a `queue_dealloca` whose waits were reached) marks its block free, and the
read tail advances over the oldest blocks once they are all free. Frees may happen in any
order; the space comes back in allocation order, as in IREE's "Transient Tensor
Ringbuffer" roadmap item.

When the ring has no room a reservation does not fail: it is parked, in order, and granted
by the retirement that makes room (on the thread that retires). Only a request larger
than the whole ring fails, with RESOURCE_EXHAUSTED, when it is made.

Live and peak bytes (sum of the 64-byte-rounded sizes of unretired blocks) are reported to
the device allocator under the heap name `"transient"`, so `allocator.statistics()`
shows them next to the ordinary heaps.

A buffer returned by `queue_alloca` exists before its memory does: it is created over a
`RingStorage` with no bytes yet, and `commit` points that storage at the block when the
reservation is granted, so subspans taken before that see the memory as well.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from ..errors import Error, InvalidArgumentError, ResourceExhaustedError
from .buffer import ALIGNMENT, RingStorage, Storage, mapped_block, pending_buffer

if TYPE_CHECKING:
    from .allocator import Allocator, HeapCounter

__all__ = ["RingBlock", "RingStatistics", "TransientRingbuffer", "DEFAULT_CAPACITY", "HEAP_NAME"]

DEFAULT_CAPACITY = 256 << 20
"""Default ring size; numpy's zeroed allocation maps pages lazily, so untouched capacity
costs address space only."""

HEAP_NAME = "transient"


GrantCallback = Callable[["RingBlock | None", "Error | None"], None]


_reclaim_queue: queue.SimpleQueue = queue.SimpleQueue()
_reclaim_thread: list[threading.Thread] = []
_reclaim_start = threading.Lock()


def _reclaim(fn: Callable[..., None], arg: object) -> None:
    """Runs `fn(arg)` on the reclaim thread (started on first use). `SimpleQueue.put` is
    safe to call from finalizers, which is what this is for."""
    _reclaim_queue.put((fn, arg))
    if not _reclaim_thread and _reclaim_start.acquire(blocking=False):
        try:
            if not _reclaim_thread:
                thread = threading.Thread(target=_reclaim_loop, name="tinyhal-ring-reclaim",
                                          daemon=True)
                _reclaim_thread.append(thread)
                thread.start()
        finally:
            _reclaim_start.release()


def _reclaim_loop() -> None:
    while True:
        fn, arg = _reclaim_queue.get()
        try:
            fn(arg)
        except Exception:  # noqa: BLE001 - a grant's failure belongs to its own operation
            pass
        fn = arg = None


def _grant_all(granted: list[tuple[GrantCallback, RingBlock]]) -> None:
    for cb, placed in granted:
        cb(placed, None)


class RingBlock:
    """One reservation: `[offset, offset + size)` of the ring (`size` 64-byte rounded)."""

    __slots__ = ("offset", "size", "requested", "retired")

    def __init__(self, offset: int, size: int, requested: int) -> None:
        self.offset = offset
        self.size = size
        self.requested = requested
        self.retired = False

    def __repr__(self) -> str:
        state = "retired" if self.retired else "live"
        return f"<RingBlock [{self.offset}, {self.offset + self.size}) {state}>"


_new_block = object.__new__


class RingStatistics(NamedTuple):
    capacity: int
    live_bytes: int
    peak_bytes: int
    live_blocks: int
    parked_requests: int
    head: int
    tail: int
    reservations: int
    waits: int  # reservations that had to wait for a retirement


class TransientRingbuffer:
    """A bump allocator over one block, with in-order reclamation and parked requests."""

    def __init__(
        self, allocator: Allocator | None = None, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        if not isinstance(capacity, int) or capacity < ALIGNMENT:
            raise InvalidArgumentError(
                f"transient ringbuffer capacity must be an int >= {ALIGNMENT}, not {capacity!r}"
            )
        self.capacity = capacity & ~(ALIGNMENT - 1)
        self.allocator = allocator
        # The ring changes the allocator's counters itself, under the allocator's lock:
        # blocks and counts change in one locked section (`_place`, `_free_locked`).
        # An RLock so a finalizer can ask whether its own thread holds it (see
        # `collected`).
        self._lock = allocator.lock if allocator is not None else threading.RLock()
        self._heap_counter: HeapCounter | None = None
        self._device_memory: HeapCounter | None = None
        self._backing: memoryview | None = None
        self._backing_address = 0  # the backing's first byte, once it exists
        self._blocks: collections.deque[RingBlock] = collections.deque()
        self._parked: collections.deque[tuple[int, GrantCallback]] = collections.deque()
        self._head = 0  # next free byte
        self._tail = 0  # first byte of the oldest live block
        self._live = 0
        self._peak = 0
        self._reservations = 0
        self._waits = 0
        self._closed: Error | None = None
        if allocator is not None:  # shown from the start, at zero
            self._heap_counter = allocator.add_heap_statistics(HEAP_NAME)
            self._device_memory = allocator.device_memory_of(HEAP_NAME)

    def __repr__(self) -> str:
        return f"<TransientRingbuffer {self._live}/{self.capacity} bytes live>"

    # -- requests ---------------------------------------------------------------------

    def check_size(self, size: int) -> None:
        """Raises RESOURCE_EXHAUSTED if `size` could never fit, however long it waited."""
        if not isinstance(size, int) or size < 0:
            raise InvalidArgumentError(f"transient allocation size must be an int >= 0, not {size!r}")
        if (size + ALIGNMENT - 1) & ~(ALIGNMENT - 1) > self.capacity:
            raise ResourceExhaustedError(
                f"transient allocation of {size} bytes exceeds the whole ringbuffer of "
                f"{self.capacity} bytes (raise the device's transient_capacity)"
            )

    def reserve(self, size: int, on_grant: GrantCallback) -> None:
        """Reserves `size` bytes; calls `on_grant(block, None)` when it has them.

        That happens at once if there is room and nobody is parked ahead, otherwise on
        the thread whose `retire` makes room. After `close(error)`, `on_grant(None,
        error)`.
        """
        self.check_size(size)
        with self._lock:
            if self._closed is not None:
                error = self._closed
                block = None
            elif not self._parked and (block := self._place(size)) is not None:
                error = None
            else:
                self._parked.append((size, on_grant))
                self._waits += 1
                return
        on_grant(block, error)

    def try_commit(self, storage: Storage) -> bool:
        """Reserves `storage.byte_length` bytes and `commit`s them to `storage` at once,
        if the ring has room and no reservation is parked ahead; False otherwise (then
        `reserve` parks the request in order). The path of an alloca whose waits are
        already met: one call instead of a reservation and a grant."""
        lock = self._lock
        lock.acquire()  # not `with`: every ready alloca's path, and that costs more
        try:
            if self._closed is not None or self._parked:
                return False
            block = self._place(storage.byte_length)
            if block is None:
                return False
            storage.array = self._backing[block.offset : block.offset + storage.byte_length]
            storage.address = self._backing_address + block.offset
            storage.ring = self
            storage.block = block
        finally:
            lock.release()
        return True

    def retire(self, block: RingBlock) -> None:
        """Frees `block`; grants parked reservations that now fit, in order."""
        for cb, placed in self._free(block):
            cb(placed, None)

    def _free(self, block: RingBlock) -> Sequence[tuple[GrantCallback, RingBlock]]:
        """Retires `block` under the lock; returns the grants to make (outside it)."""
        with self._lock:
            return self._free_locked(block)

    def _free_locked(self, block: RingBlock) -> Sequence[tuple[GrantCallback, RingBlock]]:
        if block.retired:
            return ()
        block.retired = True
        size = block.size
        self._live -= size
        heap = self._heap_counter
        if heap is not None:  # `Allocator.track(-size)` inline; before any grant below
            heap.live -= size
            heap.freed += size
            total = self.allocator.total
            total.live -= size
            if self._device_memory is not None:
                self._device_memory.live -= size
            if self.allocator.profile is not None:
                self.allocator.profile.record_heap_change(HEAP_NAME, -size, total.live,
                                                          total.peak)
        blocks = self._blocks
        while blocks and blocks[0].retired:
            blocks.popleft()
        if blocks:
            self._tail = blocks[0].offset
        else:
            self._head = self._tail = 0
        if not self._parked:
            return ()
        granted: list[tuple[GrantCallback, RingBlock]] = []
        while self._parked:
            size, cb = self._parked[0]
            placed = self._place(size)
            if placed is None:
                break
            self._parked.popleft()
            granted.append((cb, placed))
        return granted

    def close(self, error: Error) -> None:
        """Fails every parked reservation with `error`, and every later one."""
        with self._lock:
            self._closed = error
            parked = list(self._parked)
            self._parked.clear()
        for _size, cb in parked:
            cb(None, error)

    # -- buffers ----------------------------------------------------------------------

    @staticmethod
    def pending_storage(size: int) -> RingStorage:
        """A `RingStorage` of `size` bytes with no memory yet, to be `commit`ted when
        its block is granted."""
        return pending_buffer(None, size, 0, 0).storage

    def commit(self, storage: RingStorage, block: RingBlock) -> None:
        """Points `storage` (a `pending_storage`) at the bytes of `block` (64-byte
        aligned).

        `release(storage)` retires the block; so does the storage being garbage
        collected, so a transient buffer dropped without `queue_dealloca` cannot wedge
        the ring forever.
        """
        backing = self._backing
        assert backing is not None
        storage.array = backing[block.offset : block.offset + storage.byte_length]
        storage.address = self._backing_address + block.offset
        with self._lock:
            storage.ring = self
            storage.block = block

    def owns(self, storage: Storage) -> bool:
        """Whether `storage` holds a block of this ring (committed and not released)."""
        return (storage.__class__ is RingStorage and storage.ring is self
                and storage.block is not None)

    def release(self, storage: Storage) -> None:
        """Retires the block committed to `storage` (nothing if it has none)."""
        if storage.__class__ is not RingStorage or storage.ring is not self:
            return
        lock = self._lock
        lock.acquire()  # not `with`: every ready dealloca's path
        try:
            block = storage.block
            if block is None:
                return
            storage.block = None
            granted = self._free_locked(block)  # `retire`, in the same locked section
        finally:
            lock.release()
        for cb, placed in granted:
            cb(placed, None)

    def collected(self, block: RingBlock) -> None:
        """A storage died still holding `block` (the garbage collector freed a transient
        buffer without `release`): retire it.

        A collection can run at any allocation, including inside this ring's locked
        sections or inside locks held by whoever a grant completes (semaphores, device
        queues): so grants never run here, and if this thread holds the ring's lock the
        whole retirement moves to the reclaim thread. Live bytes drop here otherwise.
        """
        lock = self._lock
        if lock._is_owned():  # threading.Condition relies on the same query
            _reclaim(self.retire, block)
            return
        lock.acquire()  # `_free`, without its frame (nor `with`'s lookups)
        try:
            granted = self._free_locked(block)
        finally:
            lock.release()
        if granted:
            _reclaim(_grant_all, granted)

    # -- inspection -------------------------------------------------------------------

    def statistics(self) -> RingStatistics:
        with self._lock:
            return RingStatistics(
                capacity=self.capacity,
                live_bytes=self._live,
                peak_bytes=self._peak,
                live_blocks=sum(1 for b in self._blocks if not b.retired),
                parked_requests=len(self._parked),
                head=self._head,
                tail=self._tail,
                reservations=self._reservations,
                waits=self._waits,
            )

    # -- internals --------------------------------------------------------------------

    def _ensure_backing(self) -> memoryview:
        if self._backing is None:
            self._backing, self._backing_address = mapped_block(self.capacity)
        return self._backing

    def _place(self, size: int) -> RingBlock | None:
        """Finds room for `size` bytes at the head (wrapping to 0); lock held."""
        # 64-byte rounded; a block is never empty: head == tail means full
        need = ((size + ALIGNMENT - 1) & ~(ALIGNMENT - 1)) or ALIGNMENT
        blocks = self._blocks
        if not blocks:  # head and tail are 0 (`_free_locked` resets them)
            if need > self.capacity:
                return None
            offset = 0
            if self._backing is None:
                self._ensure_backing()
        else:
            head, tail = self._head, self._tail
            if head > tail:
                if head + need <= self.capacity:
                    offset = head
                elif need <= tail:
                    offset = 0  # wrap; [head, cap) stays unused until the tail passes it
                else:
                    return None
            elif head + need <= tail:  # wrapped: live data is [tail, cap) + [0, head)
                offset = head
            else:
                return None
        block = _new_block(RingBlock)  # without an __init__ frame
        block.offset = offset
        block.size = need
        block.requested = size
        block.retired = False
        blocks.append(block)  # the tail stays: the oldest block's, or 0 with the first
        self._head = offset + need
        live = self._live = self._live + need
        self._reservations += 1
        if live > self._peak:
            self._peak = live
        heap = self._heap_counter
        if heap is not None:  # `Allocator.track(need)` inline, under the allocator's lock
            live = heap.live = heap.live + need
            heap.allocated += need
            heap.count += 1
            if live > heap.peak:
                heap.peak = live
            total = self.allocator.total
            live = total.live = total.live + need
            if live > total.peak:
                total.peak = live
            memory = self._device_memory
            if memory is not None:
                live = memory.live = memory.live + need
                if live > memory.peak:
                    memory.peak = live
            if self.allocator.profile is not None:
                self.allocator.profile.record_heap_change(HEAP_NAME, need, total.live,
                                                          total.peak)
        return block
