"""The Python templates of the VM's straight-line instructions, and the helpers they call.

An instruction's template is rendered from its row in `optable` (`template`): a line (or
a few) of Python over its fields in layout order (`{0}`, `{1}`, ...: register locals,
literals, offsets, constant-table slots), which `codegen` fills and places; the ring
operations (add, sub, mul, fma, and, or, xor, not, shl) are shaped by `codegen` itself
from their rows' ring facts. A template names helpers by `_name`; `HELPERS` is the
namespace that gives every generated module those names (shared, never written): a
helper a row's template calls is bound here.

Integer results are wrapped to their width where stored; f32 results are rounded to
binary32 through a per-call `array('f')` (`_fa`); which NaN a float operation returns
follows IREE (the first NaN operand's payload).
"""

from __future__ import annotations

import struct
from array import array
from types import GeneratorType

from . import ops, optable
from .native import Suspend

__all__ = ["H32", "H64", "HELPERS", "M32", "M64", "template", "wrap32_expr", "wrap64_expr"]

M32, M64, H32, H64 = optable.M32, optable.M64, optable.H32, optable.H64


def wrap32_expr(expr: str) -> str:
    return f"({expr} + {H32} & {M32}) - {H32}"


def wrap64_expr(expr: str) -> str:
    return f"({expr} + {H64} & {M64}) - {H64}"


_TEMPLATES: dict[str, str | None] = {}


def template(name: str) -> str | None:
    """The Python template of op `name` from its row (`optable`), None where the
    translator emits it itself (a ring op, or a handler `codegen._Gen.op_<name>`).
    Rendered at the first translation that asks: a warm start translates nothing."""
    found = _TEMPLATES.get(name, _TEMPLATES)
    if found is _TEMPLATES:
        op = optable.by_name(name)
        python = optable.meaning(op).python if op is not None else None
        found = _TEMPLATES[name] = None if python == optable.HANDWRITTEN else python
    return found  # type: ignore[return-value]


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
