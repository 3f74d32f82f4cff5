"""The C library's `expf` and `logf` over float32 arrays (see `mathlib.c`): the bits
IREE's `vmvx` kernels produce, one C call per array rather than a Python call per
element. The C code runs without the GIL."""

from __future__ import annotations

import numpy as np

from ...hal.native import load_compiled

_module = load_compiled(__name__ + "._mathlib", __name__ + ".build")
_ffi = _module.ffi
_lib = _module.lib

__all__ = ["expf", "logf"]


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
