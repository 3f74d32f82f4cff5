"""Differential runs: random valid programs, compiled with the pinned iree-compile, run by
iree.runtime and by tinyhal on every driver, results compared bit for bit.

A program is generated from a seed (`scalar_program`, `vm_program`, `tensor_program`,
`typed_program`, `model_program`, `host_program`), so a failure is reproduced from its
seed, never from a stored file. Scalar programs are host code (arith, scf, math, util
lists) over i32, i64 and f32 with edge values; every f32 result is returned as its bits,
so nothing is compared through a double. Tensor programs go through linalg, so their
dispatches run on the HAL; typed ones over every element type (f64, f32, f16, bf16, i8,
i16, i32, i64: wrapping, shifts past the width, NaN compares feeding selects) with
dynamic shapes, transposed reductions, broadcasts, gathers and two results; model
programs are small networks built as PyTorch exports them to ONNX (convolutions with
padding, stride, dilation and groups; attention with LayerNorm and Softmax; an int8
quantized matmul) and imported with the pinned `iree-import-onnx`; both for llvm-cpu or
for VMVX, whose kernels tinyhal runs itself. Host programs add f64, a call the compiler
keeps, mutable globals carried across calls and a list holding a tensor.

`run_program` runs the calls in child processes with a timeout (`CHILD`): one per tinyhal
driver, which must answer every call and exit cleanly, and iree.runtime's apart, so
nothing IREE does to its own heap reaches tinyhal's run. IREE's VM divides with C's `/`,
so an integer division by zero (or INT_MIN / -1) kills its process with SIGFPE, and a
buffer fill, copy or clone whose element count wraps its u64 bounds check writes over
memory (SIGSEGV, or SIGABRT from its heap); such a call is recorded (`Report.iree_died`)
and IREE's run goes on from the next call in a new child. tinyhal must fail those calls
with a `tinyhal.Error`. A call either side does not finish within its timeout (a loop
whose trip count came from an edge value: ~2^31 trips; tinyhal's is `SLACK` times
IREE's) goes on likewise; where IREE gave no answer there is nothing to compare
(`Report.too_slow`), where only tinyhal gave none it is a difference. A program the
compiler refuses runs nothing (`Report.not_compiled`). Everything else must agree: the same bits, or errors of the same
status.
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
# tinyhal's children get this many times IREE's timeout: a call IREE answers slowly (a loop
# of ~2^31 trips: ~40 s) must not count as a hang where tinyhal is merely slower
SLACK = 3.0
# what tinyhal's refusal of a call IREE's own behaviour leaves undefined says (a clone of a
# buffer whose bytes before the data, IREE's object state, were written: IREE crashes on
# most, answers some): any outcome of IREE's is accepted there (`Report.undefined`)
UNDEFINED = "IREE keeps its buffer's own state there"

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


def _permuted(rng: random.Random, values: list[str], types: list[str]) -> list[str]:
    """`values` with those of each type shuffled among their places: a permutation of
    same-typed loop-carried values makes the compiler shuffle registers (branch operand
    lists that read slots they wrote). Types in first-seen order, so a seed gives the
    same program in every process (a set's order follows the string hash seed)."""
    out = list(values)
    for t in dict.fromkeys(types):
        slots = [k for k, ct in enumerate(types) if ct == t]
        picked = [out[k] for k in slots]
        rng.shuffle(picked)
        for k, value in zip(slots, picked):
            out[k] = value
    return out


def _emit_one_and_mask(g: _Scalar, t: str) -> None:
    """`%one_<t>` and `%mask_<t>` (2^(width-2) - 1) for integer type `t`, which the
    generators' ops read by name."""
    g.emit(f"%one_{t} = arith.constant 1 : {t}", 1)
    g.emit(f"%mask_{t} = arith.constant {2**(int(t[1:]) - 2) - 1} : {t}", 1)


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
        _emit_one_and_mask(g, t)
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
    nxt = _permuted(rng, [rng.choice(inner[t][-3:] + [n]) for n, t in zip(names, carried_types)],
                    carried_types)
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


# -- host programs: f64, calls, mutable globals, loops, lists of refs

F64_EDGE_BITS = [0x0000000000000000, 0x8000000000000000, 0x3FF0000000000000,
                 0xBFF0000000000000, 0x3FE0000000000000, 0x0000000000000001,
                 0x800FFFFFFFFFFFFF, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
                 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
                 0x43E0000000000000, 0xC3E0000000000000, 0x41E0000000000000,
                 0x4340000000000001, 0x3FB999999999999A]
_F64_MATH = ["absf", "floor", "ceil", "sqrt", "exp", "exp2", "log", "log2", "sin", "cos",
             "tanh", "atan", "erf", "round", "roundeven"]


def f64_value(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


class _Host(_Scalar):
    """`_Scalar` plus f64 values (arithmetic, compares, selects, conversions from i64,
    bits from i64, libm functions)."""

    def op(self, pools: dict[str, list[str]], indent: int) -> None:
        rng, pick = self.rng, self.rng.choice
        if rng.random() < 0.6:
            super().op(pools, indent)
            return
        v = self.new()
        kind = pick(["bin", "bin", "cmp", "math", "conv", "select", "bits"])
        if kind == "bin":
            op = pick(["addf", "subf", "mulf", "divf", "minimumf", "maximumf", "remf"])
            self.emit(f"{v} = arith.{op} {pick(pools['f64'])}, {pick(pools['f64'])} : f64",
                      indent)
        elif kind == "cmp":
            self.emit(f"{v} = arith.cmpf {pick(_FLOAT_PREDICATES)}, {pick(pools['f64'])}, "
                      f"{pick(pools['f64'])} : f64", indent)
            pools["i1"].append(v)
            return
        elif kind == "math":
            self.emit(f"{v} = math.{pick(_F64_MATH)} {pick(pools['f64'])} : f64", indent)
        elif kind == "conv":
            # IREE's VM conversion has i64 -> f64 only, and the compiler narrows one of an
            # extended i32 to i32 -> f64: from values no op here produced
            wide = [x for x in pools["i64"] if not x.startswith("%v")]
            self.emit(f"{v} = arith.{pick(['sitofp', 'uitofp'])} {pick(wide)} : i64 to f64",
                      indent)
        elif kind == "select":
            self.emit(f"{v} = arith.select {pick(pools['i1'])}, {pick(pools['f64'])}, "
                      f"{pick(pools['f64'])} : f64", indent)
        else:
            self.emit(f"{v} = arith.bitcast {pick(pools['i64'])} : i64 to f64", indent)
        pools["f64"].append(v)


def _host_pools(g: _Host, names: dict[str, list[str]]) -> dict[str, list[str]]:
    pools = {k: list(v) for k, v in names.items()}
    for t in ("i32", "i64"):
        _emit_one_and_mask(g, t)
    for bits in g.rng.sample(F64_EDGE_BITS, 2):
        v = g.new()
        g.emit(f"{v} = arith.constant 0x{bits:016X} : f64", 1)
        pools["f64"].append(v)
    v = g.new()
    g.emit(f"{v} = arith.cmpi slt, {pools['i32'][0]}, {pools['i32'][-1]} : i32", 1)
    pools["i1"].append(v)
    return pools


def host_program(seed: int, calls: int = 4) -> Program:
    """Host code as a model's wrapper has it: a helper function kept a call (not
    inlined) over f64/i64/f32/i32, an entry whose counted loop carries values through
    it and updates mutable globals, a list holding values and a tensor (a ref), results
    as bits. Globals persist across calls, so the call order is part of the program."""
    rng = random.Random(f"host-{seed}")
    helper = _Host(rng, False, True)
    pools = _host_pools(helper, {"i32": ["%h2"], "i64": ["%h1"], "f32": ["%h3"],
                                 "f64": ["%h0"], "i1": []})
    helper.ops(pools, 1, 3, 10)
    hb = helper.lines
    h_out = [pools[t][-1] for t in ("f64", "i64", "i32", "f32")]

    g = _Host(rng, False, True)
    g.count = itertools.count(1000)
    pools = _host_pools(g, {"i32": ["%b"], "i64": ["%a"], "f32": ["%z"], "f64": ["%x", "%y"],
                            "i1": []})
    g.ops(pools, 1, 2, 6)
    init = [rng.choice(pools[t]) for t in ("f64", "i64", "i32", "f32")]
    g.emit("%c0 = arith.constant 0 : index", 1)
    g.emit("%c1 = arith.constant 1 : index", 1)
    g.emit("%c2 = arith.constant 2 : index", 1)
    g.emit("%c3 = arith.constant 3 : index", 1)
    g.emit("%trips = arith.index_cast %n : i32 to index", 1)
    g.emit(f"%loop:4 = scf.for %k = %c0 to %trips step %c1 iter_args(%lf = {init[0]}, "
           f"%li = {init[1]}, %lw = {init[2]}, %ls = {init[3]}) -> (f64, i64, i32, f32) {{", 1)
    g.emit("%r:4 = util.call @helper(%lf, %li, %lw, %ls) : (f64, i64, i32, f32) -> "
           "(f64, i64, i32, f32)", 2)
    g.emit("%gc = util.global.load @count : i64", 2)
    g.emit("%gc1 = arith.addi %gc, %r#1 : i64", 2)
    g.emit("util.global.store %gc1, @count : i64", 2)
    g.emit("%gs = util.global.load @total : f64", 2)
    g.emit("%gs1 = arith.addf %gs, %r#0 : f64", 2)
    g.emit("util.global.store %gs1, @total : f64", 2)
    inner = {k: list(v) for k, v in pools.items()}
    inner["f64"] += ["%r#0", "%lf"]
    inner["i64"] += ["%r#1", "%gc1", "%li"]
    inner["i32"] += ["%r#2", "%lw"]
    inner["f32"] += ["%r#3", "%ls"]
    g.ops(inner, 2, 0, 4)
    nxt = [rng.choice(inner[t][-3:]) for t in ("f64", "i64", "i32", "f32")]
    g.emit(f"scf.yield {', '.join(nxt)} : f64, i64, i32, f32", 2)
    g.emit("}", 1)
    pools["f64"].append("%loop#0")
    pools["i64"].append("%loop#1")
    pools["i32"].append("%loop#2")
    pools["f32"].append("%loop#3")
    # a loop shuffling f64s (two slots each) among i64s and 32-bit values
    carried = [rng.choice(["f64", "f64", "i64", "f32", "i32"]) for _ in range(rng.randint(2, 6))]
    binds = ", ".join(f"%s{k} = {rng.choice(pools[t])}" for k, t in enumerate(carried))
    sig = ", ".join(carried)
    g.emit(f"%shuf:{len(carried)} = scf.for %q = %c0 to %trips step %c1 iter_args({binds}) "
           f"-> ({sig}) {{", 1)
    inner = {k: list(v) for k, v in pools.items()}
    for k, t in enumerate(carried):
        inner[t].append(f"%s{k}")
    g.ops(inner, 2, 0, 3)
    nxt = _permuted(rng, [rng.choice(inner[t][-2:] + [f"%s{k}"]) for k, t in enumerate(carried)],
                    carried)
    g.emit(f"scf.yield {', '.join(nxt)} : {sig}", 2)
    g.emit("}", 1)
    for k, t in enumerate(carried):
        pools[t].append(f"%shuf#{k}")
    g.emit("%list = util.list.create %c3 : !util.list<?>", 1)
    g.emit("util.list.resize %list, %c3 : !util.list<?>", 1)
    g.emit(f"util.list.set %list[%c0], {rng.choice(pools['f64'])} : f64 -> !util.list<?>", 1)
    g.emit(f"util.list.set %list[%c1], {rng.choice(pools['i64'])} : i64 -> !util.list<?>", 1)
    g.emit(f"%tensor = tensor.from_elements {rng.choice(pools['f32'])}, "
           f"{rng.choice(pools['f32'])} : tensor<2xf32>", 1)
    g.emit("%view = hal.tensor.export %tensor : tensor<2xf32> -> !hal.buffer_view", 1)
    g.emit("util.list.set %list[%c2], %view : !hal.buffer_view -> !util.list<?>", 1)
    g.emit("%lf64 = util.list.get %list[%c0] : !util.list<?> -> f64", 1)
    g.emit("%li64 = util.list.get %list[%c1] : !util.list<?> -> i64", 1)
    g.emit("%lv = util.list.get %list[%c2] : !util.list<?> -> !hal.buffer_view", 1)
    g.emit("%lt = hal.tensor.import %lv : !hal.buffer_view -> tensor<2xf32>", 1)
    g.emit(f"%lte = tensor.extract %lt[%c{rng.randrange(2)}] : tensor<2xf32>", 1)
    g.emit("%count = util.global.load @count : i64", 1)
    g.emit("%total = util.global.load @total : f64", 1)
    outs = ["%lf64", "%total", pools["f64"][-1]]
    for k, value in enumerate(outs):
        g.emit(f"%o{k} = arith.bitcast {value} : f64 to i64", 1)
    g.emit("%o3 = arith.bitcast %lte : f32 to i32", 1)
    g.emit(f"%o4 = arith.bitcast {pools['f32'][-1]} : f32 to i32", 1)
    g.emit(f"%o5 = arith.bitcast {pools['f64'][-2]} : f64 to i64", 1)
    results = ["%o0", "%o1", "%o2", "%o5", pools["i64"][-1], "%li64", "%count", "%o3", "%o4",
               pools["i32"][-1]]
    types = ["i64"] * 7 + ["i32"] * 3
    hbody = "\n".join(hb)
    body = "\n".join(g.lines)
    source = f"""util.global private mutable @count : i64 = 0 : i64
util.global private mutable @total : f64 = 0.0 : f64
util.func private @helper(%h0: f64, %h1: i64, %h2: i32, %h3: f32) -> (f64, i64, i32, f32)
    attributes {{inlining_policy = #util.inline.never}} {{
{hbody}
  util.return {', '.join(h_out)} : f64, i64, i32, f32
}}
func.func @entry(%x: f64, %y: f64, %a: i64, %b: i32, %z: f32, %n: i32) -> ({', '.join(types)}) {{
{body}
  return {', '.join(results)} : {', '.join(types)}
}}
"""
    program_calls = []
    for _ in range(calls):
        program_calls.append(("entry", [f64_value(rng.choice(F64_EDGE_BITS)),
                                        f64_value(rng.choice(F64_EDGE_BITS)),
                                        rng.choice(I64_EDGES), rng.choice(I32_EDGES),
                                        f32_value(rng.choice(F32_EDGE_BITS)),
                                        rng.choice([0, 1, 2, 5])]))
    return Program(seed, "host", source, [*SCALAR_FLAGS, "--iree-input-demote-f64-to-f32=false"],
                   program_calls)


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


# -- typed tensor programs: every element type, on llvm-cpu and VMVX

_NUMPY = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
          "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64"}
F64_EDGES = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-308, 5e-324, -5e-324, 1.7976931348623157e308,
             float("inf"), -float("inf"), float("nan"), 2.0**53 + 1, 1e16, 0.1, -2.5]
_TYPED_INT = ["addi", "subi", "muli", "andi", "ori", "xori", "shli", "shrsi", "shrui",
              "maxsi", "minsi", "maxui", "minui", "divsi", "remui"]
_TYPED_FLOAT = ["addf", "subf", "mulf", "divf", "maximumf", "minimumf", "maxnumf",
                "minnumf"]


def _edge_bytes(rng: random.Random, t: str, count: int) -> str:
    """`count` elements of type `t` drawn mostly from edge values, as little-endian hex
    (NaN payloads, subnormals, INT_MIN and shift counts past the width included)."""
    import numpy as np

    if t.startswith("i"):
        width = int(t[1:])
        edges = [0, 1, -1, 2, 3, width - 1, width, width + 1, 2 * width, 2**(width - 1) - 1,
                 -2**(width - 1), 0x55 if width == 8 else 0x5555]
        values = [rng.choice(edges) if rng.random() < 0.8 else
                  rng.randrange(-2**(width - 1), 2**(width - 1)) for _ in range(count)]
        return np.array(values, np.dtype(_NUMPY[t])).tobytes().hex()
    if t == "f32":
        return struct.pack(f"<{count}I", *(rng.choice(F32_EDGE_BITS)
                                           for _ in range(count))).hex()
    values = np.array([rng.choice(F64_EDGES) for _ in range(count)], np.float64)
    if t == "f64":
        return values.tobytes().hex()
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy

    with np.errstate(over="ignore"):
        return values.astype(np.dtype(_NUMPY[t])).tobytes().hex()


def _typed_body(rng: random.Random, t: str, compute: str, names: list[str], ops: int
                ) -> list[str]:
    """Element ops over `names` (values of type `compute`): wrapping integer ops and
    shifts by any amount, guarded divisions, float ops with NaN, compares (NaN
    predicates included) feeding selects."""
    lines, pool = [], list(names)
    for k in range(ops):
        v = f"%t{k}"
        a, b = rng.choice(pool), rng.choice(pool)
        if compute.startswith("i"):
            op = rng.choice([*_TYPED_INT, "cmp"])
            if op == "cmp":
                c = f"%q{k}"
                lines.append(f"{c} = arith.cmpi {rng.choice(_INT_PREDICATES)}, {a}, {b} : {compute}")
                lines.append(f"{v} = arith.select {c}, {a}, {rng.choice(pool)} : {compute}")
            elif op in ("divsi", "remui"):
                g = f"%g{k}"
                lines.append(f"{g} = arith.ori {b}, %one : {compute}")
                if op == "divsi":  # keep INT_MIN / -1 (UB) out: a positive divisor
                    lines.append(f"%h{k} = arith.andi {g}, %mask : {compute}")
                    g = f"%h{k}"
                lines.append(f"{v} = arith.{op} {a}, {g} : {compute}")
            else:
                lines.append(f"{v} = arith.{op} {a}, {b} : {compute}")
        else:
            op = rng.choice([*_TYPED_FLOAT, "cmp", "neg", "abs"])
            if op == "cmp":
                c = f"%q{k}"
                lines.append(f"{c} = arith.cmpf {rng.choice(_FLOAT_PREDICATES)}, {a}, {b} : "
                             f"{compute}")
                lines.append(f"{v} = arith.select {c}, {a}, {rng.choice(pool)} : {compute}")
            elif op == "neg":
                lines.append(f"{v} = arith.negf {a} : {compute}")
            elif op == "abs":
                lines.append(f"{v} = math.absf {a} : {compute}")
            else:
                lines.append(f"{v} = arith.{op} {a}, {b} : {compute}")
        pool.append(v)
    return lines


def typed_program(seed: int, calls: int = 2) -> Program:
    """A linalg program over one element type (f64, f32, f16, bf16, i8, i16, i32, i64)
    for llvm-cpu or VMVX: an elementwise function of a dynamic shape with two results,
    a reduction of a transposed input plus a broadcast bias, and a gather (indices
    reduced into range: an out-of-range extract is undefined). f16 and bf16 compute
    through f32 now and then (bf16 always); VMVX has neither (its compiler refuses
    them)."""
    rng = random.Random(f"typed-{seed}")
    backend = rng.choice(["llvm-cpu", "vmvx"])
    t = rng.choice(["f64", "f32", "i8", "i16", "i32", "i64"] if backend == "vmvx"
                   else ["f64", "f32", "f16", "bf16", "i8", "i16", "i32", "i64"])
    widen = t == "bf16" or (t == "f16" and rng.random() < 0.5)
    compute = "f32" if widen else t
    integer = t.startswith("i")
    n, rows, cols = rng.choice([1, 3, 4, 8, 13]), rng.choice([1, 2, 5]), rng.choice([1, 3, 4, 9])
    width = int(compute[1:]) if integer else 0

    def load(x: str) -> list[str]:
        return [f"{x}w = arith.extf {x} : {t} to f32"] if widen else []

    def store(x: str) -> tuple[list[str], str]:
        return ([f"%out = arith.truncf {x} : f32 to {t}"], "%out") if widen else ([], x)

    consts = [f"%one = arith.constant 1 : {compute}",
              f"%mask = arith.constant {2**(width - 2) - 1} : {compute}"] if integer else []
    args = ["%xw", "%yw"] if widen else ["%x", "%y"]
    body = _typed_body(rng, t, compute, args, rng.randint(2, 7))
    first, second = body[-1].split(" = ")[0], rng.choice(
        [line.split(" = ")[0] for line in body if line.startswith("%t")] + args)
    out1, r1 = store(first)
    out2 = [f"%out2 = arith.truncf {second} : f32 to {t}"] if widen else []
    r2 = "%out2" if widen else second
    inner = "\n    ".join([*consts, *load("%x"), *load("%y"), *body, *out1, *out2])
    combine = (rng.choice(["addi", "xori", "maxsi", "minui", "muli"]) if integer else
               rng.choice(["addf", "maximumf", "minimumf"]))
    zero = "0" if integer else "0.0"
    red_in = [*load("%x"), *load("%b")]
    xv, bv = ("%xw", "%bw") if widen else ("%x", "%b")
    red_body = "\n    ".join([*red_in, f"%p = arith.{'addi' if integer else 'addf'} {xv}, {bv} : {compute}",
                              *([f"%accw = arith.extf %acc : {t} to f32"] if widen else []),
                              f"%s = arith.{combine} %p, {'%accw' if widen else '%acc'} : {compute}",
                              *(["%sn = arith.truncf %s : f32 to " + t] if widen else [])])
    red_out = "%sn" if widen else "%s"
    source = f"""
#map = affine_map<(d0) -> (d0)>
func.func @elementwise(%a: tensor<?x{t}>, %b: tensor<?x{t}>) -> (tensor<?x{t}>, tensor<?x{t}>) {{
  %c0 = arith.constant 0 : index
  %d = tensor.dim %a, %c0 : tensor<?x{t}>
  %init = tensor.empty(%d) : tensor<?x{t}>
  %r:2 = linalg.generic {{indexing_maps = [#map, #map, #map, #map], iterator_types = ["parallel"]}}
      ins(%a, %b : tensor<?x{t}>, tensor<?x{t}>) outs(%init, %init : tensor<?x{t}>, tensor<?x{t}>) {{
  ^bb0(%x: {t}, %y: {t}, %o: {t}, %o2: {t}):
    {inner}
    linalg.yield {r1}, {r2} : {t}, {t}
  }} -> (tensor<?x{t}>, tensor<?x{t}>)
  return %r#0, %r#1 : tensor<?x{t}>, tensor<?x{t}>
}}
func.func @reduce(%a: tensor<{rows}x{cols}x{t}>, %bias: tensor<{rows}x{t}>) -> tensor<{cols}x{t}> {{
  %zero = arith.constant {zero} : {t}
  %init = tensor.empty() : tensor<{cols}x{t}>
  %fill = linalg.fill ins(%zero : {t}) outs(%init : tensor<{cols}x{t}>) -> tensor<{cols}x{t}>
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d1, d0)>,
      affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0)>],
      iterator_types = ["parallel", "reduction"]}}
      ins(%a, %bias : tensor<{rows}x{cols}x{t}>, tensor<{rows}x{t}>) outs(%fill : tensor<{cols}x{t}>) {{
  ^bb0(%x: {t}, %b: {t}, %acc: {t}):
    {red_body}
    linalg.yield {red_out} : {t}
  }} -> tensor<{cols}x{t}>
  return %r : tensor<{cols}x{t}>
}}
func.func @gather(%table: tensor<{n}x{t}>, %idx: tensor<{rows}xi32>) -> tensor<{rows}x{t}> {{
  %init = tensor.empty() : tensor<{rows}x{t}>
  %n = arith.constant {n} : i32
  %r = linalg.generic {{indexing_maps = [#map, #map], iterator_types = ["parallel"]}}
      ins(%idx : tensor<{rows}xi32>) outs(%init : tensor<{rows}x{t}>) {{
  ^bb0(%i: i32, %o: {t}):
    %k = arith.remui %i, %n : i32
    %j = arith.index_cast %k : i32 to index
    %v = tensor.extract %table[%j] : tensor<{n}x{t}>
    linalg.yield %v : {t}
  }} -> tensor<{rows}x{t}>
  return %r : tensor<{rows}x{t}>
}}
"""
    flags = ["--iree-hal-target-device=local", f"--iree-hal-local-target-device-backends={backend}",
             "--iree-input-demote-f64-to-f32=false"]
    dtype = _NUMPY[t]

    def tensor(*shape: int) -> dict:
        count = 1
        for s in shape:
            count *= s
        return {"dtype": dtype, "shape": list(shape), "hex": _edge_bytes(rng, t, count)}

    program_calls: list[tuple[str, list]] = []
    for _ in range(calls):
        length = rng.choice([0, 1, n, 17])
        program_calls.append(("elementwise", [tensor(length), tensor(length)]))
        program_calls.append(("reduce", [tensor(rows, cols), tensor(rows)]))
        program_calls.append(("gather", [tensor(n), {
            "dtype": "int32", "shape": [rows],
            "hex": _edge_bytes(rng, "i32", rows)}]))
    return Program(seed, "typed", source, flags, program_calls)


# -- small models in the form PyTorch's ONNX exporter gives them

def _model_graph(rng: random.Random, seed: int) -> tuple[bytes, list[dict]]:
    """One small ONNX model (opset 17) and its inputs' specs: a convolution stack
    (padding, stride, dilation, groups), an attention block (LayerNorm, scaled
    QK^T, Softmax, residual) or an int8 quantized matmul (MatMulInteger with zero
    points, rescaled and requantized)."""
    import numpy as np
    from onnx import TensorProto, helper

    from .zoo import _Graph

    g = _Graph(seed)
    kind = rng.choice(["conv", "attention", "quantized"])
    if kind == "conv":
        groups = rng.choice([1, 2, 4])
        c = groups * rng.choice([1, 2])
        # square inputs: the importer lowers a grouped strided convolution of a
        # non-square one to mismatched shapes (the second draw keeps the later draws)
        h = w = rng.choice([5, 8, 9])
        rng.choice([4, 7, 8])
        shape = [1, c, h, w]
        x = "x"
        for _ in range(rng.randint(1, 2)):
            k = rng.choice([1, 2, 3])
            out = groups * rng.choice([1, 2])
            pad, stride, dilation = rng.choice([0, 1, 2]), rng.choice([1, 2]), rng.choice([1, 2])
            reach = dilation * (k - 1) + 1
            if min(h, w) + 2 * pad < reach:  # no output position: a kernel of one
                k = reach = 1
            h, w = ((size + 2 * pad - reach) // stride + 1 for size in (h, w))
            weight = g.weight((out, c // groups, k, k), 0.5)
            x = g.op("Conv", [x, weight, g.weight((out,), 0.1, "b")], kernel_shape=[k, k],
                     pads=[pad, pad, pad, pad], strides=[stride] * 2,
                     dilations=[dilation] * 2, group=groups)
            x = g.op(rng.choice(["Relu", "Sigmoid", "Tanh"]), [x])
            c = out
        pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])])
        logits = g.op("Gemm", [pooled, g.weight((c, 5), 0.3), g.weight((5,), 0.1, "b")])
        y = g.op("Softmax", [logits], axis=-1)
        outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 5])]
        inputs = [("x", TensorProto.FLOAT, shape)]
    elif kind == "attention":
        seq, width = rng.choice([1, 3, 8]), rng.choice([4, 8, 16])
        x = g.layer_norm("x", width)
        q, k, v = (g.linear(x, width, width) for _ in range(3))
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[1, 0])]),
                              g.const(np.float32(1.0 / np.sqrt(width)))])
        attended = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        y = g.layer_norm(g.op("Add", [g.linear(attended, width, width), "x"]), width)
        outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT, [seq, width])]
        inputs = [("x", TensorProto.FLOAT, [seq, width])]
    else:
        m, k, n = rng.choice([1, 2, 5]), rng.choice([3, 8, 16]), rng.choice([1, 4, 7])
        weight = g.const(g.rng.integers(-128, 128, (k, n)), "wq", np.int8)
        acc = g.op("MatMulInteger", ["x", weight, g.const(np.int8(rng.randrange(-8, 8)), "xz", np.int8),
                                     g.const(np.int8(rng.randrange(-8, 8)), "wz", np.int8)])
        scaled = g.op("Mul", [g.op("Cast", [acc], to=TensorProto.FLOAT),
                              g.const(np.float32(rng.choice([0.01, 0.003, 0.5])))])
        q = g.op("QuantizeLinear", [scaled, g.const(np.float32(0.05)),
                                    g.const(np.int8(0), "yz", np.int8)])
        deq = g.op("DequantizeLinear", [q, g.const(np.float32(0.05)),
                                        g.const(np.int8(0), "yz", np.int8)])
        outputs = [helper.make_tensor_value_info(q, TensorProto.INT8, [m, n]),
                   helper.make_tensor_value_info(deq, TensorProto.FLOAT, [m, n])]
        inputs = [("x", TensorProto.INT8, [m, k])]
    model = g.model(f"m{seed}", [helper.make_tensor_value_info(*i) for i in inputs], outputs)
    specs = [{"dtype": "int8" if dtype == TensorProto.INT8 else "float32", "shape": shape}
             for _, dtype, shape in inputs]
    return model, specs


def model_program(seed: int, calls: int = 2) -> Program:
    """A small model (`_model_graph`) imported from ONNX and compiled for llvm-cpu or
    VMVX; inputs mostly ordinary values, now and then an edge value (NaN, inf, a
    subnormal)."""
    import numpy as np

    from .models import import_onnx

    rng = random.Random(f"model-{seed}")
    model, specs = _model_graph(rng, seed)
    backend = rng.choice(["llvm-cpu", "vmvx"])
    flags = ["--iree-hal-target-device=local",
             f"--iree-hal-local-target-device-backends={backend}"]
    program_calls: list[tuple[str, list]] = []
    for _ in range(calls):
        args = []
        for spec in specs:
            count = int(np.prod(spec["shape"]))
            if spec["dtype"] == "int8":
                data = np.array([rng.randrange(-128, 128) for _ in range(count)], np.int8)
            else:
                data = np.array([rng.gauss(0.0, 2.0) for _ in range(count)], np.float32)
                if rng.random() < 0.3:
                    data[rng.randrange(count)] = f32_value(rng.choice(F32_EDGE_BITS))
            args.append({**spec, "hex": data.tobytes().hex()})
        program_calls.append((f"m{seed}", args))
    return Program(seed, "model", import_onnx(model), flags, program_calls)


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
import ctypes, json, os, signal, sys
import numpy as np

spec = json.loads(sys.argv[1])
try:  # PR_SET_PDEATHSIG: a parent killed outright (no timeout of its own ran) takes this along
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
except (OSError, AttributeError):
    pass
if os.getppid() != spec["parent"]:  # it ended before the line above
    sys.exit(3)
path, calls, side, start = spec["path"], spec["calls"], spec["side"], spec["start"]
UNDEFINED = spec["undefined"]


def argument(value):
    if isinstance(value, dict) and "hex" in value:
        import ml_dtypes  # noqa: F401 - bfloat16 as a numpy dtype

        return np.frombuffer(bytes.fromhex(value["hex"]), np.dtype(value["dtype"])).reshape(
            value["shape"]).copy()
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
            if UNDEFINED in str(e):
                return ["undefined", code.name]
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
        if a.dtype.kind not in "iub" or a.ndim:
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
    # calls iree.runtime did not finish within the timeout (a loop of ~2^31 trips): no
    # answer to compare with, whatever tinyhal gave
    too_slow: int = 0
    # iree-compile refused the program (a generator's edge the compiler rejects, such as
    # a remainder it folds to one by a constant zero): nothing ran
    not_compiled: str = ""
    undefined: int = 0  # (call, driver) outcomes tinyhal refused as undefined in IREE
    differences: list[str] = field(default_factory=list)


_DEATHS = (signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)


def _run_side(path: str, calls: list, side: str, start: int, timeout: float
              ) -> tuple[dict[int, list], int | None, str]:
    """Outcomes by call from `start` on one side ("iree" or a tinyhal driver), the
    child's exit status (None: timed out) and its stderr's tail."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, env.get("PYTHONPATH")]))
    spec = json.dumps({"path": path, "calls": calls, "side": side, "start": start,
                       "undefined": UNDEFINED, "parent": os.getpid()})
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


def _run_all(program: Program, path: str, side: str, timeout: float,
             report: Report) -> dict[int, list]:
    """Outcomes by call on one side. A child that runs out of time on a call, or on
    IREE's side dies by a signal, goes on from the next call in a new child; any other
    end is a difference."""
    calls, outcomes, start = program.calls, {}, 0
    while start < len(calls):
        got, status, err = _run_side(path, calls, side, start, timeout)
        outcomes.update(got)
        k = start + len(got)
        if status == 0:
            break
        if k < len(calls) and status is None:
            outcomes[k] = ["timeout"]
        elif k < len(calls) and side == "iree" and -status in _DEATHS:
            outcomes[k] = ["died", signal.Signals(-status).name]
        else:
            who = "iree.runtime's child" if side == "iree" else f"tinyhal on {side}"
            what = "did not finish" if status is None else f"ended with {status}"
            report.differences.append(f"seed {program.seed}: {who} {what} at call {k}\n{err}")
            break
        start = k + 1
    return outcomes


def run_program(program: Program, drivers: Sequence[str] = DRIVERS,
                timeout: float = CALL_TIMEOUT) -> Report:
    """Compiles `program` and runs its calls (see the module docstring)."""
    report = Report(program)
    try:
        path = program.compile()
    except RuntimeError as e:  # e.g. a division the compiler folded to one by zero
        report.not_compiled = str(e)[-500:]
        return report
    ours = {driver: _run_all(program, path, driver, timeout * SLACK, report)
            for driver in drivers}
    theirs = _run_all(program, path, "iree", timeout, report)
    for k, (fn, args) in enumerate(program.calls):
        if k not in theirs:
            continue
        report.calls_run += 1
        expected = theirs[k]
        for driver in drivers:
            got = ours[driver].get(k)
            if got is not None and got[0] == "undefined":
                report.undefined += 1
                continue
            if got is None or got == expected or expected == ["timeout"] or (
                    expected[0] == "died" and got[0] == "error"):
                continue
            report.differences.append(
                f"seed {program.seed} call {k} {fn}{tuple(args)} on {driver}: "
                f"tinyhal {got} != iree {expected}")
        if expected[0] == "died":
            report.iree_died[expected[1]] = report.iree_died.get(expected[1], 0) + 1
        elif expected == ["timeout"]:
            report.too_slow += 1
    return report
