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
f32 / f64 extension sets. The tables were transcribed from the facts of IREE's
`isa.json` for bytecode version 17.0.
"""

from __future__ import annotations

import struct

from ..errors import InvalidArgumentError, OutOfRangeError

BYTECODE_VERSION = 0x00110000  # 17.0
BLOCK_MARKER = 0x79
PREFIX_EXT_F32 = 0xE0
PREFIX_EXT_F64 = 0xE1
REF_BIT = 0x8000
MOVE_BIT = 0x4000
REF_MASK = 0x3FFF
IMPORT_BIT = 0x80000000

FEATURE_EXT_F32 = 1 << 0
FEATURE_EXT_F64 = 1 << 1
FEATURE_YIELD = 1 << 2
FEATURE_UNWIND = 1 << 3
SUPPORTED_FEATURES = FEATURE_EXT_F32 | FEATURE_EXT_F64 | FEATURE_YIELD | FEATURE_UNWIND

# Instructions that end a block's control flow. A call that may yield is one: it resumes
# at a block of its own.
TERMINATORS = frozenset({"br", "cond_br", "br_table", "return", "yield", "call.yieldable",
                         "call.variadic.yieldable", "break", "cond_break"})

CORE_OPS = {
    0x00: ('global.load.i32', 'G w:i32'),
    0x01: ('global.store.i32', 'G r:i32'),
    0x02: ('global.load.indirect.i32', 'r:i32 w:i32'),
    0x03: ('global.store.indirect.i32', 'r:i32 r:i32'),
    0x04: ('global.load.i64', 'G w:i64'),
    0x05: ('global.store.i64', 'G r:i64'),
    0x06: ('global.load.indirect.i64', 'r:i32 w:i64'),
    0x07: ('global.store.indirect.i64', 'r:i32 r:i64'),
    0x08: ('global.load.ref', 'G T w:ref'),
    0x09: ('global.store.ref', 'G T r:ref'),
    0x0A: ('global.load.indirect.ref', 'r:i32 T w:ref'),
    0x0B: ('global.store.indirect.ref', 'r:i32 T r:ref'),
    0x0C: ('const.i32.zero', 'w:i32'),
    0x0D: ('const.i32', 'A:i32 w:i32'),
    0x0E: ('const.i64.zero', 'w:i64'),
    0x0F: ('const.i64', 'A:i64 w:i64'),
    0x10: ('const.ref.zero', 'w:ref'),
    0x11: ('const.ref.rodata', 'D w:ref'),
    0x12: ('list.alloc', 'T r:i32 w:ref'),
    0x13: ('list.reserve', 'r:ref r:i32'),
    0x14: ('list.size', 'r:ref w:i32'),
    0x15: ('list.resize', 'r:ref r:i32'),
    0x16: ('list.get.i32', 'r:ref r:i32 w:i32'),
    0x17: ('list.set.i32', 'r:ref r:i32 r:i32'),
    0x18: ('list.get.i64', 'r:ref r:i32 w:i64'),
    0x19: ('list.set.i64', 'r:ref r:i32 r:i64'),
    0x1A: ('list.get.ref', 'r:ref r:i32 T w:ref'),
    0x1B: ('list.set.ref', 'r:ref r:i32 r:ref'),
    0x1C: ('select.i32', 'r:i32 r:i32 r:i32 w:i32'),
    0x1D: ('select.i64', 'r:i32 r:i64 r:i64 w:i64'),
    0x1E: ('select.ref', 'r:i32 T r:ref r:ref w:ref'),
    0x1F: ('switch.i32', 'r:i32 r:i32 V w:i32'),
    0x20: ('switch.i64', 'r:i32 r:i64 V w:i64'),
    0x21: ('switch.ref', 'r:i32 T r:ref V w:ref'),
    0x22: ('add.i32', 'r:i32 r:i32 w:i32'),
    0x23: ('sub.i32', 'r:i32 r:i32 w:i32'),
    0x24: ('mul.i32', 'r:i32 r:i32 w:i32'),
    0x25: ('div.i32.s', 'r:i32 r:i32 w:i32'),
    0x26: ('div.i32.u', 'r:i32 r:i32 w:i32'),
    0x27: ('rem.i32.s', 'r:i32 r:i32 w:i32'),
    0x28: ('rem.i32.u', 'r:i32 r:i32 w:i32'),
    0x29: ('fma.i32', 'r:i32 r:i32 r:i32 w:i32'),
    0x2A: ('add.i64', 'r:i64 r:i64 w:i64'),
    0x2B: ('sub.i64', 'r:i64 r:i64 w:i64'),
    0x2C: ('mul.i64', 'r:i64 r:i64 w:i64'),
    0x2D: ('div.i64.s', 'r:i64 r:i64 w:i64'),
    0x2E: ('div.i64.u', 'r:i64 r:i64 w:i64'),
    0x2F: ('rem.i64.s', 'r:i64 r:i64 w:i64'),
    0x30: ('rem.i64.u', 'r:i64 r:i64 w:i64'),
    0x31: ('fma.i64', 'r:i64 r:i64 r:i64 w:i64'),
    0x32: ('not.i32', 'r:i32 w:i32'),
    0x33: ('and.i32', 'r:i32 r:i32 w:i32'),
    0x34: ('or.i32', 'r:i32 r:i32 w:i32'),
    0x35: ('xor.i32', 'r:i32 r:i32 w:i32'),
    0x36: ('not.i64', 'r:i64 w:i64'),
    0x37: ('and.i64', 'r:i64 r:i64 w:i64'),
    0x38: ('or.i64', 'r:i64 r:i64 w:i64'),
    0x39: ('xor.i64', 'r:i64 r:i64 w:i64'),
    0x3A: ('shl.i32', 'r:i32 r:i32 w:i32'),
    0x3B: ('shr.i32.s', 'r:i32 r:i32 w:i32'),
    0x3C: ('shr.i32.u', 'r:i32 r:i32 w:i32'),
    0x3D: ('shl.i64', 'r:i64 r:i32 w:i64'),
    0x3E: ('shr.i64.s', 'r:i64 r:i32 w:i64'),
    0x3F: ('shr.i64.u', 'r:i64 r:i32 w:i64'),
    0x40: ('trunc.i32.i8', 'r:i32 w:i32'),
    0x41: ('trunc.i32.i16', 'r:i32 w:i32'),
    0x42: ('trunc.i64.i32', 'r:i64 w:i32'),
    0x43: ('ext.i8.i32.s', 'r:i32 w:i32'),
    0x44: ('ext.i8.i32.u', 'r:i32 w:i32'),
    0x45: ('ext.i16.i32.s', 'r:i32 w:i32'),
    0x46: ('ext.i16.i32.u', 'r:i32 w:i32'),
    0x47: ('ext.i32.i64.s', 'r:i32 w:i64'),
    0x48: ('ext.i32.i64.u', 'r:i32 w:i64'),
    0x49: ('cmp.eq.i32', 'r:i32 r:i32 w:i32'),
    0x4A: ('cmp.ne.i32', 'r:i32 r:i32 w:i32'),
    0x4B: ('cmp.lt.i32.s', 'r:i32 r:i32 w:i32'),
    0x4C: ('cmp.lt.i32.u', 'r:i32 r:i32 w:i32'),
    0x4D: ('cmp.nz.i32', 'r:i32 w:i32'),
    0x4E: ('cmp.eq.i64', 'r:i64 r:i64 w:i32'),
    0x4F: ('cmp.ne.i64', 'r:i64 r:i64 w:i32'),
    0x50: ('cmp.lt.i64.s', 'r:i64 r:i64 w:i32'),
    0x51: ('cmp.lt.i64.u', 'r:i64 r:i64 w:i32'),
    0x52: ('cmp.nz.i64', 'r:i64 w:i32'),
    0x53: ('cmp.eq.ref', 'r:ref r:ref w:i32'),
    0x54: ('cmp.ne.ref', 'r:ref r:ref w:i32'),
    0x55: ('cmp.nz.ref', 'r:ref w:i32'),
    0x56: ('br', 'B O'),
    0x57: ('cond_br', 'r:i32 B O B O'),
    0x58: ('call', 'F V V'),
    0x59: ('call.variadic', 'F V V V'),
    0x5A: ('return', 'V'),
    0x5B: ('fail', 'r:i32 S'),
    0x5C: ('import.resolved', 'F w:i32'),
    0x5D: ('yield', 'B O'),
    0x5E: ('trace', 'S V'),
    0x5F: ('print', 'S V'),
    0x60: ('cond_break', 'r:i32 B O'),
    0x61: ('break', 'B O'),
    0x62: ('buffer.load.i8.u', 'r:ref r:i64 w:i32'),
    0x63: ('buffer.load.i8.s', 'r:ref r:i64 w:i32'),
    0x64: ('buffer.load.i16.u', 'r:ref r:i64 w:i32'),
    0x65: ('buffer.load.i16.s', 'r:ref r:i64 w:i32'),
    0x66: ('buffer.load.i32', 'r:ref r:i64 w:i32'),
    0x67: ('buffer.load.i64', 'r:ref r:i64 w:i64'),
    0x68: ('buffer.store.i8', 'r:ref r:i64 r:i32'),
    0x69: ('buffer.store.i16', 'r:ref r:i64 r:i32'),
    0x6A: ('buffer.store.i32', 'r:ref r:i64 r:i32'),
    0x6B: ('buffer.store.i64', 'r:ref r:i64 r:i64'),
    0x6C: ('buffer.alloc', 'r:i64 r:i32 w:ref'),
    0x6D: ('buffer.clone', 'r:ref r:i64 r:i64 r:i32 w:ref'),
    0x6E: ('buffer.length', 'r:ref w:i64'),
    0x6F: ('buffer.copy', 'r:ref r:i64 r:ref r:i64 r:i64'),
    0x70: ('buffer.compare', 'r:ref r:i64 r:ref r:i64 r:i64 w:i32'),
    0x71: ('buffer.fill.i8', 'r:ref r:i64 r:i64 r:i32'),
    0x72: ('buffer.fill.i16', 'r:ref r:i64 r:i64 r:i32'),
    0x73: ('buffer.fill.i32', 'r:ref r:i64 r:i64 r:i32'),
    0x74: ('buffer.fill.i64', 'r:ref r:i64 r:i64 r:i64'),
    0x75: ('ctlz.i32', 'r:i32 w:i32'),
    0x76: ('ctlz.i64', 'r:i64 w:i64'),
    0x77: ('abs.i32', 'r:i32 w:i32'),
    0x78: ('abs.i64', 'r:i64 w:i64'),
    0x7A: ('min.i32.s', 'r:i32 r:i32 w:i32'),
    0x7B: ('min.i32.u', 'r:i32 r:i32 w:i32'),
    0x7C: ('max.i32.s', 'r:i32 r:i32 w:i32'),
    0x7D: ('max.i32.u', 'r:i32 r:i32 w:i32'),
    0x7E: ('min.i64.s', 'r:i64 r:i64 w:i64'),
    0x7F: ('min.i64.u', 'r:i64 r:i64 w:i64'),
    0x80: ('max.i64.s', 'r:i64 r:i64 w:i64'),
    0x81: ('max.i64.u', 'r:i64 r:i64 w:i64'),
    0x82: ('cast.any.ref', 'r:ref T w:ref'),
    0x83: ('br_table', 'r:i32 B O H C'),
    0x84: ('buffer.hash', 'r:ref r:i64 r:i64 w:i64'),
    0x85: ('discard.refs', 'V'),
    0x86: ('assign.ref', 'r:ref w:ref'),
    0x87: ('call.yieldable', 'F V B V'),
    0x88: ('call.variadic.yieldable', 'F V V B V'),
}
EXT_F32_OPS = {
    0x00: ('global.load.f32', 'G w:f32'),
    0x01: ('global.store.f32', 'G r:f32'),
    0x02: ('global.load.indirect.f32', 'r:i32 w:f32'),
    0x03: ('global.store.indirect.f32', 'r:i32 r:f32'),
    0x04: ('const.f32.zero', 'w:f32'),
    0x05: ('const.f32', 'A:f32 w:f32'),
    0x06: ('list.get.f32', 'r:ref r:i32 w:f32'),
    0x07: ('list.set.f32', 'r:ref r:i32 r:f32'),
    0x08: ('select.f32', 'r:i32 r:f32 r:f32 w:f32'),
    0x09: ('switch.f32', 'r:i32 r:f32 V w:f32'),
    0x0A: ('add.f32', 'r:f32 r:f32 w:f32'),
    0x0B: ('sub.f32', 'r:f32 r:f32 w:f32'),
    0x0C: ('mul.f32', 'r:f32 r:f32 w:f32'),
    0x0D: ('div.f32', 'r:f32 r:f32 w:f32'),
    0x0E: ('rem.f32', 'r:f32 r:f32 w:f32'),
    0x0F: ('fma.f32', 'r:f32 r:f32 r:f32 w:f32'),
    0x10: ('abs.f32', 'r:f32 w:f32'),
    0x11: ('neg.f32', 'r:f32 w:f32'),
    0x12: ('ceil.f32', 'r:f32 w:f32'),
    0x13: ('floor.f32', 'r:f32 w:f32'),
    0x14: ('cast.si32.f32', 'r:i32 w:f32'),
    0x15: ('cast.ui32.f32', 'r:i32 w:f32'),
    0x16: ('cast.f32.si32', 'r:f32 w:i32'),
    0x17: ('cast.f32.ui32', 'r:f32 w:i32'),
    0x18: ('bitcast.i32.f32', 'r:i32 w:f32'),
    0x19: ('bitcast.f32.i32', 'r:f32 w:i32'),
    0x1A: ('atan.f32', 'r:f32 w:f32'),
    0x1B: ('atan2.f32', 'r:f32 r:f32 w:f32'),
    0x1C: ('cos.f32', 'r:f32 w:f32'),
    0x1D: ('sin.f32', 'r:f32 w:f32'),
    0x1E: ('exp.f32', 'r:f32 w:f32'),
    0x1F: ('exp2.f32', 'r:f32 w:f32'),
    0x20: ('expm1.f32', 'r:f32 w:f32'),
    0x21: ('log.f32', 'r:f32 w:f32'),
    0x22: ('log10.f32', 'r:f32 w:f32'),
    0x23: ('log1p.f32', 'r:f32 w:f32'),
    0x24: ('log2.f32', 'r:f32 w:f32'),
    0x25: ('pow.f32', 'r:f32 r:f32 w:f32'),
    0x26: ('rsqrt.f32', 'r:f32 w:f32'),
    0x27: ('sqrt.f32', 'r:f32 w:f32'),
    0x28: ('tanh.f32', 'r:f32 w:f32'),
    0x29: ('erf.f32', 'r:f32 w:f32'),
    0x2A: ('cmp.eq.f32.o', 'r:f32 r:f32 w:i32'),
    0x2B: ('cmp.eq.f32.u', 'r:f32 r:f32 w:i32'),
    0x2C: ('cmp.ne.f32.o', 'r:f32 r:f32 w:i32'),
    0x2D: ('cmp.ne.f32.u', 'r:f32 r:f32 w:i32'),
    0x2E: ('cmp.lt.f32.o', 'r:f32 r:f32 w:i32'),
    0x2F: ('cmp.lt.f32.u', 'r:f32 r:f32 w:i32'),
    0x30: ('cmp.lte.f32.o', 'r:f32 r:f32 w:i32'),
    0x31: ('cmp.lte.f32.u', 'r:f32 r:f32 w:i32'),
    0x32: ('cmp.nan.f32', 'r:f32 w:i32'),
    0x33: ('buffer.load.f32', 'r:ref r:i64 w:f32'),
    0x34: ('buffer.store.f32', 'r:ref r:i64 r:f32'),
    0x35: ('buffer.fill.f32', 'r:ref r:i64 r:i64 r:f32'),
    0x36: ('round.f32', 'r:f32 w:f32'),
    0x37: ('min.f32', 'r:f32 r:f32 w:f32'),
    0x38: ('max.f32', 'r:f32 r:f32 w:f32'),
    0x39: ('round.f32.even', 'r:f32 w:f32'),
    0x3A: ('cast.f32.si64', 'r:f32 w:i64'),
    0x3B: ('cast.f32.ui64', 'r:f32 w:i64'),
    0x3C: ('cast.si64.f32', 'r:i64 w:f32'),
    0x3D: ('cast.ui64.f32', 'r:i64 w:f32'),
}
EXT_F64_OPS = {
    0x00: ('global.load.f64', 'G w:f64'),
    0x01: ('global.store.f64', 'G r:f64'),
    0x02: ('global.load.indirect.f64', 'r:i32 w:f64'),
    0x03: ('global.store.indirect.f64', 'r:i32 r:f64'),
    0x04: ('const.f64.zero', 'w:f64'),
    0x05: ('const.f64', 'A:f64 w:f64'),
    0x06: ('list.get.f64', 'r:ref r:i32 w:f64'),
    0x07: ('list.set.f64', 'r:ref r:i32 r:f64'),
    0x08: ('select.f64', 'r:i32 r:f64 r:f64 w:f64'),
    0x09: ('switch.f64', 'r:i32 r:f64 V w:f64'),
    0x0A: ('add.f64', 'r:f64 r:f64 w:f64'),
    0x0B: ('sub.f64', 'r:f64 r:f64 w:f64'),
    0x0C: ('mul.f64', 'r:f64 r:f64 w:f64'),
    0x0D: ('div.f64', 'r:f64 r:f64 w:f64'),
    0x0E: ('rem.f64', 'r:f64 r:f64 w:f64'),
    0x0F: ('fma.f64', 'r:f64 r:f64 r:f64 w:f64'),
    0x10: ('abs.f64', 'r:f64 w:f64'),
    0x11: ('neg.f64', 'r:f64 w:f64'),
    0x12: ('ceil.f64', 'r:f64 w:f64'),
    0x13: ('floor.f64', 'r:f64 w:f64'),
    0x14: ('trunc.f64.f32', 'r:f64 w:f32'),
    0x15: ('ext.f32.f64', 'r:f32 w:f64'),
    0x16: ('cast.si32.f64', 'r:i32 w:f64'),
    0x17: ('cast.ui32.f64', 'r:i32 w:f64'),
    0x18: ('cast.f64.si32', 'r:f64 w:i32'),
    0x19: ('cast.f64.ui32', 'r:f64 w:i32'),
    0x1A: ('cast.si64.f64', 'r:i64 w:f64'),
    0x1B: ('cast.ui64.f64', 'r:i64 w:f64'),
    0x1C: ('cast.f64.si64', 'r:f64 w:i64'),
    0x1D: ('cast.f64.ui64', 'r:f64 w:i64'),
    0x1E: ('bitcast.i64.f64', 'r:i64 w:f64'),
    0x1F: ('bitcast.f64.i64', 'r:f64 w:i64'),
    0x20: ('atan.f64', 'r:f64 w:f64'),
    0x21: ('atan2.f64', 'r:f64 r:f64 w:f64'),
    0x22: ('cos.f64', 'r:f64 w:f64'),
    0x23: ('sin.f64', 'r:f64 w:f64'),
    0x24: ('exp.f64', 'r:f64 w:f64'),
    0x25: ('exp2.f64', 'r:f64 w:f64'),
    0x26: ('expm1.f64', 'r:f64 w:f64'),
    0x27: ('log.f64', 'r:f64 w:f64'),
    0x28: ('log10.f64', 'r:f64 w:f64'),
    0x29: ('log1p.f64', 'r:f64 w:f64'),
    0x2A: ('log2.f64', 'r:f64 w:f64'),
    0x2B: ('pow.f64', 'r:f64 r:f64 w:f64'),
    0x2C: ('rsqrt.f64', 'r:f64 w:f64'),
    0x2D: ('sqrt.f64', 'r:f64 w:f64'),
    0x2E: ('tanh.f64', 'r:f64 w:f64'),
    0x2F: ('erf.f64', 'r:f64 w:f64'),
    0x30: ('cmp.eq.f64.o', 'r:f64 r:f64 w:i32'),
    0x31: ('cmp.eq.f64.u', 'r:f64 r:f64 w:i32'),
    0x32: ('cmp.ne.f64.o', 'r:f64 r:f64 w:i32'),
    0x33: ('cmp.ne.f64.u', 'r:f64 r:f64 w:i32'),
    0x34: ('cmp.lt.f64.o', 'r:f64 r:f64 w:i32'),
    0x35: ('cmp.lt.f64.u', 'r:f64 r:f64 w:i32'),
    0x36: ('cmp.lte.f64.o', 'r:f64 r:f64 w:i32'),
    0x37: ('cmp.lte.f64.u', 'r:f64 r:f64 w:i32'),
    0x38: ('cmp.nan.f64', 'r:f64 w:i32'),
    0x39: ('buffer.load.f64', 'r:ref r:i64 w:f64'),
    0x3A: ('buffer.store.f64', 'r:ref r:i64 r:f64'),
    0x3B: ('buffer.fill.f64', 'r:ref r:i64 r:i64 r:f64'),
    0x3C: ('round.f64', 'r:f64 w:f64'),
    0x3D: ('min.f64', 'r:f64 r:f64 w:f64'),
    0x3E: ('max.f64', 'r:f64 r:f64 w:f64'),
    0x3F: ('round.f64.even', 'r:f64 w:f64'),
}

OPSETS = {None: CORE_OPS, PREFIX_EXT_F32: EXT_F32_OPS, PREFIX_EXT_F64: EXT_F64_OPS}
_PREFIX_NAME = {None: "", PREFIX_EXT_F32: "ext_f32 ", PREFIX_EXT_F64: "ext_f64 "}

# Parsed layouts: tuple of (code, bank-or-type) per field.
_LAYOUTS: dict[tuple[int | None, int], tuple[str, tuple[tuple[str, str], ...]]] = {}
for _prefix, _table in OPSETS.items():
    for _op, (_name, _layout) in _table.items():
        _fields = []
        for _f in _layout.split():
            code, _, arg = _f.partition(":")
            _fields.append((code, arg))
        _LAYOUTS[(_prefix, _op)] = (_name, tuple(_fields))

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
