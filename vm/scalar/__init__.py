"""Integer loops run natively: VM functions of i32/i64 arithmetic and branches only.

The Python translation (`codegen.py`) runs a VM instruction in tens of nanoseconds, which
is CPython's floor; a function that only computes on integers in a loop gains nothing from
being Python. Such a function is re-laid once, at module load, as a word program (see
`scalar.c`) and runs in the C interpreter here, with IREE's register semantics (one bank of
32-bit slots, i64 values in two of them, branch operands copied slot by slot).

A function qualifies when every instruction is in `SUPPORTED` (integer constants,
arithmetic, bitwise ops, shifts, casts, compares, select, ctlz/abs/min/max, `br`,
`cond_br`, `return`), its arguments and results are i32/i64, and it loops (some branch
goes back). A loop-free function runs a handful of instructions, for which crossing into C
costs more than it saves, so it stays Python.

The native run is an accelerator, never a second semantics: where an integer division
would fault, it stops and the function is run again by its Python translation (it has no
side effects, so running it twice is safe), which raises the VM's own error. Long loops
run in slices of `BRANCH_BUDGET` taken branches, between which Python handles signals, so
Ctrl-C still interrupts a runaway loop; the C code runs without the GIL.

`TINYHAL_VM_NATIVE_LOOPS=0` in the environment keeps every function in Python (the tests
use it to check both paths against IREE).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ...errors import InternalError
from ...hal.native import load_compiled
from .. import isa

_module = load_compiled(__name__ + "._scalar", __name__ + ".build")
_ffi = _module.ffi
_lib = _module.lib

SUPPORTED = frozenset("""
const.i32.zero const.i32 const.i64.zero const.i64 select.i32 select.i64
add.i32 sub.i32 mul.i32 div.i32.s div.i32.u rem.i32.s rem.i32.u fma.i32
add.i64 sub.i64 mul.i64 div.i64.s div.i64.u rem.i64.s rem.i64.u fma.i64
not.i32 and.i32 or.i32 xor.i32 not.i64 and.i64 or.i64 xor.i64
shl.i32 shr.i32.s shr.i32.u shl.i64 shr.i64.s shr.i64.u
trunc.i32.i8 trunc.i32.i16 trunc.i64.i32 ext.i8.i32.s ext.i8.i32.u ext.i16.i32.s
ext.i16.i32.u ext.i32.i64.s ext.i32.i64.u
cmp.eq.i32 cmp.ne.i32 cmp.lt.i32.s cmp.lt.i32.u cmp.nz.i32
cmp.eq.i64 cmp.ne.i64 cmp.lt.i64.s cmp.lt.i64.u cmp.nz.i64
ctlz.i32 ctlz.i64 abs.i32 abs.i64 min.i32.s min.i32.u max.i32.s max.i32.u
min.i64.s min.i64.u max.i64.s max.i64.u br cond_br return
""".split())

_OPCODES = {name: op for op, (name, _) in isa.CORE_OPS.items() if name in SUPPORTED}
_INTEGER_TYPES = {"i": False, "I": True}  # cconv type -> is i64
BRANCH_BUDGET = 1 << 22
_M32 = 0xFFFFFFFF


def enabled() -> bool:
    """Whether loaded modules run their integer loops natively (the default)."""
    return os.environ.get("TINYHAL_VM_NATIVE_LOOPS", "1") != "0"


class ScalarProgram(NamedTuple):
    """One function as a word program: `words` for `tinyhal_scalar_run`, the register
    file it needs (32-bit slots), where each argument goes and how many results return."""

    words: array
    register_count: int
    arguments: tuple[tuple[int, bool], ...]  # (slot, is_i64) per argument
    result_count: int


def _word(value: int) -> int:
    """An unsigned 32-bit field as the signed word `array('i')` stores."""
    value &= _M32
    return value - (1 << 32) if value >> 31 else value


def encode(instructions: Sequence, arg_types: Sequence[str], result_types: Sequence[str],
           argument_slots: Sequence[int], register_count: int) -> ScalarProgram | None:
    """The word program of one already-verified function, or None when it does not
    qualify (see the module docstring)."""
    if any(t not in _INTEGER_TYPES for t in (*arg_types, *result_types)):
        return None
    try:
        return _encode(instructions, arg_types, result_types, argument_slots, register_count)
    except ValueError:  # a register the C side could not address
        return None


def _slot(raw: int, wide: bool, register_count: int) -> int:
    """`raw` as a register slot in range for its width (else ValueError): the program is
    checked here once so the interpreter never checks anything."""
    if raw & isa.REF_BIT or raw + wide >= register_count or (wide and raw & 1):
        raise ValueError(raw)
    return raw


def _encode(instructions, arg_types, result_types, argument_slots, register_count):
    words: list[int] = []
    block_words: dict[int, int] = {}  # block pc -> word index of its first instruction
    fixups: list[tuple[int, int]] = []  # (word index, target block pc)
    loops = False
    for ins in instructions:
        if ins.name == "block":
            block_words[ins.pc] = len(words)
            continue
        if ins.name not in SUPPORTED:
            return None
        words.append(_OPCODES[ins.name])
        if ins.name == "return":
            regs = ins.fields[0]
            if len(regs) != len(result_types):
                return None
            words.append(len(regs))
            for raw, t in zip(regs, result_types):
                words += (_slot(raw, _INTEGER_TYPES[t], register_count), int(_INTEGER_TYPES[t]))
            continue
        for (code, arg), value in zip(ins.layout, ins.fields):
            if code in ("r", "w"):
                words.append(_slot(value, arg == "i64", register_count))
            elif code == "A":
                words.append(_word(value))
                if arg == "i64":
                    words.append(_word(value >> 32))
            elif code == "B":
                loops |= value <= ins.pc
                fixups.append((len(words), value))
                words.append(0)
            elif code == "O":
                words.append(len(value))
                for src, dst in value:
                    words += (_slot(src, False, register_count), _slot(dst, False, register_count))
            else:  # pragma: no cover - SUPPORTED holds no other field kinds
                return None
    if not loops:
        return None
    for at, target in fixups:
        if target not in block_words:
            return None
        words[at] = block_words[target]
    arguments = tuple((_slot(raw, _INTEGER_TYPES[t], register_count), _INTEGER_TYPES[t])
                      for raw, t in zip(argument_slots, arg_types))
    return ScalarProgram(array("i", words), register_count, arguments, len(result_types))


def entry(program: ScalarProgram, fallback: Callable) -> Callable:
    """A function with `fallback`'s signature that runs `program` natively; `fallback`
    (the Python translation of the same VM function) runs only where a division faults."""
    code = _ffi.from_buffer("int32_t[]", program.words)
    new = _ffi.new
    run = _lib.tinyhal_scalar_run
    count = program.register_count
    arguments = program.arguments
    results = program.result_count
    budget_ran_out, done = _lib.SCALAR_BUDGET, _lib.SCALAR_DONE

    def call(*args):
        regs = new("uint32_t[]", count)
        for (slot, wide), value in zip(arguments, args):
            regs[slot] = value & _M32
            if wide:
                regs[slot + 1] = (value >> 32) & _M32
        pc = new("uint32_t*")
        out = new("int64_t[]", results or 1)
        status = run(code, regs, pc, BRANCH_BUDGET, out)
        while status == budget_ran_out:
            status = run(code, regs, pc, BRANCH_BUDGET, out)
        if status != done:
            if status == _lib.SCALAR_TRAP:
                return fallback(*args)
            raise InternalError(f"native VM loop stopped with status {status} at word {pc[0]}")
        if results == 1:
            return out[0]
        return tuple(out[0:results]) if results else None

    call.__wrapped__ = fallback
    return call


__all__ = ["BRANCH_BUDGET", "SUPPORTED", "ScalarProgram", "enabled", "encode", "entry"]
