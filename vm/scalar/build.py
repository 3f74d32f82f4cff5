"""cffi build of `tinyhal.vm.scalar._scalar`: the C interpreter of VM functions.

Run by setuptools at install time (`cffi_modules` in setup.py); `tinyhal.vm.scalar` builds
the same module into a cache directory when running from an uninstalled tree. The
interpreter's opcode constants (`OP_ADD_I32`, ...) are generated here from the opcode
tables of `vm/isa.py`, so an opcode is written down once. Compiled without fast-math and
without floating-point contraction: each f32 op rounds as IREE's VM rounds it.
"""

from __future__ import annotations

import ast
import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HAL_NATIVE = os.path.join(HERE, os.pardir, os.pardir, "hal", "native")
MODULE_NAME = "tinyhal.vm.scalar._scalar"
MATHLIB = os.path.join(HERE, os.pardir, "mathlib")
SOURCES = ("build.py", "scalar.c", "tinyhal_scalar.h", os.path.join(os.pardir, "isa.py"),
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


def opcode_tables() -> dict[str, dict[int, tuple[str, str]]]:
    """`CORE_OPS` and `EXT_F32_OPS` read from isa.py's source (the build runs before the
    package is importable)."""
    with open(os.path.join(HERE, os.pardir, "isa.py")) as f:
        tree = ast.parse(f.read())
    tables = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in ("CORE_OPS", "EXT_F32_OPS")):
            tables[node.targets[0].id] = ast.literal_eval(node.value)
    return tables


def opcode_enum() -> str:
    """`enum { OP_<MNEMONIC> = <word>, ... };` for the core and f32 opcode sets."""
    tables = opcode_tables()
    entries = [(name, op) for op, (name, _) in tables["CORE_OPS"].items()]
    entries += [(name, EXT_F32_BASE + op) for op, (name, _) in tables["EXT_F32_OPS"].items()]
    body = ",\n".join(f"  OP_{name.upper().replace('.', '_')} = 0x{word:X}"
                      for name, word in entries)
    return f"enum {{\n{body}\n}};\n"


def generated_source() -> str:
    """scalar.c with the opcode constants after its includes."""
    with open(os.path.join(HERE, "scalar.c")) as f:
        source = f.read()
    marker = '#include "tinyhal_scalar.h"\n'
    return source.replace(marker, marker + opcode_enum(), 1)


def make_builder(module_name: str = MODULE_NAME) -> FFI:
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(module_name, generated_source(), include_dirs=[HERE, HAL_NATIVE, MATHLIB],
                       libraries=["m"],
                       extra_compile_args=["-O2", "-std=c11", "-fno-fast-math",
                                           "-ffp-contract=off"])
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
