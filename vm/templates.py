"""Source templates of the VM's straight-line instructions, and the helpers they call.

`TEMPLATES` maps an instruction to a line (or a few) of Python over its fields in layout
order (`{0}`, `{1}`, ...: register locals, literals, offsets, constant-table slots), which
`codegen` fills and places; the ring operations (add, sub, mul, fma, and, or, xor, not,
shl) are shaped by `codegen` itself from `regflow`'s facts and have none here. A template
names helpers by `_name`; `HELPERS` is the namespace that gives every generated module
those names (shared, never written). Keeping the two together is the contract: a helper
a template calls is defined here, next to it.

Integer results are wrapped to their width where stored; f32 results are rounded to
binary32 through a per-call `array('f')` (`_fa`); which NaN a float operation returns
follows IREE (the first NaN operand's payload).
"""

from __future__ import annotations

import struct
from array import array
from types import GeneratorType

from . import ops
from .native import Suspend

__all__ = ["H32", "H64", "HELPERS", "M32", "M64", "TEMPLATES", "wrap32_expr", "wrap64_expr"]

M32 = "4294967295"
M64 = "18446744073709551615"
H32 = "2147483648"
H64 = "9223372036854775808"


def wrap32_expr(expr: str) -> str:
    return f"({expr} + {H32} & {M32}) - {H32}"


def wrap64_expr(expr: str) -> str:
    return f"({expr} + {H64} & {M64}) - {H64}"


def _wrapped(res: str, expr: str, bits: int) -> str:
    """`res = expr` wrapped to a signed `bits` integer; the common in-range case costs
    two compares instead of three big-int operations."""
    hi, lo = (2**31 - 1, -(2**31)) if bits == 32 else (2**63 - 1, -(2**63))
    wrap = wrap32_expr(res) if bits == 32 else wrap64_expr(res)
    return f"{res} = {expr}\nif {res} > {hi} or {res} < {lo}: {res} = {wrap}"


TEMPLATES: dict[str, str] = {}


def _int_ops(bits: int) -> None:
    t = f"i{bits}"

    def w(expr: str, res: str) -> str:
        return _wrapped(res, expr, bits)

    m = M32 if bits == 32 else M64
    sh = 31 if bits == 32 else 63
    TEMPLATES.update({
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

TEMPLATES.update({
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
    TEMPLATES[f"buffer.load.{_w}"] = "{2} = _buffer_load_%s({0}, {1})" % _w.replace(".", "")
for _w in ("i8", "i16", "i32", "i64", "f32", "f64"):
    TEMPLATES[f"buffer.store.{_w}"] = "_buffer_store_%s({0}, {1}, {2})" % _w
    TEMPLATES[f"buffer.fill.{_w}"] = "_buffer_fill_%s({0}, {1}, {2}, {3})" % _w

_FR = "_fa[0] = {e}; {r} = _fa[0]"  # round to binary32 through the per-call array


def _float_ops(t: str) -> None:
    f32 = t == "f32"

    def arith(expr: str, res: str) -> str:
        return _FR.format(e=expr, r=res) if f32 else f"{res} = {expr}"

    TEMPLATES.update({
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
        TEMPLATES[f"{name}.{t}"] = "{1} = _%s_%s({0})" % (name, t)


_float_ops("f32")
_float_ops("f64")
TEMPLATES.update({
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


def _helpers() -> dict:
    """The names templates (and `codegen`) call, by the name they call them."""
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
        "_wrap32": ops.wrap32,
        "_to_f32": ops.round_f32,  # not `_round_f32`: that is `vm.round.f32` (below)
        "_f32_from_bits": ops.f32_from_bits,
        "_fail": ops.fail,
        "_check_ref_class": ops.check_ref_class, "_ref_classes": ops.ref_classes,
        "_remember": ops.remember_call, "_UNSET": ops.UNSET,
    }
    for name in dir(ops):
        if name.startswith(("div_", "rem_", "buffer_", "list_", "cast_", "bitcast_",
                            "atan2_", "pow_", "rsqrt_", "round_even_")):
            ns["_" + name] = getattr(ops, name)
    for name in ("atan", "cos", "sin", "exp", "exp2", "expm1", "log", "log10", "log1p",
                 "log2", "sqrt", "tanh", "erf", "ceil", "floor", "round"):
        ns[f"_{name}_f32"] = ops.f32_unary(name)
        ns[f"_{name}_f64"] = ops.f64_unary(name)
    return ns


HELPERS = _helpers()
