"""Control flow, globals, lists, buffers and failures: tinyhal vs iree.runtime."""

from __future__ import annotations

import pytest

from support.vm_pairs import vm_compile_source
from tinyhal.errors import Error

PROGRAM = """
util.global private mutable @count : i32 = 0 : i32
util.global private mutable @acc64 : i64 = 5 : i64
util.global private mutable @accf : f32 = 1.5 : f32

func.func @bump(%d: i32) -> (i32, i64, f32) {
  %v = util.global.load @count : i32
  %n = arith.addi %v, %d : i32
  util.global.store %n, @count : i32
  %w = util.global.load @acc64 : i64
  %de = arith.extsi %d : i32 to i64
  %m = arith.muli %w, %de : i64
  %m2 = arith.addi %m, %w : i64
  util.global.store %m2, @acc64 : i64
  %f = util.global.load @accf : f32
  %df = arith.sitofp %d : i32 to f32
  %g = arith.mulf %f, %df : f32
  %g2 = arith.addf %g, %f : f32
  util.global.store %g2, @accf : f32
  return %n, %m2, %g2 : i32, i64, f32
}

func.func @collatz(%n: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %c2 = arith.constant 2 : i32
  %c3 = arith.constant 3 : i32
  %r:2 = scf.while (%x = %n, %steps = %c0) : (i32, i32) -> (i32, i32) {
    %go = arith.cmpi sgt, %x, %c1 : i32
    scf.condition(%go) %x, %steps : i32, i32
  } do {
  ^bb0(%x: i32, %steps: i32):
    %rem = arith.remui %x, %c2 : i32
    %odd = arith.cmpi ne, %rem, %c0 : i32
    %nx = scf.if %odd -> i32 {
      %t = arith.muli %x, %c3 : i32
      %t1 = arith.addi %t, %c1 : i32
      scf.yield %t1 : i32
    } else {
      %h = arith.divui %x, %c2 : i32
      scf.yield %h : i32
    }
    %s1 = arith.addi %steps, %c1 : i32
    scf.yield %nx, %s1 : i32, i32
  }
  return %r#1 : i32
}

func.func @sum_f64(%n: i32) -> f64 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %z = arith.constant 0.0 : f64
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z) -> f64 {
    %ii = arith.index_cast %i : index to i64
    %f = arith.sitofp %ii : i64 to f64
    %q = arith.constant 0.1 : f64
    %t = arith.mulf %f, %q : f64
    %a = arith.addf %acc, %t : f64
    scf.yield %a : f64
  }
  return %r : f64
}

func.func @sum_f32(%n: i32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %z = arith.constant 0.0 : f32
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %z) -> f32 {
    %ii = arith.index_cast %i : index to i32
    %f = arith.sitofp %ii : i32 to f32
    %q = arith.constant 0.1 : f32
    %t = arith.mulf %f, %q : f32
    %a = arith.addf %acc, %t : f32
    scf.yield %a : f32
  }
  return %r : f32
}

func.func @switchy(%i: i32) -> i32 {
  %idx = arith.index_cast %i : i32 to index
  %r = scf.index_switch %idx -> i32
  case 0 { %a = arith.constant 10 : i32  scf.yield %a : i32 }
  case 1 { %b = arith.constant 20 : i32  scf.yield %b : i32 }
  case 5 { %c = arith.constant 50 : i32  scf.yield %c : i32 }
  default { %d = arith.constant -1 : i32  scf.yield %d : i32 }
  return %r : i32
}

func.func @lists(%n: i32, %x: f32) -> (i32, f32, i64, i32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %l = util.list.create %c2 : !util.list<?>
  util.list.resize %l, %c2 : !util.list<?>
  util.list.set %l[%c0], %n : i32 -> !util.list<?>
  util.list.set %l[%c1], %x : f32 -> !util.list<?>
  %a = util.list.get %l[%c0] : !util.list<?> -> i32
  %b = util.list.get %l[%c1] : !util.list<?> -> f32
  %t = util.list.create %c2 : !util.list<i64>
  util.list.resize %t, %c1 : !util.list<i64>
  %e = arith.extsi %n : i32 to i64
  util.list.set %t[%c0], %e : i64 -> !util.list<i64>
  %f = util.list.get %t[%c0] : !util.list<i64> -> i64
  %s = util.list.size %t : !util.list<i64>
  %si = arith.index_cast %s : index to i32
  %nested = util.list.create %c1 : !util.list<!util.list<i64>>
  util.list.resize %nested, %c1 : !util.list<!util.list<i64>>
  util.list.set %nested[%c0], %t : !util.list<i64> -> !util.list<!util.list<i64>>
  %t2 = util.list.get %nested[%c0] : !util.list<!util.list<i64>> -> !util.list<i64>
  %s2 = util.list.size %t2 : !util.list<i64>
  %s2i = arith.index_cast %s2 : index to i32
  return %a, %b, %f, %s2i : i32, f32, i64, i32
}

func.func @bufs(%n: i32, %m: i64) -> (i32, i32, i64, i32, i32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  %c16 = arith.constant 16 : index
  %b = util.buffer.alloc uninitialized : !util.buffer{%c16}
  util.buffer.fill %n, %b[%c0 for %c16] : i32 -> !util.buffer{%c16}
  util.buffer.store %n, %b[%c4 for %c4] : i32 -> !util.buffer{%c16}
  util.buffer.store %m, %b[%c8 for %c8] : i64 -> !util.buffer{%c16}
  %v = util.buffer.load %b[%c4 for %c4] : !util.buffer{%c16} -> i32
  %w = util.buffer.load %b[%c8 for %c8] : !util.buffer{%c16} -> i64
  %byte = util.buffer.load %b[%c1 for %c1] : !util.buffer{%c16} -> i8
  %bytei = arith.extsi %byte : i8 to i32
  %cst = util.buffer.constant : !util.buffer = dense<[1, 2, 3, 4]> : tensor<4xi32>
  %k = util.buffer.load %cst[%c8 for %c4] : !util.buffer{%c16} -> i32
  %b2 = util.buffer.alloc uninitialized : !util.buffer{%c16}
  util.buffer.copy %cst[%c0], %b2[%c0], %c16 : !util.buffer{%c16} -> !util.buffer{%c16}
  %eq = util.buffer.compare %cst[%c0], %b2[%c0], %c16 : !util.buffer{%c16}, !util.buffer{%c16}
  %eqi = arith.extui %eq : i1 to i32
  return %v, %k, %w, %bytei, %eqi : i32, i32, i64, i32, i32
}

func.func @check(%a: i32) -> i32 {
  %c10 = arith.constant 10 : i32
  %ok = arith.cmpi slt, %a, %c10 : i32
  cf.assert %ok, "value must be below ten"
  %r = arith.muli %a, %a : i32
  return %r : i32
}
"""


@pytest.fixture(scope="module")
def prog_path():
    return vm_compile_source(PROGRAM, ["--iree-input-demote-f64-to-f32=false"])


def test_globals_persist_across_calls(vm_pair, prog_path):
    p = vm_pair(prog_path, fresh=True)
    for d in (1, 2, -3, 7, 100000, -(2**31)):
        p.check("bump", d)


def test_loops_and_branches(vm_pair, prog_path):
    p = vm_pair(prog_path)
    for n in (0, 1, 2, 3, 7, 27, 97, 871, -5):
        p.check("collatz", n)
    for n in (0, 1, 10, 1000):
        p.check("sum_f64", n)
        p.check("sum_f32", n)
    for i in (-1, 0, 1, 2, 5, 6, 100):
        p.check("switchy", i)


def test_lists_and_buffers(vm_pair, prog_path):
    p = vm_pair(prog_path)
    for n, x in ((7, 1.5), (-1, -0.0), (2**31 - 1, 3.25)):
        p.check("lists", n, x)
    for n, m in ((0x01020304, 2**40 + 5), (-1, -1), (0, 0)):
        p.check("bufs", n, m)


def test_check_failure_message(vm_pair, prog_path):
    p = vm_pair(prog_path)
    p.check("check", 3)
    with pytest.raises(Exception, match="below ten"):
        p.theirs("check", 11)
    with pytest.raises(Error, match="below ten") as info:
        p.ours("check", 11)
    assert "check" in str(info.value)


def test_reflection_and_metadata(prog_path):
    from tinyhal.vm import load_module

    m = load_module(prog_path)
    assert m.bytecode_version == 0x00110000
    assert m.global_bytes_capacity >= 16
    decl = m.exports["bump"].reflection["iree.abi.declaration"]
    assert decl.startswith("sync func @bump")
    assert m.exports["bump"].cconv.text == "0i_iIf"
    assert m.rodata and not m.rodata[0].mutable
    assert m.rodata[0].data.readonly
