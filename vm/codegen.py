"""Translates verified bytecode functions into Python source, compiled once per module.

Every VM function becomes one Python function whose registers are local variables
(`i<n>` for the 32-bit bank, where f32 values and whole i64/f64 values live in their
first slot, and `r<n>` for refs), so the inner loop does no dict look-ups, attribute
chains or allocation per instruction. Basic blocks are dispatched by a block index
through a binary `if` tree inside one `while` loop.

Integer arithmetic follows the function's data flow (`regflow.py`): single-use results
stay unwrapped inside their reader's expression and are wrapped once where stored,
constant registers become literals, compares fold into their branch, loop-carried
values are computed in place and may be held unsigned, and counted loops become
`for ... in range`.

A function that may suspend (it contains `vm.yield`, `call.yieldable` or calls such a
function) is generated as a Python generator: suspension points `yield` either `None`
(`vm.yield`) or a `native.Suspend`, and internal calls to such functions use
`yield from`, so the whole VM stack suspends and resumes as one coroutine.

Nothing read from the module is pasted into source except integers formatted here;
strings and floats go through the per-module constant table `_K`.
"""

from __future__ import annotations

import linecache
import math
import re
import struct
from array import array
from dataclasses import dataclass
from types import GeneratorType

from ..errors import InvalidArgumentError, OutOfRangeError
from . import isa, ops, record_blocks, scalar
from .cconv import cconv_registers
from .native import Suspend

M32 = "4294967295"
M64 = "18446744073709551615"
H32 = "2147483648"
H64 = "9223372036854775808"


def _w32(expr: str) -> str:
    return f"({expr} + {H32} & {M32}) - {H32}"


def _w64(expr: str) -> str:
    return f"({expr} + {H64} & {M64}) - {H64}"


def _wrapped(res: str, expr: str, bits: int) -> str:
    """`res = expr` wrapped to a signed `bits` integer; the common in-range case costs
    two compares instead of three big-int operations."""
    hi, lo = (2**31 - 1, -(2**31)) if bits == 32 else (2**63 - 1, -(2**63))
    wrap = _w32(res) if bits == 32 else _w64(res)
    return f"{res} = {expr}\nif {res} > {hi} or {res} < {lo}: {res} = {wrap}"


# Straight-line ops: template over the instruction's fields in layout order. The ring ops
# (add, sub, mul, fma, and, or, xor, not, shl) are emitted by `_Gen.ring_op` instead.
_SIMPLE: dict[str, str] = {}


def _int_ops(bits: int) -> None:
    t = f"i{bits}"

    def w(expr: str, res: str) -> str:
        return _wrapped(res, expr, bits)

    m = M32 if bits == 32 else M64
    sh = 31 if bits == 32 else 63
    _SIMPLE.update({
        f"div.{t}.s": "{2} = _div_%ss({0}, {1})" % t,
        f"div.{t}.u": "{2} = _div_%su({0}, {1})" % t,
        f"rem.{t}.s": "{2} = _rem_%ss({0}, {1})" % t,
        f"rem.{t}.u": "{2} = _rem_%su({0}, {1})" % t,
        f"abs.{t}": w("abs({0})", "{1}"),
        f"min.{t}.s": "{2} = {1} if {1} < {0} else {0}",
        f"min.{t}.u": "{2} = {1} if ({1} & %s) < ({0} & %s) else {0}" % (m, m),
        f"max.{t}.s": "{2} = {1} if {0} < {1} else {0}",
        f"max.{t}.u": "{2} = {1} if ({0} & %s) < ({1} & %s) else {0}" % (m, m),
        f"ctlz.{t}": "{1} = %d - ({0} & %s).bit_length()" % (bits, m),
        f"shr.{t}.s": "{2} = {0} >> ({1} & %d)" % sh,
        f"shr.{t}.u": w("({0} & %s) >> ({1} & %d)" % (m, sh), "{2}"),
        f"cmp.eq.{t}": "{2} = 1 if {0} == {1} else 0",
        f"cmp.ne.{t}": "{2} = 1 if {0} != {1} else 0",
        f"cmp.lt.{t}.s": "{2} = 1 if {0} < {1} else 0",
        f"cmp.lt.{t}.u": "{2} = 1 if ({0} & %s) < ({1} & %s) else 0" % (m, m),
        f"cmp.nz.{t}": "{1} = 1 if {0} else 0",
        f"select.{t}": "{3} = {1} if {0} else {2}",
        f"const.{t}": "{1} = {0!r}",
        f"const.{t}.zero": "{0} = 0",
        f"global.load.{t}": "{1} = _ld_%s(_G, {0})[0]" % t,
        f"global.store.{t}": "_st_%s(_G, {0}, {1})" % t,
        f"global.load.indirect.{t}": "{1} = _ld_%s(_G, _goff({0}, %d, _GCAP))[0]" % (t, bits // 8),
        f"global.store.indirect.{t}": "_st_%s(_G, _goff({0}, %d, _GCAP), {1})" % (t, bits // 8),
        f"list.get.{t}": "{2} = _list_get_%s({0}, {1})" % t,
        f"list.set.{t}": "_list_set_%s({0}, {1}, {2})" % t,
    })


_int_ops(32)
_int_ops(64)

_SIMPLE.update({
    "trunc.i32.i8": "{1} = {0} & 255",
    "trunc.i32.i16": "{1} = {0} & 65535",
    "ext.i8.i32.s": "{1} = {0} & 255\nif {1} > 127: {1} -= 256",
    "ext.i8.i32.u": "{1} = {0} & 255",
    "ext.i16.i32.s": "{1} = {0} & 65535\nif {1} > 32767: {1} -= 65536",
    "ext.i16.i32.u": "{1} = {0} & 65535",
    "trunc.i64.i32": "{1} = {0} & %s\nif {1} > 2147483647: {1} -= 4294967296" % M32,
    "ext.i32.i64.s": "{1} = {0}",
    "ext.i32.i64.u": "{1} = {0} & " + M32,
    "cmp.eq.ref": "{2} = 1 if {0} is {1} else 0",
    "cmp.ne.ref": "{2} = 0 if {0} is {1} else 1",
    "cmp.nz.ref": "{1} = 0 if {0} is None else 1",
    "const.ref.zero": "{0} = None",
    "const.ref.rodata": "{1} = _ROD[{0}]",
    "list.reserve": "_list_reserve({0}, {1})",
    "list.size": "{1} = _list_size({0})",
    "list.resize": "_list_resize({0}, {1})",
    "buffer.alloc": "{2} = _buffer_alloc({0}, {1})",
    "buffer.clone": "{4} = _buffer_clone({0}, {1}, {2}, {3})",
    "buffer.length": "{1} = _buffer_length({0})",
    "buffer.copy": "_buffer_copy({0}, {1}, {2}, {3}, {4})",
    "buffer.compare": "{5} = _buffer_compare({0}, {1}, {2}, {3}, {4})",
    "buffer.hash": "{3} = _buffer_hash({0}, {1}, {2})",
    "fail": "if {0}: raise _fail({0}, {1})",
})
for _w in ("i8.u", "i8.s", "i16.u", "i16.s", "i32", "i64", "f32", "f64"):
    _SIMPLE[f"buffer.load.{_w}"] = "{2} = _buffer_load_%s({0}, {1})" % _w.replace(".", "")
for _w in ("i8", "i16", "i32", "i64", "f32", "f64"):
    _SIMPLE[f"buffer.store.{_w}"] = "_buffer_store_%s({0}, {1}, {2})" % _w
    _SIMPLE[f"buffer.fill.{_w}"] = "_buffer_fill_%s({0}, {1}, {2}, {3})" % _w

_FR = "_fa[0] = {e}; {r} = _fa[0]"  # round to binary32 through the per-call array


def _float_ops(t: str) -> None:
    f32 = t == "f32"

    def arith(expr: str, res: str) -> str:
        return _FR.format(e=expr, r=res) if f32 else f"{res} = {expr}"

    _SIMPLE.update({
        # Which NaN a commutative op returns depends on how CPython was compiled (and
        # differs between its generic and specialised paths); IREE returns the first
        # NaN operand's payload, so a NaN result is fixed up explicitly.
        f"add.{t}": "_t = {0} + {1}\nif _t != _t: _t = _nanp({0}, {1}, _t)\n"
        + arith("_t", "{2}"),
        f"sub.{t}": arith("{0} - {1}", "{2}"),
        f"mul.{t}": "_t = {0} * {1}\nif _t != _t: _t = _nanp({0}, {1}, _t)\n"
        + arith("_t", "{2}"),
        f"div.{t}": arith("({0} / {1} if {1} else _div_f({0}, {1}))", "{2}"),
        f"rem.{t}": "{2} = _rem_%s({0}, {1})" % t,
        f"fma.{t}": (
            "_t = {0} * {1}\nif _t != _t: _t = _nanp({0}, {1}, _t)\n"
            + ("_fa[0] = _t; _t = _fa[0] + {2}\nif _t != _t: _t = _nanp(_fa[0], {2}, _t)\n"
               "_fa[0] = _t; {3} = _fa[0]" if f32 else
               "_u = _t + {2}\nif _u != _u: _u = _nanp(_t, {2}, _u)\n{3} = _u")
        ),
        f"abs.{t}": "{1} = abs({0})",
        f"neg.{t}": "{1} = -{0}",
        f"min.{t}": "{2} = {1} if {1} < {0} else {0}",
        f"max.{t}": "{2} = {1} if {0} < {1} else {0}",
        f"atan2.{t}": "{2} = _atan2_%s({0}, {1})" % t,
        f"pow.{t}": "{2} = _pow_%s({0}, {1})" % t,
        f"rsqrt.{t}": "{1} = _rsqrt_%s({0})" % t,
        f"round.{t}.even": "{1} = _round_even_%s({0})" % t,
        f"cmp.eq.{t}.o": "{2} = 1 if {0} == {1} else 0",
        f"cmp.eq.{t}.u": "{2} = 0 if ({0} < {1} or {0} > {1}) else 1",
        f"cmp.ne.{t}.o": "{2} = 1 if {0} != {1} else 0",
        f"cmp.ne.{t}.u": "{2} = 1 if {0} != {1} else 0",
        f"cmp.lt.{t}.o": "{2} = 1 if {0} < {1} else 0",
        f"cmp.lt.{t}.u": "{2} = 0 if {0} >= {1} else 1",
        f"cmp.lte.{t}.o": "{2} = 1 if {0} <= {1} else 0",
        f"cmp.lte.{t}.u": "{2} = 0 if {0} > {1} else 1",
        f"cmp.nan.{t}": "{1} = 1 if {0} != {0} else 0",
        f"select.{t}": "{3} = {1} if {0} else {2}",
        f"const.{t}.zero": "{0} = 0.0",
        f"global.load.{t}": "{1} = _gload_%s(_G, {0})" % t,
        f"global.store.{t}": "_gstore_%s(_G, {0}, {1})" % t,
        f"global.load.indirect.{t}": "{1} = _gload_%s(_G, _goff({0}, %d, _GCAP))"
        % (t, 4 if f32 else 8),
        f"global.store.indirect.{t}": "_gstore_%s(_G, _goff({0}, %d, _GCAP), {1})"
        % (t, 4 if f32 else 8),
        f"list.get.{t}": "{2} = _list_get_%s({0}, {1})" % t,
        f"list.set.{t}": "_list_set_%s({0}, {1}, {2})" % t,
    })
    for name in ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p",
                 "log2", "sqrt", "tanh", "erf", "ceil", "floor", "round"):
        _SIMPLE[f"{name}.{t}"] = "{1} = _%s_%s({0})" % (name, t)


_float_ops("f32")
_float_ops("f64")
_SIMPLE.update({
    "cast.si32.f32": _FR.format(e="{0}", r="{1}"),
    "cast.ui32.f32": _FR.format(e="({0} & %s)" % M32, r="{1}"),
    "cast.si64.f32": "{1} = _cast_si64_f32({0})",
    "cast.ui64.f32": "{1} = _cast_ui64_f32({0})",
    "cast.f32.si32": "{1} = _cast_f32_si32({0})",
    "cast.f32.ui32": "{1} = _cast_f32_ui32({0})",
    "cast.f32.si64": "{1} = _cast_f32_si64({0})",
    "cast.f32.ui64": "{1} = _cast_f32_ui64({0})",
    "bitcast.i32.f32": "{1} = _bitcast_i32_f32({0})",
    "bitcast.f32.i32": "{1} = _bitcast_f32_i32({0})",
    "trunc.f64.f32": _FR.format(e="{0}", r="{1}"),
    "ext.f32.f64": "{1} = float({0})",
    "cast.si32.f64": "{1} = float({0})",
    "cast.ui32.f64": "{1} = float({0} & %s)" % M32,
    "cast.si64.f64": "{1} = float({0})",
    "cast.ui64.f64": "{1} = float({0} & %s)" % M64,
    "cast.f64.si32": "{1} = _cast_f64_si32({0})",
    "cast.f64.ui32": "{1} = _cast_f64_ui32({0})",
    "cast.f64.si64": "{1} = _cast_f64_si64({0})",
    "cast.f64.ui64": "{1} = _cast_f64_ui64({0})",
    "bitcast.i64.f64": "{1} = _bitcast_i64_f64({0})",
    "bitcast.f64.i64": "{1} = _bitcast_f64_i64({0})",
})

_TERMINATORS = {"br", "cond_br", "br_table", "return", "yield", "call.yieldable",
                "call.variadic.yieldable", "break", "cond_break"}
_YIELDING = {"yield", "call.yieldable", "call.variadic.yieldable"}


def _struct_fn(fmt: str, kind: str):
    s = struct.Struct("<" + fmt)
    return s.unpack_from if kind == "ld" else s.pack_into


def _gload_f32(g, off):
    return ops.f32_from_bits(struct.unpack_from("<I", g, off)[0])


def _gstore_f32(g, off, v):
    struct.pack_into("<I", g, off, ops.f32_bits(v))


_ld_f64 = struct.Struct("<d").unpack_from
_st_f64 = struct.Struct("<d").pack_into


def _gload_f64(g, off):
    return _ld_f64(g, off)[0]


def _gstore_f64(g, off, v):
    _st_f64(g, off, v)


def base_namespace() -> dict:
    """Helpers every generated module sees (shared, immutable)."""
    ns = {
        "_array": array,
        "_Z": (0.0,),
        "_Suspend": Suspend,
        "_GenType": GeneratorType,
        "_ld_i32": _struct_fn("i", "ld"), "_st_i32": _struct_fn("i", "st"),
        "_ld_i64": _struct_fn("q", "ld"), "_st_i64": _struct_fn("q", "st"),
        "_gload_f32": _gload_f32, "_gstore_f32": _gstore_f32,
        "_gload_f64": _gload_f64, "_gstore_f64": _gstore_f64,
        "_goff": ops.global_offset,
        "_grefi": ops.global_ref_index,
        "_div_f": ops.div_f,
        "_nanp": ops.nan_propagate,
        "_wrap32": ops.wrap32, "_wrap64": ops.wrap64,
        "_round_f32": ops.round_f32,
        "_fail": ops.fail,
        "_check_ref_type": ops.check_ref_type,
        "_remember": ops.remember_call, "_UNSET": ops.UNSET,
    }
    for name in dir(ops):
        if name.startswith(("div_", "rem_", "buffer_", "list_", "cast_", "bitcast_", "fma_",
                            "atan2_", "pow_", "rsqrt_", "round_even_")):
            ns["_" + name] = getattr(ops, name)
    for name in ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p",
                 "log2", "sqrt", "tanh", "erf", "ceil", "floor", "round"):
        ns[f"_{name}_f32"] = ops.f32_unary(name)
        ns[f"_{name}_f64"] = ops.f64_unary(name)
    return ns


_BASE_NAMESPACE = base_namespace()


def element_type_name(type_name: str) -> str:
    """Maps a module type-table name to a VMList element type / ref type name."""
    t = type_name.strip()
    if t in ("i8", "i16", "i32", "i64", "f32", "f64"):
        return t
    if t in ("!vm.opaque", "?", "!vm.ref<?>", "opaque"):
        return "variant"
    if t.startswith("!"):
        t = t[1:]
    if t.startswith("vm.ref<") and t.endswith(">"):
        t = t[7:-1].lstrip("!")
    lt = t.find("<")
    if lt > 0:
        t = t[:lt]
    return t


@dataclass
class ModuleProgram:
    """The compiled Python form of a module, instantiated per context."""

    code: object  # code object defining `_f<ordinal>` functions
    filename: str
    source: str
    line_pcs: list  # line number (1-based) -> (ordinal, pc) or None
    generator_ordinals: frozenset
    constants: list
    import_yield_sites: frozenset  # import ordinals called with call.yieldable
    native_loops: dict  # ordinal -> scalar.ScalarProgram run natively in place of `_f<n>`
    record_blocks: tuple  # site -> record_blocks.RecordBlock, called as `_blk<site>`


class _Gen:
    """Per-function source emitter."""

    def __init__(self, module, fn, program_state) -> None:
        self.module = module
        self.fn = fn
        self.st = program_state
        desc = fn.descriptor
        self.i32_limit = _pow2(max(1, desc.i32_register_count))
        self.ref_limit = _pow2(max(1, desc.ref_register_count))
        self.where = f"{module.name}.{fn.name}"
        self.lines: list[tuple[int, str, int]] = []  # (indent, text, pc)
        self.i_regs: set[int] = set()
        self.r_regs: set[int] = set()
        self.uses_fa = False
        self.block_index: dict[int, int] = {}
        self.blocks: list = []
        self.cur_block = -1
        self.loop_mode = False
        self.self_loop_used = False
        self.inlining = False
        from . import regflow  # the translator's analysis: a warm cache never imports it

        self.flow = regflow.Flow()
        self.pending: dict[str, tuple[str, bool]] = {}  # fused ring results (expr, bounded)
        self.pending_cond: tuple[str, str] | None = None  # folded compare (register, cond)
        self.lazy: dict[str, int] = {}  # registers carried unreduced in this counted loop

    # -- register helpers
    def err(self, ins, msg: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{self.where}+{ins.pc:08X} ({ins.name}): {msg}")

    def ireg(self, ins, raw: int, wide: bool) -> str:
        """The value of an integer/float register as an expression, for a read."""
        return self.read(self.ireg_name(ins, raw, wide))

    def read(self, name: str) -> str:
        c = self.flow.constants.get(name)
        if c is not None:
            return str(c) if c >= 0 else f"({c})"
        w = self.flow.unsigned.get(name)
        if w is not None:
            h = H32 if w == 32 else H64
            return f"(({name} ^ {h}) - {h})"
        return name

    def ireg_name(self, ins, raw: int, wide: bool) -> str:
        """The local holding an integer/float register (validated), for a write."""
        if raw & isa.REF_BIT:
            raise self.err(ins, f"register {raw} is a ref register, expected i32/i64")
        if wide:
            if raw & 1:
                raise self.err(ins, f"64-bit register {raw} not 8-byte aligned")
            if raw + 1 >= self.i32_limit:
                raise OutOfRangeError(f"{self.where}: 64-bit register {raw} out of range")
        elif raw >= self.i32_limit:
            raise OutOfRangeError(f"{self.where}: register {raw} out of range")
        self.i_regs.add(raw)
        return f"i{raw}"

    def rreg(self, ins, raw: int) -> str:
        if not raw & isa.REF_BIT:
            raise self.err(ins, f"register {raw} is not a ref register")
        idx = raw & isa.REF_MASK
        if idx >= self.ref_limit:
            raise OutOfRangeError(f"{self.where}: ref register {idx} out of range")
        self.r_regs.add(idx)
        return f"r{idx}"

    def anyreg(self, ins, raw: int) -> str:
        """A register of either bank, for a read."""
        if raw & isa.REF_BIT:
            return self.rreg(ins, raw)
        return self.ireg(ins, raw, False)

    def const(self, value) -> str:
        return f"_K[{self.st.constant(value)}]"

    def type_name(self, ins, type_id: int) -> str:
        types = self.module.types
        if type_id >= len(types):
            raise OutOfRangeError(
                f"{self.where}: type id ordinal out of range: {type_id} (table={len(types)})"
            )
        return element_type_name(types[type_id])

    def block(self, ins, target: int) -> int:
        idx = self.block_index.get(target)
        if idx is None:
            raise self.err(ins, f"branch target {target:08X} is not a block")
        return idx

    # -- emit
    def emit(self, indent: int, text: str, pc: int) -> None:
        self.lines.append((indent, text, pc))

    def remap(self, ins, pairs, indent: int) -> None:
        from . import regflow

        skipped = self.flow.skipped_pairs.get(ins.pc, ())
        if regflow.slot_hazard(pairs):
            self.remap_slots(ins, [p for p in pairs if not p[0] & isa.REF_BIT], indent)
            pairs = [p for p in pairs if p[0] & isa.REF_BIT]
        for src, dst in pairs:
            if (src & isa.REF_BIT) != (dst & isa.REF_BIT):
                raise self.err(ins, "branch operand remaps between register banks")
            if not src & isa.REF_BIT:
                s = self.ireg_name(ins, src, False)
                d = self.ireg_name(ins, dst, False)
                if s != d and (s, d) not in skipped:
                    self.emit(indent, f"{d} = {self.copy_value(s, d)}", ins.pc)
                continue
            s = self.rreg(ins, src)
            d = self.rreg(ins, dst)
            if s != d:
                self.emit(indent, f"{d} = {s}", ins.pc)
                if src & isa.REF_BIT and src & isa.MOVE_BIT:
                    self.emit(indent, f"{s} = None", ins.pc)

    def remap_slots(self, ins, pairs, indent: int) -> None:
        """An integer remap list that reads a slot an earlier pair of it wrote, run as
        IREE runs every list: 32-bit slot moves one after another, so a later pair sees
        the earlier writes, halves of an i64 included (an i64 lives whole in its first
        slot's local here, so its halves are split out and joined back as needed)."""
        for src, dst in pairs:
            self.ireg_name(ins, src, False)
            self.ireg_name(ins, dst, False)
        wide = self.wide_slots(ins)

        def initial(slot: int) -> tuple[str, int]:
            if slot in wide:
                return ("lo", slot)
            if slot & 1 and slot - 1 in wide:
                return ("hi", slot - 1)
            return ("i32", slot)

        state: dict[int, tuple[str, int]] = {}
        for src, dst in pairs:
            state[dst] = state.get(src) or initial(src)
        moved64 = {d for d, (kind, slot) in state.items()
                   if not d & 1 and kind == "lo" and state.get(d + 1) == ("hi", slot)}

        def half(value: tuple[str, int]) -> str:
            kind, slot = value
            r = self.read(f"i{slot}")
            if kind == "lo":
                return f"((({r} & {M32}) ^ {H32}) - {H32})"
            if kind == "hi":
                return f"({r} >> 32)"
            return r

        out: list[tuple[str, str]] = []
        for dst in sorted(state):
            if dst & 1 and dst - 1 in moved64:
                continue
            if dst in moved64:
                lo, hi = state[dst], state[dst + 1]
                if (lo[0] == "lo" and hi == ("hi", lo[1])) or (
                        lo[0] == "i32" == hi[0] and not lo[1] & 1 and hi[1] == lo[1] + 1):
                    value = self.read(f"i{lo[1]}")
                else:
                    value = f"({half(hi)} << 32) | ({half(lo)} & {M32})"
            else:
                value = half(state[dst])
            out.append((f"i{dst}", value))
        for k, (_, value) in enumerate(out):
            self.emit(indent, f"_m{k} = {value}", ins.pc)
        for k, (name, _) in enumerate(out):
            self.emit(indent, f"{name} = _m{k}", ins.pc)

    def wide_slots(self, ins) -> set[int]:
        """First slots of the registers holding an i64 when `ins` runs: by the last typed
        write in its block, else by every typed write in the function being an i64."""
        params = {reg: {"I": "i64", "F": "f64", "i": "i32", "f": "f32"}[t]
                  for t, (bank, reg) in zip(self.fn.cconv.args,
                                            cconv_registers(self.fn.cconv.args))
                  if bank == "i"}
        kinds: dict[int, set] = {reg: {arg} for reg, arg in params.items()}
        for blk in self.blocks:
            for other in blk:
                for (code, arg), val in zip(other.layout, other.fields):
                    if code == "w" and arg != "ref":
                        kinds.setdefault(val, set()).add(arg)
        last: dict[int, str] = {}
        for bi, blk in enumerate(self.blocks):
            if blk[0].pc <= ins.pc <= blk[-1].pc:
                if bi == 0:
                    for reg, arg in params.items():
                        last[reg] = arg
                        if arg in ("i64", "f64"):
                            last[reg + 1] = "hi"
                for other in blk:
                    if other.pc >= ins.pc:
                        break
                    for (code, arg), val in zip(other.layout, other.fields):
                        if code == "w" and arg != "ref":
                            last[val] = arg
                            if arg in ("i64", "f64"):
                                last[val + 1] = "hi"
                            elif val & 1 and last.get(val - 1) in ("i64", "f64"):
                                last[val - 1] = "split"
                break
        wide = set()
        for slot, ks in kinds.items():
            arg = last.get(slot)
            if arg == "i64" or (arg is None and ks == {"i64"} and slot + 1 not in last):
                wide.add(slot)
        return wide

    def copy_value(self, src: str, dst: str) -> str:
        """`src`'s value in the form `dst` holds (see regflow: constant, unsigned)."""
        w = self.flow.unsigned.get(dst)
        if w is None:
            return self.read(src)
        if self.flow.unsigned.get(src) == w:
            return src
        m = M32 if w == 32 else M64
        c = self.flow.constants.get(src)
        if c is not None:
            return str(c & int(m))
        return f"{src} & {m}"

    def jump(self, ins, target_pc: int, pairs, indent: int) -> None:
        self.remap(ins, pairs, indent)
        self.goto(indent, self.block(ins, target_pc), ins.pc)

    def goto(self, indent: int, idx: int, pc: int, pre: tuple = ()) -> None:
        """Transfers control to block `idx` (after emitting `pre` lines)."""
        if self.loop_mode and idx == self.cur_block:
            for line in pre:
                self.emit(indent, line, pc)
            self.emit(indent, "continue", pc)  # the block's own `while` loop
            self.self_loop_used = True
            return
        self.emit(indent, f"_b = {idx}", pc)
        for line in pre:
            self.emit(indent, line, pc)
        self.emit(indent, "break" if self.loop_mode else "continue", pc)

    # Blocks this small are duplicated into an unconditional branch that targets them
    # (typically a loop header: compare + cond_br), saving a dispatch per iteration and
    # turning loops into self-loops that run as a plain Python `while`.
    TAIL_DUP_MAX = 4

    def _start_block(self, bi: int, loop_mode: bool) -> None:
        """Fresh emission state for block `bi`."""
        self.lines = []
        self.pending = {}
        self.pending_cond = None
        self.cur_block = bi
        self.loop_mode = loop_mode
        self.self_loop_used = False

    def _emit_block(self, bi: int, blk: list, loop_mode: bool) -> list:
        self._start_block(bi, loop_mode)
        self._emit_run(blk[1:], 0)
        if blk[-1].name not in _TERMINATORS:
            if bi + 1 < len(self.blocks):
                self.goto(0, bi + 1, blk[-1].pc)
            else:
                self.emit(0, "raise _fail(13, _FALLOFF)", blk[-1].pc)
        return self.lines

    def _emit_counted(self, bi: int, blk: list, loop: tuple) -> list:
        """A counted loop (regflow): the block's body under `for counter in range(...)`,
        its header's compare and step replaced by the range."""
        counter, bound, step_pc, header = loop
        self._start_block(bi, False)
        self.has_branches = True
        cmp, cond_br = self.blocks[header][1:]
        self.emit(0, f"for {counter} in range({counter}, {self.read(bound)}):", cmp.pc)
        self.lazy = self.flow.lazy.get(bi, {})
        self._emit_run([ins for ins in blk[1:-1] if ins.pc != step_pc], 1)
        br = blk[-1]
        self.remap(br, br.fields[1], 1)
        if self.lines[-1][0] == 0:
            self.emit(1, "pass", br.pc)
        for name, width in sorted(self.lazy.items()):
            self.emit(0, f"{name} &= {M32 if width == 32 else M64}", br.pc)
        self.lazy = {}
        self.emit(0, f"{counter} += 1", step_pc)
        self.jump(cond_br, cond_br.fields[3], cond_br.fields[4], 0)
        return self.lines

    def generate(self) -> list[tuple[int, str, int]]:
        from . import regflow

        fn = self.fn
        instrs = fn.instructions
        if not instrs or instrs[0].name != "block":
            raise InvalidArgumentError(f"{self.where}: function does not begin with a block")
        blocks: list[list] = []
        for ins in instrs:
            if ins.name == "block":
                self.block_index[ins.pc] = len(blocks)
                blocks.append([ins])
            else:
                blocks[-1].append(ins)
        if len(blocks) != fn.descriptor.block_count:
            raise InvalidArgumentError(
                f"{self.where}: {len(blocks)} blocks found, descriptor says "
                f"{fn.descriptor.block_count}"
            )
        last = blocks[-1][-1]
        if last.name not in _TERMINATORS and last.name != "fail":
            raise InvalidArgumentError(f"{self.where}: function missing terminator in the last block")

        self.blocks = blocks
        i_params = [f"i{reg}" for bank, reg in cconv_registers(fn.cconv.args) if bank == "i"]
        self.flow = regflow.analyse(fn, blocks, self.block_index, i_params,
                                    self.module.functions, self.module.imports,
                                    _TERMINATORS) or regflow.Flow()
        bodies: list[list[tuple[int, str, int]]] = []
        for bi, blk in enumerate(blocks):
            if bi in self.flow.counted:
                bodies.append(self._emit_counted(bi, blk, self.flow.counted[bi]))
                continue
            lines = self._emit_block(bi, blk, True)
            if self.self_loop_used:
                body = [(0, "while 1:", -1)]
                body += [(ind + 1, text, pc) for ind, text, pc in lines]
                body.append((0, "continue", -1))
            else:
                body = self._emit_block(bi, blk, False)
            bodies.append(body)

        # Header: parameters and register initialisation.
        params = []
        for bank, reg in cconv_registers(fn.cconv.args):
            params.append(f"{bank}{reg}")
        param_set = set(params)
        out: list[tuple[int, str, int]] = []
        name = f"_f{fn.ordinal}"
        out.append((0, f"def {name}({', '.join(params)}):", -1))
        inits_i = [f"i{n}" for n in sorted(self.i_regs) if f"i{n}" not in param_set]
        inits_r = [f"r{n}" for n in sorted(self.r_regs) if f"r{n}" not in param_set]
        for chunk in _chunks(inits_i, 32):
            out.append((1, " = ".join(chunk) + " = 0", -1))
        for chunk in _chunks(inits_r, 32):
            out.append((1, " = ".join(chunk) + " = None", -1))
        if self.uses_fa:
            out.append((1, "_fa = _array('f', _Z)", -1))
        if len(blocks) == 1 and not self.has_branches:
            for indent, text, pc in bodies[0]:
                if text == "continue" or text.startswith("_b = "):
                    continue
                out.append((1 + indent, text, pc))
            return out
        out.append((1, "_b = 0", -1))
        out.append((1, "while 1:", -1))
        self._tree(out, bodies, 0, len(blocks), 2)
        return out

    has_branches = False

    def _tree(self, out, bodies, lo: int, hi: int, indent: int) -> None:
        if hi - lo == 1:
            for ind, text, pc in bodies[lo]:
                out.append((indent + ind, text, pc))
            return
        if hi - lo == 2:
            out.append((indent, f"if _b == {lo}:", -1))
            self._tree(out, bodies, lo, lo + 1, indent + 1)
            out.append((indent, "else:", -1))
            self._tree(out, bodies, lo + 1, hi, indent + 1)
            return
        mid = (lo + hi) // 2
        out.append((indent, f"if _b < {mid}:", -1))
        self._tree(out, bodies, lo, mid, indent + 1)
        out.append((indent, "else:", -1))
        self._tree(out, bodies, mid, hi, indent + 1)

    # -- one instruction
    def instruction(self, ins, ind: int) -> None:
        from . import regflow

        name = ins.name
        f = ins.fields
        pc = ins.pc
        if pc in self.flow.constant_defs:
            self.ireg_name(ins, f[-1], name.startswith("const.i64"))
            return
        ring = regflow.RING_OPS.get(name)
        if ring is not None:
            self.ring_op(ins, ring, ind)
            return
        if name.startswith("const.i") and not name.endswith(".ref"):
            res = self.ireg_name(ins, f[-1], name.startswith("const.i64"))
            w = self.flow.unsigned.get(res)
            if w is not None:
                value = 0 if name.endswith("zero") else f[0]
                self.emit(ind, f"{res} = {value & (2**w - 1)}", pc)
                return
        tmpl = _SIMPLE.get(name)
        if tmpl is not None and name not in _SPECIAL:
            args = []
            for (code, arg), val in zip(ins.layout, f):
                if code in ("r", "w"):
                    if arg == "ref":
                        args.append(self.rreg(ins, val))
                    elif code == "w":
                        args.append(self.ireg_name(ins, val, arg in ("i64", "f64")))
                    else:
                        args.append(self.ireg(ins, val, arg in ("i64", "f64")))
                elif code == "A":
                    args.append(val)
                elif code == "G":
                    args.append(self.global_offset(ins, val))
                elif code == "D":
                    if val >= len(self.module.rodata):
                        raise OutOfRangeError(f"{self.where}: rodata ordinal {val} out of range")
                    args.append(val)
                elif code == "S":
                    args.append(self.const(val))
                else:
                    raise self.err(ins, f"unexpected field {code}")
            text = tmpl.format(*args)
            if pc in self.flow.fused_cmps and self.fold_compare(ins, text):
                return
            if "_fa" in text:
                self.uses_fa = True
            for line in text.split("\n"):
                self.emit(ind, line, pc)
            # move semantics for refs read with the move bit (e.g. none in _SIMPLE)
            return
        handler = getattr(self, "op_" + name.replace(".", "_"), None)
        if handler is None:
            raise self.err(ins, "unsupported instruction")
        handler(ins, f, ind)

    def fold_compare(self, ins, text: str) -> bool:
        """Keeps a compare whose only reader is the next cond_br as that branch's
        condition instead of materialising 0/1."""
        res = self.ireg_name(ins, ins.fields[-1], False)
        for head, tail, negate in ((f"{res} = 1 if ", " else 0", False),
                                   (f"{res} = 0 if ", " else 1", True)):
            if text.startswith(head) and text.endswith(tail) and "\n" not in text:
                cond = text[len(head): len(text) - len(tail)]
                self.pending_cond = (res, f"not ({cond})" if negate else f"({cond})")
                return True
        return False

    def ring_op(self, ins, ring, ind: int) -> None:
        """add/sub/mul/fma/and/or/xor/not/shl: operands that regflow fused are substituted
        unwrapped; the result is wrapped once, only where it is stored."""
        tmpl, width, ring_pos, bitwise = ring
        f = ins.fields
        operands = []
        bounded = bitwise
        lits: list[int | None] = []
        canonical: list[bool] = []
        for i, ((_code, arg), val) in enumerate(zip(ins.layout[:-1], f[:-1])):
            name = self.ireg_name(ins, val, arg == "i64")
            lit = self.flow.constants.get(name)
            lits.append(lit if i in ring_pos else None)
            canonical.append(True)
            if i not in ring_pos:
                operands.append(self.read(name))
            elif name in self.pending:
                text, b = self.pending.pop(name)
                operands.append(f"({text})")
                bounded = bounded and b
                canonical[-1] = b
            elif lit is not None:
                operands.append(self.read(name))
            elif self.flow.unsigned.get(name) == width:
                operands.append(name)
                bounded = False
                canonical[-1] = False
            else:
                operands.append(self.read(name))
        expr = tmpl.format(*operands)
        res = self.ireg_name(ins, f[-1], width == 64)
        pc = ins.pc
        if pc in self.flow.fused:
            self.pending[res] = (expr, bounded or pc in self.flow.in_range)
            return
        target = self.flow.rename.get(pc, res)
        self.i_regs.add(int(target[1:]))
        m, h = (M32, H32) if width == 32 else (M64, H64)
        hi, lo = (2**31 - 1, -(2**31)) if width == 32 else (2**63 - 1, -(2**63))
        if target in self.lazy:  # reduced once, after its counted loop
            self.emit(ind, f"{target} = {expr}", pc)
            return
        if target in self.flow.unsigned:
            self.emit(ind, f"{target} = ({expr}) & {m}", pc)
            return
        if bounded or pc in self.flow.in_range:
            self.emit(ind, f"{target} = {expr}", pc)
            return
        side = _one_sided(ins.name, canonical, lits, width)
        self.emit(ind, f"{target} = {expr}", pc)
        if side > 0:
            self.emit(ind, f"if {target} > {hi}: {target} -= {int(m) + 1}", pc)
        elif side < 0:
            self.emit(ind, f"if {target} < {lo}: {target} += {int(m) + 1}", pc)
        else:
            self.emit(ind, f"if {target} > {hi} or {target} < {lo}: "
                           f"{target} = ({target} + {h} & {m}) - {h}", pc)

    def global_offset(self, ins, val: int) -> int:
        width = 8 if ins.name.endswith(("i64", "f64")) else 4
        if val + width > self.module.global_bytes_capacity:
            raise OutOfRangeError(
                f"{self.where}: global byte_offset out of range: {val} "
                f"(rwdata={self.module.global_bytes_capacity})"
            )
        return val

    def moved(self, raw: int) -> bool:
        return bool(raw & isa.REF_BIT and raw & isa.MOVE_BIT)

    def clear_moved(self, ins, raws, keep: set, ind: int) -> None:
        for raw in raws:
            if self.moved(raw):
                name = f"r{raw & isa.REF_MASK}"
                if name not in keep:
                    self.emit(ind, f"{name} = None", ins.pc)

    # constants that need exact float bits
    def op_const_f32(self, ins, f, ind):
        value = ops.f32_from_bits(f[0])
        self.emit(ind, f"{self.ireg_name(ins, f[1], False)} = {self._float_literal(value)}", ins.pc)

    def op_const_f64(self, ins, f, ind):
        self.emit(ind, f"{self.ireg_name(ins, f[1], True)} = {self._float_literal(f[0])}", ins.pc)

    def _float_literal(self, value: float) -> str:
        if value.__class__ is float and math.isfinite(value):
            return repr(value)
        return self.const(value)

    def op_global_load_ref(self, ins, f, ind):
        g = f[0]
        if g >= self.module.global_ref_count:
            raise OutOfRangeError(f"{self.where}: global ref ordinal out of range: {g}")
        t = self.type_name(ins, f[1])
        res = self.rreg(ins, f[2])
        self.emit(ind, f"{res} = _check_ref_type(_GR[{g}], {self.const(t)}, 'global.load.ref')",
                  ins.pc)
        if f[2] & isa.MOVE_BIT:
            self.emit(ind, f"_GR[{g}] = None", ins.pc)

    def op_global_store_ref(self, ins, f, ind):
        g = f[0]
        if g >= self.module.global_ref_count:
            raise OutOfRangeError(f"{self.where}: global ref ordinal out of range: {g}")
        t = self.type_name(ins, f[1])
        val = self.rreg(ins, f[2])
        self.emit(ind, f"_GR[{g}] = _check_ref_type({val}, {self.const(t)}, 'global.store.ref')",
                  ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_global_load_indirect_ref(self, ins, f, ind):
        idx = self.ireg(ins, f[0], False)
        t = self.type_name(ins, f[1])
        res = self.rreg(ins, f[2])
        self.emit(ind, f"_t = _grefi({idx}, _GRN)", ins.pc)
        self.emit(ind, f"{res} = _check_ref_type(_GR[_t], {self.const(t)}, 'global.load.ref')",
                  ins.pc)
        if f[2] & isa.MOVE_BIT:
            self.emit(ind, "_GR[_t] = None", ins.pc)

    def op_global_store_indirect_ref(self, ins, f, ind):
        idx = self.ireg(ins, f[0], False)
        t = self.type_name(ins, f[1])
        val = self.rreg(ins, f[2])
        self.emit(ind, f"_GR[_grefi({idx}, _GRN)] = _check_ref_type({val}, {self.const(t)}, "
                       "'global.store.ref')", ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_list_alloc(self, ins, f, ind):
        t = self.type_name(ins, f[0])
        cap = self.ireg(ins, f[1], False)
        res = self.rreg(ins, f[2])
        self.emit(ind, f"{res} = _list_alloc({self.const(t)}, {cap})", ins.pc)

    def op_list_get_ref(self, ins, f, ind):
        lst = self.rreg(ins, f[0])
        idx = self.ireg(ins, f[1], False)
        t = self.type_name(ins, f[2])
        res = self.rreg(ins, f[3])
        move = bool(f[3] & isa.MOVE_BIT)
        self.emit(ind, f"{res} = _list_get_ref({lst}, {idx}, {self.const(t)}, {move})", ins.pc)

    def op_list_set_ref(self, ins, f, ind):
        lst = self.rreg(ins, f[0])
        idx = self.ireg(ins, f[1], False)
        val = self.rreg(ins, f[2])
        self.emit(ind, f"_list_set_ref({lst}, {idx}, {val})", ins.pc)
        self.clear_moved(ins, [f[2]], set(), ind)

    def op_select_ref(self, ins, f, ind):
        cond = self.ireg(ins, f[0], False)
        self.type_name(ins, f[1])
        a = self.rreg(ins, f[2])
        b = self.rreg(ins, f[3])
        res = self.rreg(ins, f[4])
        self.emit(ind, f"{res} = {a} if {cond} else {b}", ins.pc)
        self.clear_moved(ins, [f[2], f[3]], {res}, ind)

    def _switch(self, ins, f, ind, wide: bool, ref: bool):
        idx = self.ireg(ins, f[0], False)
        if ref:
            self.type_name(ins, f[1])
            default_raw, values, res_raw = f[2], f[3], f[4]
            default = self.rreg(ins, default_raw)
            names = [self.rreg(ins, v) for v in values]
            res = self.rreg(ins, res_raw)
        else:
            default_raw, values, res_raw = f[1], f[2], f[3]
            default = self.ireg(ins, default_raw, wide)
            names = [self.ireg(ins, v, wide) for v in values]
            res = self.ireg_name(ins, res_raw, wide)
        if not names:
            self.emit(ind, f"{res} = {default}", ins.pc)
        else:
            tup = "(" + ", ".join(names) + ",)"
            pick = f"{tup}[{idx}]"
            if ins.name == "switch.i64":
                pick = f"_wrap32({pick})"  # IREE reads only the low 32 bits here
            self.emit(ind, f"{res} = {pick} if 0 <= {idx} < {len(names)} else {default}", ins.pc)
        if ref:
            self.clear_moved(ins, [default_raw, *values], {res}, ind)

    def op_switch_i32(self, ins, f, ind):
        self._switch(ins, f, ind, False, False)

    def op_switch_i64(self, ins, f, ind):
        self._switch(ins, f, ind, True, False)

    def op_switch_f32(self, ins, f, ind):
        self._switch(ins, f, ind, False, False)

    def op_switch_f64(self, ins, f, ind):
        self._switch(ins, f, ind, True, False)

    def op_switch_ref(self, ins, f, ind):
        self._switch(ins, f, ind, False, True)

    def op_cast_any_ref(self, ins, f, ind):
        src = self.rreg(ins, f[0])
        t = self.type_name(ins, f[1])
        res = self.rreg(ins, f[2])
        self.emit(ind, f"{res} = _check_ref_type({src}, {self.const(t)}, 'cast.any.ref')", ins.pc)
        self.clear_moved(ins, [f[0]], {res}, ind)

    def op_assign_ref(self, ins, f, ind):
        src = self.rreg(ins, f[0])
        res = self.rreg(ins, f[1])
        if src != res:
            self.emit(ind, f"{res} = {src}", ins.pc)
            self.clear_moved(ins, [f[0]], {res}, ind)

    def op_discard_refs(self, ins, f, ind):
        for raw in f[0]:
            self.emit(ind, f"{self.rreg(ins, raw)} = None", ins.pc)

    def op_import_resolved(self, ins, f, ind):
        ordinal = f[0]
        if not ordinal & isa.IMPORT_BIT:
            raise self.err(ins, "import.resolved of a non-import function")
        k = ordinal & ~isa.IMPORT_BIT
        if k >= len(self.module.imports):
            raise self.err(ins, f"import ordinal {k} out of range")
        self.emit(ind, f"{self.ireg_name(ins, f[1], False)} = _res{k}", ins.pc)

    def _trace(self, ins, f, ind, kind: str):
        names = [self.anyreg(ins, r) for r in f[1]]
        tup = "(" + "".join(n + ", " for n in names) + ")"
        self.emit(ind, f"_on_{kind}({self.const(f[0])}, {tup})", ins.pc)
        for raw in f[1]:
            if self.moved(raw):
                self.emit(ind, f"r{raw & isa.REF_MASK} = None", ins.pc)

    def op_trace(self, ins, f, ind):
        self._trace(ins, f, ind, "trace")

    def op_print(self, ins, f, ind):
        self._trace(ins, f, ind, "print")

    # -- control flow
    def op_br(self, ins, f, ind):
        self.has_branches = True
        idx = self.block(ins, f[0])
        target = self.blocks[idx] if idx < len(self.blocks) else None
        if (
            not self.inlining
            and ins.name == "br"
            and target is not None
            and idx != self.cur_block
            and 1 < len(target) <= self.TAIL_DUP_MAX + 1
            and target[-1].name in ("cond_br", "br", "return")
        ):
            self.remap(ins, f[1], ind)
            self.inlining = True
            try:
                for t_ins in target[1:]:
                    self.instruction(t_ins, ind)
            finally:
                self.inlining = False
            return
        self.jump(ins, f[0], f[1], ind)

    op_break = op_br

    def op_cond_break(self, ins, f, ind):
        self.ireg(ins, f[0], False)
        self.has_branches = True
        self.jump(ins, f[1], f[2], ind)

    def op_cond_br(self, ins, f, ind):
        self.has_branches = True
        cond = self.ireg(ins, f[0], False)
        folded, self.pending_cond = self.pending_cond, None
        if folded is not None and folded[0] == self.ireg_name(ins, f[0], False):
            cond = folded[1]
        t_idx, f_idx = self.block(ins, f[1]), self.block(ins, f[3])
        if not f[2] and not f[4] and not self.loop_mode:
            self.emit(ind, f"_b = {t_idx} if {cond} else {f_idx}", ins.pc)
            self.emit(ind, "continue", ins.pc)
            return
        self.emit(ind, f"if {cond}:", ins.pc)
        self.jump(ins, f[1], f[2], ind + 1)
        self.jump(ins, f[3], f[4], ind)

    def op_br_table(self, ins, f, ind):
        self.has_branches = True
        idx = self.ireg(ins, f[0], False)
        cases = f[4]
        for i, (target, pairs) in enumerate(cases):
            self.emit(ind, f"{'if' if i == 0 else 'elif'} {idx} == {i}:", ins.pc)
            self.jump(ins, target, pairs, ind + 1)
        self.jump(ins, f[1], f[2], ind)

    def op_return(self, ins, f, ind):
        regs = f[0]
        results = self.fn.cconv.results
        if len(regs) != len(results):
            raise self.err(ins, f"returns {len(regs)} values, signature declares {len(results)}")
        names = [self._typed_reg(ins, raw, t) for raw, t in zip(regs, results)]
        if not names:
            self.emit(ind, "return", ins.pc)
        elif len(names) == 1:
            self.emit(ind, f"return {names[0]}", ins.pc)
        else:
            self.emit(ind, f"return ({', '.join(names)})", ins.pc)

    def _typed_reg(self, ins, raw: int, t: str) -> str:
        if t == "r":
            return self.rreg(ins, raw)
        return self.ireg(ins, raw, t in "IF")

    def op_yield(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self.remap(ins, f[1], ind)
        self.goto(ind, self.block(ins, f[0]), ins.pc, pre=("yield None",))

    def op_call(self, ins, f, ind):
        self._call(ins, f[0], None, f[1], f[2], None, ind)

    def op_call_variadic(self, ins, f, ind):
        self._call(ins, f[0], f[1], f[2], f[3], None, ind)

    def op_call_yieldable(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self._call(ins, f[0], None, f[1], f[3], f[2], ind)

    def op_call_variadic_yieldable(self, ins, f, ind):
        self.has_branches = True
        self.st.mark_generator(self.fn.ordinal)
        self._call(ins, f[0], f[1], f[2], f[4], f[3], ind)

    def _call(self, ins, ordinal, segments, src, dst, resume_pc, ind):
        pc = ins.pc
        yieldable = resume_pc is not None
        if ordinal & isa.IMPORT_BIT:
            k = ordinal & ~isa.IMPORT_BIT
            if k >= len(self.module.imports):
                raise self.err(ins, f"import ordinal {k} out of range")
            imp = self.module.imports[k]
            args = self._import_args(ins, imp, segments, src)
            result_types = imp.cconv.results
            if len(dst) > len(result_types):
                raise self.err(ins, f"call to {imp.full_name} expects {len(dst)} results, "
                                    f"import declares {len(result_types)}")
            if yieldable:
                self.st.yield_imports.add(k)
                self.emit(ind, f"_t = _impy{k}({args})", pc)
                self.emit(ind, "if _t.__class__ is _Suspend: _t = yield _t", pc)
                self.emit(ind, "elif _t.__class__ is _GenType: _t = yield from _t", pc)
            elif (imp.full_name in record_blocks.PASS_THROUGH and len(result_types) == 1
                    and all(t == "r" for t in imp.cconv.args)):
                # pure: each call site remembers its last refs (by identity) and result
                tree = self._import_arg_tree(ins, imp, segments, src)
                site = f"_P{self.st.pure_site(len(tree))}"
                same = " and ".join(f"{site}[{i}] is {a}" for i, a in enumerate(tree))
                self.emit(ind, f"_t = {site}[{len(tree)}] if {same} else "
                               f"_remember({site}, _imp{k}, {args})", pc)
            else:
                self.emit(ind, f"_t = _imp{k}({args})", pc)
            self.clear_moved(ins, src, set(), ind)
            outs = []
            for i, raw in enumerate(dst):
                t = result_types[i]
                val = "_t" if len(result_types) == 1 else f"_t[{i}]"
                reg = self._typed_reg(ins, raw, t)
                if t == "i":
                    outs.append(f"{reg} = " + _w32(val))
                elif t == "I":
                    outs.append(f"{reg} = " + _w64(val))
                elif t == "f":
                    outs.append(f"{reg} = _round_f32(float({val}))")
                elif t == "F":
                    outs.append(f"{reg} = float({val})")
                else:
                    outs.append(f"{reg} = {val}")
            for line in outs:
                self.emit(ind, line, pc)
        else:
            if segments is not None:
                raise self.err(ins, "variadic calls only supported for imports")
            if ordinal >= len(self.module.functions):
                raise self.err(ins, f"function ordinal {ordinal} out of range")
            callee = self.module.functions[ordinal]
            if len(src) != len(callee.cconv.args) or len(dst) != len(callee.cconv.results):
                raise self.err(ins, f"call to {callee.name} does not match its signature")
            args = ", ".join(self._typed_reg(ins, raw, t)
                             for raw, t in zip(src, callee.cconv.args))
            self.st.calls.setdefault(self.fn.ordinal, set()).add(ordinal)
            # Generator-ness of the callee is decided after all functions are seen;
            # emit a placeholder both ways and pick at assembly.
            call = f"@CALL{ordinal}@({args})"
            results = [self._typed_reg(ins, raw, t) for raw, t in zip(dst, callee.cconv.results)]
            moved = [raw for raw in src if self.moved(raw)]
            if moved:
                self.emit(ind, f"_t = {call}", pc)
                self.clear_moved(ins, src, set(), ind)
                if results:
                    self.emit(ind, f"{', '.join(results)}{',' if len(results) > 1 else ''}"
                                   f" = _t", pc)
            elif not results:
                self.emit(ind, call, pc)
            elif len(results) == 1:
                self.emit(ind, f"{results[0]} = {call}", pc)
            else:
                self.emit(ind, f"{', '.join(results)} = {call}", pc)
        if yieldable:
            self.goto(ind, self.block(ins, resume_pc), pc)

    def _import_args(self, ins, imp, segments, src) -> str:
        parts = []
        for arg in self._import_arg_tree(ins, imp, segments, src):
            if isinstance(arg, list):
                parts.append("[" + ", ".join(
                    "(" + "".join(v + ", " for v in entry) + ")" for entry in arg) + "]")
            else:
                parts.append(arg)
        return ", ".join(parts)

    def _import_arg_tree(self, ins, imp, segments, src) -> list:
        """Each argument of an import call as an expression; a variadic segment as a
        list of entries (tuples of expressions)."""
        parts: list = []
        pos = 0
        for seg_i, t in enumerate(imp.cconv.args):
            if isinstance(t, tuple):
                if segments is None or seg_i >= len(segments):
                    raise self.err(ins, f"variadic call to {imp.full_name} lacks segment sizes")
                count = segments[seg_i]
                inner = t[1]
                if pos + count * len(inner) > len(src):
                    raise self.err(ins, f"call to {imp.full_name} has too few operands")
                entries = []
                for _ in range(count):
                    vals = []
                    for it in inner:
                        vals.append(self._typed_reg(ins, src[pos], it))
                        pos += 1
                    entries.append(tuple(vals))
                parts.append(entries)
            else:
                if pos >= len(src):
                    raise self.err(ins, f"call to {imp.full_name} has too few operands")
                parts.append(self._typed_reg(ins, src[pos], t))
                pos += 1
        if pos != len(src):
            raise self.err(ins, f"call to {imp.full_name} has {len(src)} operands, "
                                f"signature takes {pos}")
        return parts

    # -- recording blocks (vm/record_blocks.py)
    def _emit_run(self, instrs, ind: int) -> None:
        """Emits `instrs` in order, each recording block as one site call."""
        i = 0
        while i < len(instrs):
            end = record_blocks.find_block(instrs, i, self.module.imports)
            if end is None:
                self.instruction(instrs[i], ind)
                i += 1
            else:
                self._emit_record_block(instrs[i:end], ind)
                i = end

    def _emit_record_block(self, instrs, ind: int) -> None:
        """The instructions of a block as usual, but each record operation's non-literal
        operands kept in locals `_d<n>` and the operations made by one `_blk<site>`
        call at the end, which returns the command buffer."""
        cb_raw = record_blocks.call_operands(instrs[0])[3][0]
        cb = self.rreg(instrs[0], cb_raw)
        values: list[tuple[str, bool]] = []  # (local, is a ref)
        kept: dict[str, int] = {}  # expression -> its value's index, while it holds
        ops = []
        moved_cb = False

        def leaf(ins, expr: str, t: str) -> tuple:
            if expr == cb:
                return ("cb",)
            literal = expr[1:-1] if expr.startswith("(") and expr.endswith(")") else expr
            if literal.lstrip("-").isdigit():
                return ("k", int(literal))
            index = kept.get(expr)
            if index is None:
                index = kept[expr] = len(values)
                values.append((f"_d{index}", t == "r"))
                self.emit(ind, f"_d{index} = {expr}", ins.pc)
            return ("d", index)

        def forget_assigned(since: int) -> None:
            """Drops kept expressions over registers that lines from `since` assign."""
            assigned = set()
            for _indent, text, _pc in self.lines[since:]:
                assigned.update(_ASSIGNED.findall(text))
            if assigned:
                for expr in [e for e in kept if assigned.intersection(_REGISTER.findall(e))]:
                    del kept[expr]

        for ins in instrs:
            k, segments, src, dst = record_blocks.call_operands(ins)
            imp = self.module.imports[k] if k >= 0 else None
            if imp is None or imp.full_name in record_blocks.PASS_THROUGH:
                since = len(self.lines)
                self.instruction(ins, ind)
                forget_assigned(since)
                continue
            if len(dst) > len(imp.cconv.results):
                raise self.err(ins, f"call to {imp.full_name} expects {len(dst)} results, "
                                    f"import declares {len(imp.cconv.results)}")
            template = []
            for arg, t in zip(self._import_arg_tree(ins, imp, segments, src), imp.cconv.args):
                if isinstance(arg, list):
                    template.append(tuple(tuple(leaf(ins, e, it) for e, it in zip(entry, t[1]))
                                          for entry in arg))
                else:
                    template.append(leaf(ins, arg, t))
            ops.append((k, tuple(template)))
            if imp.full_name != record_blocks.CREATE and self.moved(src[0]):
                moved_cb = True
            since = len(self.lines)
            self.clear_moved(ins, src, {cb}, ind)
            forget_assigned(since)
        pc = instrs[-1].pc
        site = self.st.record_block(record_blocks.RecordBlock(tuple(ops), len(values)))
        names = [name for name, _ in values]
        self.emit(ind, f"{cb} = _blk{site}(({''.join(n + ', ' for n in names)}))", pc)
        refs = [name for name, is_ref in values if is_ref]
        if refs:
            self.emit(ind, " = ".join(refs) + " = None", pc)
        if moved_cb:
            self.emit(ind, f"{cb} = None", pc)


_SPECIAL = {"const.f32", "const.f64"}
_REGISTER = re.compile(r"\b[ir]\d+\b")
# a register local that a line of generated code assigns (also augmented: `i3 -= ...`)
_ASSIGNED = re.compile(r"\b([ir]\d+)\s*(?:<<|>>|//|\*\*|[-+*/%&|^])?=(?!=)")


def _one_sided(op: str, canonical: list, lits: list, width: int) -> int:
    """+1 / -1 when a wrapped add/sub of a canonical value and a constant can only
    overflow upwards / downwards, else 0."""
    kind = op.split(".")[0]
    if kind not in ("add", "sub") or len(lits) != 2:
        return 0
    half = 2 ** (width - 1)
    if lits[1] is not None and lits[0] is None:
        c, other = lits[1], canonical[0]
    elif kind == "add" and lits[0] is not None and lits[1] is None:
        c, other = lits[0], canonical[1]
    else:
        return 0
    if not other:
        return 0
    if kind == "sub":
        c = -c
    if 0 < c < half:
        return 1
    if -half <= c < 0:
        return -1
    return 0


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def _chunks(items, n):
    for i in range(0, len(items), n):
        yield items[i : i + n]


class _ProgramState:
    def __init__(self) -> None:
        self.constants: list = []
        self._const_index: dict = {}
        self.generators: set[int] = set()
        self.calls: dict[int, set[int]] = {}
        self.yield_imports: set[int] = set()
        self.record_blocks: list[record_blocks.RecordBlock] = []
        self.pure_sites: list[int] = []  # arity of each pure import call site (`_P<n>`)
        self._record_block_index: dict = {}

    def pure_site(self, arity: int) -> int:
        self.pure_sites.append(arity)
        return len(self.pure_sites) - 1

    def record_block(self, block: record_blocks.RecordBlock) -> int:
        """The site number of `block` (equal blocks share one site)."""
        site = self._record_block_index.get(block)
        if site is None:
            site = self._record_block_index[block] = len(self.record_blocks)
            self.record_blocks.append(block)
        return site

    def constant(self, value) -> int:
        if value.__class__ is float or isinstance(value, ops.F32SNaN):
            key = (value.__class__.__name__, ops.bitcast_f64_i64(value),
                   getattr(value, "bits", None))
        else:
            key = (value.__class__.__name__, value)
        idx = self._const_index.get(key)
        if idx is None:
            idx = len(self.constants)
            self.constants.append(value)
            self._const_index[key] = idx
        return idx

    def mark_generator(self, ordinal: int) -> None:
        self.generators.add(ordinal)


_COUNTER = [0]


def generate_module(module) -> ModuleProgram:
    st = _ProgramState()
    per_fn = []
    for fn in module.functions:
        g = _Gen(module, fn, st)
        per_fn.append((fn, g, g.generate()))

    # Propagate generator-ness through the internal call graph (fixpoint).
    changed = True
    while changed:
        changed = False
        for caller, callees in st.calls.items():
            if caller not in st.generators and callees & st.generators:
                st.generators.add(caller)
                changed = True

    native_loops = {}
    if scalar.enabled():
        for fn, g, _body in per_fn:
            if fn.ordinal not in st.generators:
                program = scalar.encode(
                    fn.instructions, fn.cconv.args, fn.cconv.results,
                    [reg for _bank, reg in cconv_registers(fn.cconv.args)], g.i32_limit)
                if program is not None:
                    native_loops[fn.ordinal] = program

    lines: list[str] = []
    line_pcs: list = [None]  # 1-based
    for n, arity in enumerate(st.pure_sites):  # per context: each instantiation runs them
        lines.append(f"_P{n} = [{'_UNSET, ' * arity}None]")
        line_pcs.append(None)
    for fn, _g, body in per_fn:
        is_gen = fn.ordinal in st.generators
        needs_yield_stub = is_gen
        for indent, text, pc in body:
            if "@CALL" in text:
                text = _resolve_calls(text, st.generators)
            if "yield" in text and not text.startswith("def "):
                needs_yield_stub = False
            lines.append("    " * indent + text)
            line_pcs.append((fn.ordinal, pc) if pc >= 0 else None)
        if needs_yield_stub:
            lines.append("    if 0: yield")
            line_pcs.append(None)
        lines.append("")
        line_pcs.append(None)

    _COUNTER[0] += 1
    filename = f"<tinyhal-vm:{module.name}#{_COUNTER[0]}>"
    source = "\n".join(lines) + "\n"
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ModuleProgram(code, filename, source, line_pcs, frozenset(st.generators),
                         st.constants, frozenset(st.yield_imports), native_loops,
                         tuple(st.record_blocks))


def _resolve_calls(text: str, generators) -> str:
    out = []
    i = 0
    while True:
        j = text.find("@CALL", i)
        if j < 0:
            out.append(text[i:])
            break
        k = text.index("@", j + 5)
        ordinal = int(text[j + 5 : k])
        out.append(text[i:j])
        # find the matching parenthesised argument list
        depth = 0
        m = k + 1
        while True:
            c = text[m]
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            m += 1
        args = text[k + 1 : m + 1]
        if ordinal in generators:
            out.append(f"(yield from _f{ordinal}{args})")
        else:
            out.append(f"_f{ordinal}{args}")
        i = m + 1
    return "".join(out)


def instantiate(module, namespace_extra: dict) -> dict:
    """Executes the module's code in a fresh namespace (one per context)."""
    prog = module.program
    ns = dict(_BASE_NAMESPACE)
    ns["_K"] = prog.constants
    ns["_FALLOFF"] = b"execution fell off the end of the function"
    ns.update(namespace_extra)
    exec(prog.code, ns)  # noqa: S102 - source generated by this module from verified bytecode
    for ordinal, program in prog.native_loops.items():
        ns[f"_f{ordinal}"] = scalar.entry(program, ns[f"_f{ordinal}"])
    return ns
