"""The VM's number semantics: integer wrapping and binary32 values as Python numbers.

Registers hold i32/i64 values as Python ints kept in signed range (`wrap32`, `wrap64`)
and f32 values as Python floats exactly representable in binary32 (`round_f32`). Where
the binary32 -> double conversion loses the bits, the value is carried as an `F32Bits`
(a float remembering its bits), so that moving it (a load then a store, a select, a
copy, a call) keeps the pattern, as IREE's VM does. Both the interpreter's helpers
(`vm.ops`) and the VM value types (`vm.types`) build on this module, which imports
neither.
"""

from __future__ import annotations

import struct
from array import array

INT32_MIN = -(1 << 31)
INT64_MIN = -(1 << 63)
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF

_S_f = struct.Struct("<f")
_S_I = struct.Struct("<I")
_S_d = struct.Struct("<d")
_S_Q = struct.Struct("<Q")
_S_q = struct.Struct("<q")


def wrap32(x: int) -> int:
    return ((x + 0x80000000) & M32) - 0x80000000


def wrap64(x: int) -> int:
    return ((x + 0x8000000000000000) & M64) - 0x8000000000000000


class F32Bits(float):
    """An f32 whose float value does not carry its binary32 bits, carried through
    registers with its exact bit pattern.

    Two cases: a signalling NaN (the conversion to double quiets it), and a subnormal
    read while denormals-are-zero is on (the HAL turns it on around every dispatch, as
    IREE does), whose float value is then a zero of its sign. Arithmetic and comparisons
    see the float value, as the hardware does under that state; moves keep `bits`, and
    so do `neg` and `abs`, which IREE does on the sign bit alone."""

    __slots__ = ("bits",)
    bits: int

    def __neg__(self):
        return f32_from_bits(self.bits ^ 0x80000000)

    def __abs__(self):
        return f32_from_bits(self.bits & 0x7FFFFFFF)


def round_f32(x: float) -> float:
    """Rounds a double to the nearest binary32 value (overflow gives inf, like C)."""
    if x.__class__ is F32Bits:
        return x
    return array("f", (x,))[0]


def f32_from_bits(bits: int) -> float:
    """The register value of the binary32 pattern `bits`: a float, or an `F32Bits` when
    the float (converted under the current floating-point state) loses the pattern."""
    bits &= M32
    value = _S_f.unpack(_S_I.pack(bits))[0]
    if not value:
        if bits & 0x7FFFFFFF:  # a subnormal, flushed by denormals-are-zero
            return _carried(value, bits)
    elif (bits & 0x7FC00000) == 0x7F800000 and bits & 0x003FFFFF:  # a signalling NaN
        return _carried(value, bits)
    return value


def _carried(value: float, bits: int) -> F32Bits:
    carried = F32Bits(value)
    carried.bits = bits
    return carried


def is_subnormal_f32(bits: int) -> bool:
    return not bits & 0x7F800000 and bool(bits & 0x007FFFFF)


def f32_bits(x: float) -> int:
    if x.__class__ is F32Bits:
        return x.bits
    return _S_I.unpack(_S_f.pack(x))[0]


def bitcast_f32_i32(x: float) -> int:
    return wrap32(f32_bits(x))


def bitcast_i32_f32(x: int) -> float:
    return f32_from_bits(x)


def bitcast_f64_i64(x: float) -> int:
    return _S_q.unpack(_S_d.pack(x))[0]


def bitcast_i64_f64(x: int) -> float:
    return _S_d.unpack(_S_q.pack(wrap64(x)))[0]
