"""HAL enumerations with IREE's numeric values (memory types, usage, access, elements)."""

from __future__ import annotations

import enum
import math
import struct
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np


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
    FLOAT_8_E5M2 = 0x24
    FLOAT_8_E4M3FN = 0x25
    FLOAT_8_E5M2_FNUZ = 0x26
    FLOAT_8_E4M3_FNUZ = 0x27
    FLOAT_8_E8M0_FNU = 0x28


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
    INT_2 = _element(NumericalType.INTEGER, 2)
    SINT_2 = _element(NumericalType.INTEGER_SIGNED, 2)
    UINT_2 = _element(NumericalType.INTEGER_UNSIGNED, 2)
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
    FLOAT_8_E5M2 = _element(NumericalType.FLOAT_8_E5M2, 8)
    FLOAT_8_E4M3_FN = _element(NumericalType.FLOAT_8_E4M3FN, 8)
    FLOAT_8_E5M2_FNUZ = _element(NumericalType.FLOAT_8_E5M2_FNUZ, 8)
    FLOAT_8_E4M3_FNUZ = _element(NumericalType.FLOAT_8_E4M3_FNUZ, 8)
    FLOAT_8_E8M0_FNU = _element(NumericalType.FLOAT_8_E8M0_FNU, 8)

    @property
    def bit_count(self) -> int:
        return int(self) & 0xFF

    @property
    def numerical_type(self) -> int:
        return (int(self) >> 24) & 0xFF


class EncodingType(enum.IntEnum):
    OPAQUE = 0
    DENSE_ROW_MAJOR = 1


# -- the element-type table ----------------------------------------------------------------


class ElementInfo:
    """One element type at every boundary it crosses.

    `element_type` is the HAL code; `mlir` IREE's spelling (in MLIR types, ABI
    declarations and `iree-run-module`'s `--input=2xbf16=...`); `dtype` the numpy dtype
    that holds one element (ml_dtypes' for bf16, the fp8 family and sub-byte integers,
    one element per byte as ml_dtypes stores them); `kserve` the KServe V2 datatype, or
    None where V2 has none; `dtype_name` the numpy type's name, or `ml_dtypes.NAME`:
    ml_dtypes (2.5 MiB, ~5 ms) is imported only when an element type that needs it is
    first used. One instance per type, in the tables below. (A plain class: defined at
    every start-up, which a dataclass makes slower; `dtype`, read per tensor, is an
    attribute once computed.)
    """

    def __init__(self, element_type: int, mlir: str, dtype_name: str,
                 kserve: str | None = None) -> None:
        self.element_type = element_type
        self.mlir = mlir
        self.dtype_name = dtype_name
        self.kserve = kserve

    def __repr__(self) -> str:
        return f"ElementInfo(0x{self.element_type:08X}, {self.mlir!r})"

    @cached_property
    def dtype(self) -> np.dtype:
        import numpy as np

        module, _, name = self.dtype_name.rpartition(".")
        if module == "ml_dtypes":
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, name))
        return np.dtype(getattr(np, name))

    @property
    def bit_count(self) -> int:
        return self.element_type & 0xFF

    @property
    def numerical_type(self) -> int:
        return (self.element_type >> 24) & 0xFF


def is_integer_type(element_type: int) -> bool:
    """Whether an element type code is an integer of any signedness (not i1/bool)."""
    return (element_type >> 24) & 0xFF in (0x10, 0x11, 0x12)


def _info(element_type: ElementType, mlir: str, dtype: str, kserve: str | None = None
          ) -> ElementInfo:
    return ElementInfo(int(element_type), mlir, dtype, kserve)


ELEMENT_TYPES: tuple[ElementInfo, ...] = (
    _info(ElementType.BOOL_8, "i1", "bool_", "BOOL"),
    _info(ElementType.INT_2, "i2", "ml_dtypes.int2"),
    _info(ElementType.SINT_2, "si2", "ml_dtypes.int2"),
    _info(ElementType.UINT_2, "ui2", "ml_dtypes.uint2"),
    _info(ElementType.INT_4, "i4", "ml_dtypes.int4"),
    _info(ElementType.SINT_4, "si4", "ml_dtypes.int4"),
    _info(ElementType.UINT_4, "ui4", "ml_dtypes.uint4"),
    _info(ElementType.INT_8, "i8", "int8", "INT8"),
    _info(ElementType.SINT_8, "si8", "int8", "INT8"),
    _info(ElementType.UINT_8, "ui8", "uint8", "UINT8"),
    _info(ElementType.INT_16, "i16", "int16", "INT16"),
    _info(ElementType.SINT_16, "si16", "int16", "INT16"),
    _info(ElementType.UINT_16, "ui16", "uint16", "UINT16"),
    _info(ElementType.INT_32, "i32", "int32", "INT32"),
    _info(ElementType.SINT_32, "si32", "int32", "INT32"),
    _info(ElementType.UINT_32, "ui32", "uint32", "UINT32"),
    _info(ElementType.INT_64, "i64", "int64", "INT64"),
    _info(ElementType.SINT_64, "si64", "int64", "INT64"),
    _info(ElementType.UINT_64, "ui64", "uint64", "UINT64"),
    _info(ElementType.FLOAT_16, "f16", "float16", "FP16"),
    _info(ElementType.FLOAT_32, "f32", "float32", "FP32"),
    _info(ElementType.FLOAT_64, "f64", "float64", "FP64"),
    _info(ElementType.BFLOAT_16, "bf16", "ml_dtypes.bfloat16", "BF16"),
    _info(ElementType.FLOAT_8_E5M2, "f8E5M2", "ml_dtypes.float8_e5m2"),
    _info(ElementType.FLOAT_8_E4M3_FN, "f8E4M3FN", "ml_dtypes.float8_e4m3fn"),
    _info(ElementType.FLOAT_8_E5M2_FNUZ, "f8E5M2FNUZ", "ml_dtypes.float8_e5m2fnuz"),
    _info(ElementType.FLOAT_8_E4M3_FNUZ, "f8E4M3FNUZ", "ml_dtypes.float8_e4m3fnuz"),
    _info(ElementType.FLOAT_8_E8M0_FNU, "f8E8M0FNU", "ml_dtypes.float8_e8m0fnu"),
    _info(ElementType.COMPLEX_FLOAT_64, "complex<f32>", "complex64"),
    _info(ElementType.COMPLEX_FLOAT_128, "complex<f64>", "complex128"),
    _info(ElementType.OPAQUE_8, "x8", "uint8"),
    _info(ElementType.OPAQUE_16, "x16", "uint16"),
    _info(ElementType.OPAQUE_32, "x32", "uint32"),
    _info(ElementType.OPAQUE_64, "x64", "uint64"),
)
"""Every element type tinyhal moves across a boundary (API, tinyhal-run, .npy, server)."""

_BY_CODE: dict[int, ElementInfo] = {e.element_type: e for e in ELEMENT_TYPES}
_BY_MLIR: dict[str, ElementInfo] = {e.mlir: e for e in ELEMENT_TYPES}
_BY_MLIR["index"] = _BY_CODE[ElementType.INT_64]
# numpy -> HAL as iree.runtime maps it: numpy integers are signed or unsigned, never signless.
# Filled when a dtype is first looked up (numpy is imported only by what uses it); those
# of ml_dtypes join when a dtype of ml_dtypes is first looked up (its caller has imported it).
_BY_DTYPE: dict[np.dtype, ElementInfo] = {}


def element_info(element_type: int) -> ElementInfo | None:
    """The table entry of a HAL element type, or None for one tinyhal has no dtype for."""
    return _BY_CODE.get(int(element_type))


def element_info_for_mlir(name: str) -> ElementInfo | None:
    """The table entry of an MLIR element type (`f32`, `bf16`, `f8E4M3FN`, `i4`, `index`)."""
    return _BY_MLIR.get(name)


def numpy_dtype(element_type: int) -> np.dtype:
    """The numpy dtype that holds `element_type`; INVALID_ARGUMENT if numpy has none."""
    info = _BY_CODE.get(int(element_type))
    if info is None:
        raise InvalidArgumentError(
            f"element type {format_element_type(element_type)} "
            f"(0x{int(element_type):08X}) has no numpy equivalent"
        )
    return info.dtype


def element_type_for(dtype: np.dtype) -> ElementType:
    """The IREE element type for a numpy dtype; INVALID_ARGUMENT for unsupported dtypes."""
    import numpy as np

    if not _BY_DTYPE:
        for e in ELEMENT_TYPES:
            if e.numerical_type not in (0x00, 0x10) and not e.dtype_name.startswith("ml_dtypes."):
                _BY_DTYPE.setdefault(e.dtype, e)
    dtype = np.dtype(dtype)
    info = _BY_DTYPE.get(dtype)
    if info is None and dtype.type.__module__.startswith("ml_dtypes"):
        for e in ELEMENT_TYPES:
            if e.numerical_type not in (0x00, 0x10):
                _BY_DTYPE.setdefault(e.dtype, e)
        info = _BY_DTYPE.get(dtype)
    if info is None:
        raise InvalidArgumentError(f"numpy dtype {np.dtype(dtype)} has no HAL element type")
    return ElementType(info.element_type)


_FORMAT_PREFIX = {0x10: "i", 0x11: "si", 0x12: "ui", 0x21: "f", 0x22: "bf", 0x23: "cf"}
_SPECIAL_NAMES = {
    int(ElementType.FLOAT_8_E5M2): "f8E5M2",
    int(ElementType.FLOAT_8_E4M3_FN): "f8E4M3FN",
    int(ElementType.FLOAT_8_E5M2_FNUZ): "f8E5M2FNUZ",
    int(ElementType.FLOAT_8_E4M3_FNUZ): "f8E4M3FNUZ",
    int(ElementType.FLOAT_8_E8M0_FNU): "f8E8M0FNU",
}


def format_element_type(element_type: int) -> str:
    """IREE's spelling of any element type code (`iree_hal_format_element_type`):
    `f32`, `si8`, `i1`, `bf16`, `f8E4M3FN`, `*16` for opaque or unknown kinds."""
    element_type = int(element_type)
    special = _SPECIAL_NAMES.get(element_type)
    if special is not None:
        return special
    numerical = (element_type >> 24) & 0xFF
    if numerical == 0x13:
        return "i1"
    return f"{_FORMAT_PREFIX.get(numerical, '*')}{element_type & 0xFF}"


def parse_element_type(text: str) -> int:
    """An element type from IREE's spelling, by `iree_hal_parse_element_type`'s rules
    (`i1`, `i8`/`si8`/`ui8`, `f32`, `bf16`, `cf64`, `x16`/`*16`, the fp8 names)."""
    if text == "i1":
        return int(ElementType.BOOL_8)
    for code, name in _SPECIAL_NAMES.items():
        if text == name:
            return code
    for prefix, numerical in (("i", 0x10), ("si", 0x11), ("ui", 0x12), ("f", 0x21),
                              ("bf", 0x22), ("cf", 0x23), ("x", 0x00), ("*", 0x00)):
        if text.startswith(prefix):
            digits = text[len(prefix):]
            if not digits.isdigit() or not digits.isascii() or int(digits) > 0xFF:
                raise InvalidArgumentError(f"out of range bit count in '{text}'")
            return (numerical << 24) | int(digits)
    raise InvalidArgumentError(f"unhandled element type prefix in '{text}'")


def float32_bits(value: float) -> int:
    """The bits of `value` rounded to f32 (to nearest even; beyond f32's range an
    infinity of its sign, as a C cast gives)."""
    try:
        return _U32.unpack(_F32.pack(value))[0]
    except OverflowError:
        return 0xFF800000 if value < 0 else 0x7F800000


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def packed_byte_length(element_count: int, element_type: int) -> int:
    """Bytes `element_count` dense elements take in a buffer (sub-byte types packed)."""
    return (element_count * (int(element_type) & 0xFF) + 7) // 8


def pack_elements(array: np.ndarray, element_type: int) -> np.ndarray:
    """The bytes a HAL buffer holds for `array` (row-major; sub-byte elements packed
    8 // bits to a byte, the first element in the low bits, as IREE packs i4)."""
    import numpy as np

    bits = element_type & 0xFF
    if bits >= 8:
        if array.flags.c_contiguous:
            return array.reshape(-1).view(np.uint8)
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    flat = np.ascontiguousarray(array).reshape(-1)
    if 8 % bits:
        return flat.view(np.uint8)
    per_byte = 8 // bits
    values = flat.view(np.uint8) & np.uint8((1 << bits) - 1)
    padded = np.zeros(-(-values.size // per_byte) * per_byte, np.uint8)
    padded[: values.size] = values
    lanes = padded.reshape(-1, per_byte)
    out = np.zeros(lanes.shape[0], np.uint8)
    for lane in range(per_byte):
        out |= lanes[:, lane] << np.uint8(lane * bits)
    return out


def unpack_elements(raw: np.ndarray, shape: tuple[int, ...], element_type: int) -> np.ndarray:
    """The array of `shape` a HAL buffer's bytes `raw` hold (inverse of `pack_elements`)."""
    import numpy as np

    info = _BY_CODE.get(element_type)
    dtype = info.dtype if info is not None else numpy_dtype(element_type)
    bits = element_type & 0xFF
    if bits >= 8 and type(raw) is np.ndarray and raw.dtype == np.uint8 and raw.ndim == 1:
        count = 1
        for d in shape:
            count *= d
        return raw[: count * dtype.itemsize].view(dtype).reshape(shape)
    count = math.prod(shape)
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if bits >= 8 or 8 % bits:
        return raw[: count * dtype.itemsize].view(dtype).reshape(shape)
    per_byte = 8 // bits
    lanes = [(raw >> np.uint8(lane * bits)) & np.uint8((1 << bits) - 1)
             for lane in range(per_byte)]
    values = np.stack(lanes, axis=1).reshape(-1)[:count]
    return values.view(dtype).reshape(shape)


# Element type -> (numpy.ndarray, dtype) for whole-byte types, filled as `copy_elements`
# meets them: a call right after a large kernel runs with cold caches, so the result path
# touches as little as it can.
_WHOLE_BYTE_ARRAYS: dict[int, tuple[Any, Any]] = {}


def copy_elements(backing: memoryview, offset: int, shape: tuple[int, ...],
                  element_type: int) -> np.ndarray:
    """A new array of `shape` holding the elements stored at byte `offset` of `backing`
    (1-D uint8 memory that holds them all). One numpy view and one copy for byte-sized
    types: the result path of every invocation."""
    whole_bytes = _WHOLE_BYTE_ARRAYS.get(element_type)
    if whole_bytes is not None:
        return whole_bytes[0](shape, whole_bytes[1], backing, offset).copy()
    import numpy as np

    info = _BY_CODE.get(element_type)
    if info is not None and element_type & 0xFF >= 8:
        _WHOLE_BYTE_ARRAYS[element_type] = (np.ndarray, info.dtype)
        return np.ndarray(shape, info.dtype, backing, offset).copy()
    count = math.prod(shape)
    length = (count * (element_type & 0xFF) + 7) // 8
    return unpack_elements(np.frombuffer(backing, np.uint8, length, offset).copy(), shape,
                           element_type)


WHOLE_BUFFER = -1
"""A length meaning "from the offset to the end of the buffer" (IREE_HAL_WHOLE_BUFFER)."""
