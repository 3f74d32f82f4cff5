"""cffi build of `tinyhal.vm.scalar._scalar`: the integer-only VM function interpreter.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.vm.scalar` builds
the same module into a cache directory when running from an uninstalled tree.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = "tinyhal.vm.scalar._scalar"
SOURCES = ("build.py", "scalar.c", "tinyhal_scalar.h")

CDEF = """
enum { SCALAR_DONE = 0, SCALAR_BUDGET = 1, SCALAR_TRAP = 2, SCALAR_BAD_OPCODE = 3 };
int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc, uint64_t budget,
                       int64_t* results);
"""


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    with open(os.path.join(HERE, "scalar.c")) as f:
        source = f.read()
    builder.set_source(module_name, source, include_dirs=[HERE],
                       extra_compile_args=["-O2", "-std=c11"])
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
