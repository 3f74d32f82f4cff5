"""`--trace_execution`: one line per executed VM instruction, in IREE's format.

IREE's runtime built with `IREE_VM_EXECUTION_TRACING_ENABLE` (off in its release builds,
the pip `iree-run-module` among them) prints, before each bytecode instruction it
dispatches, a line to stderr:

    [module.fn+0000002A]    %i4:5 = vm.add.i64 %i0:1(3), %i2:3(4)

that is the function (its debug name by internal ordinal, or `@ordinal`), the offset of the
instruction's first byte, four spaces, and the instruction disassembled with the value of
every register it reads in parentheses. The block marker is printed (`<block>`) only where
a function is entered: branches land past it. Imports print nothing of their own.

tinyhal runs a traced module through a separate translation (`codegen.generate_module`
with `traced=True`): no data-flow shaping, no native loops, no recording blocks, and a
call `_tr(site, values)` before each instruction, where `site` is what `describe` made
of the instruction here (text and value kinds) and `values` the registers it reads. The
untraced translation, which everything else runs, is not touched.

Values print as IREE prints them: `%d` for i32 operands, the 64-bit value for i64,
`%.9g` / `%.17g` for f32 / f64, `!type/0x...` or `null` for refs; in call, return, branch
and discard lists every integer register prints as its unsigned low 32 bits (IREE reads
the 32-bit slot there whatever it holds). A ref's address is the object's `id`, so only
its type and nullness can be compared with IREE's.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import IO, Any

from . import isa
from .numbers import f32_bits, round_f32

__all__ = ["Tracer", "describe", "entry_site", "function_label", "list_kinds", "ref_type_name",
           "traced_program"]

_M32 = 0xFFFFFFFF
_LIST_KINDS = {"i": "u32", "I": "u32", "f": "u32f", "F": "u32d", "r": "ref"}


def traced_program(module: Any) -> Any:
    """`module`'s traced translation (`codegen.generate_module(..., traced=True)`): made
    for each traced context, never cached (tracing is for debugging, not for speed)."""
    from . import codegen
    from .verifier import verify_module

    return codegen.generate_module(module, verify_module(module), traced=True)


def function_label(module: Any, ordinal: int) -> str | None:
    """The name IREE gives internal function `ordinal` in a trace: the debug database's
    entry at that position (iree-compile 3.13 may list fewer functions than the module
    has, and IREE still reads them by position), else none."""
    db = module.debug_database
    if db is None or not 0 <= ordinal < len(db.functions):
        return None
    return db.functions[ordinal].local_name or None


def _frame(module: Any, ordinal: int) -> str:
    label = function_label(module, ordinal)
    return f"{module.name}.{label}" if label else f"{module.name}@{ordinal}"


def _callee(module: Any, ordinal: int) -> str:
    if ordinal & isa.IMPORT_BIT:
        return module.imports[ordinal & ~isa.IMPORT_BIT].full_name
    label = function_label(module, ordinal)
    return f"{module.name}.{label}" if label else f"{module.name}:{ordinal}"


def _name(raw: int, bank: str, move_names: bool = False) -> str:
    if bank == "ref":
        reg = raw & isa.REF_MASK
        return f"%R{reg}" if move_names and raw & isa.MOVE_BIT else f"%r{reg}"
    if bank in ("i64", "f64"):
        return f"%i{raw}:{raw + 1}"
    return f"%i{raw}"


def _any_name(raw: int) -> str:
    """A register of a list (call, return, branch operands): move shown as `%R`."""
    return _name(raw, "ref" if raw & isa.REF_BIT else "i32", True)


# Instructions whose ref registers IREE names with their move bit (`%R3` for a move).
_MOVE_NAMED = {"global.load.ref", "global.store.ref", "global.load.indirect.ref",
               "global.store.indirect.ref", "assign.ref", "const.ref.rodata",
               "buffer.alloc", "buffer.clone", "list.alloc", "list.get.ref",
               "list.set.ref", "select.ref", "switch.ref", "cast.any.ref"}


class _Site:
    """The text of one traced instruction: literal pieces around value slots."""

    def __init__(self) -> None:
        self.parts: list[str | tuple] = []
        self.reads: list[tuple[int, str]] = []  # (raw register, kind) per value passed

    def text(self, s: str) -> None:
        self.parts.append(s)

    def value(self, raw: int, kind: str, paren: bool = True) -> None:
        self.parts.append((kind, paren))
        self.reads.append((raw, kind))

    def reg(self, raw: int, bank: str, move_names: bool = False) -> None:
        """A register read: its name and its value in parentheses."""
        self.text(_name(raw, bank, move_names))
        self.value(raw, bank)

    def listed(self, raws, kinds) -> None:
        for n, (raw, kind) in enumerate(zip(raws, kinds)):
            self.text((", " if n else "") + _any_name(raw) + "(")
            self.value(raw, kind, False)
            self.text(")")

    def remap(self, pairs, slot_kind: Callable[[int], str]) -> None:
        for n, (src, dst) in enumerate(pairs):
            self.text((", " if n else "") + _any_name(src) + "(")
            self.value(src, "ref" if src & isa.REF_BIT else slot_kind(src), False)
            self.text(")->" + _any_name(dst))

    def global_value(self, kind: str, offset: int | None) -> None:
        """The global's current value, read when the line is printed: at `offset`, or
        (None) at the next value passed (an indirect load's index register)."""
        self.parts.append(("g" + kind, offset))


def describe(module: Any, ins: Any, slot_kind: Callable[[int], str],
             arg_kinds: Callable[[int], tuple[str, ...]],
             result_kinds: tuple[str, ...]) -> _Site:
    """The trace line of `ins` (without its frame prefix): text pieces and the registers
    whose values it shows, as IREE's disassembler writes it. `slot_kind(raw)` says how a
    32-bit slot in a branch list holds its value (`u32`: an i32 or f32; `u32hi`: the high
    half of the i64 in the slot before; `u32pair`: that or its own, told by the value;
    `u32d` / `u32dhi`: a half of an f64); `arg_kinds(ordinal)` the list kinds of a
    callee's arguments; `result_kinds` those of this function's results."""
    s = _Site()
    name, f = ins.name, ins.fields
    banks = [arg for code, arg in ins.layout if code in ("r", "w")]
    raws = [v for (code, _a), v in zip(ins.layout, f) if code in ("r", "w")]
    codes = [code for code, _a in ins.layout if code in ("r", "w")]
    move_names = name in _MOVE_NAMED
    effect = isa.EFFECTS.get(name)
    # a branch by its operand layout: "BO" a jump, "rBO"/"rBOBO" conditional, "rBOHC" a table
    branch = "".join(code for code, _a in ins.layout) if name in isa.TERMINATORS else ""
    reads = [(raw, bank) for raw, bank, code in zip(raws, banks, codes) if code == "r"]
    writes = [(raw, bank) for raw, bank, code in zip(raws, banks, codes) if code == "w"]

    def results() -> None:
        if writes:
            s.text(", ".join(_name(raw, bank, move_names) for raw, bank in writes) + " = ")

    def operands(pairs, sep: str = ", ") -> None:
        for n, (raw, bank) in enumerate(pairs):
            if n:
                s.text(sep)
            s.reg(raw, bank, move_names)

    if name == "block":
        s.text("<block>")
    elif name.startswith("global."):
        _global(s, name, f, reads, writes, module)
    elif name in ("const.i32", "const.i64"):
        results()
        width = 8 if name.endswith("32") else 16
        s.text(f"vm.{name} {f[0]}  // 0x{f[0] & (2 ** (width * 4) - 1):0{width}X}")
    elif name == "const.f32":
        results()
        s.text(f"vm.const.f32 {_g9(struct.unpack('<f', struct.pack('<I', f[0]))[0])}")
    elif name == "const.f64":
        results()
        s.text(f"vm.const.f64 {_g17(f[0])}")
    elif name == "const.ref.rodata":
        results()
        s.text(f"vm.const.ref.rodata {f[0]}  // {len(module.rodata[f[0]])}b")
    elif name.startswith("buffer.store."):
        s.text(f"vm.{name} ")
        value_kind = "u8" if name.endswith("i8") else "u16" if name.endswith("i16") else None
        s.text(_name(reads[2][0], reads[2][1]))
        s.value(reads[2][0], value_kind or reads[2][1])
        s.text(", ")
        operands(reads[:2])
    elif name in ("buffer.fill.i8", "buffer.fill.i16"):
        s.text(f"vm.{name} ")
        operands(reads[:3])
        s.text(", " + _name(reads[3][0], "i32"))
        s.value(reads[3][0], "u8" if name.endswith("i8") else "u16")
    elif name.startswith("select."):
        results()
        s.text(f"vm.{name} ")
        s.reg(*reads[0])
        s.text(" ? ")
        s.reg(*reads[1], move_names)
        s.text(" : ")
        s.reg(*reads[2], move_names)
        if name == "select.ref":
            s.text(" -> " + module.types[f[1]])
    elif name.startswith("switch."):
        results()
        s.text(f"vm.{name} ")
        s.reg(*reads[0])
        s.text("[")
        value_list = f[3] if name == "switch.ref" else f[2]
        s.listed(value_list, [("ref" if r & isa.REF_BIT else slot_kind(r)) for r in value_list])
        s.text("] else ")
        s.reg(*reads[1], move_names)
    elif name == "list.alloc":
        results()
        s.text("vm.list.alloc ")
        operands(reads)
        s.text(f" : !vm.list<{module.types[f[0]]}>")
    elif name == "list.get.ref":
        results()
        s.text("vm.list.get.ref ")
        operands(reads)
        s.text(" : " + module.types[f[2]])
    elif name == "cast.any.ref":
        results()
        s.text("vm.cast.any.ref ")
        operands(reads)
        s.text(" : !vm.ref<?> -> " + module.types[f[1]])
    elif effect == "call":
        _call(s, module, name, f, arg_kinds)
    elif name == "return":
        s.text("vm.return")
        if f[0]:
            s.text(" ")
            s.listed(f[0], [_LIST_KINDS[t] for t in result_kinds])
    elif name == "discard.refs":
        s.text("vm.discard.refs ")
        s.listed(f[0], ["ref"] * len(f[0]))
    elif effect == "output":
        s.text(f'vm.{name} "{f[0].decode("utf-8", "replace")}"(')
        s.listed(f[1], [("ref" if r & isa.REF_BIT else slot_kind(r)) for r in f[1]])
        s.text(")")
    elif effect == "fail":
        s.text("vm.fail ")
        s.reg(*reads[0])
        s.text(f', "{f[1].decode("utf-8", "replace")}"')
    elif name == "import.resolved":
        results()
        s.text(f"vm.import.resolved @{_callee(module, f[0])}")
        s.parts.append(("resolved", f[0] & ~isa.IMPORT_BIT))
    elif branch == "BO":
        s.text(f"vm.{name} ^{f[0]:08X}(")
        s.remap(f[1], slot_kind)
        s.text(")")
    elif branch in ("rBO", "rBOBO"):
        s.text(f"vm.{name} ")
        s.reg(f[0], "i32")
        s.text(f", ^{f[1]:08X}(")
        s.remap(f[2], slot_kind)
        if branch == "rBOBO":
            s.text(f"), ^{f[3]:08X}(")
            s.remap(f[4], slot_kind)
        s.text(")")
    elif branch == "rBOHC":
        s.text("vm.br_table ")
        s.reg(f[0], "i32")
        s.text(f" {{ default: ^{f[1]:08X}(")
        s.remap(f[2], slot_kind)
        for n, (target, pairs) in enumerate(f[4]):
            s.text(f"), {n}: ^{target:08X}(")
            s.remap(pairs, slot_kind)
        s.text(") }")
    else:
        results()
        s.text(f"vm.{name}" + (" " if reads else ""))
        operands(reads)
    return s


def _global(s: _Site, name: str, f, reads, writes, module) -> None:
    bank = name.rsplit(".", 1)[1]
    indirect = ".indirect." in name
    if name.startswith("global.load"):
        raw, wbank = writes[0]
        s.text(_name(raw, wbank, True) + f" = vm.{name} ")
        table = ".refs[" if bank == "ref" else ".rwdata["
        if indirect:
            s.text(table)
            s.reg(*reads[0])
            s.text("]")
            s.reads.append((reads[0][0], "i32"))  # the index again: where to read
            s.global_value(bank, None)
        else:
            s.text(f"{table}{f[0]}]")
            s.global_value(bank, f[0])
        if bank == "ref":
            s.text(" : " + module.types[f[1]])
        return
    value = reads[-1]
    s.text(f"vm.{name} ")
    s.reg(value[0], value[1], True)
    table = ".refs[" if bank == "ref" else ".rwdata["
    if indirect:
        s.text(", " + table)
        s.reg(*reads[0])
        s.text("]")
    else:
        s.text(f", {table}{f[0]}]")
    if bank == "ref":
        s.text(" : " + module.types[f[1]])


def _call(s: _Site, module, name: str, f, arg_kinds) -> None:
    ordinal = f[0]
    variadic = "variadic" in name
    yieldable = name.endswith("yieldable")
    segments = f[1] if variadic else None
    src = f[2] if variadic else f[1]
    dst = f[-1]
    if dst and not yieldable:
        s.text(", ".join(_any_name(r) for r in dst) + " = ")
    s.text(f"vm.{name} @{_callee(module, ordinal)}")
    if variadic:
        s.text(" segments[" + ", ".join(str(n) for n in segments) + "]")
    s.text("(")
    kinds = list(arg_kinds(ordinal))
    if variadic:
        kinds = _flatten_variadic(kinds, segments)
    kinds += ["u32"] * (len(src) - len(kinds))
    s.listed(src, kinds)
    s.text(")")
    if yieldable:
        s.text(f" -> ^{f[-2]:08X}(" + ", ".join(_any_name(r) for r in dst) + ")")


def _flatten_variadic(kinds: list, segments) -> list[str]:
    """The list kinds of a variadic call's flat operand list: a tuple segment repeated as
    many times as its segment size says."""
    out: list[str] = []
    for kind, count in zip(kinds, segments):
        if isinstance(kind, tuple):
            for _ in range(count):
                out.extend(kind)
        else:
            out.append(kind)
    return out


def list_kinds(cconv_types) -> tuple:
    """A calling convention's argument types as list kinds (a variadic segment as a
    tuple of its element kinds)."""
    return tuple(tuple(_LIST_KINDS[t] for t in c[1]) if isinstance(c, tuple) else _LIST_KINDS[c]
                 for c in cconv_types)


def entry_site() -> _Site:
    """The line IREE prints on entering a function: its block marker."""
    s = _Site()
    s.text("<block>")
    return s


# -- printing

def _g9(v: float) -> str:
    if math.isnan(v):
        return "-nan" if math.copysign(1.0, v) < 0 else "nan"
    return "%.9g" % v


def _g17(v: float) -> str:
    if math.isnan(v):
        return "-nan" if math.copysign(1.0, v) < 0 else "nan"
    return "%.17g" % v


def _f32_value(v) -> float:
    return struct.unpack("<f", struct.pack("<I", f32_bits(v)))[0]


def _ref_text(obj: Any) -> str:
    if obj is None:
        return "null"
    return f"!{ref_type_name(obj)}/0x{id(obj):x}"


_REF_TYPES: list[tuple[type, str]] = []


def ref_type_name(obj: Any) -> str:
    """The IREE type name of a ref (`hal.buffer_view`, `vm.list`, ...)."""
    name = getattr(type(obj), "type_name", None)
    if isinstance(name, str):
        return name
    if not _REF_TYPES:
        from ..hal import Allocator, Buffer, BufferView, CommandBuffer, Device, Executable
        from ..hal.semaphore import Fence
        from .hal_module import HalFile

        _REF_TYPES.extend([(BufferView, "hal.buffer_view"), (Buffer, "hal.buffer"),
                           (CommandBuffer, "hal.command_buffer"), (Device, "hal.device"),
                           (Executable, "hal.executable"), (Fence, "hal.fence"),
                           (Allocator, "hal.allocator"), (HalFile, "hal.file")])
    for cls, type_name in _REF_TYPES:
        if isinstance(obj, cls):
            return type_name
    return type(obj).__name__


def _u32f(v) -> int:
    return f32_bits(v)


def _u32d(v) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0] & _M32


def _u32dhi(v) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0] >> 32


def _pair(v) -> int:
    """The odd slot after one that may hold an i64 whole, from (that slot's local, this
    slot's local): the i64's high half when the value is wider than 32 bits, else this
    slot's own value."""
    wide, own = v
    if isinstance(wide, int) and not -0x80000000 <= wide <= 0x7FFFFFFF:
        return (wide >> 32) & _M32
    return _slot(own)


def _as_int_bits(v, bits: int) -> int:
    """An integer register's value; a float (a module reading an f32/f64 register as an
    integer) as its bits, as IREE reads the slot."""
    if not isinstance(v, float):
        return v
    if round_f32(v) == v or math.isnan(v):
        raw = f32_bits(v)
        return raw - ((raw & 0x80000000) << 1) if bits == 32 else raw
    raw = struct.unpack("<q", struct.pack("<d", v))[0]
    return ((raw + 0x80000000) & _M32) - 0x80000000 if bits == 32 else raw


def _slot(v) -> int:
    """A 32-bit slot read from a local that may hold an int or (by the function's data
    flow) an f32."""
    if isinstance(v, float):
        return f32_bits(v)
    return v & _M32


_VALUE: dict[str, Callable[[Any], str]] = {
    "i32": lambda v: str(_as_int_bits(v, 32)),
    "i64": lambda v: str(_as_int_bits(v, 64)),
    "f32": lambda v: _g9(_f32_value(v)),
    "f64": lambda v: _g17(v),
    "ref": _ref_text,
    "u8": lambda v: str(v & 0xFF),
    "u16": lambda v: str(v & 0xFFFF),
    "u32": lambda v: str(_slot(v)),
    "u32hi": lambda v: str((v >> 32) & _M32),
    "u32f": lambda v: str(_u32f(v)),
    "u32d": lambda v: str(_u32d(v)),
    "u32dhi": lambda v: str(_u32dhi(v)),
    "u32pair": lambda v: str(_pair(v)),
}


class Tracer:
    """Prints a traced module instance's lines: `tracer(site, values)` per instruction
    (see `codegen`, `traced=True`). `stream` is written one line at a time, as IREE's
    `fprintf(stderr, ...)`."""

    def __init__(self, module: Any, sites: tuple, linkage: Any, stream: IO[str]) -> None:
        self.sites = [(f"[{_frame(module, ordinal)}+{pc:08X}]    ", parts)
                      for ordinal, pc, parts in sites]
        self.linkage = linkage
        self.stream = stream

    def __call__(self, site: int, values: tuple) -> None:
        prefix, parts = self.sites[site]
        out = [prefix]
        n = 0
        for part in parts:
            if part.__class__ is str:
                out.append(part)
                continue
            kind, arg = part
            if kind == "resolved":
                out.append(" // (resolved)" if self.linkage.resolved[arg] else " // (unresolved)")
                continue
            if kind[0] == "g":  # a global's value: at a static offset, or the index passed
                if arg is None:
                    arg = values[n]
                    n += 1
                out.append("(" + self._global(kind[1:], arg) + ")")
                continue
            text = _VALUE[kind](values[n])
            n += 1
            out.append(f"({text})" if arg else text)
        self.stream.write("".join(out) + "\n")

    def _global(self, bank: str, offset: int) -> str:
        if bank == "ref":
            refs = self.linkage.global_refs
            return _ref_text(refs[offset]) if 0 <= offset < len(refs) else "null"
        data = self.linkage.rwdata
        fmt = {"i32": "<i", "i64": "<q", "f32": "<f", "f64": "<d"}[bank]
        if not 0 <= offset <= len(data) - struct.calcsize(fmt):
            return "0"
        value = struct.unpack_from(fmt, data, offset)[0]
        return _g9(value) if bank == "f32" else _g17(value) if bank == "f64" else str(value)
