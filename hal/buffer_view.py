"""Buffer views: a buffer plus shape, element type and encoding, as IREE describes tensors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .native import core as _core
from .types import (
    BufferUsage,
    ElementType,
    MemoryType,
    element_type_for,
    numpy_dtype,
    pack_elements,
    unpack_elements,
)

if TYPE_CHECKING:
    import numpy as np


def dense_byte_length(shape: Sequence[int], element_type: int) -> int:
    """Bytes of a dense row-major tensor; sub-byte elements are packed."""
    bits = int(element_type) & 0xFF
    return (math.prod(shape) * bits + 7) // 8


class BufferView(_core.BufferViewCore):
    """A shaped, typed view of a buffer.

    `BufferView(buffer, shape, element_type, encoding_type=EncodingType.DENSE_ROW_MAJOR)`
    checks what IREE's `iree_hal_buffer_view_create` does: `buffer` is a `Buffer`
    (INVALID_ARGUMENT), no dimension is negative (INVALID_ARGUMENT), and the buffer has
    the bytes the shape and element type need (OUT_OF_RANGE). `shape` is kept as a tuple
    of ints, the types as ints. The constructor and the fields are in the C base
    (`hal/native/core.c`), so every view, the VM's included, is built by that one check
    without a Python frame; the fields are read-only after.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        try:
            et = ElementType(self.element_type).name
        except ValueError:
            et = f"0x{self.element_type:08X}"
        return f"<BufferView {'x'.join(map(str, self.shape)) or 'scalar'} {et}>"

    @property
    def byte_length(self) -> int:
        return dense_byte_length(self.shape, self.element_type)

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.element_type)

    @classmethod
    def from_numpy(cls, device: Any, array: Any,
                   memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                   usage: BufferUsage = BufferUsage.DEFAULT | BufferUsage.MAPPING) -> BufferView:
        """Copies a numpy array into a new device buffer."""
        import numpy as np

        array = np.asarray(array)
        element_type = element_type_for(array.dtype)
        data = pack_elements(array, element_type)
        buffer = device.allocator.allocate(data.nbytes, memory_type, usage)
        device.write_bytes(buffer, data)
        return cls(buffer, array.shape, element_type)

    def to_numpy(self, device: Any = None) -> np.ndarray:
        """Copies the view's contents into a new numpy array.

        Host-visible memory is read through a mapping; device-only memory (the `emu`
        driver's) through a transfer on the buffer's device (or `device`).
        """
        device = device or self.buffer.allocator.device_ref()
        data = device.read_array(self.buffer, 0, self.byte_length)
        return unpack_elements(data, self.shape, self.element_type)
