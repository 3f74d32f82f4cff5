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


def test_wraps_around_the_end():
    ring = TransientRingbuffer(capacity=256)
    (a, _), = grab(ring, 128)
    (b, _), = grab(ring, 64)
    ring.retire(a)
    (c, _), = grab(ring, 64)  # fits at the head [192, 256)
    assert c.offset == 192
    (d, _), = grab(ring, 128)  # wraps to [0, 128), behind the tail at 128
    assert d.offset == 0
    assert grab(ring, 64) == []  # [128,192) is b: full
    ring.retire(b)
    st = ring.statistics()
    assert st.parked_requests == 0 and st.live_bytes == 256


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


def test_random_workload_never_overlaps_live_blocks():
    rng = random.Random(7)
    ring = TransientRingbuffer(capacity=8192)
    live = []
    granted = []
    for _ in range(3000):
        if live and (rng.random() < 0.45 or ring.statistics().parked_requests):
            victim = live.pop(rng.randrange(len(live)))
            ring.retire(victim)
        else:
            ring.reserve(rng.randint(0, 2000), lambda blk, err: granted.append(blk))
        live.extend(granted)
        granted.clear()
        spans = sorted((b.offset, b.offset + b.size) for b in live)
        for (_s0, e0), (s1, _e1) in zip(spans, spans[1:]):
            assert e0 <= s1
        assert all(b.offset % 64 == 0 and b.offset + b.size <= 8192 for b in live)
        assert ring.statistics().live_bytes == sum(b.size for b in live)
