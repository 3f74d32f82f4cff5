"""The C library's `expf` and `logf` over float32 arrays, and f32 `mmt4d` with fused
multiply-adds (see `mathlib.c`): the bits IREE's `vmvx` kernels produce, one C call per
operation rather than a Python call per element. The C code runs without the GIL."""

from __future__ import annotations

import numpy as np

from ...hal.native import load_compiled

_module = load_compiled(__name__ + "._mathlib", __name__ + ".build")
_ffi = _module.ffi
_lib = _module.lib

__all__ = ["expf", "logf", "mmt4d_f32_fma"]


def _apply(function, x: np.ndarray) -> np.ndarray:
    source = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(source)
    function(_ffi.from_buffer("float[]", source), _ffi.from_buffer("float[]", out),
             source.size)
    return out


def expf(x: np.ndarray) -> np.ndarray:
    """`expf` of every element of `x` (a float32 array of any shape)."""
    return _apply(_lib.tinyhal_expf_array, x)


def logf(x: np.ndarray) -> np.ndarray:
    """`logf` of every element of `x` (a float32 array of any shape)."""
    return _apply(_lib.tinyhal_logf_array, x)


def mmt4d_f32_fma(lhs: np.ndarray, rhs: np.ndarray, out: np.ndarray, accumulate: bool
                  ) -> None:
    """`out` (M, N, M0, N0) = [out +] lhs (M, K, M0, K0) x rhs (N, K, N0, K0), one fused
    multiply-add per (k, k0) in order. Each operand's rows may be strided; within a row
    its tiles must be contiguous (as `mmt4d` maps them), which is checked here."""
    for array in (lhs, rhs, out):
        if array.dtype != np.float32 or array.ndim != 4 or (
                array.shape[0] and not array[0].flags.c_contiguous):
            raise ValueError("mmt4d operands are float32 rows of contiguous tiles")
    m, k, m0, k0 = lhs.shape
    n, _, n0, _ = rhs.shape

    def pointer(array: np.ndarray, ctype: str):
        return _ffi.cast(ctype, array.__array_interface__["data"][0])

    _lib.tinyhal_mmt4d_f32_fma(
        pointer(lhs, "const float*"), lhs.strides[0] // 4, pointer(rhs, "const float*"),
        rhs.strides[0] // 4, pointer(out, "float*"), out.strides[0] // 4, m, n, k, m0, n0,
        k0, int(accumulate))
