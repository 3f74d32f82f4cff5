"""HAL enumerations with IREE's numeric values (memory types, usage, access, elements)."""

from __future__ import annotations

import enum

import numpy as np

from ..errors import InvalidArgumentError


class MemoryType(enum.IntFlag):
    """Where memory lives and who may see it (`iree_hal_memory_type_t`)."""

    NONE = 0
    OPTIMAL = 1 << 0
    HOST_VISIBLE = 1 << 1
    HOST_COHERENT = 1 << 2
    HOST_CACHED = 1 << 3
    HOST_LOCAL = HOST_VISIBLE | HOST_COHERENT | (1 << 6)
    OPTIMAL_FOR_HOST = OPTIMAL | HOST_LOCAL
    DEVICE_VISIBLE = 1 << 4
    DEVICE_LOCAL = DEVICE_VISIBLE | (1 << 5)
    OPTIMAL_FOR_DEVICE = OPTIMAL | DEVICE_LOCAL


class BufferUsage(enum.IntFlag):
    """What a buffer may be used for (`iree_hal_buffer_usage_t`)."""

    NONE = 0
    TRANSFER_SOURCE = 1 << 0
    TRANSFER_TARGET = 1 << 1
    TRANSFER = TRANSFER_SOURCE | TRANSFER_TARGET
    DISPATCH_INDIRECT_PARAMETERS = 1 << 8
    DISPATCH_UNIFORM_READ = 1 << 9
    DISPATCH_STORAGE_READ = 1 << 10
    DISPATCH_STORAGE_WRITE = 1 << 11
    DISPATCH_STORAGE = DISPATCH_STORAGE_READ | DISPATCH_STORAGE_WRITE
    DISPATCH_IMAGE_READ = 1 << 12
    DISPATCH_IMAGE_WRITE = 1 << 13
    DISPATCH_IMAGE = DISPATCH_IMAGE_READ | DISPATCH_IMAGE_WRITE
    DISPATCH = (
        DISPATCH_INDIRECT_PARAMETERS | DISPATCH_UNIFORM_READ | DISPATCH_STORAGE | DISPATCH_IMAGE
    )
    SHARING_EXPORT = 1 << 16
    SHARING_REPLICATE = 1 << 17
    SHARING_CONCURRENT = 1 << 18
    SHARING_IMMUTABLE = 1 << 19
    MAPPING_SCOPED = 1 << 24
    MAPPING_PERSISTENT = 1 << 25
    MAPPING_OPTIONAL = 1 << 26
    MAPPING_ACCESS_RANDOM = 1 << 27
    MAPPING_ACCESS_SEQUENTIAL_WRITE = 1 << 28
    MAPPING = MAPPING_SCOPED | MAPPING_ACCESS_RANDOM
    DEFAULT = TRANSFER | DISPATCH_STORAGE


class MemoryAccess(enum.IntFlag):
    """How a mapping or binding touches memory (`iree_hal_memory_access_t`)."""

    NONE = 0
    READ = 1 << 0
    WRITE = 1 << 1
    DISCARD = 1 << 2
    DISCARD_WRITE = WRITE | DISCARD
    MAY_ALIAS = 1 << 3
    UNALIGNED = 1 << 4
    ANY = 1 << 5
    ALL = READ | WRITE | DISCARD


class NumericalType(enum.IntEnum):
    UNKNOWN = 0x00
    INTEGER = 0x10
    INTEGER_SIGNED = 0x11
    INTEGER_UNSIGNED = 0x12
    BOOLEAN = 0x13
    FLOAT = 0x20
    FLOAT_IEEE = 0x21
    FLOAT_BRAIN = 0x22
    FLOAT_COMPLEX = 0x23


def _element(numerical: NumericalType, bits: int) -> int:
    return (int(numerical) << 24) | bits


class ElementType(enum.IntEnum):
    """Element types encoded as IREE encodes them: numerical type << 24 | bit count."""

    NONE = 0
    OPAQUE_8 = _element(NumericalType.UNKNOWN, 8)
    OPAQUE_16 = _element(NumericalType.UNKNOWN, 16)
    OPAQUE_32 = _element(NumericalType.UNKNOWN, 32)
    OPAQUE_64 = _element(NumericalType.UNKNOWN, 64)
    BOOL_8 = _element(NumericalType.BOOLEAN, 8)
    INT_4 = _element(NumericalType.INTEGER, 4)
    SINT_4 = _element(NumericalType.INTEGER_SIGNED, 4)
    UINT_4 = _element(NumericalType.INTEGER_UNSIGNED, 4)
    INT_8 = _element(NumericalType.INTEGER, 8)
    SINT_8 = _element(NumericalType.INTEGER_SIGNED, 8)
    UINT_8 = _element(NumericalType.INTEGER_UNSIGNED, 8)
    INT_16 = _element(NumericalType.INTEGER, 16)
    SINT_16 = _element(NumericalType.INTEGER_SIGNED, 16)
    UINT_16 = _element(NumericalType.INTEGER_UNSIGNED, 16)
    INT_32 = _element(NumericalType.INTEGER, 32)
    SINT_32 = _element(NumericalType.INTEGER_SIGNED, 32)
    UINT_32 = _element(NumericalType.INTEGER_UNSIGNED, 32)
    INT_64 = _element(NumericalType.INTEGER, 64)
    SINT_64 = _element(NumericalType.INTEGER_SIGNED, 64)
    UINT_64 = _element(NumericalType.INTEGER_UNSIGNED, 64)
    FLOAT_16 = _element(NumericalType.FLOAT_IEEE, 16)
    FLOAT_32 = _element(NumericalType.FLOAT_IEEE, 32)
    FLOAT_64 = _element(NumericalType.FLOAT_IEEE, 64)
    BFLOAT_16 = _element(NumericalType.FLOAT_BRAIN, 16)
    COMPLEX_FLOAT_64 = _element(NumericalType.FLOAT_COMPLEX, 64)
    COMPLEX_FLOAT_128 = _element(NumericalType.FLOAT_COMPLEX, 128)

    @property
    def bit_count(self) -> int:
        return int(self) & 0xFF

    @property
    def numerical_type(self) -> int:
        return (int(self) >> 24) & 0xFF


class EncodingType(enum.IntEnum):
    OPAQUE = 0
    DENSE_ROW_MAJOR = 1


_NUMPY_BY_ELEMENT: dict[int, np.dtype] = {
    ElementType.BOOL_8: np.dtype(np.bool_),
    ElementType.INT_8: np.dtype(np.int8),
    ElementType.SINT_8: np.dtype(np.int8),
    ElementType.UINT_8: np.dtype(np.uint8),
    ElementType.OPAQUE_8: np.dtype(np.uint8),
    ElementType.INT_16: np.dtype(np.int16),
    ElementType.SINT_16: np.dtype(np.int16),
    ElementType.UINT_16: np.dtype(np.uint16),
    ElementType.OPAQUE_16: np.dtype(np.uint16),
    ElementType.INT_32: np.dtype(np.int32),
    ElementType.SINT_32: np.dtype(np.int32),
    ElementType.UINT_32: np.dtype(np.uint32),
    ElementType.OPAQUE_32: np.dtype(np.uint32),
    ElementType.INT_64: np.dtype(np.int64),
    ElementType.SINT_64: np.dtype(np.int64),
    ElementType.UINT_64: np.dtype(np.uint64),
    ElementType.OPAQUE_64: np.dtype(np.uint64),
    ElementType.FLOAT_16: np.dtype(np.float16),
    ElementType.FLOAT_32: np.dtype(np.float32),
    ElementType.FLOAT_64: np.dtype(np.float64),
    ElementType.COMPLEX_FLOAT_64: np.dtype(np.complex64),
    ElementType.COMPLEX_FLOAT_128: np.dtype(np.complex128),
}

_ELEMENT_BY_NUMPY: dict[np.dtype, ElementType] = {
    np.dtype(np.bool_): ElementType.BOOL_8,
    np.dtype(np.int8): ElementType.SINT_8,
    np.dtype(np.uint8): ElementType.UINT_8,
    np.dtype(np.int16): ElementType.SINT_16,
    np.dtype(np.uint16): ElementType.UINT_16,
    np.dtype(np.int32): ElementType.SINT_32,
    np.dtype(np.uint32): ElementType.UINT_32,
    np.dtype(np.int64): ElementType.SINT_64,
    np.dtype(np.uint64): ElementType.UINT_64,
    np.dtype(np.float16): ElementType.FLOAT_16,
    np.dtype(np.float32): ElementType.FLOAT_32,
    np.dtype(np.float64): ElementType.FLOAT_64,
    np.dtype(np.complex64): ElementType.COMPLEX_FLOAT_64,
    np.dtype(np.complex128): ElementType.COMPLEX_FLOAT_128,
}


def numpy_dtype(element_type: int) -> np.dtype:
    """The numpy dtype that holds `element_type`; INVALID_ARGUMENT if numpy has none."""
    try:
        return _NUMPY_BY_ELEMENT[element_type]
    except KeyError:
        raise InvalidArgumentError(
            f"element type 0x{int(element_type):08X} has no numpy equivalent"
        ) from None


def element_type_for(dtype: np.dtype) -> ElementType:
    """The IREE element type for a numpy dtype; INVALID_ARGUMENT for unsupported dtypes."""
    try:
        return _ELEMENT_BY_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise InvalidArgumentError(f"numpy dtype {np.dtype(dtype)} has no HAL element type") from None


WHOLE_BUFFER = -1
"""A length meaning "from the offset to the end of the buffer" (IREE_HAL_WHOLE_BUFFER)."""
