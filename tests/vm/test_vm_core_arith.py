"""Scalar arithmetic, compares, selects and casts: tinyhal vs iree.runtime, bit for bit."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.vm_pairs import F32_EDGES, F64_EDGES, I32_EDGES, I64_EDGES, vm_compile_source

# Keep f64 as f64 (iree-compile demotes it to f32 by default).
F64_FLAGS = ["--iree-input-demote-f64-to-f32=false"]

INT_BINARY = ["addi", "subi", "muli", "andi", "ori", "xori", "shli", "shrsi", "shrui",
              "minsi", "minui", "maxsi", "maxui"]
INT_DIV = ["divsi", "divui", "remsi", "remui"]
INT_CMP = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
FLOAT_BINARY = ["addf", "subf", "mulf", "divf", "remf", "minimumf", "maximumf"]
FLOAT_CMP = ["oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult",
             "ule", "une", "uno"]
FLOAT_MATH = ["sqrt", "exp", "log", "sin", "cos", "tanh", "exp2", "log2", "log10",
              "log1p", "expm1", "atan", "erf", "ceil", "floor", "round", "roundeven",
              "rsqrt", "absf"]


def _int_source(t: str) -> str:
    out = []
    for op in INT_BINARY + INT_DIV:
        out.append(f"func.func @{op}_{t}(%a: {t}, %b: {t}) -> {t} {{\n"
                   f"  %c = arith.{op} %a, %b : {t}\n  return %c : {t}\n}}")
    for p in INT_CMP:
        out.append(f"func.func @cmp_{p}_{t}(%a: {t}, %b: {t}) -> i1 {{\n"
                   f"  %c = arith.cmpi {p}, %a, %b : {t}\n  return %c : i1\n}}")
    out.append(f"func.func @select_{t}(%c: i1, %a: {t}, %b: {t}) -> {t} {{\n"
               f"  %r = arith.select %c, %a, %b : {t}\n  return %r : {t}\n}}")
    for op in ("ctlz", "absi"):
        out.append(f"func.func @{op}_{t}(%a: {t}) -> {t} {{\n"
                   f"  %c = math.{op} %a : {t}\n  return %c : {t}\n}}")
    return "\n".join(out)


def _float_source(t: str) -> str:
    out = []
    for op in FLOAT_BINARY:
        out.append(f"func.func @{op}_{t}(%a: {t}, %b: {t}) -> {t} {{\n"
                   f"  %c = arith.{op} %a, %b : {t}\n  return %c : {t}\n}}")
    for p in FLOAT_CMP:
        out.append(f"func.func @cmp_{p}_{t}(%a: {t}, %b: {t}) -> i1 {{\n"
                   f"  %c = arith.cmpf {p}, %a, %b : {t}\n  return %c : i1\n}}")
    for op in FLOAT_MATH:
        out.append(f"func.func @{op}_{t}(%a: {t}) -> {t} {{\n"
                   f"  %c = math.{op} %a : {t}\n  return %c : {t}\n}}")
    out.append(f"func.func @negf_{t}(%a: {t}) -> {t} {{\n"
               f"  %c = arith.negf %a : {t}\n  return %c : {t}\n}}")
    for op in ("atan2", "powf"):
        out.append(f"func.func @{op}_{t}(%a: {t}, %b: {t}) -> {t} {{\n"
                   f"  %c = math.{op} %a, %b : {t}\n  return %c : {t}\n}}")
    out.append(f"func.func @fma_{t}(%a: {t}, %b: {t}, %c: {t}) -> {t} {{\n"
               f"  %r = math.fma %a, %b, %c : {t}\n  return %r : {t}\n}}")
    out.append(f"func.func @select_{t}(%c: i1, %a: {t}, %b: {t}) -> {t} {{\n"
               f"  %r = arith.select %c, %a, %b : {t}\n  return %r : {t}\n}}")
    return "\n".join(out)


CASTS = """
func.func @sitofp_i32_f32(%a: i32) -> f32 { %r = arith.sitofp %a : i32 to f32  return %r : f32 }
func.func @uitofp_i32_f32(%a: i32) -> f32 { %r = arith.uitofp %a : i32 to f32  return %r : f32 }
func.func @sitofp_i64_f32(%a: i64) -> f32 { %r = arith.sitofp %a : i64 to f32  return %r : f32 }
func.func @uitofp_i64_f32(%a: i64) -> f32 { %r = arith.uitofp %a : i64 to f32  return %r : f32 }
func.func @sitofp_i64_f64(%a: i64) -> f64 { %r = arith.sitofp %a : i64 to f64  return %r : f64 }
func.func @uitofp_i64_f64(%a: i64) -> f64 { %r = arith.uitofp %a : i64 to f64  return %r : f64 }
func.func @fptosi_f32_i32(%a: f32) -> i32 { %r = arith.fptosi %a : f32 to i32  return %r : i32 }
func.func @fptoui_f32_i32(%a: f32) -> i32 { %r = arith.fptoui %a : f32 to i32  return %r : i32 }
func.func @fptosi_f32_i64(%a: f32) -> i64 { %r = arith.fptosi %a : f32 to i64  return %r : i64 }
func.func @extf(%a: f32) -> f64 { %r = arith.extf %a : f32 to f64  return %r : f64 }
func.func @bitcast_f32_i32(%a: f32) -> i32 { %r = arith.bitcast %a : f32 to i32  return %r : i32 }
func.func @bitcast_i32_f32(%a: i32) -> f32 { %r = arith.bitcast %a : i32 to f32  return %r : f32 }
func.func @bitcast_f64_i64(%a: f64) -> i64 { %r = arith.bitcast %a : f64 to i64  return %r : i64 }
func.func @bitcast_i64_f64(%a: i64) -> f64 { %r = arith.bitcast %a : i64 to f64  return %r : f64 }
func.func @nan_roundtrip(%a: i32) -> i32 {
  %f = arith.bitcast %a : i32 to f32
  %g = arith.negf %f : f32
  %h = arith.negf %g : f32
  %r = arith.bitcast %h : f32 to i32
  return %r : i32
}
func.func @nan_add_payload(%a: i32, %b: f32) -> i32 {
  %f = arith.bitcast %a : i32 to f32
  %g = arith.addf %f, %b : f32
  %r = arith.bitcast %g : f32 to i32
  return %r : i32
}
func.func @nan_mul_payload(%a: i32, %b: f32) -> i32 {
  %f = arith.bitcast %a : i32 to f32
  %g = arith.mulf %b, %f : f32
  %r = arith.bitcast %g : f32 to i32
  return %r : i32
}
func.func @extsi_i32_i64(%a: i32) -> i64 { %r = arith.extsi %a : i32 to i64  return %r : i64 }
func.func @extui_i32_i64(%a: i32) -> i64 { %r = arith.extui %a : i32 to i64  return %r : i64 }
func.func @trunci_i64_i32(%a: i64) -> i32 { %r = arith.trunci %a : i64 to i32  return %r : i32 }
func.func @small_ints(%a: i8, %b: i16, %c: i1) -> (i8, i16, i32, i32) {
  %a2 = arith.muli %a, %a : i8
  %b2 = arith.addi %b, %b : i16
  %ae = arith.extsi %a2 : i8 to i32
  %be = arith.extui %b2 : i16 to i32
  %ce = arith.extui %c : i1 to i32
  %s = arith.addi %ae, %ce : i32
  return %a2, %b2, %s, %be : i8, i16, i32, i32
}
"""


@pytest.fixture(scope="module")
def int_path():
    return vm_compile_source(_int_source("i32") + "\n" + _int_source("i64"))


@pytest.fixture(scope="module")
def float_path():
    return vm_compile_source(_float_source("f32") + "\n" + _float_source("f64"), F64_FLAGS)


@pytest.fixture(scope="module")
def cast_path():
    return vm_compile_source(CASTS, F64_FLAGS)


def _divisible(op, a, b, bits):
    if b == 0:
        return False
    return not (op in ("divsi", "remsi") and a == -(1 << (bits - 1)) and b == -1)


@pytest.mark.parametrize("t,edges", [("i32", I32_EDGES), ("i64", I64_EDGES)])
def test_int_binary_edges(vm_pair, int_path, t, edges):
    p = vm_pair(int_path)
    bits = int(t[1:])
    for op in INT_BINARY + INT_DIV:
        for a, b in itertools.product(edges, repeat=2):
            if op in INT_DIV and not _divisible(op, a, b, bits):
                continue
            p.check(f"{op}_{t}", a, b)
    for pred in INT_CMP:
        for a, b in itertools.product(edges, repeat=2):
            p.check(f"cmp_{pred}_{t}", a, b)
    for a in edges:
        for op in ("ctlz", "absi"):
            p.check(f"{op}_{t}", a)
        p.check(f"select_{t}", 1, a, 5)
        p.check(f"select_{t}", 0, a, 5)


@pytest.mark.parametrize("t", ["i32", "i64"])
def test_int_division_faults_trap(vm_pair, int_path, t):
    """IREE dies with SIGFPE on these; tinyhal raises an error naming the function."""
    from tinyhal.errors import Error

    p = vm_pair(int_path)
    int_min = -(1 << (int(t[1:]) - 1))
    for op in INT_DIV:
        with pytest.raises(Error, match=f"{op}_{t}"):
            p.ours(f"{op}_{t}", 5, 0)
    for op in ("divsi", "remsi"):
        with pytest.raises(Error):
            p.ours(f"{op}_{t}", int_min, -1)


@settings(max_examples=60, deadline=None)
@given(a=st.integers(-(2**31), 2**31 - 1), b=st.integers(-(2**31), 2**31 - 1),
       c=st.integers(-(2**63), 2**63 - 1), d=st.integers(-(2**63), 2**63 - 1))
def test_int_random(vm_pair_cache, a, b, c, d):
    from support.vm_pairs import Pair

    path = vm_compile_source(_int_source("i32") + "\n" + _int_source("i64"))
    p = vm_pair_cache.get(path) or vm_pair_cache.setdefault(path, Pair(path))
    for op in INT_BINARY:
        p.check(f"{op}_i32", a, b)
        p.check(f"{op}_i64", c, d)
    for op in INT_DIV:
        if _divisible(op, a, b, 32):
            p.check(f"{op}_i32", a, b)
        if _divisible(op, c, d, 64):
            p.check(f"{op}_i64", c, d)


@pytest.mark.parametrize("t,edges", [("f32", F32_EDGES), ("f64", F64_EDGES)])
def test_float_edges(vm_pair, float_path, t, edges):
    p = vm_pair(float_path)
    for op in FLOAT_BINARY + ["atan2", "powf"]:
        for a, b in itertools.product(edges, repeat=2):
            p.check(f"{op}_{t}", a, b)
    for pred in FLOAT_CMP:
        for a, b in itertools.product(edges, repeat=2):
            p.check(f"cmp_{pred}_{t}", a, b)
    for op in FLOAT_MATH + ["negf"]:
        for a in edges:
            p.check(f"{op}_{t}", a)
    for a, b, c in itertools.product(edges[:10], repeat=3):
        p.check(f"fma_{t}", a, b, c)
    for a in edges:
        p.check(f"select_{t}", 1, a, 2.0)
        p.check(f"select_{t}", 0, 2.0, a)


@settings(max_examples=80, deadline=None)
@given(a=st.floats(width=32), b=st.floats(width=32))
def test_f32_random(vm_pair_cache, a, b):
    from support.vm_pairs import Pair

    path = vm_compile_source(_float_source("f32") + "\n" + _float_source("f64"), F64_FLAGS)
    p = vm_pair_cache.get(path) or vm_pair_cache.setdefault(path, Pair(path))
    for op in ("addf", "subf", "mulf", "divf", "remf", "powf", "atan2"):
        p.check(f"{op}_f32", a, b)
    for op in ("sqrt", "exp", "log", "sin", "tanh", "erf", "roundeven"):
        p.check(f"{op}_f32", a)


def test_casts(vm_pair, cast_path):
    p = vm_pair(cast_path)
    for a in I32_EDGES:
        for fn in ("sitofp_i32_f32", "uitofp_i32_f32", "bitcast_i32_f32", "extsi_i32_i64",
                   "extui_i32_i64"):
            p.check(fn, a)
    for a in I64_EDGES + [2**53 + 1, 2**60 + 2**36 + 1, -(2**62) - 1, 2**24 + 1]:
        for fn in ("sitofp_i64_f32", "uitofp_i64_f32", "sitofp_i64_f64", "uitofp_i64_f64",
                   "bitcast_i64_f64", "trunci_i64_i32"):
            p.check(fn, a)
    for a in F32_EDGES + [2.5, -3.5, 0.49999997, 1e20, -1e20]:
        for fn in ("fptosi_f32_i32", "fptoui_f32_i32", "fptosi_f32_i64", "extf",
                   "bitcast_f32_i32"):
            if math.isnan(a) or math.isinf(a) or abs(a) >= 2**31:
                continue  # poison in MLIR; the compiler may fold differently
            p.check(fn, a)
    for a in F64_EDGES:
        p.check("bitcast_f64_i64", a)


def test_nan_payloads(vm_pair, cast_path):
    p = vm_pair(cast_path)
    for bits in (0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x7FA00000, 0xFF800003,
                 0x7F800000, 0x80000000):
        signed = bits - (1 << 32) if bits >= 1 << 31 else bits
        p.check("nan_roundtrip", signed)
        p.check("bitcast_i32_f32", signed)
        for b in (1.0, math.nan, -0.0):
            p.check("nan_add_payload", signed, b)
            p.check("nan_mul_payload", signed, b)


def test_small_int_types(vm_pair, cast_path):
    p = vm_pair(cast_path)
    for a, b, c in itertools.product([0, 1, -1, 127, -128, 100], [0, -1, 32767, -32768, 1234],
                                     [0, 1]):
        p.check("small_ints", a, b, c)
