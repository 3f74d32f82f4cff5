"""The transient ringbuffer on its own: placement, in-order reclamation, parked requests."""

from __future__ import annotations

import random

import pytest

from tinyhal.errors import AbortedError, InvalidArgumentError, ResourceExhaustedError
from tinyhal.hal.allocator import Allocator
from tinyhal.hal.ringbuffer import HEAP_NAME, TransientRingbuffer


def grab(ring, size):
    got = []
    ring.reserve(size, lambda block, error: got.append((block, error)))
    return got


def test_bump_and_reset():
    ring = TransientRingbuffer(capacity=1024)
    (a, _), = grab(ring, 100)
    (b, _), = grab(ring, 1)
    assert (a.offset, a.size) == (0, 128)
    assert (b.offset, b.size) == (128, 64)
    ring.retire(a)
    ring.retire(b)
    st = ring.statistics()
    assert st.live_bytes == 0 and st.head == 0 and st.tail == 0 and st.peak_bytes == 192


def test_every_block_is_64_byte_aligned_in_memory():
    ring = TransientRingbuffer(capacity=4096)
    for size in (1, 63, 65, 200, 0):
        (block, _), = grab(ring, size)
        storage = ring.pending_storage(size)
        ring.commit(storage, block)
        assert storage.address % 64 == 0
        assert len(storage.array) == size


def test_full_ring_parks_until_retirement_in_order():
    ring = TransientRingbuffer(capacity=256)
    (a, _), = grab(ring, 128)
    (b, _), = grab(ring, 128)
    c = grab(ring, 64)
    d = grab(ring, 64)
    assert c == [] and d == []
    assert ring.statistics().parked_requests == 2
    ring.retire(b)  # the newest block: the tail is still held by `a`
    assert c == [] and d == []
    ring.retire(a)
    assert c and d and c[0][1] is None and d[0][1] is None
    assert c[0][0].offset == 0 and d[0][0].offset == 64


def test_wraps_early_once_the_room_before_the_tail_holds_the_live_span():
    ring = TransientRingbuffer(capacity=1024)
    (a, _), = grab(ring, 128)
    (b, _), = grab(ring, 64)
    ring.retire(a)  # room before the tail: 128 >= the live span [128, 192)
    (c, _), = grab(ring, 64)
    assert c.offset == 0
    (d, _), = grab(ring, 64)  # behind the tail at 128
    assert d.offset == 64
    (e, _), = grab(ring, 64)  # [128, 192) is b: the lowest gap that holds it is above b
    assert e.offset == 192
    (f, _), = grab(ring, 128)  # extends that run
    assert f.offset == 256
    for block in (b, c, d, e, f):
        ring.retire(block)
    st = ring.statistics()
    assert st.live_bytes == 0 and st.live_blocks == 0 and st.waits == 0 and st.high_water == 384
    (g, _), = grab(ring, 64)
    assert g.offset == 0


def test_waits_only_when_no_gap_holds_the_request():
    ring = TransientRingbuffer(capacity=512)
    (a, _), = grab(ring, 128)  # [0, 128)
    (b, _), = grab(ring, 128)  # [128, 256)
    ring.retire(a)
    (c, _), = grab(ring, 64)  # wraps early: [0, 64)
    (d, _), = grab(ring, 128)  # [64, 128) is too small: the gap above b, [256, 384)
    assert (c.offset, d.offset) == (0, 256)
    e = grab(ring, 192)  # gaps left: [64, 128) and [384, 512): neither holds 192
    assert e == []
    ring.retire(b)  # frees [128, 256): [64, 256) holds it
    assert e[0][0].offset == 64


def test_wraps_at_the_end_while_the_live_span_outgrows_the_room_before_the_tail():
    ring = TransientRingbuffer(capacity=256)
    (a, _), = grab(ring, 64)
    (b, _), = grab(ring, 128)
    ring.retire(a)  # room before the tail (64) < live span (128): stays at the head
    (c, _), = grab(ring, 64)
    assert c.offset == 192
    (d, _), = grab(ring, 64)  # the end is reached: wraps behind the tail at 64
    assert d.offset == 0
    e = grab(ring, 64)  # [64, 192) is b: full
    assert e == []
    ring.retire(b)
    assert e[0][0].offset == 64
    st = ring.statistics()
    assert st.parked_requests == 0 and st.live_bytes == 192 and st.high_water == 256


@pytest.mark.parametrize("order", ["fifo", "older_half", "any"])
def test_steady_traffic_stays_near_its_live_span(order):
    """Some block is always live: the head must still come back to low addresses instead
    of walking the whole capacity (every page it passes stays resident)."""
    rng = random.Random(3)
    ring = TransientRingbuffer(capacity=256 << 20)
    window, live = 24, []
    for _ in range(20000):
        (block, error), = grab(ring, rng.randint(1, 16 << 10))
        assert error is None
        live.append(block)
        if len(live) > window:
            span = {"fifo": 1, "older_half": len(live) // 2, "any": len(live)}[order]
            ring.retire(live.pop(rng.randrange(span)))
    st = ring.statistics()
    assert st.waits == 0 and st.reservations == 20000
    assert st.high_water <= 8 * (window + 1) * (16 << 10)  # the old ring walked all 256 MiB
    for block in live:
        ring.retire(block)
    assert ring.statistics().live_bytes == 0


def test_too_large_fails_at_once():
    ring = TransientRingbuffer(capacity=256)
    with pytest.raises(ResourceExhaustedError):
        ring.reserve(257, lambda *_: None)
    with pytest.raises(InvalidArgumentError):
        ring.reserve(-1, lambda *_: None)
    (a, _), = grab(ring, 256)  # exactly the whole ring is fine
    ring.retire(a)


def test_close_fails_parked_requests():
    ring = TransientRingbuffer(capacity=128)
    (a, _), = grab(ring, 128)
    parked = grab(ring, 64)
    ring.close(AbortedError("device closed"))
    assert parked and parked[0][0] is None and isinstance(parked[0][1], AbortedError)
    late = grab(ring, 64)
    assert isinstance(late[0][1], AbortedError)


def test_statistics_reach_the_allocator():
    alloc = Allocator("test")
    ring = TransientRingbuffer(alloc, capacity=1024)
    (a, _), = grab(ring, 100)
    (b, _), = grab(ring, 300)
    assert alloc.statistics()[HEAP_NAME].live_bytes == 128 + 320
    ring.retire(a)
    ring.retire(b)
    st = alloc.statistics()[HEAP_NAME]
    assert st.live_bytes == 0 and st.peak_bytes == 448


@pytest.mark.parametrize("seed, capacity, largest", [(7, 8192, 2000), (11, 8192, 2000),
                                                     (23, 3072, 300)])  # the last: many runs
def test_random_workload_never_overlaps_live_blocks(seed, capacity, largest):
    rng = random.Random(seed)
    ring = TransientRingbuffer(capacity=capacity)
    live = []
    granted = []
    for _ in range(3000):
        if live and (rng.random() < 0.45 or ring.statistics().parked_requests):
            victim = live.pop(rng.randrange(len(live)))
            ring.retire(victim)
        else:
            ring.reserve(rng.randint(0, largest), lambda blk, err: granted.append(blk))
        live.extend(granted)
        granted.clear()
        spans = sorted((b.offset, b.offset + b.size) for b in live)
        for (_s0, e0), (s1, _e1) in zip(spans, spans[1:]):
            assert e0 <= s1
        assert all(b.offset % 64 == 0 and b.offset + b.size <= capacity for b in live)
        assert ring.statistics().live_bytes == sum(b.size for b in live)
    while live:  # a retirement may grant a parked request: retire that too
        ring.retire(live.pop())
        live.extend(granted)
        granted.clear()
    st = ring.statistics()
    assert (st.live_bytes, st.live_blocks, st.parked_requests, st.head, st.tail) == (0, 0, 0, 0, 0)


def _resident(ring) -> int:
    """Resident bytes of the ring's own address range, by the kernel's count (mincore):
    the map holding it may be merged with neighbouring anonymous memory, whose pages an
    Rss line of /proc/self/smaps would add."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    page = mmap.PAGESIZE
    pages = (ring.capacity + page - 1) // page
    vector = ctypes.create_string_buffer(pages)
    if libc.mincore(ring._backing_address, pages * page, vector) != 0:
        raise AssertionError(f"mincore of the ring's map failed: errno {ctypes.get_errno()}")
    return page * sum(byte & 1 for byte in vector.raw)


def _filled(ring, size, byte):
    (block, error), = grab(ring, size)
    assert error is None
    storage = ring.pending_storage(size)
    ring.commit(storage, block)
    storage.array[:] = bytes([byte]) * size
    return block, storage


def test_give_back_returns_the_pages_above_the_live_blocks():
    """After a burst of large blocks, the pages above the live ones and above `keep` go
    back to the system; the live block's bytes stay; given-back pages read as zeros when
    placed again."""
    mb = 1 << 20
    ring = TransientRingbuffer(capacity=64 * mb)
    for block, _ in [_filled(ring, 4 * mb, 9) for _ in range(4)]:
        ring.retire(block)
    low, low_storage = _filled(ring, 3 * mb, 7)  # at 0 (the ring was empty), kept live
    assert _resident(ring) >= 16 * mb
    assert ring.give_back(keep=mb) == 13 * mb  # [3, 16) MiB: above the live block
    assert _resident(ring) <= 3 * mb + (256 << 10)
    assert bytes(low_storage.array) == b"\x07" * (3 * mb)
    ring.retire(low)
    assert ring.give_back(keep=mb) == 15 * mb  # [1, 16) MiB asked, [1, 3) still resident
    assert _resident(ring) <= mb + (256 << 10)
    again, storage = _filled(ring, 2 * mb, 5)
    assert bytes(storage.array[-4:]) == b"\x05" * 4
    ring.retire(again)
    assert TransientRingbuffer(capacity=mb).give_back() == 0  # no memory yet: nothing


def test_give_back_never_takes_the_pages_of_a_block_placed_meanwhile():
    """Blocks placed and filled on another thread while the ring gives back keep their
    bytes (the give-back holds the ring's lock for each step, so a block is placed either
    before a step, above its live end, or after it)."""
    import threading

    mb = 1 << 20
    ring = TransientRingbuffer(capacity=64 * mb)
    stop = threading.Event()
    failures, placed = [], [0]

    def traffic():
        rng = random.Random(5)
        live = []
        while not stop.is_set():
            placed[0] = n = placed[0] + 1
            block, storage = _filled(ring, rng.randint(1, 3 * mb), n % 251)
            live.append((block, storage, n % 251))
            if len(live) > 3:
                old, old_storage, byte = live.pop(0)
                data = bytes(old_storage.array)
                if data != bytes([byte]) * len(data):
                    failures.append((old.offset, old.size))
                ring.retire(old)
        for block, _, _ in live:
            ring.retire(block)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        while placed[0] < 250 and thread.is_alive():
            ring.give_back(keep=0)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert failures == []


def test_give_back_all_reaches_every_ring_with_memory():
    from tinyhal.hal.ringbuffer import give_back_all

    mb = 1 << 20
    rings = [TransientRingbuffer(capacity=16 * mb) for _ in range(2)]
    for ring in rings:
        block, _ = _filled(ring, 4 * mb, 1)
        ring.retire(block)
    give_back_all(keep=0)
    assert [_resident(ring) for ring in rings] == [0, 0]
