"""Host memory is plain Python memory: aligned zeroed blocks as byte memoryviews, with
every other view of a block (slices, mappings, numpy arrays over it) countable, so the
API can tell when nothing but its own buffer refers to an input's memory."""

from __future__ import annotations

import numpy as np
import pytest

from tinyhal.errors import InvalidArgumentError
from tinyhal.hal.buffer import (
    ALIGNMENT,
    Storage,
    as_byte_view,
    host_block,
    mapped_block,
    views_of_block,
)


@pytest.mark.parametrize("make", [host_block, mapped_block])
@pytest.mark.parametrize("size", [0, 1, 63, 4096, 3 << 20])
def test_blocks_are_aligned_zeroed_writable_bytes(make, size):
    block, address = make(size)
    assert (block.format, block.ndim, block.nbytes, block.readonly) == ("B", 1, size, False)
    assert address % ALIGNMENT == 0
    assert not any(block[:: max(1, size // 97)])
    if size:
        block[-1] = 7
        assert np.frombuffer(block, np.uint8)[-1] == 7


def test_every_other_view_of_a_block_is_counted():
    storage = Storage(256)
    array = storage.array
    assert views_of_block(array) == 1
    window = array[16:32]
    assert views_of_block(array) == 2
    as_numpy = np.frombuffer(array[64:128], np.float32)
    del window
    assert views_of_block(array) == 2
    as_numpy[:] = 1.5
    assert np.frombuffer(array, np.float32)[16] == 1.5
    del as_numpy
    assert views_of_block(array) == 1


def test_byte_views_of_host_objects():
    assert as_byte_view(np.arange(6, dtype=np.int16).reshape(2, 3)).nbytes == 12
    assert as_byte_view(b"abc").readonly
    with pytest.raises(InvalidArgumentError, match="C-contiguous"):
        as_byte_view(np.arange(8, dtype=np.int32)[::2])
    with pytest.raises(InvalidArgumentError, match="bytes-like"):
        as_byte_view([1, 2, 3])
