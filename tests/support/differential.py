"""Differential runs: random valid programs, compiled with the pinned iree-compile, run by
iree.runtime and by tinyhal on every driver, results compared bit for bit.

A program is generated from a seed (`scalar_program`, `tensor_program`), so a failure
is reproduced from its seed, never from a stored file. Scalar programs are host code
(arith, scf, math, util lists) over i32, i64 and f32 with edge values; every f32 result
is returned as its bits, so nothing is compared through a double. Tensor programs go
through linalg, so their dispatches run on the HAL.

`run_program` runs the calls in child processes with a timeout (`CHILD`): one per tinyhal
driver, which must answer every call and exit cleanly, and iree.runtime's apart, so
nothing IREE does to its own heap reaches tinyhal's run. IREE's VM divides with C's `/`,
so an integer division by zero (or INT_MIN / -1) kills its process with SIGFPE, and a
buffer fill, copy or clone whose element count wraps its u64 bounds check writes over
memory (SIGSEGV, or SIGABRT from its heap); such a call is recorded (`Report.iree_died`)
and IREE's run goes on from the next call in a new child. tinyhal must fail those calls
with a `tinyhal.Error`. Everything else must agree: the same bits, or errors of the
same status.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from .iree_tools import compile_mlir

DRIVERS = ("sync", "task", "emu")
SCALAR_FLAGS = ["--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu"]
CALL_TIMEOUT = 60.0

I32_EDGES = [0, 1, -1, 2, 7, 31, 32, 33, 63, 64, 255, 65535, 2**31 - 1, -(2**31),
             -(2**31) + 1, 0x55555555, -12345]
I64_EDGES = [0, 1, -1, 2, 31, 32, 63, 64, 65, 2**31 - 1, -(2**31), 2**32, 2**63 - 1,
             -(2**63), -(2**63) + 1, 0x5555555555555555, -0x0123456789ABCDEF]
F32_EDGE_BITS = [0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x3F000000, 0x3FC00000,
                 0x40200000, 0xC0200000, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
                 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x4B800001,
                 0x4F000000, 0xCF000000, 0x5F000000, 0xDF000000, 0x4F800000, 0x3DCCCCCD]


def f32_value(bits: int) -> float:
    """The double a caller passes for an f32 argument with these bits (both runtimes
    narrow it back exactly: every edge here is a quiet or non-NaN binary32)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@dataclass
class Program:
    """One generated program: its MLIR, compiler flags and calls `(function, args)`."""

    seed: int
    kind: str
    source: str
    flags: list[str]
    calls: list[tuple[str, list]] = field(default_factory=list)

    def compile(self) -> str:
        return str(compile_mlir(self.source, self.flags))


# -- scalar programs

_INT_BINARY = ["addi", "subi", "muli", "andi", "ori", "xori", "shli", "shrsi", "shrui",
               "minsi", "maxsi", "minui", "maxui", "divsi", "divui", "remsi", "remui",
               "ceildivsi", "floordivsi", "ceildivui"]
_DIVISIONS = {"divsi", "divui", "remsi", "remui", "ceildivsi", "floordivsi", "ceildivui"}
_INT_PREDICATES = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
_FLOAT_BINARY = ["arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf",
                 "arith.minimumf", "arith.maximumf", "math.powf", "math.atan2"]
_FLOAT_MATH = ["absf", "floor", "ceil", "sqrt", "round", "roundeven", "exp", "exp2",
               "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tanh", "atan",
               "erf", "rsqrt"]
_INT_MATH = ["ctlz", "absi"]
_FLOAT_PREDICATES = ["false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt",
                     "uge", "ult", "ule", "une", "uno", "true"]


class _Scalar:
    """Builds one function: values by type in pools, ops appended as text."""

    def __init__(self, rng: random.Random, traps: bool, floats: bool) -> None:
        self.rng = rng
        self.traps = traps
        self.floats = floats
        self.count = itertools.count()
        self.lines: list[str] = []

    def new(self) -> str:
        return f"%v{next(self.count)}"

    def emit(self, text: str, indent: int) -> None:
        self.lines.append("  " * indent + text)

    def op(self, pools: dict[str, list[str]], indent: int) -> None:
        rng = self.rng
        kind = rng.choice(["int", "int", "int", "cmpi", "cast", "float", "float", "cmpf",
                           "math", "select", "bitcast"] if self.floats else
                          ["int", "int", "int", "cmpi", "cast", "select", "intmath"])
        v = self.new()
        it = rng.choice(["i32", "i64"])
        pick = rng.choice
        if kind == "int":
            name = pick(_INT_BINARY)
            a, b = pick(pools[it]), pick(pools[it])
            if name in _DIVISIONS and not (self.traps and rng.random() < 0.3):
                d = self.new()
                self.emit(f"{d} = arith.ori {b}, %one_{it} : {it}", indent)
                if name in ("divsi", "remsi", "ceildivsi", "floordivsi"):
                    e = self.new()  # keep INT_MIN / -1 out of the guarded form
                    self.emit(f"{e} = arith.andi {d}, %mask_{it} : {it}", indent)
                    d = e
                b = d
            self.emit(f"{v} = arith.{name} {a}, {b} : {it}", indent)
            pools[it].append(v)
        elif kind == "cmpi":
            a, b = pick(pools[it]), pick(pools[it])
            self.emit(f"{v} = arith.cmpi {pick(_INT_PREDICATES)}, {a}, {b} : {it}", indent)
            pools["i1"].append(v)
        elif kind == "intmath":
            self.emit(f"{v} = math.{pick(_INT_MATH)} {pick(pools[it])} : {it}", indent)
            pools[it].append(v)
        elif kind == "cast":
            choice = rng.randrange(6) if self.floats else rng.choice([0, 1, 2, 5])
            if choice == 0:
                self.emit(f"{v} = arith.extsi {pick(pools['i32'])} : i32 to i64", indent)
                pools["i64"].append(v)
            elif choice == 1:
                self.emit(f"{v} = arith.extui {pick(pools['i32'])} : i32 to i64", indent)
                pools["i64"].append(v)
            elif choice == 2:
                self.emit(f"{v} = arith.trunci {pick(pools['i64'])} : i64 to i32", indent)
                pools["i32"].append(v)
            elif choice == 3:
                conv = pick(["sitofp", "uitofp"])
                self.emit(f"{v} = arith.{conv} {pick(pools[it])} : {it} to f32", indent)
                pools["f32"].append(v)
            elif choice == 4:
                conv = pick(["fptosi", "fptoui"])
                self.emit(f"{v} = arith.{conv} {pick(pools['f32'])} : f32 to {it}", indent)
                pools[it].append(v)
            else:
                self.emit(f"{v} = arith.extui {pick(pools['i1'])} : i1 to {it}", indent)
                pools[it].append(v)
        elif kind == "float":
            a, b = pick(pools["f32"]), pick(pools["f32"])
            self.emit(f"{v} = {pick(_FLOAT_BINARY)} {a}, {b} : f32", indent)
            pools["f32"].append(v)
        elif kind == "cmpf":
            a, b = pick(pools["f32"]), pick(pools["f32"])
            self.emit(f"{v} = arith.cmpf {pick(_FLOAT_PREDICATES)}, {a}, {b} : f32", indent)
            pools["i1"].append(v)
        elif kind == "math":
            which = pick([*_FLOAT_MATH, *_INT_MATH, "negf", "fma"])
            a = pick(pools["f32"])
            if which in _INT_MATH:
                self.emit(f"{v} = math.{which} {pick(pools[it])} : {it}", indent)
                pools[it].append(v)
                return
            if which == "negf":
                self.emit(f"{v} = arith.negf {a} : f32", indent)
            elif which == "fma":
                self.emit(f"{v} = math.fma {a}, {pick(pools['f32'])}, {pick(pools['f32'])}"
                          " : f32", indent)
            else:
                self.emit(f"{v} = math.{which} {a} : f32", indent)
            pools["f32"].append(v)
        elif kind == "select":
            t = pick(["i32", "i64", "f32"] if self.floats else ["i32", "i64"])
            self.emit(f"{v} = arith.select {pick(pools['i1'])}, {pick(pools[t])}, "
                      f"{pick(pools[t])} : {t}", indent)
            pools[t].append(v)
        else:
            if rng.random() < 0.5:
                self.emit(f"{v} = arith.bitcast {pick(pools['f32'])} : f32 to i32", indent)
                pools["i32"].append(v)
            else:
                self.emit(f"{v} = arith.bitcast {pick(pools['i32'])} : i32 to f32", indent)
                pools["f32"].append(v)

    def ops(self, pools: dict[str, list[str]], indent: int, low: int, high: int) -> None:
        for _ in range(self.rng.randint(low, high)):
            self.op(pools, indent)


def _scalar_function(rng: random.Random, name: str, traps: bool, floats: bool
                     ) -> tuple[str, list[str]]:
    """One function of (i32, i32, i64, i64, f32, f32, i32 trip count): straight-line ops,
    a loop carrying a random mix of i32/i64/f32 values, a two-armed if, then results
    (i32 and i64; f32 as bits). Without `floats`, integers only, f32 arguments unused:
    such a function runs in the C interpreter (`vm/scalar`). Returns its text and its
    argument types."""
    g = _Scalar(rng, traps, floats)
    arg_types = ["i32", "i32", "i64", "i64", "f32", "f32", "i32"] if floats else [
        "i32", "i32", "i64", "i64", "i32"]
    pools: dict[str, list[str]] = {"i32": ["%a0", "%a1"], "i64": ["%a2", "%a3"],
                                   "f32": ["%a4", "%a5"] if floats else [], "i1": []}
    for t in ("i32", "i64"):
        g.emit(f"%one_{t} = arith.constant 1 : {t}", 1)
        g.emit(f"%mask_{t} = arith.constant {2**(int(t[1:]) - 2) - 1} : {t}", 1)
        for c in rng.sample(I32_EDGES if t == "i32" else I64_EDGES, 3):
            v = g.new()
            g.emit(f"{v} = arith.constant {c} : {t}", 1)
            pools[t].append(v)
    for bits in rng.sample(F32_EDGE_BITS, 3) if floats else ():
        v = g.new()
        g.emit(f"{v} = arith.constant 0x{bits:08X} : f32", 1)
        pools["f32"].append(v)
    v = g.new()
    g.emit(f"{v} = arith.cmpi slt, %a0, %a1 : i32", 1)
    pools["i1"].append(v)
    g.ops(pools, 1, 3, 10)

    carried_types = [rng.choice(["i32", "i64", "f32", "i64", "f32"] if floats else
                                ["i32", "i64", "i64"])
                     for _ in range(rng.randint(1, 5))]
    init = [rng.choice(pools[t]) for t in carried_types]
    names = [f"%c{k}" for k in range(len(carried_types))]
    sig = ", ".join(["i32", *carried_types])
    g.emit("%zero = arith.constant 0 : i32", 1)
    g.emit("%step = arith.constant 1 : i32", 1)
    loop = g.new()
    binds = ", ".join(["%i = %zero", *(f"{n} = {x}" for n, x in zip(names, init))])
    g.emit(f"{loop}:{len(names) + 1} = scf.while ({binds}) : ({sig}) -> ({sig}) {{", 1)
    g.emit(f"%go = arith.cmpi slt, %i, %a{len(arg_types) - 1} : i32", 2)
    g.emit(f"scf.condition(%go) %i, {', '.join(names)} : {sig}", 2)
    g.emit("} do {", 1)
    g.emit(f"^bb0(%i: i32, {', '.join(f'{n}: {t}' for n, t in zip(names, carried_types))}):",
           1)
    inner = {t: list(p) for t, p in pools.items()}
    for n, t in zip(names, carried_types):
        inner[t].append(n)
    inner["i32"].append("%i")
    g.ops(inner, 2, 2, 8)
    nxt = [rng.choice(inner[t][-3:] + [n]) for n, t in zip(names, carried_types)]
    # a permutation of same-typed carried values makes the compiler shuffle registers
    for t in set(carried_types):
        slots = [k for k, ct in enumerate(carried_types) if ct == t]
        values = [nxt[k] for k in slots]
        rng.shuffle(values)
        for k, value in zip(slots, values):
            nxt[k] = value
    g.emit("%i1 = arith.addi %i, %step : i32", 2)
    g.emit(f"scf.yield %i1, {', '.join(nxt)} : {sig}", 2)
    g.emit("}", 1)
    for k, t in enumerate(carried_types):
        pools[t].append(f"{loop}#{k + 1}")
    pools["i32"].append(f"{loop}#0")

    if pools["i1"]:
        t = rng.choice(["i32", "i64", "f32"] if floats else ["i32", "i64"])
        v = g.new()
        g.emit(f"{v} = scf.if {rng.choice(pools['i1'])} -> {t} {{", 1)
        for arm in range(2):
            arm_pools = {k: list(p) for k, p in pools.items()}
            g.ops(arm_pools, 2, 1, 4)
            g.emit(f"scf.yield {rng.choice(arm_pools[t][-3:])} : {t}", 2)
            if arm == 0:
                g.emit("} else {", 1)
        g.emit("}", 1)
        pools[t].append(v)

    outs: list[tuple[str, str]] = []
    for t in ("i32", "i64", "f32") if floats else ("i32", "i64"):
        for value in rng.sample(pools[t][-6:], min(2, len(pools[t]))):
            if t == "f32":
                b = g.new()
                g.emit(f"{b} = arith.bitcast {value} : f32 to i32", 1)
                outs.append((b, "i32"))
            else:
                outs.append((value, t))
    args = ", ".join(f"%a{k}: {t}" for k, t in enumerate(arg_types))
    results = ", ".join(t for _, t in outs)
    body = "\n".join(g.lines)
    text = (f"func.func @{name}({args}) -> ({results}) {{\n{body}\n"
            f"  return {', '.join(v for v, _ in outs)} : {results}\n}}\n")
    return text, arg_types


def _scalar_args(rng: random.Random, types: Sequence[str]) -> list:
    out: list = []
    for k, t in enumerate(types):
        if k == len(types) - 1:
            out.append(rng.choice([0, 1, 2, 3]))
        elif t == "i32":
            out.append(rng.choice(I32_EDGES) if rng.random() < 0.8 else rng.randrange(-2**31, 2**31))
        elif t == "i64":
            out.append(rng.choice(I64_EDGES) if rng.random() < 0.8 else rng.randrange(-2**63, 2**63))
        else:
            out.append(f32_value(rng.choice(F32_EDGE_BITS)))
    return out


def scalar_program(seed: int, functions: int = 4, calls: int = 6, traps: bool = True,
                   integers: bool = False) -> Program:
    """Host-code program number `seed`: `functions` random functions (integers only if
    `integers`: these run in the C interpreter), `calls` argument tuples each drawn from
    edge values (division guards dropped in some ops if `traps`)."""
    rng = random.Random(f"{'integer' if integers else 'scalar'}-{seed}")
    parts, program_calls = [], []
    for k in range(functions):
        text, types = _scalar_function(rng, f"f{k}", traps, not integers)
        parts.append(text)
        program_calls += [(f"f{k}", _scalar_args(rng, types)) for _ in range(calls)]
    return Program(seed, "integer" if integers else "scalar", "".join(parts),
                   list(SCALAR_FLAGS), program_calls)


# -- tensor programs

_TENSOR_FLOAT = ["arith.addf", "arith.subf", "arith.mulf", "arith.maximumf", "arith.minimumf"]


def tensor_program(seed: int, calls: int = 2) -> Program:
    """A small linalg program: an elementwise chain over two f32 vectors, a matmul, an
    integer reduction; its dispatches run on the HAL."""
    rng = random.Random(f"tensor-{seed}")
    n = rng.choice([1, 3, 4, 7, 16])
    m = rng.choice([1, 2, 5])
    k = rng.choice([1, 3, 8])
    body = []
    pool = ["%x", "%y"]
    for i in range(rng.randint(1, 5)):
        op = rng.choice(_TENSOR_FLOAT)
        a, b = rng.choice(pool), rng.choice(pool)
        body.append(f"    %e{i} = {op} {a}, {b} : f32")
        pool.append(f"%e{i}")
    elementwise = "\n".join(body)
    source = f"""
#map = affine_map<(d0) -> (d0)>
func.func @elementwise(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %init = tensor.empty() : tensor<{n}xf32>
  %r = linalg.generic {{indexing_maps = [#map, #map, #map], iterator_types = ["parallel"]}}
      ins(%a, %b : tensor<{n}xf32>, tensor<{n}xf32>) outs(%init : tensor<{n}xf32>) {{
  ^bb0(%x: f32, %y: f32, %o: f32):
{elementwise}
    linalg.yield {pool[-1]} : f32
  }} -> tensor<{n}xf32>
  return %r : tensor<{n}xf32>
}}
func.func @matmul(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<{m}x{n}xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>)
      outs(%fill : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  return %r : tensor<{m}x{n}xf32>
}}
func.func @reduce(%a: tensor<{n}xi32>) -> tensor<i32> {{
  %zero = arith.constant 0 : i32
  %init = tensor.empty() : tensor<i32>
  %fill = linalg.fill ins(%zero : i32) outs(%init : tensor<i32>) -> tensor<i32>
  %r = linalg.generic {{indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>],
      iterator_types = ["reduction"]}} ins(%a : tensor<{n}xi32>) outs(%fill : tensor<i32>) {{
  ^bb0(%x: i32, %acc: i32):
    %s = arith.{rng.choice(["addi", "xori", "maxsi", "muli"])} %x, %acc : i32
    linalg.yield %s : i32
  }} -> tensor<i32>
  return %r : tensor<i32>
}}
"""
    program_calls: list[tuple[str, list]] = []
    for _ in range(calls):
        def floats(*shape: int) -> dict:
            count = 1
            for s in shape:
                count *= s
            return {"dtype": "float32", "shape": list(shape),
                    "bits": [rng.choice(F32_EDGE_BITS) for _ in range(count)]}
        program_calls.append(("elementwise", [floats(n), floats(n)]))
        program_calls.append(("matmul", [floats(m, k), floats(k, n)]))
        program_calls.append(("reduce", [{"dtype": "int32", "shape": [n],
                                          "bits": [rng.choice(I32_EDGES) & 0xFFFFFFFF
                                                   for _ in range(n)]}]))
    return Program(seed, "tensor", source, list(SCALAR_FLAGS), program_calls)


# -- VM-level programs: buffers and lists

_BUFFER_WIDTHS = [("i8.u", "i8", "i32"), ("i8.s", "i8", "i32"), ("i16.u", "i16", "i32"),
                  ("i16.s", "i16", "i32"), ("i32", "i32", "i32"), ("i64", "i64", "i64"),
                  ("f32", "f32", "f32")]


def _vm_function(rng: random.Random, name: str) -> str:
    """(i64 index, i64 length, i32 value, f32 value) -> (i32, i64, i32): a buffer of
    `length` bytes (or a fixed one) and a list, then random stores, loads, fills, copies,
    compares, clones and list operations at indices drawn from edge values and the
    arguments; results as bits."""
    lines = []
    count = itertools.count()

    def new() -> str:
        return f"%v{next(count)}"

    def const64(value: int) -> str:
        v = new()
        lines.append(f"    {v} = vm.const.i64 {value}")
        return v

    def const32(value: int) -> str:
        v = new()
        lines.append(f"    {v} = vm.const.i32 {value}")
        return v

    size = rng.choice([0, 1, 4, 7, 8, 16, 33])
    length = "%len" if rng.random() < 0.3 else const64(size)
    zero32 = const32(0)
    lines.append(f"    %buf = vm.buffer.alloc {length}, {zero32} : !vm.buffer")
    indices = ["%index", *(const64(k) for k in rng.sample(
        [0, 1, 2, 3, -1, -2, size - 1, size, size // 2, 2**62, 2**63 - 1, -(2**63)], 5))]
    # ranges reach at most 8 bytes before the data: further back IREE touches its buffer
    # header or the heap (and may crash or corrupt it), which tinyhal refuses
    offsets = ["%index", *(const64(k) for k in rng.sample(
        [0, 1, -1, size - 1, size, 2**62, -(2**63)], 4))]
    lengths = ["%len", *(const64(k) for k in rng.sample([0, 1, 2, 3, size, size + 1], 3))]
    i32s = ["%word", *(const32(k) for k in rng.sample(I32_EDGES, 3))]
    i64s = [*(const64(k) for k in rng.sample(I64_EDGES, 3))]
    f32s = ["%f"]
    list_size = rng.choice([0, 1, 3, 8])
    elem = rng.choice(["i32", "i64", "f32"])
    lines.append(f"    %n = vm.const.i32 {list_size}")
    lines.append(f"    %list = vm.list.alloc %n : (i32) -> !vm.list<{elem}>")
    lines.append(f"    vm.list.resize %list, %n : (!vm.list<{elem}>, i32)")
    list_indices = ["%word", *(const32(k) for k in (0, list_size - 1, list_size, -1))]
    pools = {"i32": i32s, "i64": i64s, "f32": f32s}
    for _ in range(rng.randint(3, 10)):
        kind = rng.choice(["store", "load", "load", "fill", "copy", "compare", "clone",
                           "length", "list"])
        suffix, store, t = rng.choice(_BUFFER_WIDTHS)
        at = rng.choice(indices)
        if kind == "store":
            lines.append(f"    vm.buffer.store.{store} {rng.choice(pools[t])}, %buf[{at}]"
                         f" : {t} -> !vm.buffer")
        elif kind == "load":
            v = new()
            lines.append(f"    {v} = vm.buffer.load.{suffix} %buf[{at}] : !vm.buffer -> {t}")
            pools[t].append(v)
        elif kind == "fill":
            fill_t = "i32" if t == "f32" else t
            lines.append(f"    vm.buffer.fill.{store if t != 'f32' else 'i32'} %buf, "
                         f"{rng.choice(offsets)}, {rng.choice(lengths)}, "
                         f"{rng.choice(pools[fill_t])} : {fill_t} -> !vm.buffer")
        elif kind == "copy":
            lines.append(f"    vm.buffer.copy %buf, {rng.choice(offsets)}, %buf, "
                         f"{rng.choice(offsets)}, {rng.choice(lengths)} : "
                         "!vm.buffer -> !vm.buffer")
        elif kind == "compare":
            v = new()
            lines.append(f"    {v} = vm.buffer.compare %buf, {rng.choice(offsets)}, %buf, "
                         f"{rng.choice(offsets)}, {rng.choice(lengths)} : "
                         "!vm.buffer, !vm.buffer")
            pools["i32"].append(v)
        elif kind == "clone":
            v = new()
            lines.append(f"    {v} = vm.buffer.clone %buf, {rng.choice(offsets)}, "
                         f"{rng.choice(lengths)}, {zero32} : !vm.buffer -> !vm.buffer")
            w = new()
            lines.append(f"    {w} = vm.buffer.length {v} : !vm.buffer -> i64")
            pools["i64"].append(w)
        elif kind == "length":
            v = new()
            lines.append(f"    {v} = vm.buffer.length %buf : !vm.buffer -> i64")
            pools["i64"].append(v)
        else:
            where = rng.choice(list_indices)
            if rng.random() < 0.5:
                lines.append(f"    vm.list.set.{elem} %list, {where}, {rng.choice(pools[elem])}"
                             f" : (!vm.list<{elem}>, i32, {elem})")
            else:
                v = new()
                lines.append(f"    {v} = vm.list.get.{elem} %list, {where} : "
                             f"(!vm.list<{elem}>, i32) -> {elem}")
                pools[elem].append(v)
    f_bits = new()
    lines.append(f"    {f_bits} = vm.bitcast.f32.i32 {pools['f32'][-1]} : f32 -> i32")
    size_v = new()
    lines.append(f"    {size_v} = vm.list.size %list : (!vm.list<{elem}>) -> i32")
    body = "\n".join(lines)
    return (f"  vm.func @{name}(%index: i64, %len: i64, %word: i32, %f: f32) -> "
            f"(i32, i64, i32, i32) {{\n{body}\n"
            f"    vm.return {pools['i32'][-1]}, {pools['i64'][-1]}, {f_bits}, {size_v} : "
            f"i32, i64, i32, i32\n  }}\n  vm.export @{name}\n")


def vm_program(seed: int, functions: int = 4, calls: int = 6) -> Program:
    """VM-dialect program number `seed` (buffers and lists, see `_vm_function`)."""
    rng = random.Random(f"vm-{seed}")
    parts, program_calls = [], []
    for k in range(functions):
        parts.append(_vm_function(rng, f"g{k}"))
        for _ in range(calls):
            program_calls.append((f"g{k}", [
                rng.choice([0, 1, -1, 3, 8, 15, 2**62, -(2**63)]),
                rng.choice([0, 1, 8, 16, 17]),
                rng.choice(I32_EDGES),
                f32_value(rng.choice(F32_EDGE_BITS))]))
    source = "vm.module @vm_program {\n" + "".join(parts) + "}\n"
    return Program(seed, "vm", source, [*SCALAR_FLAGS, "--compile-from=vm"], program_calls)


# -- running

CHILD = r"""
import json, os, sys
import numpy as np

spec = json.loads(sys.argv[1])
path, calls, side, start = spec["path"], spec["calls"], spec["side"], spec["start"]


def argument(value):
    if isinstance(value, dict):
        raw = np.array(value["bits"], np.uint32 if value["dtype"] == "float32" else np.int64)
        return raw.astype(np.uint32).view(value["dtype"]).reshape(value["shape"])
    return value


def outcome(run):
    try:
        result = run()
    except Exception as e:
        code = getattr(e, "code", None)
        if code is not None and hasattr(code, "name"):
            return ["error", code.name]
        text = str(e)
        for name in ("INVALID_ARGUMENT", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                     "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "PERMISSION_DENIED", "INTERNAL"):
            if name in text:
                return ["error", name]
        return ["error", type(e).__name__ + ": " + text[:200]]
    results = result if isinstance(result, (list, tuple)) else [result]
    out = []
    for r in results:
        if hasattr(r, "to_host"):
            r = r.to_host()
        a = np.asarray(r)
        if a.dtype.kind == "f" or a.ndim:
            out.append([str(a.dtype), list(a.shape), a.tobytes().hex()])
        else:
            out.append(int(a))
    return ["ok", out]


if side == "iree":
    import iree.runtime as rt

    module = rt.load_vm_flatbuffer_file(path, driver="local-sync")
    call = lambda fn, args: getattr(module, fn)(*args)
else:
    import tinyhal

    module = tinyhal.load(path, device=side)
    call = module.invoke
for k in range(start, len(calls)):
    fn, args = calls[k]
    args = [argument(a) for a in args]
    print(json.dumps([k, outcome(lambda: call(fn, args) if side == "iree" else call(fn, *args))]),
          flush=True)
if side == "iree":
    os._exit(0)  # not IREE's teardown: a call that wrote past a buffer may have hurt its heap
module.close()
"""


@dataclass
class Report:
    """What one program's run found."""

    program: Program
    calls_run: int = 0
    # calls IREE's process died on, by signal, which tinyhal failed cleanly: SIGFPE (an
    # integer division fault), SIGSEGV or SIGABRT (a buffer fill, copy or clone whose
    # element count wraps IREE's u64 bounds check writes over memory or its heap)
    iree_died: dict[str, int] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)


_DEATHS = (signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)


def _run_side(path: str, calls: list, side: str, start: int, timeout: float
              ) -> tuple[dict[int, list], int | None, str]:
    """Outcomes by call from `start` on one side ("iree" or a tinyhal driver), the
    child's exit status (None: timed out) and its stderr's tail."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
    spec = json.dumps({"path": path, "calls": calls, "side": side, "start": start})
    proc = subprocess.Popen([sys.executable, "-c", CHILD, spec], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = None
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    return {k: o for k, o in rows}, status, err[-1500:]


def run_program(program: Program, drivers: Sequence[str] = DRIVERS,
                timeout: float = CALL_TIMEOUT) -> Report:
    """Compiles `program` and runs its calls (see the module docstring)."""
    report = Report(program)
    path = program.compile()
    calls = program.calls
    ours: dict[str, dict[int, list]] = {}
    for driver in drivers:
        outcomes, status, err = _run_side(path, calls, driver, 0, timeout)
        ours[driver] = outcomes
        if status != 0:
            what = "did not finish" if status is None else f"exited with {status}"
            report.differences.append(f"seed {program.seed} on {driver}: tinyhal {what} "
                                      f"after {len(outcomes)} calls\n{err}")
    theirs: dict[int, list] = {}
    start = 0
    while start < len(calls):
        outcomes, status, err = _run_side(path, calls, "iree", start, timeout)
        theirs.update(outcomes)
        if status == 0:
            break
        k = start + len(outcomes)
        if status is None or -status not in _DEATHS or k >= len(calls):
            report.differences.append(f"seed {program.seed}: iree.runtime's child ended "
                                      f"({status}) at call {k}\n{err}")
            break
        theirs[k] = ["died", signal.Signals(-status).name]
        start = k + 1
    for k, (fn, args) in enumerate(calls):
        if k not in theirs:
            continue
        report.calls_run += 1
        expected = theirs[k]
        for driver in drivers:
            got = ours[driver].get(k)
            if got is None:
                continue
            if expected[0] == "died":
                if got[0] == "error":
                    continue
            elif got == expected:
                continue
            report.differences.append(
                f"seed {program.seed} call {k} {fn}{tuple(args)} on {driver}: "
                f"tinyhal {got} != iree {expected}")
        if expected[0] == "died":
            report.iree_died[expected[1]] = report.iree_died.get(expected[1], 0) + 1
    return report
