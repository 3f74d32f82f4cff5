"""cffi build of `tinyhal.vm.mathlib._mathlib`: C library math over float arrays, and
f32 mmt4d with fused multiply-adds.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.vm.mathlib`
builds the same module into a cache directory when running from an uninstalled tree.
Compiled without fast-math, so each element is one call of the C library's function.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.vm.mathlib._mathlib"
SOURCES = ("build.py", "mathlib.c", "mmt4d_fma.h")

CDEF = """
void tinyhal_expf_array(const float* in, float* out, size_t count);
void tinyhal_logf_array(const float* in, float* out, size_t count);
void tinyhal_mmt4d_f32_fma(const float* lhs, int64_t lhs_row_stride, const float* rhs,
                           int64_t rhs_row_stride, float* out, int64_t out_row_stride,
                           int64_t m, int64_t n, int64_t k, int64_t m0, int64_t n0,
                           int64_t k0, int accumulate);
"""


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    with open(os.path.join(HERE, "mathlib.c")) as f:
        source = f.read()
    builder.set_source(module_name, source, libraries=["m"], include_dirs=[HERE],
                       extra_compile_args=["-O2", "-std=c11", "-fno-fast-math",
                                           "-ffp-contract=off"])
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
