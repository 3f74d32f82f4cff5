"""Buffer contents as text, exactly as IREE's HAL string utilities write and read them.

`iree-run-module`, `iree-check-module` and their tinyhal counterparts print tensors as
`2x2xf32=[1 2][3 4]` and parse `--input=2xbf16=1.5,2`; users diff the two tools' output,
so every byte must match IREE 3.13 (`iree_hal_format_buffer_elements`,
`iree_hal_parse_buffer_elements`):

- integers print in decimal at their width and signedness (signless as signed);
- every real floating type prints its value widened to f32 (f64 as itself) with C's
  `%G` (`1.5`, `3.29649E+38`, `NAN`, `-INF`); values parse with C's `strtof`/`strtod`
  and convert to the element type (bf16, f16 and the fp8 family round to nearest even,
  as IREE's converters do);
- everything else (i1, sub-byte integers, complex, opaque) is hex bytes, one group per
  *dense* element byte count. Sub-byte integers are packed in buffers (two i4 to a byte,
  the first in the low nibble), so IREE reads and writes them a packed byte at a time
  and, with more elements than bytes, runs out of data while printing (OUT_OF_RANGE).

Numbers are parsed with the C library's own `strtol`/`strtoul`/`strtoll`/`strtoull`/
`strtof`/`strtod` (through ctypes) so accepted spellings, partial parses and overflow
behave as in IREE.
"""

from __future__ import annotations

import ctypes
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidArgumentError, OutOfRangeError
from .types import (
    ElementType,
    float32_bits,
    format_element_type,
    numpy_dtype,
    packed_byte_length,
    parse_element_type,
)

__all__ = [
    "dense_byte_count",
    "format_buffer_elements",
    "format_c_float",
    "format_shape_and_element_type",
    "parse_buffer_elements",
    "parse_shape_and_element_type",
]

_libc = ctypes.CDLL(None, use_errno=True)
_C_PARSERS = {  # kind -> (libc function, result type, scratch size IREE copies into)
    "i32": ("strtol", ctypes.c_long, 16),
    "u32": ("strtoul", ctypes.c_ulong, 16),
    "i64": ("strtoll", ctypes.c_longlong, 32),
    "u64": ("strtoull", ctypes.c_ulonglong, 32),
    "f32": ("strtof", ctypes.c_float, 32),
    "f64": ("strtod", ctypes.c_double, 32),
}
for _fn_name, _restype, _ in _C_PARSERS.values():
    _fn = getattr(_libc, _fn_name)
    _fn.restype = _restype
    _fn.argtypes = (ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)) + (
        () if _fn_name in ("strtof", "strtod") else (ctypes.c_int,))

_INT_RANGES = {  # element type -> (C parser, lowest, highest value accepted; None: any)
    ElementType.INT_8: ("i32", -(1 << 7), (1 << 8) - 1),
    ElementType.SINT_8: ("i32", None, (1 << 7) - 1),
    ElementType.UINT_8: ("u32", None, (1 << 8) - 1),
    ElementType.INT_16: ("i32", -(1 << 15), (1 << 16) - 1),
    ElementType.SINT_16: ("i32", None, (1 << 15) - 1),
    ElementType.UINT_16: ("u32", None, (1 << 16) - 1),
    ElementType.INT_32: ("i32", None, None),
    ElementType.SINT_32: ("i32", None, None),
    ElementType.UINT_32: ("u32", None, None),
    ElementType.INT_64: ("i64", None, None),
    ElementType.SINT_64: ("i64", None, None),
    ElementType.UINT_64: ("u64", None, None),
}
_FLOATS = {
    int(ElementType.FLOAT_16), int(ElementType.FLOAT_32), int(ElementType.FLOAT_64),
    int(ElementType.BFLOAT_16), int(ElementType.FLOAT_8_E5M2),
    int(ElementType.FLOAT_8_E4M3_FN), int(ElementType.FLOAT_8_E5M2_FNUZ),
    int(ElementType.FLOAT_8_E4M3_FNUZ), int(ElementType.FLOAT_8_E8M0_FNU),
}


def dense_byte_count(element_type: int) -> int:
    """Bytes one element takes when not packed (`iree_hal_element_dense_byte_count`)."""
    return ((int(element_type) & 0xFF) + 7) // 8


# -- C number parsing ---------------------------------------------------------------------


def _c_parse(kind: str, token: str) -> int | float | None:
    """`iree_string_view_atoi_*` / `atof` / `atod`: the value (ints wrapped to the
    parser's width as IREE's casts do), or None where IREE's parser fails."""
    fn_name, _, limit = _C_PARSERS[kind]
    raw = token.encode("utf-8", "replace")
    if len(raw) >= limit:
        return None
    buf = ctypes.create_string_buffer(raw, limit)
    end = ctypes.c_char_p()
    args: tuple = (buf, ctypes.byref(end)) if kind[0] == "f" else (buf, ctypes.byref(end), 0)
    ctypes.set_errno(0)
    value = getattr(_libc, fn_name)(*args)
    error = ctypes.get_errno()
    if ctypes.cast(end, ctypes.c_void_p).value == ctypes.addressof(buf):
        return None
    if kind[0] == "f":
        return value if value != 0 or error == 0 else None
    if error and value in (-(1 << 63), (1 << 63) - 1, (1 << 64) - 1):
        return None
    if value == 0 and error:
        return None
    if kind == "i32":
        value = ((value + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
    elif kind == "u32":
        value &= 0xFFFFFFFF
    return value


# (exponent bits, mantissa bits, has infinity, has NaN, bias tweak, NaN is -0) per type
_NARROW_FLOATS = {
    int(ElementType.FLOAT_16): (5, 10, True, True, 0, False),
    int(ElementType.BFLOAT_16): (8, 7, True, True, 0, False),
    int(ElementType.FLOAT_8_E5M2): (5, 2, True, True, 0, False),
    int(ElementType.FLOAT_8_E4M3_FN): (4, 3, False, True, 0, False),
    int(ElementType.FLOAT_8_E5M2_FNUZ): (5, 2, False, True, 1, True),
    int(ElementType.FLOAT_8_E4M3_FNUZ): (4, 3, False, True, 1, True),
}


def _round_half_even_bias(value: int, shift: int) -> int:
    even_bit = 1 << shift
    odd_bit = even_bit >> 1
    return (value + (odd_bit if value & even_bit else odd_bit - 1)) & 0xFFFFFFFF


def narrow_float_bits(value: float, element_type: int) -> int:
    """The bits of f32 `value` in a narrower float type, rounded as IREE's own converter
    (`iree_math_f32_to_*`) rounds: to nearest even, f32 subnormals to zero (kept for
    bf16), overflow to infinity or NaN, NaN as all-ones exponent and mantissa (or -0 in
    the FNUZ types). numpy and ml_dtypes differ from it in NaN payloads and FNUZ
    subnormals, and IREE's parser is what `--input=` must match."""
    ebits, mbits, has_inf, has_nan, bias_tweak, nan_is_neg_zero = _NARROW_FLOATS[element_type]
    sign_shift = ebits + mbits
    sign_mask = 1 << sign_shift
    mantissa_mask = (1 << mbits) - 1
    exp_mask = (1 << sign_shift) - (1 << mbits)
    exp_bias = bias_tweak + (1 << (ebits - 1)) - 1
    bits = float32_bits(value)
    sign = (bits >> 31) << sign_shift
    f32_exp = bits & 0x7F800000
    f32_mantissa = bits & 0x7FFFFF
    exp = mantissa = 0
    make_nan = make_inf = False
    if f32_exp == 0x7F800000:
        exp = exp_mask
        make_nan, make_inf = bool(f32_mantissa), not f32_mantissa
    elif f32_exp == 0:
        if ebits == 8:
            shift = 23 - mbits
            mantissa = _round_half_even_bias(f32_mantissa, shift) >> shift
    else:
        arithmetic_exp = (f32_exp >> 23) - 127
        if arithmetic_exp > (1 << (ebits - 1)) - int(has_inf):
            make_inf = True
        elif arithmetic_exp + exp_bias <= 0:
            shift = 23 - mbits - arithmetic_exp + (1 - exp_bias)
            if 0 <= shift <= 23:
                mantissa = _round_half_even_bias((1 << 23) + f32_mantissa, shift) >> shift
        else:
            shift = 23 - mbits
            biased = _round_half_even_bias(f32_mantissa, shift)
            if biased > 0x7FFFFF:
                biased = 0
                arithmetic_exp += 1
            exp = (arithmetic_exp + exp_bias) << mbits
            mantissa = biased >> shift
            if not has_inf and exp > exp_mask:
                make_nan = True
    if make_inf:
        if has_inf:
            return sign | exp_mask
        if not has_nan:
            return sign | exp_mask | mantissa_mask
        make_nan = True
    if make_nan:
        if not has_nan:
            return 0
        return sign_mask if nan_is_neg_zero else sign | exp_mask | mantissa_mask
    if nan_is_neg_zero and exp == 0 and mantissa == 0:
        return 0
    return sign | exp | mantissa


def _e8m0_bits(value: float) -> int:
    """f32 -> f8E8M0FNU (a power of two, no sign, no zero) as IREE converts it: the
    nearer of the two powers of two by the frexp fraction, NaN (0xFF) past the range."""
    value = _F32.unpack(_U32.pack(float32_bits(value)))[0]
    if not math.isfinite(value):
        return 0xFF
    if value <= 0:
        return 0
    fraction, exponent = math.frexp(value)
    biased = exponent - (fraction < 0.75) + 127
    return 0 if biased < 0 else min(biased, 0xFF)


def _parse_element(token: str, element_type: int, size: int) -> bytes:
    entry = _INT_RANGES.get(element_type)  # type: ignore[call-overload]
    if entry is not None:
        kind, lo, hi = entry
        value = _c_parse(kind, token)
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            raise InvalidArgumentError(
                f"invalid {format_element_type(element_type)} value '{token}'")
        return (int(value) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    if element_type in _FLOATS:
        wide = element_type == ElementType.FLOAT_64
        value = _c_parse("f64" if wide else "f32", token)
        if value is None:
            raise InvalidArgumentError(
                f"invalid {format_element_type(element_type)} value '{token}'")
        if element_type in _NARROW_FLOATS:
            return narrow_float_bits(value, element_type).to_bytes(size, "little")
        if element_type == ElementType.FLOAT_8_E8M0_FNU:
            return bytes([_e8m0_bits(value)])
        if wide:
            return struct.pack("<d", value)
        return _U32.pack(float32_bits(value))
    if len(token) != size * 2:
        raise InvalidArgumentError(
            f"binary hex element count mismatch: buffer length={len(token)} < "
            f"expected={size * 2}")
    return bytes((_hex_digit(token[2 * i]) << 4) | _hex_digit(token[2 * i + 1])
                 for i in range(size))


def _hex_digit(c: str) -> int:
    return int(c, 16) if c in "0123456789abcdefABCDEF" else 0


_SEPARATORS = re.compile(r"[\s,\[\]]+")


def parse_buffer_elements(text: str, shape: Sequence[int], element_type: int) -> bytearray:
    """The buffer bytes (packed for sub-byte types) `text` gives a tensor of `shape`:
    one value splats, no values give zeros (`iree_hal_parse_buffer_elements`)."""
    element_type = int(element_type)
    size = dense_byte_count(element_type)
    byte_length = packed_byte_length(math.prod(shape), element_type)
    capacity = byte_length // size if size else 0
    if not text:
        return bytearray(byte_length)
    tokens = [t for t in _SEPARATORS.split(text) if t]
    ends_with_separator = bool(_SEPARATORS.fullmatch(text[-1]))
    out = bytearray()
    for i, token in enumerate(tokens):
        if i >= capacity:
            if i == len(tokens) - 1 and not ends_with_separator:
                raise OutOfRangeError(
                    f"output data overflow: element_capacity={capacity} < dst_i={i}")
            raise OutOfRangeError(
                f"output data buffer overflow: element_capacity={capacity} < dst_i={i}+")
        out += _parse_element(token, element_type, size)
    if len(tokens) == 1 and capacity > 1:
        out = out * capacity
    elif len(tokens) < capacity:
        raise OutOfRangeError(
            f"input data string underflow: dst_i={len(tokens)} < element_capacity={capacity}")
    del out[byte_length:]
    return out + bytes(byte_length - len(out))


def parse_shape_and_element_type(text: str) -> tuple[tuple[int, ...], int]:
    """`2x3xf32` (or `f32`) as (shape, element type), as `iree_hal_parse_shape_and_
    element_type` reads the part of an `--input=` before `=`."""
    text = text.strip().removeprefix('"').removesuffix('"')
    if not text:
        raise InvalidArgumentError("empty string input")
    head = text.split("=", 1)[0]
    shape_text, x, type_text = head.rpartition("x")
    if not x:
        shape_text, type_text = "", head
    shape: list[int] = []
    if shape_text:
        for dim in shape_text.split("x"):
            if not dim.isdigit() or not dim.isascii() or int(dim) >= 1 << 63:  # int64
                raise InvalidArgumentError(
                    f"shape[{len(shape)}] invalid value '{dim}' of '{shape_text}'")
            shape.append(int(dim))
    return tuple(shape), parse_element_type(type_text)


# -- formatting ---------------------------------------------------------------------------


def format_c_float(value: float) -> str:
    """C's `%G` of a double (Python's `%G` drops a NaN's sign; C keeps it)."""
    if math.isnan(value):
        return "-NAN" if math.copysign(1.0, value) < 0 else "NAN"
    return "%G" % value


def format_shape_and_element_type(shape: Sequence[int], element_type: int) -> str:
    dims = "x".join(str(d) for d in shape)
    return (dims + "x" if dims else "") + format_element_type(element_type)


_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_STRUCT_FLOATS = {int(ElementType.FLOAT_16): "e", int(ElementType.FLOAT_32): "f",
                  int(ElementType.FLOAT_64): "d"}


def _element_strings(data: memoryview, element_type: int, size: int) -> Callable[[int], str]:
    """index -> IREE's text of the element at byte offset index * size of `data`."""
    count = len(data) // size if size else 0
    whole = data[: count * size]
    if element_type in _INT_RANGES:
        code = {1: "b", 2: "h", 4: "i", 8: "q"}[size]
        if (element_type >> 24) & 0xFF == 0x12:
            code = code.upper()
        ints = struct.unpack(f"<{count}{code}", whole)
        return lambda i: str(ints[i])
    code = _STRUCT_FLOATS.get(element_type)
    if code is not None or element_type == ElementType.BFLOAT_16:
        if code is not None:
            floats = struct.unpack(f"<{count}{code}", whole)
        else:  # bf16 is the high half of an f32
            floats = struct.unpack(f"<{count}f", b"".join(
                _U32.pack(h << 16) for h in struct.unpack(f"<{count}H", whole)))
        if element_type != ElementType.FLOAT_32 and element_type != ElementType.FLOAT_64:
            # IREE widens every NaN to a positive one
            floats = tuple(math.nan if f != f else f for f in floats)
        return lambda i: format_c_float(floats[i])
    if element_type in _FLOATS:  # the fp8 family: numpy and ml_dtypes convert them
        import numpy as np

        typed = np.frombuffer(whole, np.uint8).view(numpy_dtype(element_type))
        wide = typed.astype(np.float64 if element_type == ElementType.FLOAT_64 else np.float32)
        if element_type in _NARROW_FLOATS:  # IREE widens every NaN to a positive one
            wide[np.isnan(wide)] = np.nan
        return lambda i: format_c_float(float(wide[i]))
    return lambda i: whole[i * size : (i + 1) * size].tobytes().hex().upper()


def format_buffer_elements(data: Any, shape: Sequence[int], element_type: int,
                           max_element_count: int = 1024) -> str:
    """The contents part of `2x2xf32=[1 2][3 4]` for buffer bytes `data` (any
    C-contiguous buffer: bytes, a memoryview, a numpy array); elides after
    `max_element_count` elements with `...` (`iree_hal_format_buffer_elements`)."""
    element_type = int(element_type)
    data = memoryview(data)
    if data.format != "B" or data.ndim != 1:
        data = data.cast("B")
    size = dense_byte_count(element_type)
    text_of = _element_strings(data, element_type, size)
    budget = [max(0, max_element_count)]
    out: list[str] = []

    def leaf(start: int, length: int, n: int) -> None:
        shown = min(budget[0], n)
        if length < shown * size:
            raise OutOfRangeError(
                f"input data underflow; data_length={length} < expected={shown * size}")
        budget[0] -= shown
        first = start // size if size else 0
        out.append(" ".join(text_of(first + i) for i in range(shown)))
        if shown < n:
            out.append("...")

    def nested(start: int, length: int, dims: Sequence[int]) -> None:
        if len(dims) == 1:
            leaf(start, length, dims[0])
            return
        stride = math.prod(dims[1:]) * size
        if length < stride * dims[0]:
            raise OutOfRangeError(
                f"input data underflow: data_length={length} < expected={stride * dims[0]}")
        for i in range(dims[0]):
            out.append("[")
            nested(start + i * stride, stride, dims[1:])
            out.append("]")

    nested(0, len(data), tuple(shape) or (1,))
    return "".join(out)
