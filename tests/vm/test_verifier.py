"""The bytecode verifier (`vm/verifier.py`) rejects what the translator cannot take, and
the translator (`vm/codegen.py`) translates whatever the verifier passed.

Hand-assembled functions reach each rejection and its message; mutated real modules
check the split: a function that decodes and verifies always translates."""

from __future__ import annotations

import ast
import copy
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.vm_pairs import vm_compile_source
from tinyhal.errors import Error, InternalError, InvalidArgumentError, OutOfRangeError
from tinyhal.vm import codegen, isa, regflow, templates
from tinyhal.vm.cconv import parse_cconv
from tinyhal.vm.loader import Function, load_module
from tinyhal.vm.verifier import verify_module

BLOCK = b"\x79"


def u16(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}H", *values)


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


class Regs(tuple):
    """A register list (`V`, or `O` with pairs flattened): 2-byte aligned, as encoded."""


def asm(*parts: bytes | Regs) -> bytes:
    out = bytearray()
    for part in parts:
        if isinstance(part, Regs):
            if len(out) & 1:
                out += b"\x00"
            count = len(part) // 2 if getattr(part, "pairs", False) else len(part)
            out += u16(count, *part)
        else:
            out += part
    return bytes(out)


def pairs(*flat: int) -> Regs:
    regs = Regs(flat)
    regs.pairs = True
    return regs


def const_i32(value: int, reg: int) -> bytes:
    return b"\x0d" + struct.pack("<i", value) + u16(reg)


RETURN = b"\x5a"


def module_of(body: bytes, *, blocks: int = 1, cconv: str = "0v_v", i32: int = 4,
              refs: int = 1, **state) -> SimpleNamespace:
    descriptor = SimpleNamespace(block_count=blocks, i32_register_count=i32,
                                 ref_register_count=refs)
    fn = Function(0, "f", descriptor, SimpleNamespace(attrs={}),
                  parse_cconv(cconv, "m.f"), "m.f", memoryview(body))
    module = SimpleNamespace(name="m", types=["i32"], rodata=[], global_bytes_capacity=0,
                             global_ref_count=0, imports=[], functions=[fn])
    vars(module).update(state)
    return module


REJECTED = [
    ("register 5 out of range", OutOfRangeError,
     asm(BLOCK, const_i32(1, 5), RETURN, Regs())),
    (r"m\.f\+00000001 \(const\.i32\): register 32768 is a ref register",
     InvalidArgumentError, asm(BLOCK, const_i32(1, 0x8000), RETURN, Regs())),
    (r"\(const\.i64\): 64-bit register 1 not 8-byte aligned", InvalidArgumentError,
     asm(BLOCK, b"\x0f", struct.pack("<q", 1), u16(1), RETURN, Regs())),
    (r"\(br\): branch target 00000099 is not a block", InvalidArgumentError,
     asm(BLOCK, b"\x56", u32(0x99), pairs())),
    (r"\(br\): branch operand remaps between register banks", InvalidArgumentError,
     asm(BLOCK, b"\x56", u32(0), pairs(0, 0x8000))),
    ("2 blocks found, descriptor says 1", InvalidArgumentError,
     asm(BLOCK, const_i32(1, 0), BLOCK, RETURN, Regs())),
    ("function missing terminator", InvalidArgumentError,
     asm(BLOCK, const_i32(1, 0))),
    ("function does not begin with a block", InvalidArgumentError,
     asm(const_i32(1, 0), RETURN, Regs())),
    (r"\(return\): returns 0 values, signature declares 1", InvalidArgumentError,
     asm(BLOCK, RETURN, Regs()), {"cconv": "0v_i"}),
    ("global byte_offset out of range: 0", OutOfRangeError,
     asm(BLOCK, b"\x00", u32(0), u16(0), RETURN, Regs())),
    ("rodata ordinal 0 out of range", OutOfRangeError,
     asm(BLOCK, b"\x11", u32(0), u16(0x8000), RETURN, Regs())),
    ("type id ordinal out of range: 7", OutOfRangeError,
     asm(BLOCK, b"\x12", u32(7), u16(0, 0x8000), RETURN, Regs())),
    (r"\(call\): import ordinal 3 out of range", InvalidArgumentError,
     asm(BLOCK, b"\x58", u32(isa.IMPORT_BIT | 3), Regs(), Regs(), RETURN, Regs())),
    (r"\(call\): function ordinal 9 out of range", InvalidArgumentError,
     asm(BLOCK, b"\x58", u32(9), Regs(), Regs(), RETURN, Regs())),
    (r"\(import\.resolved\): import\.resolved of a non-import function",
     InvalidArgumentError, asm(BLOCK, b"\x5c", u32(0), u16(0), RETURN, Regs())),
]
REJECTED = [(r[0], r[1], module_of(r[2], **(r[3] if len(r) > 3 else {}))) for r in REJECTED]


@pytest.mark.parametrize("expected, error, module", REJECTED, ids=[r[0] for r in REJECTED])
def test_the_verifier_names_what_is_wrong(expected, error, module):
    with pytest.raises(error, match=expected):
        verify_module(module)


def test_a_verified_function_translates():
    module = module_of(asm(BLOCK, const_i32(7, 1), RETURN, Regs((1,))), cconv="0v_i")
    program = codegen.generate_module(module, verify_module(module))
    assert "return 7" in program.source or "return i1" in program.source


def test_the_translator_raises_nothing_of_its_own():
    """Every rejection of bad bytecode is the verifier's: codegen has no `raise`."""
    tree = ast.parse(Path(codegen.__file__).read_text())
    raises = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Raise)]
    assert not raises, f"vm/codegen.py raises at lines {raises}"


def test_a_translator_failure_on_verified_bytecode_is_an_internal_error(monkeypatch):
    """The loader calls a file corrupt only when parsing or verification rejects it; a
    translator failure on verified bytecode is tinyhal's bug and says so."""
    path = vm_compile_source("func.func @f(%a: i32) -> i32 {\n  return %a : i32\n}\n")

    def broken(module, verified):
        raise KeyError("no template")

    monkeypatch.setenv("TINYHAL_VM_CACHE", "off")
    monkeypatch.setattr(codegen, "generate_module", broken)
    with pytest.raises(InternalError, match=r"verified bytecode failed \(KeyError.*tinyhal bug"):
        load_module(path)


def test_every_instruction_has_a_translation():
    """The verifier passes every instruction the decoder knows; the translator must then
    have a template or a handler for each (it has no error of its own to raise)."""
    for table in isa.OPSETS.values():
        for name, _layout in table.values():
            handler = "op_" + name.replace(".", "_")
            assert (templates.template(name) is not None or name in regflow.RING_OPS
                    or hasattr(codegen._Gen, handler)), name


SOURCE = """
util.global private mutable @g : i64 = 3 : i64
func.func @f(%a: i64, %b: f32, %n: i32) -> (i64, f32) {
  %v = util.global.load @g : i64
  %c = arith.addi %a, %v : i64
  util.global.store %c, @g : i64
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %b) -> f32 {
    %d = arith.mulf %acc, %acc : f32
    scf.yield %d : f32
  }
  return %c, %r : i64, f32
}
"""


@pytest.fixture(scope="module")
def real_module():
    from support.mutations import subjects

    small_cnn, = subjects(["small_cnn"])
    return [load_module(vm_compile_source(SOURCE)), load_module(small_cnn.path)]


@settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_what_the_verifier_passes_translates(real_module, data):
    """Mutated bytecode is either rejected by the decoder or the verifier, or translates:
    translation never fails on verified input."""
    module = copy.copy(data.draw(st.sampled_from(real_module)))
    index = data.draw(st.integers(0, len(module.functions) - 1))
    fn = module.functions[index]
    body = bytearray(fn.bytecode)
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    module.functions = list(module.functions)
    module.functions[index] = Function(fn.ordinal, fn.name, fn.descriptor, fn.signature,
                                       fn.cconv, fn.where, memoryview(bytes(body)))
    try:
        verified = verify_module(module)
    except Error:
        return
    codegen.generate_module(module, verified)
