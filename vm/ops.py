"""Runtime helpers the generated interpreter code calls for the less common operations.

Semantics follow IREE's `vm/ops.h` exactly, including its quirks (for example
`cast.f64.si32` rounds through `float`), so results match IREE bit for bit. Float
functions with libm behaviour (`sinf`, `lroundf`, ...) call the C library through ctypes
rather than Python's `math`, which works in double precision and raises on domain errors.
"""

from __future__ import annotations

import ctypes
import struct

from ..errors import (
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    error_for_code,
)
from .numbers import (  # noqa: F401 - the generated code reaches these through `ops`
    INT32_MIN,
    INT64_MIN,
    M32,
    M64,
    F32Bits,
    bitcast_f32_i32,
    bitcast_f64_i64,
    bitcast_i32_f32,
    bitcast_i64_f64,
    f32_bits,
    f32_from_bits,
    is_subnormal_f32,
    round_f32,
    wrap32,
    wrap64,
)
from .types import VALUE_TYPES, VARIANT, VMBuffer, VMList, ref_type_matches

_S_d = struct.Struct("<d")
_S_Q = struct.Struct("<Q")


# ---------------------------------------------------------------------------
# libm through ctypes.



def _open_libm() -> ctypes.CDLL:
    """glibc's libm by its soname; `find_library` (which runs `ldconfig -p` in a child
    process, milliseconds at every start) only where that name is not found."""
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:
        from ctypes.util import find_library

        return ctypes.CDLL(find_library("m"))


_libm = _open_libm()
_cf, _cd, _cl, _cll = ctypes.c_float, ctypes.c_double, ctypes.c_long, ctypes.c_longlong

# The iree-base-runtime 3.13.0 wheel links these symbol versions of glibc's libm (its
# manylinux baseline); newer default versions differ in edge cases (e.g. the sign of
# log(-1)'s NaN), so bind exactly the ones IREE calls, where the C library has them.
_GLIBC_2_27 = {"expf", "exp2f", "logf", "log2f", "powf"}
try:
    _dlvsym = ctypes.CDLL(None).dlvsym
    _dlvsym.restype = ctypes.c_void_p
    _dlvsym.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
except AttributeError:  # pragma: no cover - not glibc
    _dlvsym = None


def _libm_fn(name: str, restype, *argtypes):
    proto = ctypes.CFUNCTYPE(restype, *argtypes)
    if _dlvsym is not None:
        version = "GLIBC_2.27" if name in _GLIBC_2_27 else "GLIBC_2.2.5"
        addr = _dlvsym(_libm._handle, name.encode(), version.encode())
        if addr:
            return proto(addr)
    return proto((name, _libm))


_F32_UNARY = {}
_F64_UNARY = {}
for _n in ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p", "log2",
           "sqrt", "tanh", "erf", "ceil", "floor", "round", "fabs"):
    _F32_UNARY[_n] = _libm_fn(_n + "f", _cf, _cf)
    _F64_UNARY[_n] = _libm_fn(_n, _cd, _cd)
_atan2f = _libm_fn("atan2f", _cf, _cf, _cf)
_atan2 = _libm_fn("atan2", _cd, _cd, _cd)
_powf = _libm_fn("powf", _cf, _cf, _cf)
_pow = _libm_fn("pow", _cd, _cd, _cd)
_remainderf = _libm_fn("remainderf", _cf, _cf, _cf)
_remainder = _libm_fn("remainder", _cd, _cd, _cd)
_fmodf = _libm_fn("fmodf", _cf, _cf, _cf)
_fmod = _libm_fn("fmod", _cd, _cd, _cd)
_lroundf = _libm_fn("lroundf", _cl, _cf)
_llroundf = _libm_fn("llroundf", _cll, _cf)
_lround = _libm_fn("lround", _cl, _cd)
_llround = _libm_fn("llround", _cll, _cd)


def f32_libm_address(name: str) -> int:
    """The address of the C library function an f32 op calls: `name` as `f32_unary`
    takes it, or `atan2`, `pow`, `remainder`, `lround`, `llround`. The native interpreter
    (`vm.scalar`) calls these very functions, so both paths give the same bits."""
    fn = _F32_UNARY.get(name) or {"atan2": _atan2f, "pow": _powf, "remainder": _remainderf,
                                  "lround": _lroundf, "llround": _llroundf}[name]
    return ctypes.cast(fn, ctypes.c_void_p).value


def f32_unary(name: str):
    fn = _F32_UNARY[name]

    def op(x):
        return round_f32(fn(x))

    op.__name__ = f"{name}_f32"
    return op


def f64_unary(name: str):
    return _F64_UNARY[name]


def atan2_f32(y, x):
    return round_f32(_atan2f(y, x))


def pow_f32(b, e):
    return round_f32(_powf(b, e))


def rem_f32(a, b):
    return round_f32(_remainderf(a, b))


atan2_f64 = _atan2
pow_f64 = _pow
rem_f64 = _remainder


def rsqrt_f32(x):
    s = round_f32(_F32_UNARY["sqrt"](x))
    return round_f32(div_f(1.0, s))


def rsqrt_f64(x):
    return div_f(1.0, _F64_UNARY["sqrt"](x))


_DEFAULT_NAN = _S_d.unpack(_S_Q.pack(0xFFF8000000000000))[0]  # x86 "real indefinite"


def div_f(a: float, b: float) -> float:
    """IEEE division by a zero divisor (Python raises), as x86 SSE computes it."""
    if b:
        return a / b
    if a != a:
        return a + 0.0  # propagates (and quiets) the NaN operand
    if a == 0.0:
        return _DEFAULT_NAN
    negative = (a < 0.0) != (_S_Q.unpack(_S_d.pack(b))[0] >> 63 == 1)
    return float("-inf") if negative else float("inf")


def round_even_f32(x):
    # IREE's non-C23 fallback, including its sign-of-zero behaviour.
    r = round_f32(_F32_UNARY["round"](x))
    if abs(round_f32(x - r)) == 0.5:
        if _fmodf(r, 2.0) != 0:
            r = round_f32(r - 1.0) if r > 0.0 else round_f32(r + 1.0)
    return r


def round_even_f64(x):
    r = _F64_UNARY["round"](x)
    if abs(x - r) == 0.5:
        if _fmod(r, 2.0) != 0:
            r = r - 1.0 if r > 0.0 else r + 1.0
    return r


def cast_f32_si32(x):
    return wrap32(_lroundf(x))


def cast_f32_ui32(x):
    return wrap32(_llroundf(x))


def cast_f32_si64(x):
    return _llroundf(x)


def _cvtt64(v: float) -> int:
    """x86 cvttsd2si: truncation, 'integer indefinite' when out of range or NaN."""
    if v != v or not (-9.223372036854775808e18 <= v < 9.223372036854775808e18):
        return INT64_MIN
    return int(v)


def _to_u64(v: float) -> int:
    """The branchless float -> uint64 sequence clang emits for x86-64 without AVX-512:
    both truncations, the second of `v - 2^63`, merged by the first's sign, so NaN, inf
    and values from 2^64 give 2^63 (as IREE's runtime does), not 0."""
    low = _cvtt64(v)
    return low | (_cvtt64(v - 9.223372036854775808e18) & (low >> 63))


def cast_f32_ui64(x):
    return _to_u64(_F32_UNARY["round"](x))


def cast_si64_f32(x: int) -> float:
    return _exact_int_to_f32(x)


def cast_ui64_f32(x: int) -> float:
    return _exact_int_to_f32(x & M64)


def _exact_int_to_f32(v: int) -> float:
    """Correctly rounded integer -> binary32 (round half to even), no double rounding."""
    if -(1 << 53) <= v <= (1 << 53):
        return round_f32(float(v))
    sign = -1.0 if v < 0 else 1.0
    a = -v if v < 0 else v
    shift = a.bit_length() - 24
    mant, rest = a >> shift, a & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and mant & 1):
        mant += 1
    return round_f32(sign * float(mant) * (2.0**shift))


def cast_f64_si32(x):
    return wrap32(_lroundf(x))


def cast_f64_ui32(x):
    return wrap32(_llroundf(x))


def cast_f64_si64(x):
    return _lround(x)


def cast_f64_ui64(x):
    return wrap64(_llround(x))


def nan_propagate(a: float, b: float, result: float) -> float:
    """The NaN x86 returns for a commutative op: the first NaN operand, quieted."""
    if a != a:
        return float(a) + 0.0
    if b != b:
        return float(b) + 0.0
    return result  # invalid operation: the hardware's default NaN


# ---------------------------------------------------------------------------
# Integer ops whose C semantics need care. IREE executes these with the host's
# divide instruction, which faults (SIGFPE, killing the process) on a zero divisor
# and on INT_MIN / -1; tinyhal traps with an error instead.


def _div_trap(what: str, a: int, b: int):
    return InvalidArgumentError(f"{what}: integer division fault ({a} / {b})")


def div_i32s(a: int, b: int) -> int:
    if b == 0 or (b == -1 and a == INT32_MIN):
        raise _div_trap("div.i32.s", a, b)
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def rem_i32s(a: int, b: int) -> int:
    if b == 0 or (b == -1 and a == INT32_MIN):
        raise _div_trap("rem.i32.s", a, b)
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def div_i32u(a: int, b: int) -> int:
    if b == 0:
        raise _div_trap("div.i32.u", a, b)
    return wrap32((a & M32) // (b & M32))


def rem_i32u(a: int, b: int) -> int:
    if b == 0:
        raise _div_trap("rem.i32.u", a, b)
    return wrap32((a & M32) % (b & M32))


def div_i64s(a: int, b: int) -> int:
    if b == 0 or (b == -1 and a == INT64_MIN):
        raise _div_trap("div.i64.s", a, b)
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def rem_i64s(a: int, b: int) -> int:
    if b == 0 or (b == -1 and a == INT64_MIN):
        raise _div_trap("rem.i64.s", a, b)
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def div_i64u(a: int, b: int) -> int:
    if b == 0:
        raise _div_trap("div.i64.u", a, b)
    return wrap64((a & M64) // (b & M64))


def rem_i64u(a: int, b: int) -> int:
    if b == 0:
        raise _div_trap("rem.i64.u", a, b)
    return wrap64((a & M64) % (b & M64))


# ---------------------------------------------------------------------------
# vm.buffer


def _buf(b, what: str) -> VMBuffer:
    if b is None:
        raise InvalidArgumentError(f"{what} is null")
    if b.__class__ is not VMBuffer:
        raise InvalidArgumentError(f"{what} is a {type(b).__name__}, not a vm.buffer")
    return b


def element_span(b: VMBuffer, index: int, size: int, what: str) -> tuple[memoryview, int]:
    """Where an element access outside `[0, len)` lands, by IREE's rule
    (`iree_vm_buffer_check_ro/rw`, `byte_pieces` with the index a u64): an index that
    wraps lands on the element it wraps to, one whose end wraps to 0 (-1 above all) on
    the `size` bytes before the data (`VMBuffer.head`). Returns the memory and the byte
    offset in it."""
    memory, start, _ = byte_pieces(b, index * size, size, what)[0]
    return memory, start


def _writable(b: VMBuffer) -> None:
    if not b.mutable:
        raise PermissionDeniedError("buffer is read-only and cannot be mapped for mutation")


def _make_load(fmt: str, size: int, name: str):
    unpack = struct.Struct("<" + fmt).unpack_from

    def load(b, index):
        b = _buf(b, "source_buffer")
        off = index * size
        if index < 0 or off + size > len(b.data):
            return unpack(*element_span(b, index, size, name))[0]
        return unpack(b.data, off)[0]

    load.__name__ = name.replace(".", "_")
    return load


buffer_load_i8u = _make_load("B", 1, "buffer.load.i8.u")
buffer_load_i8s = _make_load("b", 1, "buffer.load.i8.s")
buffer_load_i16u = _make_load("H", 2, "buffer.load.i16.u")
buffer_load_i16s = _make_load("h", 2, "buffer.load.i16.s")
buffer_load_i32 = _make_load("i", 4, "buffer.load.i32")
buffer_load_i64 = _make_load("q", 8, "buffer.load.i64")
buffer_load_f64 = _make_load("d", 8, "buffer.load.f64")
_unpack_f32 = struct.Struct("<f").unpack_from
_unpack_u32 = struct.Struct("<I").unpack_from


def buffer_load_f32(b, index):
    """One frame for the common value; a NaN, or a zero whose pattern is not a zero
    (a subnormal under denormals-are-zero), is made from its bits (`f32_from_bits`)."""
    if b.__class__ is not VMBuffer:
        _buf(b, "source_buffer")
    data = b.data
    off = index * 4
    if index < 0 or off + 4 > len(data):
        data, off = element_span(b, index, 4, "buffer.load.f32")
    value = _unpack_f32(data, off)[0]
    if value == value and (value or not _unpack_u32(data, off)[0] & 0x7FFFFFFF):
        return value
    return f32_from_bits(_unpack_u32(data, off)[0])


def _make_store(fmt: str, size: int, name: str, mask: int | None):
    pack = struct.Struct("<" + fmt).pack_into

    def store(b, index, value):
        b = _buf(b, "target_buffer")
        _writable(b)
        data = b.data
        off = index * size
        if index < 0 or off + size > len(data):
            data, off = element_span(b, index, size, name)
        pack(data, off, value & mask if mask is not None else value)

    store.__name__ = name.replace(".", "_")
    return store


buffer_store_i8 = _make_store("B", 1, "buffer.store.i8", 0xFF)
buffer_store_i16 = _make_store("H", 2, "buffer.store.i16", 0xFFFF)
buffer_store_i32 = _make_store("I", 4, "buffer.store.i32", M32)
buffer_store_i64 = _make_store("Q", 8, "buffer.store.i64", M64)
buffer_store_f64 = _make_store("d", 8, "buffer.store.f64", None)
_pack_f32 = struct.Struct("<f").pack_into
_pack_u32 = struct.Struct("<I").pack_into


def buffer_store_f32(b, index, value):
    """One frame; an `F32Bits` is stored as its bits."""
    if b.__class__ is not VMBuffer:
        _buf(b, "target_buffer")
    if not b.mutable:
        _writable(b)
    data = b.data
    off = index * 4
    if index < 0 or off + 4 > len(data):
        data, off = element_span(b, index, 4, "buffer.store.f32")
    if value.__class__ is F32Bits:
        _pack_u32(data, off, value.bits)
    else:
        _pack_f32(data, off, value)


def byte_pieces(b: VMBuffer, offset: int, length: int, what: str) -> list:
    """The memory IREE's byte range `[offset, offset + length)` of `b` covers, as
    `(memory, start, count)` pieces, by its rule (`iree_vm_buffer_map`): offset and
    length are u64s and the range fails with OUT_OF_RANGE only when its end, modulo 2^64,
    is past the buffer's, so a range that starts before the data and wraps into it also
    covers the bytes before it (`VMBuffer.head`). One that reaches further back than
    those, or is longer than 2^64 - 1 bytes (a fill's element count), fails here (IREE
    reads or writes memory that is not the buffer's)."""
    n = len(b.data)
    start, length = offset & M64, length & M64 if length < 0 else length
    end = (start + length) & M64
    before = (1 << 64) - start
    if end > n or length > M64 or (
            start + length > M64 and (b.head is None or before > len(b.head))):
        raise OutOfRangeError(
            f"{what}: out-of-bounds access detected (offset={start}, length={length}, "
            f"buffer length={n})"
        )
    if start + length <= M64:
        return [(b.data, start, length)]
    return [(b.head, len(b.head) - before, before), (b.data, 0, end)]


def _read(pieces: list) -> bytes:
    return b"".join(bytes(memory[start : start + count]) for memory, start, count in pieces)


def _write(pieces: list, data: bytes) -> None:
    at = 0
    for memory, start, count in pieces:
        memory[start : start + count] = data[at : at + count]
        at += count


def _fill(b, index, count, pattern: bytes, name: str):
    b = _buf(b, "buffer")
    size = len(pattern)
    _writable(b)
    start = index * size
    if index < 0 or count < 0 or start + count * size > len(b.data):
        pieces = byte_pieces(b, start, (count & M64) * size, name)
        _write(pieces, pattern * (sum(p[2] for p in pieces) // size))
    elif count:
        b.data[start : start + count * size] = pattern * count


def buffer_fill_i8(b, index, count, value):
    _fill(b, index, count, bytes((value & 0xFF,)), "buffer.fill.i8")


def buffer_fill_i16(b, index, count, value):
    _fill(b, index, count, struct.pack("<H", value & 0xFFFF), "buffer.fill.i16")


def buffer_fill_i32(b, index, count, value):
    _fill(b, index, count, struct.pack("<I", value & M32), "buffer.fill.i32")


def buffer_fill_i64(b, index, count, value):
    _fill(b, index, count, struct.pack("<Q", value & M64), "buffer.fill.i64")


def buffer_fill_f32(b, index, count, value):
    _fill(b, index, count, struct.pack("<I", f32_bits(value)), "buffer.fill.f32")


def buffer_fill_f64(b, index, count, value):
    _fill(b, index, count, struct.pack("<d", value), "buffer.fill.f64")


def buffer_alloc(length, alignment):
    return VMBuffer.allocate(length)


def buffer_clone(src, offset, length, alignment):
    src = _buf(src, "source")
    if src.mutable and src.head and any(src.head):
        # IREE keeps its buffer object's own state in a VM-allocated buffer's 8 bytes
        # before the data; clone reads it and crashes once a store or fill wrote there
        raise OutOfRangeError(
            "buffer.clone: the source's 8 bytes before its data were overwritten; IREE "
            "keeps its buffer's own state there")
    if offset < 0 or length < 0 or offset + length > len(src.data):
        data = _read(byte_pieces(src, offset, length, "buffer.clone"))
        out = VMBuffer.allocate(len(data))
        out.data[:] = data
        return out
    out = VMBuffer.allocate(length)
    out.data[:] = src.data[offset : offset + length]
    return out


def buffer_length(b):
    return len(_buf(b, "buffer").data)


def _in_range(b: VMBuffer, offset: int, length: int) -> bool:
    return offset >= 0 and length >= 0 and offset + length <= len(b.data)


def buffer_copy(src, src_off, dst, dst_off, length):
    src = _buf(src, "source_buffer")
    dst = _buf(dst, "target_buffer")
    if not (_in_range(src, src_off, length) and _in_range(dst, dst_off, length)):
        data = _read(byte_pieces(src, src_off, length, "buffer.copy source"))
        _writable(dst)
        _write(byte_pieces(dst, dst_off, length, "buffer.copy target"), data)
        return
    _writable(dst)
    dst.data[dst_off : dst_off + length] = src.data[src_off : src_off + length].tobytes()


def buffer_compare(lhs, lhs_off, rhs, rhs_off, length):
    lhs = _buf(lhs, "lhs_buffer")
    rhs = _buf(rhs, "rhs_buffer")
    if not (_in_range(lhs, lhs_off, length) and _in_range(rhs, rhs_off, length)):
        left = _read(byte_pieces(lhs, lhs_off, length, "buffer.compare lhs"))
        return 1 if left == _read(byte_pieces(rhs, rhs_off, length, "buffer.compare rhs")) else 0
    return 1 if lhs.data[lhs_off : lhs_off + length] == rhs.data[rhs_off : rhs_off + length] else 0


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & M64


def _sipround(v0, v1, v2, v3):
    v0 = (v0 + v1) & M64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & M64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & M64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & M64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def buffer_hash(b, offset, length):
    """SipHash-2-4 with key 00..0f, as IREE's vm.buffer.hash."""
    b = _buf(b, "source_buffer")
    data = _read(byte_pieces(b, offset, length, "buffer.hash"))
    v0 = 0x736F6D6570736575 ^ 0x0706050403020100
    v1 = 0x646F72616E646F6D ^ 0x0F0E0D0C0B0A0908
    v2 = 0x6C7967656E657261 ^ 0x0706050403020100
    v3 = 0x7465646279746573 ^ 0x0F0E0D0C0B0A0908
    full = length - (length % 8)
    for i in range(0, full, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        for _ in range(2):
            v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
    tail = int.from_bytes(data[full:], "little")
    h = ((length << 56) & M64) | tail
    v3 ^= h
    for _ in range(2):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= h
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return wrap64(v0 ^ v1 ^ v2 ^ v3)


# ---------------------------------------------------------------------------
# vm.list


def _list(lst) -> VMList:
    if lst is None:
        raise InvalidArgumentError("list is null")
    if lst.__class__ is not VMList:
        raise InvalidArgumentError(f"list is a {type(lst).__name__}, not a vm.list")
    return lst


def list_alloc(element_type: str, capacity: int):
    if capacity < 0:
        capacity &= M32
    return VMList(element_type, capacity)


def list_reserve(lst, capacity):
    _list(lst).reserve(capacity & M32)


def list_size(lst):
    return len(_list(lst).items)


def list_resize(lst, size):
    _list(lst).resize(size & M32)


def list_get_i32(lst, index):
    return wrap32(_list(lst).get_value_as(index & M32, "i32"))


def list_get_i64(lst, index):
    return wrap64(_list(lst).get_value_as(index & M32, "i64"))


def list_get_f32(lst, index):
    return _list(lst).get_value_as(index & M32, "f32")


def list_get_f64(lst, index):
    return _list(lst).get_value_as(index & M32, "f64")


def list_set_i32(lst, index, value):
    _list(lst).set_value(index & M32, value, "i32")


def list_set_i64(lst, index, value):
    _list(lst).set_value(index & M32, value, "i64")


def list_set_f32(lst, index, value):
    _list(lst).set_value(index & M32, value, "f32")


def list_set_f64(lst, index, value):
    _list(lst).set_value(index & M32, value, "f64")


def list_get_ref(lst, index, expected_type, move):
    obj = _list(lst).get_ref(index & M32, move)
    if obj is not None and (
        expected_type in VALUE_TYPES or expected_type == VARIANT
        or not ref_type_matches(obj, expected_type)
    ):
        return None  # IREE puts null in the register unless the types are the same,
        # and no element's type is the opaque `!vm.ref<?>`
    return obj


def list_set_ref(lst, index, obj):
    _list(lst).set_ref(index & M32, obj)


# ---------------------------------------------------------------------------
# Refs, globals and failures


_REF_CLASSES: dict[str | None, set[type]] = {}


def ref_classes(expected: str | None) -> set[type]:
    """The classes of objects `check_ref_class` has accepted for ref type `expected`,
    one set per type shared by every program: whether a ref may be held where a type is
    declared depends on its class alone (see `types.ref_type_matches`)."""
    return _REF_CLASSES.setdefault(expected, set())


def check_ref_class(obj, expected: str | None, what: str, accepted: set[type]) -> None:
    """`check_ref_type` of `obj`, then `obj`'s class added to `accepted` (the set
    `ref_classes(expected)`), so generated code checks that class by a set lookup."""
    check_ref_type(obj, expected, what)
    accepted.add(obj.__class__)


def check_ref_type(obj, expected: str | None, what: str):
    """`obj` if a ref of type `expected` may hold it (see `types.ref_type_matches`)."""
    if obj is None:
        return obj
    name = getattr(type(obj), "type_name", None)
    if name == expected or not isinstance(name, str):
        return obj  # the common cases (and native objects, never checked), without a call
    if not ref_type_matches(obj, expected):
        raise InvalidArgumentError(
            f"{what}: ref type mismatch: have {type(obj).__name__}, expected {expected}"
        )
    return obj


def global_ref_index(index: int, count: int) -> int:
    u = index & M32
    if u >= count:
        raise OutOfRangeError(f"global ref ordinal out of range: {index} (table={count})")
    return u


def global_offset(offset: int, width: int, capacity: int) -> int:
    u = offset & M32
    if u + width > capacity:
        raise OutOfRangeError(f"global byte_offset out of range: {offset} (rwdata={capacity})")
    return u


def fail(status_code: int, message: bytes):
    """Builds the error `vm.fail` raises (code as IREE's status codes)."""
    text = message.decode("utf-8", "replace")
    return error_for_code(status_code & M32, text)


UNSET = object()  # no call remembered yet at a pure import's call site


def remember_call(site: list, bits: int, fn, *args):
    """Calls a pure import (`hal.executable.lookup.function`) and remembers its
    arguments and result at the call site, which reuses the result while it is called
    with the same refs (by identity) again. An integer result is kept wrapped to the
    `bits` of its register (0: a ref, kept as it is), so a reuse is one read."""
    result = fn(*args)
    if bits == 64:
        result = wrap64(result)
    elif bits == 32:
        result = wrap32(result)
    site[:] = [*args, result]
    return result


def null_import(name: str, ordinal: int):
    def missing(*_args):
        raise NotFoundError(f"optional import `{name}` (ordinal {ordinal}) not resolved")

    return missing


__all__ = [n for n in dir() if not n.startswith("_")] + ["VARIANT"]
