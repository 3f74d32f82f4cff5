"""cffi build of `tinyhal.vm.scalar._scalar`: the C interpreter of VM functions.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.vm.scalar` builds
the same module into a cache directory when running from an uninstalled tree. The
interpreter's opcode constants (`OP_ADD_I32`, ...) and the case of every op it runs are
generated here from the op table (`vm/optable.py`, a row per op), so an op is written
down once; scalar.c spells only what its rows call HANDWRITTEN (branches, calls, return). Compiled without fast-math and
without floating-point contraction: each f32 op rounds as IREE's VM rounds it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HAL_NATIVE = os.path.join(HERE, os.pardir, os.pardir, "hal", "native")
MODULE_NAME = "tinyhal.vm.scalar._scalar"
MATHLIB = os.path.join(HERE, os.pardir, "mathlib")
OPTABLE = os.path.join(HERE, os.pardir, "optable.py")
SOURCES = ("build.py", "scalar.c", "tinyhal_scalar.h", os.path.join(os.pardir, "optable.py"),
           os.path.join(HAL_NATIVE, "tinyhal_executable.h"),
           os.path.join(MATHLIB, "mmt4d_fma.h"))
EXT_F32_BASE = 0x100  # an f32-extension opcode's word: this plus its byte

CDEF = """
enum { SCALAR_DONE = 0, SCALAR_BUDGET = 1, SCALAR_TRAP = 2, SCALAR_BAD_OPCODE = 3 };
int tinyhal_scalar_run(const int32_t* code, uint32_t* regs, uint32_t* pc, uint64_t budget,
                       int64_t* results);
enum {
  MATH_ATAN, MATH_COS, MATH_SIN, MATH_EXP, MATH_EXP2, MATH_EXPM1, MATH_LOG, MATH_LOG10,
  MATH_LOG1P, MATH_LOG2, MATH_SQRT, MATH_TANH, MATH_ERF, MATH_CEIL, MATH_FLOOR, MATH_ROUND,
  MATH_UNARY_COUNT
};
typedef struct tinyhal_scalar_math_t {
  void* unary[16];
  void* atan2f;
  void* powf;
  void* remainderf;
  void* lroundf;
  void* llroundf;
} tinyhal_scalar_math_t;
void tinyhal_scalar_set_math(const tinyhal_scalar_math_t* math);
typedef struct tinyhal_vmvx_entry_t {
  uint64_t environment[12];
  const int32_t* code;
  uint32_t register_count;
  uint32_t ref_count;
  uint32_t rodata_count;
  uint8_t* const* rodata_data;
  const uint64_t* rodata_lengths;
  uint64_t max_allocation;
  uint64_t budget;
  uint32_t features;
  int32_t tiles[9];
  void* on_trap;
  void* on_budget;
} tinyhal_vmvx_entry_t;
void* tinyhal_vmvx_dispatch_address(void);
"""


def load_optable() -> ModuleType:
    """`vm/optable.py`, loaded by path: the build runs before the package is importable,
    and the table imports nothing of it."""
    spec = importlib.util.spec_from_file_location("tinyhal_build_optable", OPTABLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _interpreted(optable: ModuleType, rows: Sequence | None) -> list:
    """The rows of the core and f32 sets (the ones the interpreter has opcodes for)."""
    return [op for op in (optable.rows() if rows is None else rows)
            if op.opset in (None, optable.EXT_F32)]


def _constant(name: str) -> str:
    return f"OP_{name.upper().replace('.', '_')}"


def opcode_enum(optable: ModuleType, rows: Sequence | None = None) -> str:
    """`enum { OP_<MNEMONIC> = <word>, ... };` for the core and f32 opcode sets."""
    body = ",\n".join(
        f"  {_constant(op.name)} = 0x{op.opcode + (EXT_F32_BASE if op.opset else 0):X}"
        for op in _interpreted(optable, rows))
    return f"enum {{\n{body}\n}};\n"


def opcode_cases(optable: ModuleType, source: str, rows: Sequence | None = None) -> str:
    """The `interpret` switch's case of every op the interpreter runs, from its row; a row
    whose case is HANDWRITTEN must find it in `source`."""
    lines = []
    for op in _interpreted(optable, rows):
        c = optable.meaning(op).c
        if c is None:
            continue
        if c == optable.HANDWRITTEN:
            if f"case {_constant(op.name)}:" not in source:
                raise ValueError(f"{op.name}: its row says scalar.c spells its case; it does not")
            continue
        lines.append(f"      case {_constant(op.name)}: {c}\n")
    return "".join(lines)


def generated_source(rows: Sequence | None = None) -> str:
    """scalar.c with the opcode constants after its includes and the op table's cases in
    its interpreter (`rows`: the table's, or a test's with its own op)."""
    with open(os.path.join(HERE, "scalar.c")) as f:
        source = f.read()
    optable = load_optable()
    include = '#include "tinyhal_scalar.h"\n'
    cases = "      /* @optable-cases */\n"
    if include not in source or cases not in source:
        raise ValueError("scalar.c lost a marker the build fills in")
    source = source.replace(include, include + opcode_enum(optable, rows), 1)
    return source.replace(cases, opcode_cases(optable, source, rows), 1)


def make_builder(module_name: str = MODULE_NAME, rows: Sequence | None = None) -> FFI:
    """The cffi builder of the interpreter (`rows`: see `generated_source`)."""
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(module_name, generated_source(rows),
                       include_dirs=[HERE, HAL_NATIVE, MATHLIB],
                       libraries=["m"],
                       extra_compile_args=["-O2", "-std=c11", "-fno-fast-math",
                                           "-ffp-contract=off"])
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
