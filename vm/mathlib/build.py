"""cffi build of `tinyhal.vm.mathlib._mathlib`: C library math over float arrays.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.vm.mathlib`
builds the same module into a cache directory when running from an uninstalled tree.
Compiled without fast-math, so each element is one call of the C library's function.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.vm.mathlib._mathlib"
SOURCES = ("build.py", "mathlib.c")

CDEF = """
void tinyhal_expf_array(const float* in, float* out, size_t count);
void tinyhal_logf_array(const float* in, float* out, size_t count);
"""


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    with open(os.path.join(HERE, "mathlib.c")) as f:
        source = f.read()
    builder.set_source(module_name, source, libraries=["m"],
                       extra_compile_args=["-O2", "-std=c11", "-fno-fast-math"])
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
