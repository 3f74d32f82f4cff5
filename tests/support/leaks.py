"""A check that repeating an operation keeps no Python memory."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable


def traced_growth(cycle: Callable[[], None], warm: int, measured: int) -> int:
    """Bytes of Python memory still held after `measured` more calls of `cycle`, once
    `warm` calls have filled every cache and free list it uses (collected before and
    after, so only what the calls keep alive counts)."""
    for _ in range(warm):
        cycle()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(measured):
            cycle()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
