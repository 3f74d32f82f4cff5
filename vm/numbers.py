"""The VM's number semantics: integer wrapping and binary32 values as Python numbers.

Registers hold i32/i64 values as Python ints kept in signed range (`wrap32`, `wrap64`)
and f32 values as Python floats exactly representable in binary32 (`round_f32`). A
signalling NaN cannot survive the float -> double conversion, so one is carried as an
`F32SNaN` (a float remembering its bits). Both the interpreter's helpers (`vm.ops`) and
the VM value types (`vm.types`) build on this module, which imports neither.
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


class F32SNaN(float):
    """An f32 signalling NaN carried through registers with its exact bit pattern."""

    bits: int

    def __neg__(self):
        return f32_from_bits(self.bits ^ 0x80000000)

    def __abs__(self):
        return f32_from_bits(self.bits & 0x7FFFFFFF)


def round_f32(x: float) -> float:
    """Rounds a double to the nearest binary32 value (overflow gives inf, like C)."""
    if x.__class__ is F32SNaN:
        return x
    return array("f", (x,))[0]


def f32_from_bits(bits: int) -> float:
    bits &= M32
    value = _S_f.unpack(_S_I.pack(bits))[0]
    if (bits & 0x7F800000) == 0x7F800000 and (bits & 0x007FFFFF) and not bits & 0x00400000:
        snan = F32SNaN(value)
        snan.bits = bits
        return snan
    return value


def f32_bits(x: float) -> int:
    if x.__class__ is F32SNaN:
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
