"""The transient ringbuffer behind `queue_alloca` / `queue_dealloca`.

One preallocated block of `capacity` bytes (64-byte aligned, allocated lazily on first
use) is handed out in allocation order: each reservation bumps a write head, each
retirement (a `queue_dealloca` whose waits were reached) marks its block free, and the
read tail advances over the oldest blocks once they are all free. Frees may happen in any
order; the space comes back in allocation order, as in IREE's "Transient Tensor
Ringbuffer" roadmap item.

Placement prefers low addresses, so the memory the ring touches stays near its live set
rather than its capacity (the map's pages stay resident once written): the head wraps to 0
as soon as the room below the oldest live block holds the request and the whole live span,
not only at the end; a block that meets an older live one (one outliving its lap) starts
a new run in the lowest gap that holds it rather than waiting. Up to 16 such runs; a
reservation waits only when no gap holds it. `statistics().high_water` is the end of the
highest block ever placed.

When the ring has no room a reservation does not fail: it is parked, in order, and granted
by the retirement that makes room (on the thread that retires). Only a request larger
than the whole ring fails, with RESOURCE_EXHAUSTED, when it is made.

Live and peak bytes (sum of the 64-byte-rounded sizes of unretired blocks) are reported to
the device allocator under the heap name `"transient"`, so `allocator.statistics()`
shows them next to the ordinary heaps.

A buffer returned by `queue_alloca` exists before its memory does: it is created over a
`RingStorage` with no bytes yet, and `commit` points that storage at the block when the
reservation is granted, so subspans taken before that see the memory as well.

Pages written stay resident after their blocks retire: a burst of large transients (a
large request's) leaves its high water resident for as long as the process lives.
`give_back` returns the pages above the live blocks (and above the first `keep` bytes,
which steady traffic reuses) to the system; `give_back_all` does it for every ring of
the process. It is not on any operation's path: its caller decides when (the server: on
its trimming thread, after a large request's memory was released), so traffic that
stays small never pays page faults for it.
"""

from __future__ import annotations

import collections
import mmap
import queue
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..errors import Error, InvalidArgumentError, ResourceExhaustedError
from .buffer import ALIGNMENT, RingStorage, mapped_block
from .native import core as _core

RingCore = _core.RingCore

if TYPE_CHECKING:
    from .allocator import Allocator

__all__ = ["RingBlock", "RingStatistics", "TransientRingbuffer", "DEFAULT_CAPACITY", "HEAP_NAME",
           "GIVE_BACK_KEEP", "give_back_all"]

DEFAULT_CAPACITY = 256 << 20
"""Default ring size; numpy's zeroed allocation maps pages lazily, so untouched capacity
costs address space only."""

HEAP_NAME = "transient"

GIVE_BACK_KEEP = 1 << 20
"""Bytes at the front of a ring that `give_back` keeps resident: small traffic's blocks
are placed there (placement prefers low addresses) and would fault them in again."""

_GIVE_BACK_STEP = 2 << 20  # pages given back per hold of the ring's lock
_PAGE = mmap.PAGESIZE
_rings: weakref.WeakSet = weakref.WeakSet()  # every ring with a backing block
_rings_lock = threading.Lock()


def give_back_all(keep: int = GIVE_BACK_KEEP) -> int:
    """`give_back(keep)` of every ring of the process that has memory; the bytes asked
    back in all."""
    with _rings_lock:
        rings = list(_rings)
    return sum(ring.give_back(keep) for ring in rings)


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


RingBlock = _core.RingBlock
"""One reservation: `[offset, offset + size)` of the ring (`size` 64-byte rounded), with
`requested` and `retired` (C: `hal/native/core.c`)."""


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
    high_water: int  # end of the highest block ever placed: the bytes the ring has touched


class TransientRingbuffer(RingCore):
    """A bump allocator over one block, with in-order reclamation and parked requests.

    The bookkeeping (head, tail, live blocks, counters) is in the C base
    (`hal/native/core.c`), as are placement, retirement, `try_commit` and `release`: the
    path of every ready alloca and dealloca, each one C call under the allocator's lock.
    Parked requests, grants, close and collection stay here.
    """

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
        self._heap_name = HEAP_NAME
        self._parked: collections.deque[tuple[int, GrantCallback]] = collections.deque()
        if allocator is not None:  # shown from the start, at zero
            self._heap_counter = allocator.add_heap_statistics(HEAP_NAME)
            self._total = allocator.total
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

    # commit_new(allocator, size, memory_type_bits, usage_bits) -> Buffer | None (C): a
    # `pending_buffer` committed by `try_commit` in one call, built by the same
    # constructors (`RingStorage`, `Buffer`), or None when that would return False
    # (nothing made then): the ready alloca's path.

    # try_commit(storage) -> bool (C): reserves `storage.byte_length` bytes and `commit`s
    # them to `storage` at once, if the ring has room and no reservation is parked ahead;
    # False otherwise (then `reserve` parks the request in order). The path of an alloca
    # whose waits are already met: one call instead of a reservation and a grant.

    def retire(self, block: RingBlock) -> None:
        """Frees `block`; grants parked reservations that now fit, in order."""
        for cb, placed in self._free(block):
            cb(placed, None)

    # _free(block) and _free_locked(block) (C, the second with the lock held) retire
    # `block` and return the grants to make, outside the lock, from `_grant_parked`.

    def _grant_parked(self) -> list[tuple[GrantCallback, RingBlock]]:
        """Places parked reservations that now fit, in order (lock held)."""
        granted: list[tuple[GrantCallback, RingBlock]] = []
        parked = self._parked
        while parked:
            size, cb = parked[0]
            placed = self._place(size)
            if placed is None:
                break
            parked.popleft()
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
        return RingStorage(size)

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

    # owns(storage) -> bool (C): whether `storage` holds a block of this ring (committed
    # and not released).

    # release(storage) (C): retires the block committed to `storage` (nothing if it has
    # none, or is not this ring's), then makes the grants that frees.

    # collected(block) (C): a storage died still holding `block` (the garbage collector
    # freed a transient buffer without `release`): retire it. A collection can run at any
    # allocation, including inside this ring's locked sections or inside locks held by
    # whoever a grant completes (semaphores, device queues): so grants never run there
    # (`_grant_later`), and if this thread holds the ring's lock the whole retirement
    # moves to the reclaim thread (`_retire_later`). Live bytes drop there otherwise.

    def _retire_later(self, block: RingBlock) -> None:
        _reclaim(self.retire, block)

    def _grant_later(self, granted: list[tuple[GrantCallback, RingBlock]]) -> None:
        _reclaim(_grant_all, granted)

    # -- giving memory back -----------------------------------------------------------

    def give_back(self, keep: int = GIVE_BACK_KEEP) -> int:
        """Returns the pages above the live blocks and above the first `keep` bytes to the
        system (`MADV_DONTNEED`: they read as zeros when next placed, as a new ring's do);
        the bytes of the span asked back (0 when nothing is above). A step of the span at
        a time under the ring's lock, so no block can be placed in the pages while they
        go and no operation waits for more than one step; from the top down, so what a
        placement meanwhile takes at the bottom is left alone.

        Costs nothing on the ring's operations; a caller that gives back after every
        request would make the next one fault its pages in again (see the module doc)."""
        if self._backing is None:
            return 0
        raw = self._backing.obj
        keep = -(-max(keep, 0) // _PAGE) * _PAGE
        top = -(-self._high_water // _PAGE) * _PAGE
        asked = 0
        while top > keep:
            with self._lock:
                start = max(keep, top - _GIVE_BACK_STEP,
                            -(-self._live_end() // _PAGE) * _PAGE)
                if start >= top:
                    break
                raw.madvise(mmap.MADV_DONTNEED, start, top - start)
            asked += top - start
            top = start
        return asked

    # -- inspection -------------------------------------------------------------------

    def statistics(self) -> RingStatistics:
        with self._lock:
            return RingStatistics(
                capacity=self.capacity,
                live_bytes=self._live,
                peak_bytes=self._peak,
                live_blocks=self._live_blocks(),
                parked_requests=len(self._parked),
                head=self._head,
                tail=self._tail,
                reservations=self._reservations,
                waits=self._waits,
                high_water=self._high_water,
            )

    # -- internals --------------------------------------------------------------------

    def _ensure_backing(self) -> memoryview:
        if self._backing is None:
            self._backing, self._backing_address = mapped_block(self.capacity)
            with _rings_lock:
                _rings.add(self)
        return self._backing
