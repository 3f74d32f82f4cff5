"""VM bytecode 17.0 instruction set: opcode tables and a bounds-checked decoder.

Each opcode maps to `(mnemonic, operand layout)`. The layout is a space-separated list of
field codes read in order:

    r:<bank> / w:<bank>  register read / written (bank i32, i64, f32, f64 or ref);
                         u16; ref registers have bit 15 set and bit 14 = move
    A:<type>             literal constant of that type (4 or 8 bytes)
    G  global (byte offset or ref ordinal, u32)    F  function ordinal (u32; bit 31 = import)
    D  rodata ordinal (u32)                        T  type id (u32)
    S  string (u16 length + bytes)                 H  u16 constant (br_table size)
    V  register list (align 2, u16 count, u16 registers)
    B  branch target pc (u32)                      O  branch operand list (align 2, u16
                                                      count, (u16 src, u16 dst) pairs)
    C  br_table cases: H entries of (B, O)

Opcode 0x79 is the block marker that begins every basic block; 0xE0 / 0xE1 prefix the
f32 / f64 extension sets. The opcodes and layouts are rows of `optable` (transcribed from
the facts of IREE's `isa.json` for bytecode version 17.0), which defines every op.
"""

from __future__ import annotations

import struct

from ..errors import InvalidArgumentError, OutOfRangeError
from . import optable

BYTECODE_VERSION = 0x00110000  # 17.0
BLOCK_MARKER = 0x79
PREFIX_EXT_F32 = optable.EXT_F32
PREFIX_EXT_F64 = optable.EXT_F64
REF_BIT = 0x8000
MOVE_BIT = 0x4000
REF_MASK = 0x3FFF
IMPORT_BIT = 0x80000000

FEATURE_EXT_F32 = 1 << 0
FEATURE_EXT_F64 = 1 << 1
FEATURE_YIELD = 1 << 2
FEATURE_UNWIND = 1 << 3
SUPPORTED_FEATURES = FEATURE_EXT_F32 | FEATURE_EXT_F64 | FEATURE_YIELD | FEATURE_UNWIND

# The opcode tables, derived from the op table (`optable`, where each op is defined): each
# opcode maps to `(mnemonic, layout)`; `TERMINATORS` end a block's control flow.
CORE_OPS: dict[int, tuple[str, str]] = {}
EXT_F32_OPS: dict[int, tuple[str, str]] = {}
EXT_F64_OPS: dict[int, tuple[str, str]] = {}
TERMINATORS: set[str] = set()
EFFECTS: dict[str, str] = {}  # op -> `optable.Op.effect` ("call", "output", "fail")
COMPARES: set[str] = set()  # ops writing an i32 0/1 predicate (`optable.Op.compare`)

OPSETS = {None: CORE_OPS, PREFIX_EXT_F32: EXT_F32_OPS, PREFIX_EXT_F64: EXT_F64_OPS}
_PREFIX_NAME = {None: "", PREFIX_EXT_F32: "ext_f32 ", PREFIX_EXT_F64: "ext_f64 "}

# Parsed layouts: tuple of (code, bank-or-type) per field.
_LAYOUTS: dict[tuple[int | None, int], tuple[str, tuple[tuple[str, str], ...]]] = {}


def _derive(op: optable.Op) -> None:
    OPSETS[op.opset][op.opcode] = (op.name, op.layout)
    _LAYOUTS[(op.opset, op.opcode)] = (op.name, tuple(
        (code, arg) for code, _, arg in (f.partition(":") for f in op.layout.split())))
    if op.terminator:
        TERMINATORS.add(op.name)
    if op.effect:
        EFFECTS[op.name] = op.effect
    if op.compare:
        COMPARES.add(op.name)


optable.on_row(_derive)

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class Instruction:
    """One decoded instruction: `pc` of its first byte, `end` one past its last, `fields`
    its decoded values, one per `layout` field. (A plain class: defined at every start-up,
    which a dataclass makes slower.)"""

    __slots__ = ("pc", "end", "name", "fields", "layout")

    def __init__(self, pc: int, end: int, name: str, fields: list,
                 layout: tuple[tuple[str, str], ...]) -> None:
        self.pc = pc
        self.end = end
        self.name = name
        self.fields = fields
        self.layout = layout

    def __repr__(self) -> str:
        return f"Instruction({self.pc}, {self.end}, {self.name!r}, {self.fields!r})"


class _Cursor:
    __slots__ = ("data", "pc", "end", "where")

    def __init__(self, data: memoryview, where: str) -> None:
        self.data = data
        self.pc = 0
        self.end = len(data)
        self.where = where

    def need(self, n: int) -> int:
        pc = self.pc
        if pc + n > self.end:
            raise OutOfRangeError(
                f"{self.where}: bytecode data overrun decoding at {pc:08X} "
                f"({n} bytes wanted, {self.end - pc} available)"
            )
        self.pc = pc + n
        return pc

    def u8(self) -> int:
        return self.data[self.need(1)]

    def u16(self) -> int:
        return _U16.unpack_from(self.data, self.need(2))[0]

    def u32(self) -> int:
        return _U32.unpack_from(self.data, self.need(4))[0]

    def align2(self) -> None:
        if self.pc & 1:
            self.need(1)

    def reg_list(self) -> tuple[int, ...]:
        self.align2()
        n = self.u16()
        at = self.need(2 * n)
        return struct.unpack_from(f"<{n}H", self.data, at)

    def remap_list(self) -> tuple[tuple[int, int], ...]:
        self.align2()
        n = self.u16()
        at = self.need(4 * n)
        flat = struct.unpack_from(f"<{2 * n}H", self.data, at)
        return tuple(zip(flat[0::2], flat[1::2]))


def decode_function(data: memoryview, where: str) -> list[Instruction]:
    """Decodes all instructions of one function's bytecode (exactly to its length)."""
    cur = _Cursor(data, where)
    out: list[Instruction] = []
    while cur.pc < cur.end:
        start = cur.pc
        op = cur.u8()
        prefix = None
        if op in (PREFIX_EXT_F32, PREFIX_EXT_F64):
            prefix = op
            op = cur.u8()
        if prefix is None and op == BLOCK_MARKER:
            out.append(Instruction(start, cur.pc, "block", [], ()))
            continue
        entry = _LAYOUTS.get((prefix, op))
        if entry is None:
            raise InvalidArgumentError(
                f"{where}: unknown {_PREFIX_NAME[prefix]}opcode 0x{op:02X} at {start:08X}"
            )
        name, layout = entry
        fields: list = []
        for code, arg in layout:
            if code == "r" or code == "w":
                fields.append(cur.u16())
            elif code == "A":
                if arg == "i32":
                    fields.append(_I32.unpack_from(cur.data, cur.need(4))[0])
                elif arg == "f32":
                    fields.append(_U32.unpack_from(cur.data, cur.need(4))[0])  # raw bits
                elif arg == "i64":
                    fields.append(_I64.unpack_from(cur.data, cur.need(8))[0])
                else:
                    fields.append(_F64.unpack_from(cur.data, cur.need(8))[0])
            elif code in ("G", "F", "D", "T", "B"):
                fields.append(cur.u32())
            elif code == "S":
                n = cur.u16()
                at = cur.need(n)
                fields.append(bytes(cur.data[at : at + n]))
            elif code == "V":
                fields.append(cur.reg_list())
            elif code == "O":
                fields.append(cur.remap_list())
            elif code == "H":
                fields.append(cur.u16())
            elif code == "C":
                count = fields[-1]
                cases = []
                for _ in range(count):
                    target = cur.u32()
                    cases.append((target, cur.remap_list()))
                fields.append(cases)
            else:  # pragma: no cover - table is static
                raise AssertionError(code)
        out.append(Instruction(start, cur.pc, name, fields, layout))
    return out
