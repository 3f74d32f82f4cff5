"""VMVX executables: IREE's portable executable format, run by tinyhal's own VM.

`iree-compile --iree-hal-local-target-device-backends=vmvx` emits executables in format
`vmvx-bytecode-fb`: each is a VM bytecode module (a `.vmfb` of its own) whose exports are
the dispatch functions, calling convention `0rrriiiiiiiii_v`: local memory, constants and
a list of binding buffers (`!vm.buffer`s), then the workgroup id, size and count (x, y,
z). The code is VM bytecode over the `vmvx` module's operations (with
`--iree-vmvx-enable-microkernels`: 2-D elementwise ops, copies, fills, `mmt4d`, `pack`,
`unpack`), and without microkernels plain VM loops; there is no machine code, which is
why a device whose executable policy is `"portable"` still loads it.

`VMVXExecutable` is an `Executable` to the HAL: each export has a C dispatch function of
IREE's ABI, so the native workgroup loop, streams and every driver (`sync`, `task`, `emu`)
run it as they run a library, and a failure fails the dispatch with its VM error. An
export made of scalar VM code (plain loops of loads, stores and f32/integer arithmetic:
what VMVX emits without microkernels, and around them) and calls of the `vmvx`
operations runs in the C interpreter of `vm.scalar`, which has those operations too: the
dispatch function is the interpreter itself, each workgroup one C call with no Python,
on the task driver from several threads at once. An export using what the interpreter
lacks is decided at load to stay Python: its dispatch function is a cffi callback
calling the export's translation for one workgroup, with the `vmvx` operations below as
numpy over strided views of the bindings, never a Python loop over elements. Where a
native run stops at a VM error, the workgroup runs again in Python, whose error the
dispatch reports, so both paths fail alike.

The `vmvx` module (`VMVX_EXPORTS`, one row per export as in IREE's `exports.inl`) maps
each 2-D operand as IREE does: offset and strides in elements, every byte it reaches
inside the buffer (OUT_OF_RANGE otherwise), writable for outputs. Integer operations follow the host's C semantics (wrapping;
shift counts taken modulo 32; a zero divisor, or INT_MIN / -1, is an error where the C
kernel would fault). `exp` and `log` call the C library's `expf` and `logf` over the
whole operand in C (`tinyhal.vm.mathlib`), so they give IREE's bits. f32 `mmt4d` sums
over k in IREE's order; where IREE's x86-64 microkernels have a tile function for the
tile shape on this CPU (those use fused multiply-adds) it fuses too, in C, otherwise it
multiplies and adds with a rounding each, as IREE's generic tile; `query_tile_sizes.2d`
answers what IREE's microkernels answer on this host, so the tiles agree.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import (
    Error,
    InvalidArgumentError,
    OutOfRangeError,
    PermissionDeniedError,
)
from ..hal.cpu import cpu_feature
from ..hal.executable import Executable, ExportInfo
from ..hal.native import ffi
from . import scalar
from .context import Context
from .loader import load_module
from .native import NativeModule
from .native_table import Export, build_module
from .types import MAX_ALLOCATION_BYTES, VMBuffer, VMList
from .vmvx_format import VMVX_FORMAT

__all__ = ["VMVX_EXPORTS", "VMVX_FORMAT", "VMVXExecutable", "create_vmvx_module"]

ENTRY_CCONV = "0rrriiiiiiiii_v"
VMVX_MODULE_VERSION = 0

# -- operand mapping -----------------------------------------------------------------


def _view(buffer: Any, dtype: Any, offset: int, stride0: int, stride1: int, size0: int,
          size1: int, what: str, writable: bool = False) -> np.ndarray:
    """The (size0, size1) strided view of `buffer` IREE's `vmvx` module maps, checked as
    IREE checks it. An output must also fit its buffer without overlapping itself
    (compiled code never writes one element twice): that bounds every operation's work
    and temporaries by the bytes the program really has, so bytecode that is not
    trusted cannot make an operation allocate without bound."""
    if not isinstance(buffer, VMBuffer):
        raise InvalidArgumentError(f"vmvx {what}: expected a !vm.buffer, got "
                                   f"{type(buffer).__name__}")
    itemsize = (dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)).itemsize
    if min(offset, stride0, stride1, size0, size1) < 0 or max(
            size0, size1, stride0 + 1, stride1 + 1) >= 1 << 32:
        raise InvalidArgumentError(f"buffer overflow for {what}")
    if writable and not buffer.mutable:
        raise PermissionDeniedError(f"vmvx {what}: the buffer is read-only")
    start = offset * itemsize
    if size0 == 0 or size1 == 0:
        return np.empty((size0, size1), dtype)
    end = start + ((size0 - 1) * stride0 + (size1 - 1) * stride1 + 1) * itemsize
    length = len(buffer.data)
    if end > length:
        raise OutOfRangeError(
            f"vmvx {what}: range [{start}, {end}) is out of bounds of the {length}-byte "
            "buffer")
    if writable and size0 * size1 * itemsize > length:
        raise InvalidArgumentError(
            f"vmvx {what}: {size0}x{size1} elements cannot fit the {length}-byte buffer "
            "without overlapping")
    return np.ndarray((size0, size1), dtype, buffer.data, start,
                      (stride0 * itemsize, stride1 * itemsize))


def _tiled(buffer: Any, dtype: Any, offset: int, row_stride: int, rows: int,
           shape: tuple[int, ...], what: str, writable: bool = False) -> np.ndarray:
    """`rows` rows of `row_stride` elements, each holding a contiguous block of
    `shape`: a (rows, *shape) view (mmt4d, pack and unpack operands)."""
    if min(shape) < 0:
        raise InvalidArgumentError(f"buffer overflow for {what}")
    inner = math.prod(shape)
    flat = _view(buffer, dtype, offset, row_stride, 1, rows, inner, what, writable)
    itemsize = flat.itemsize
    strides = [itemsize] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return np.lib.stride_tricks.as_strided(flat, (rows, *shape),
                                           (row_stride * itemsize, *strides),
                                           writeable=writable)


# -- elementwise -------------------------------------------------------------------------


def _shift_count(rhs: np.ndarray) -> np.ndarray:
    return rhs & np.uint32(31)  # x86 shifts take the count modulo 32


def _div_signed(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    a, b = lhs.view(np.int32).astype(np.int64), rhs.view(np.int32).astype(np.int64)
    if not b.all() or ((a == -(1 << 31)) & (b == -1)).any():
        raise InvalidArgumentError("vmvx divs.2d.i32: integer division fault (a zero "
                                   "divisor or INT_MIN / -1)")
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q).astype(np.int32).view(np.uint32)


def _div_unsigned(lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    if not rhs.all():
        raise InvalidArgumentError("vmvx divu.2d.i32: integer division fault (a zero "
                                   "divisor)")
    return lhs // rhs


_F = np.dtype(np.float32)
_U = np.dtype(np.uint32)
# name -> (element view, function of the two operand views)
_BINARY: dict[str, tuple[Any, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add.2d.f32": (_F, np.add),
    "sub.2d.f32": (_F, np.subtract),
    "mul.2d.f32": (_F, np.multiply),
    "div.2d.f32": (_F, np.divide),
    "add.2d.i32": (_U, np.add),
    "sub.2d.i32": (_U, np.subtract),
    "mul.2d.i32": (_U, np.multiply),
    "and.2d.i32": (_U, np.bitwise_and),
    "or.2d.i32": (_U, np.bitwise_or),
    "xor.2d.i32": (_U, np.bitwise_xor),
    "shl.2d.i32": (_U, lambda a, b: a << _shift_count(b)),
    "shru.2d.i32": (_U, lambda a, b: a >> _shift_count(b)),
    "shrs.2d.i32": (_U, lambda a, b: (a.view(np.int32) >> _shift_count(b).view(np.int32)
                                      ).view(np.uint32)),
    "divs.2d.i32": (_U, _div_signed),
    "divu.2d.i32": (_U, _div_unsigned),
}


def _expf(x: np.ndarray) -> np.ndarray:
    from .mathlib import expf  # its C module loads when a program first needs it

    return expf(x)


def _logf(x: np.ndarray) -> np.ndarray:
    from .mathlib import logf

    return logf(x)


def _ctlz(x: np.ndarray) -> np.ndarray:
    _, exponent = np.frexp(x.astype(np.float64))
    return np.where(x == 0, 32, 32 - exponent).astype(np.uint32)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / np.sqrt(x)


_UNARY: dict[str, tuple[Any, Callable[[np.ndarray], np.ndarray]]] = {
    "abs.2d.f32": (_F, np.abs),
    "neg.2d.f32": (_F, np.negative),
    "ceil.2d.f32": (_F, np.ceil),
    "floor.2d.f32": (_F, np.floor),
    "exp.2d.f32": (_F, _expf),
    "log.2d.f32": (_F, _logf),
    "rsqrt.2d.f32": (_F, _rsqrt),
    "ctlz.2d.i32": (_U, _ctlz),
}


def _binary(name: str, dtype: Any, fn: Callable) -> Callable[..., None]:
    def op(state: Any, lhs, lhs_offset, lhs_stride0, lhs_stride1, rhs, rhs_offset,
           rhs_stride0, rhs_stride1, out, out_offset, out_stride0, out_stride1, size0,
           size1) -> None:
        a = _view(lhs, dtype, lhs_offset, lhs_stride0, lhs_stride1, size0, size1, "lhs")
        b = _view(rhs, dtype, rhs_offset, rhs_stride0, rhs_stride1, size0, size1, "rhs")
        o = _view(out, dtype, out_offset, out_stride0, out_stride1, size0, size1, "out",
                  True)
        o[...] = fn(a, b)

    op.__name__ = name.replace(".", "_")
    return op


def _unary(name: str, dtype: Any, fn: Callable) -> Callable[..., None]:
    def op(state: Any, src, in_offset, in_stride0, in_stride1, out, out_offset,
           out_stride0, out_stride1, size0, size1) -> None:
        a = _view(src, dtype, in_offset, in_stride0, in_stride1, size0, size1, "in")
        o = _view(out, dtype, out_offset, out_stride0, out_stride1, size0, size1, "out",
                  True)
        o[...] = fn(a)

    op.__name__ = name.replace(".", "_")
    return op


def _copy(dtype: Any) -> Callable[..., None]:
    return _unary(f"copy.2d.x{np.dtype(dtype).itemsize * 8}", dtype, lambda a: a)


def fill_2d_x32(state: Any, value: int, out, out_offset: int, out_row_stride: int,
                size0: int, size1: int) -> None:
    o = _view(out, np.uint32, out_offset, out_row_stride, 1, size0, size1, "out", True)
    o[...] = value & 0xFFFFFFFF


# -- mmt4d, pack, unpack -----------------------------------------------------------------

_MMT4D_ACCUMULATE = 0x100
_MMT4D_TYPES = {0x01: (np.float32, np.float32), 0x02: (np.int8, np.int32)}
_PACK_TYPES = {0x01: np.uint32, 0x02: np.uint8, 0x03: np.uint32}
_UNPACK_TYPES = {0x01: np.uint32, 0x03: np.uint32}
_TRANSPOSE_INNER = 0x100
_TRANSPOSE_OUTER = 0x200


def mmt4d(state: Any, lhs, lhs_offset: int, lhs_row_stride: int, rhs, rhs_offset: int,
          rhs_row_stride: int, out, out_offset: int, out_row_stride: int, m: int, n: int,
          k: int, m0: int, n0: int, k0: int, flags: int) -> None:
    types = _MMT4D_TYPES.get(flags & 0xFF)
    if types is None:
        raise InvalidArgumentError(f"vmvx mmt4d: unhandled flags 0x{flags & 0xFFFFFFFF:x}")
    if min(m0, n0, k0) < 0:
        raise InvalidArgumentError("buffer overflow for mmt4d tile sizes")
    in_type, out_type = types
    a = _tiled(lhs, in_type, lhs_offset, lhs_row_stride, m, (k, m0, k0), "lhs")
    b = _tiled(rhs, in_type, rhs_offset, rhs_row_stride, n, (k, n0, k0), "rhs")
    o = _tiled(out, out_type, out_offset, out_row_stride, m, (n, m0, n0), "out", True)
    accumulate = bool(flags & _MMT4D_ACCUMULATE)
    if out_type is np.float32 and _fused_f32_tile(m0, n0, k0):
        if min(m, n) > 0:
            from .mathlib import mmt4d_f32_fma

            mmt4d_f32_fma(a, b, o, accumulate)
        return
    # The generic tile: a multiply and an add per (k, k0) in order over all (m, n, m0, n0) at once, so
    # temporaries stay the output's size: for f32 each rounded (IREE's kernels do not
    # fuse them), for s8 x s8 -> s32 wrapping, in any order the same bits.
    acc = o.astype(out_type) if accumulate else np.zeros(o.shape, out_type)
    with np.errstate(all="ignore"):
        for kk in range(k):
            for kk0 in range(k0):
                acc += (a[:, None, kk, :, None, kk0].astype(out_type, copy=False)
                        * b[None, :, kk, None, :, kk0].astype(out_type, copy=False))
    o[...] = acc


def _padding(dtype: Any, padding_value: int) -> Any:
    bits = np.dtype(dtype).itemsize * 8
    return np.array(padding_value & ((1 << bits) - 1)).astype(dtype)


def pack(state: Any, src, in_offset: int, in_stride0: int, in_stride1: int, out,
         out_offset: int, out_stride0: int, out_stride1: int, in_size0: int, in_size1: int,
         out_size0: int, out_size1: int, out_size2: int, out_size3: int,
         padding_value: int, flags: int) -> None:
    dtype = _PACK_TYPES.get(flags & 0xFF)
    if dtype is None:
        raise InvalidArgumentError(f"vmvx pack: unhandled flags 0x{flags & 0xFFFFFFFF:x}")
    if min(out_size0, out_size1, out_size2, out_size3) == 0:
        return
    source = _view(src, dtype, in_offset, in_stride0, in_stride1, in_size0, in_size1, "in")
    o = _tiled(out, dtype, out_offset, out_stride0, out_size0,
               (out_size1, out_size2, out_size3), "out", True)
    outer0, outer1 = ((out_size1, out_size0) if flags & _TRANSPOSE_OUTER
                      else (out_size0, out_size1))
    tile0, tile1 = ((out_size3, out_size2) if flags & _TRANSPOSE_INNER
                    else (out_size2, out_size3))
    if outer0 * tile0 < in_size0 or outer1 * tile1 < in_size1:
        raise InvalidArgumentError(
            f"vmvx pack: {outer0}x{outer1} tiles of {tile0}x{tile1} cannot hold the "
            f"{in_size0}x{in_size1} source")
    padded = np.full((outer0 * tile0, outer1 * tile1), _padding(dtype, padding_value), dtype)
    padded[:in_size0, :in_size1] = source
    tiles = padded.reshape(outer0, tile0, outer1, tile1).transpose(0, 2, 1, 3)
    if flags & _TRANSPOSE_OUTER:
        tiles = tiles.transpose(1, 0, 2, 3)
    if flags & _TRANSPOSE_INNER:
        tiles = tiles.transpose(0, 1, 3, 2)
    o[...] = tiles


def unpack(state: Any, src, in_offset: int, in_stride0: int, in_stride1: int, out,
           out_offset: int, out_stride0: int, out_stride1: int, in_size0: int,
           in_size1: int, in_size2: int, in_size3: int, out_size0: int, out_size1: int,
           flags: int) -> None:
    dtype = _UNPACK_TYPES.get(flags & 0xFF)
    if dtype is None:
        raise InvalidArgumentError(
            f"vmvx unpack: unhandled flags 0x{flags & 0xFFFFFFFF:x}")
    o = _view(out, dtype, out_offset, out_stride0, out_stride1, out_size0, out_size1, "out",
              True)
    if min(in_size0, in_size1, in_size2, in_size3) == 0:
        return
    tiles = _tiled(src, dtype, in_offset, in_stride0, in_size0,
                   (in_size1, in_size2, in_size3), "in")
    if flags & _TRANSPOSE_INNER:
        tiles = tiles.transpose(0, 1, 3, 2)
    if flags & _TRANSPOSE_OUTER:
        tiles = tiles.transpose(1, 0, 2, 3)
    outer0, outer1, tile0, tile1 = tiles.shape
    if outer0 * tile0 < out_size0 or outer1 * tile1 < out_size1:
        raise InvalidArgumentError(
            f"vmvx unpack: {outer0}x{outer1} tiles of {tile0}x{tile1} cannot fill the "
            f"{out_size0}x{out_size1} result")
    outer0, outer1 = -(-out_size0 // tile0), -(-out_size1 // tile1)  # the tiles it reads
    whole = tiles[:outer0, :outer1].transpose(0, 2, 1, 3).reshape(outer0 * tile0,
                                                                  outer1 * tile1)
    o[...] = whole[:out_size0, :out_size1]


_QUERY_ROLES = {0x01: (0, 1), 0x02: (2, 1), 0x03: (0, 2)}  # lhs (M, K), rhs (N, K), result
_QUERY_MATMUL_F32 = 0x0100
_QUERY_MATMUL_I8 = 0x0200


def _x86_64_features() -> tuple[bool, bool, bool]:
    """(avx2+fma+f16c, and avx512 f/bw/dq/vl/cd, and avx512 vnni) on this host, as IREE's
    runtime reports them: what IREE's x86-64 microkernels select their tiles by."""
    avx2 = all(cpu_feature(f) for f in ("avx2", "fma", "f16c"))
    avx512 = avx2 and all(cpu_feature(f) for f in
                          ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"))
    return avx2, avx512, avx512 and bool(cpu_feature("avx512vnni"))


def _matmul_tile(operation: int) -> tuple[int, int, int]:
    """(M0, K0, N0) IREE's microkernels choose for a matmul on this host (x86-64; the
    generic 8x4x8 elsewhere)."""
    avx2, avx512, vnni = _x86_64_features()
    if platform.machine() not in ("x86_64", "AMD64"):
        return 8, 4, 8
    if operation == _QUERY_MATMUL_F32:
        return (16, 1, 16) if avx512 else (8, 1, 8) if avx2 else (8, 1, 4)
    if operation == _QUERY_MATMUL_I8:
        return (16, 2, 16) if vnni else (8, 2, 8) if avx2 else (8, 2, 4)
    return 8, 4, 8


def query_tile_sizes_2d(state: Any, size0: int, size1: int, flags: int) -> tuple[int, int]:
    """The tile sizes of one matmul operand (`flags`: operation and operand role), as
    IREE's microkernels answer on this host: they decide which tile function `mmt4d`
    runs, and so (for f32) whether it fuses its multiply-adds."""
    role = _QUERY_ROLES.get(flags & 0xFF)
    if role is None or not flags & 0xFF00:
        raise InvalidArgumentError(
            f"vmvx query_tile_sizes.2d: flags 0x{flags & 0xFFFFFFFF:x} name no matmul "
            "operand")
    tile = _matmul_tile(flags & 0xFF00)
    return tile[role[0]], tile[role[1]]


def _fused_f32_tile(m0: int, n0: int, k0: int) -> bool:
    """Whether IREE's x86-64 microkernels have an f32 tile function for (m0, n0, k0) on
    this host; those use fused multiply-adds, the generic one does not."""
    avx2, avx512, _ = _x86_64_features()
    if k0 != 1:
        return False
    return ((avx512 and n0 == 16 and m0 in (1, 2, 4, 8, 16))
            or (avx2 and n0 == 8 and m0 in (1, 2, 4, 8)))


_X32B = "0rIIIrIIIrIIIII_v"
_X32U = "0rIIIrIIIII_v"
_REFS_X32B = ("vm.buffer", None, None, None) * 3 + (None, None)
_REFS_X32U = ("vm.buffer", None, None, None) * 2 + (None, None)

VMVX_EXPORTS: tuple[Export, ...] = tuple(sorted(
    [Export(name, _X32B, _REFS_X32B, _binary(name, dtype, fn))
     for name, (dtype, fn) in _BINARY.items()]
    + [Export(name, _X32U, _REFS_X32U, _unary(name, dtype, fn))
       for name, (dtype, fn) in _UNARY.items()]
    + [Export(f"copy.2d.x{bits}", _X32U, _REFS_X32U, _copy(dtype))
       for bits, dtype in ((8, np.uint8), (16, np.uint16), (32, np.uint32),
                           (64, np.uint64))]
    + [Export("fill.2d.x32", "0irIIII_v", (None, "vm.buffer", None, None, None, None),
              fill_2d_x32),
       Export("mmt4d", "0rIIrIIrIIIIIiiii_v",
              ("vm.buffer", None, None) * 3 + (None,) * 7, mmt4d),
       Export("pack", "0rIIIrIIIIIIIIIIi_v",
              ("vm.buffer", None, None, None) * 2 + (None,) * 8, pack),
       Export("unpack", "0rIIIrIIIIIIIIIi_v",
              ("vm.buffer", None, None, None) * 2 + (None,) * 7, unpack),
       Export("query_tile_sizes.2d", "0IIi_II", (None, None, None), query_tile_sizes_2d)],
    key=lambda e: e.name))


def create_vmvx_module() -> NativeModule:
    """The `vmvx` module (version 0); it keeps no state."""
    return build_module("vmvx", VMVX_MODULE_VERSION, VMVX_EXPORTS, None,
                        {"vm.buffer": VMBuffer})


# -- the executable ----------------------------------------------------------------------

_DISPATCH_FN = ffi.typeof("tinyhal_dispatch_fn_t")
_EMPTY = VMBuffer(b"")


def _attribute(reflection: dict[str, str], key: str) -> int:
    try:
        return int(reflection.get(key, "0"))
    except ValueError:
        return 0


class VMVXExecutable(Executable):
    """A `vmvx-bytecode-fb` executable: its bytecode module linked with the `vmvx`
    module in a context of its own, each export a C-callable dispatch function."""

    def __init__(self, data: bytes, name: str = "") -> None:
        from _blake2 import blake2b

        data = bytes(data)
        self.name = name
        self.digest = blake2b(data, digest_size=32).hexdigest()
        self.format = VMVX_FORMAT
        self._what = f"executable {name!r}" if name else f"executable {self.digest[:12]}"
        self._regions: list[tuple[int, int, int]] = []
        try:
            module = load_module(data)
        except Error as exc:
            raise exc.with_context(f"VMVX {self._what}") from exc
        self._module = module
        exports: list[ExportInfo] = []
        for ordinal, export in enumerate(module.exports.values()):
            if export.cconv.text != ENTRY_CCONV:
                raise InvalidArgumentError(
                    f"VMVX {self._what}: export {export.name!r} has calling convention "
                    f"{export.cconv.text!r}, not {ENTRY_CCONV!r} (an ABI version mismatch?)")
            reflection = export.reflection
            exports.append(ExportInfo(
                ordinal, export.name, (1, 1, 1), _attribute(reflection, "constant_count"),
                _attribute(reflection, "binding_count"),
                _attribute(reflection, "local_memory"), 0, ""))
        self.exports = exports
        self.export_names = [e.name for e in exports]
        self._by_name = {e.name: e.ordinal for e in exports}
        self._templates: dict = {}
        self._context = Context([create_vmvx_module(), module])
        instance = self._context.instances[-1]
        functions = [instance.function(name) for name in self.export_names]
        for function in functions:
            if function.is_generator:
                raise InvalidArgumentError(
                    f"VMVX {self._what}: export {function.name!r} may yield, which a "
                    "dispatch function cannot")
        self._functions = [function.callable for function in functions]
        self._environment = ffi.new("tinyhal_environment_t*")
        self._callbacks: dict[Any, Any] = {}
        self._bindings: dict[tuple, VMList] = {}
        self._last_failure = ""
        self._entries = self._native_entries(module)

    def _native_entries(self, module: Any) -> dict[int, scalar.WorkgroupEntry]:
        """The exports the C interpreter runs, by ordinal (see the module docstring)."""
        programs = module.program.native_entries if scalar.enabled() else {}
        rodata = [buffer.data for buffer in module.rodata]
        avx2, avx512, _ = _x86_64_features()
        fused_tiles = int(avx2) | int(avx512) << 1  # as `_fused_f32_tile` reads them
        matmul_tiles = [size for operation in (_QUERY_MATMUL_F32, _QUERY_MATMUL_I8, 0xFF00)
                        for size in _matmul_tile(operation)]  # as query_tile_sizes_2d
        entries = {}
        for ordinal, name in enumerate(self.export_names):
            program = programs.get(module.exports[name].internal_ordinal)
            if program is None:
                continue
            on_trap = self._callbacks[("trap", ordinal)] = ffi.callback(
                _DISPATCH_FN, self._trap_runner(ordinal))
            entries[ordinal] = scalar.WorkgroupEntry(
                program, rodata, MAX_ALLOCATION_BYTES, fused_tiles, matmul_tiles,
                int(ffi.cast("uintptr_t", on_trap)), self._interrupted(name))
        return entries

    @property
    def native_exports(self) -> list[str]:
        """The names of the exports the C interpreter runs."""
        return [self.export_names[ordinal] for ordinal in sorted(self._entries)]

    def __repr__(self) -> str:
        return f"<VMVXExecutable {self.name or self.digest[:12]} {self.export_names}>"

    def describe_address(self, address: int) -> str:
        return f"pc 0x{address:x} (outside the executable: {self._what} is VM bytecode)"

    def dispatch_function(self, ordinal: int) -> Any:
        entry = self._entries.get(ordinal)
        if entry is not None:
            return ffi.cast(_DISPATCH_FN, entry.function_address)
        callback = self._callbacks.get(ordinal)
        if callback is None:
            callback = self._callbacks[ordinal] = ffi.callback(
                _DISPATCH_FN, self._workgroup_runner(ordinal))
        return callback

    def dispatch_environment(self, ordinal: int) -> Any:
        entry = self._entries.get(ordinal)
        if entry is None:
            return self._environment
        return ffi.cast("tinyhal_environment_t*", entry.environment_address)

    def failure_detail(self) -> str:
        return self._last_failure

    def _binding_list(self, state: Any) -> VMList:
        count = state.binding_count
        key = tuple(int(ffi.cast("uintptr_t", state.binding_ptrs[i])) for i in range(count)
                    ) + tuple(state.binding_lengths[i] for i in range(count))
        found = self._bindings.get(key)
        if found is None:
            found = VMList("vm.buffer")
            for i in range(count):
                length = state.binding_lengths[i]
                data = (ffi.buffer(state.binding_ptrs[i], length) if length else
                        bytearray())
                found.append(VMBuffer(memoryview(data), True))
            if len(self._bindings) >= 64:
                self._bindings.clear()
            self._bindings[key] = found
        return found

    def _workgroup_runner(self, ordinal: int) -> Callable[[Any, Any, Any], int]:
        function = self._functions[ordinal]
        name = self.export_names[ordinal]

        def run(environment: Any, state: Any, workgroup: Any) -> int:
            try:
                with np.errstate(all="ignore"):  # IEEE results, as C gives them
                    self._run_workgroup(function, state, workgroup)
                return 0
            except BaseException as exc:  # noqa: BLE001 - reported as the dispatch's status
                error = exc if isinstance(exc, Error) else None
                message = error.message if error is not None else f"{type(exc).__name__}: {exc}"
                self._last_failure = f"{name}: {message}"
                code = int(error.code) if error is not None else 13  # INTERNAL
                return code if 0 < code < 32 else 13

        return run

    def _trap_runner(self, ordinal: int) -> Callable[[Any, Any, Any], int]:
        """A workgroup the native run stopped at a VM error, run again by the export's
        Python translation, whose error the dispatch reports; should that run not fail,
        the disagreement fails the dispatch (never a silent result)."""
        run = self._workgroup_runner(ordinal)
        name = self.export_names[ordinal]

        def rerun(environment: Any, state: Any, workgroup: Any) -> int:
            status = run(environment, state, workgroup)
            if status == 0:
                self._last_failure = (f"{name}: the native run stopped at a VM error the "
                                      "Python run did not raise (a tinyhal bug)")
                return 13  # INTERNAL
            return status

        return rerun

    def _interrupted(self, name: str) -> Callable[[BaseException], None]:
        def interrupted(exc: BaseException) -> None:
            self._last_failure = f"{name}: {type(exc).__name__}: {exc}"

        return interrupted

    def _run_workgroup(self, function: Callable[..., Any], state: Any, workgroup: Any
                       ) -> None:
        """One workgroup: the export called as IREE's VMVX loader calls it."""
        constants = (VMBuffer(ffi.buffer(state.constants, 4 * state.constant_count), False)
                     if state.constant_count else _EMPTY)
        local = (VMBuffer(ffi.buffer(workgroup.local_memory, workgroup.local_memory_size),
                          True) if workgroup.local_memory_size else _EMPTY)
        function(local, constants, self._binding_list(state), workgroup.workgroup_id_x,
                 workgroup.workgroup_id_y, workgroup.workgroup_id_z, state.workgroup_size_x,
                 state.workgroup_size_y, state.workgroup_size_z, state.workgroup_count_x,
                 state.workgroup_count_y, state.workgroup_count_z)

    def close(self) -> None:
        self._callbacks = {}
        self._bindings = {}
        self._entries = {}
