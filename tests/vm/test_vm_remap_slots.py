"""Branch operand remaps that IREE runs as ordered 32-bit slot moves.

IREE's VM copies a branch's (src, dst) register list one slot at a time, in list order.
The pinned compiler can emit a list where an i64 pair's move overwrites a slot that a
later pair still reads (`... %i0->%i2, %i1->%i3, %i3->%i0`: the i32 loop counter in %i3
is clobbered by the high half of the i64 in %i0:1 before it is copied to %i0), so the
target sees the i64's high half as the counter. tinyhal holds an i64 whole in its first
slot and must split it to give the same result. The program below is a random program
(reduced) that produced such a list; results are compared with iree.runtime bit for bit.
"""

from __future__ import annotations

import pytest

from support.vm_pairs import I64_EDGES, vm_compile_source
from tinyhal.vm import load_module, regflow

HAZARD_MLIR = """
func.func @f0(%a: i64, %b: i64, %c: i64, %n: i32) -> (i32, i64, i64, i64) {
  %v1 = arith.constant 9223372036854775807 : i64
  %v2 = arith.constant 12345 : i64
  %v3 = arith.constant 2147483647 : i64
  %v4 = arith.constant -1 : i64
  %one = arith.constant 1 : i64
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %v9 = arith.ori %v1, %a : i64
  %v12 = arith.shrui %v9, %v3 : i64
  %v14 = arith.cmpi slt, %v4, %v12 : i64
  %v13 = arith.select %v14, %v4, %a : i64
  %v15 = arith.addi %v13, %v9 : i64
  %r:4 = scf.while (%i = %c0, %x = %v13, %y = %v15, %z = %v1)
      : (i32, i64, i64, i64) -> (i32, i64, i64, i64) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %y, %z : i32, i64, i64, i64
  } do {
  ^bb0(%i: i32, %x: i64, %y: i64, %z: i64):
    %v19 = arith.ori %x, %one : i64
    %v18 = arith.divui %z, %v19 : i64
    %v24 = arith.shli %v18, %x : i64
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %y, %v24, %v24 : i32, i64, i64, i64
  }
  %v28 = arith.cmpi slt, %v1, %v3 : i64
  %v27 = arith.select %v28, %v3, %v1 : i64
  %v29 = arith.andi %r#2, %v2 : i64
  %v33 = arith.cmpi slt, %v29, %r#3 : i64
  %v32 = scf.if %v33 -> i64 {
    %v35 = arith.shrui %r#1, %v1 : i64
    scf.yield %v35 : i64
  } else {
    %v36 = arith.addi %v4, %v1 : i64
    %v41 = arith.andi %v27, %v3 : i64
    %v44 = arith.addi %v41, %v36 : i64
    scf.yield %v44 : i64
  }
  return %r#0, %v32, %r#1, %r#2 : i32, i64, i64, i64
}
"""

# A loop whose back edge swaps two i64s through a temporary pair
# (%i14->%i20, %i15->%i21, %i16->%i14, ..., %i20->%i16, %i21->%i17).
SWAP_MLIR = """
func.func @swap(%a: i64, %b: i64, %c: i64, %n: i32) -> (i32, i64, i64, i64) {
  %v1 = arith.constant 1099511627779 : i64
  %v2 = arith.constant -9223372036854775808 : i64
  %v3 = arith.constant 3 : i64
  %v4 = arith.constant -2147483648 : i64
  %one = arith.constant 1 : i64
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %v5 = arith.ori %v2, %v1 : i64
  %v6 = arith.shrui %v1, %v4 : i64
  %r:4 = scf.while (%i = %c0, %x = %b, %y = %v2, %z = %b) : (i32, i64, i64, i64) -> (i32, i64, i64, i64) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %y, %z : i32, i64, i64, i64
  } do {
  ^bb0(%i: i32, %x: i64, %y: i64, %z: i64):
  %v7 = arith.muli %x, %y : i64
  %v8 = arith.addi %v1, %v4 : i64
  %v9 = arith.addi %x, %y : i64
  %v10 = arith.shrui %v7, %v8 : i64
  %v11 = arith.ori %y, %v3 : i64
  %v12 = arith.addi %z, %v8 : i64
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %v9, %v12, %y : i32, i64, i64, i64
  }
  %v13 = arith.shli %v4, %v3 : i64
  %v14 = arith.shrsi %r#1, %v2 : i64
  %v15 = arith.subi %v2, %v3 : i64
  %v16 = arith.subi %v2, %r#1 : i64
  return %r#0, %v4, %r#1, %v2 : i32, i64, i64, i64
}
"""


@pytest.fixture(scope="module")
def hazard_path():
    return vm_compile_source(HAZARD_MLIR)


def _remap_lists(path):
    for fn in load_module(path).functions:
        for ins in fn.instructions:
            if ins.name in ("br", "cond_br"):
                yield from (f for f in ins.fields if isinstance(f, tuple))


def test_program_has_an_ordered_remap(hazard_path):
    assert any(regflow.slot_hazard(pairs) for pairs in _remap_lists(hazard_path))


def test_slot_hazard_predicate():
    assert regflow.slot_hazard(((0, 2), (1, 3), (3, 0)))
    assert not regflow.slot_hazard(((8, 12), (9, 13), (18, 8), (19, 9)))
    assert not regflow.slot_hazard(((3, 4), (0, 2), (1, 3)))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_ordered_remap_matches_iree(vm_pair, hazard_path, n, loop_mode):
    p = vm_pair(hazard_path)
    for a in I64_EDGES:
        for b in (0, -1, 2**40 + 3):
            p.check("f0", a, b, 12345, n)
    assert p.ours("f0", 0, 0, 0, 0) == (0, -9223372034707292163, 9223372036854775806, 0)


@pytest.mark.parametrize("n", [0, 1, 3, 17])
def test_swap_through_temporary_matches_iree(vm_pair, n, loop_mode):
    path = vm_compile_source(SWAP_MLIR)
    assert any(regflow.slot_hazard(pairs) for pairs in _remap_lists(path))
    p = vm_pair(path)
    for a in (0, -1):
        for b in I64_EDGES:
            p.check("swap", a, b, 0, n)


# An index loop: the entry's list (%i1->%i4, %i4->%i0, %i5->%i1) puts the i32 `a` into the
# low slot of the i64 counter %i0:1 and the zero's high half into its high slot, so IREE
# starts the counter at `a` zero-extended (a loop of n trips runs none for a < 0). The
# target block reads %i0:1 as one i64: its halves must be joined where they land.
COUNTER_MLIR = """
func.func @mix(%n: i32, %a: i32, %b: i32, %c: i32) -> i32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %a) -> i32 {
    %x = arith.xori %acc, %b : i32
    %m = arith.maxsi %x, %c : i32
    %k = arith.addi %m, %b : i32
    scf.yield %k : i32
  }
  return %r : i32
}
"""


# The same with an f32 carried: its bits land in the counter's low slot (%i2->%i4,
# %i4->%i2, %i5->%i3), so IREE's counter starts at the float's bits.
F32_COUNTER_MLIR = """
func.func @square(%a: i64, %b: f32, %n: i32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nn = arith.index_cast %n : i32 to index
  %r = scf.for %i = %c0 to %nn step %c1 iter_args(%acc = %b) -> f32 {
    %d = arith.mulf %acc, %acc : f32
    scf.yield %d : f32
  }
  return %r : f32
}
"""


@pytest.mark.parametrize("n", [0, 1, 5])
def test_halves_joined_where_the_target_reads_an_i64_match_iree(vm_pair, n, loop_mode):
    path = vm_compile_source(COUNTER_MLIR)
    assert any(regflow.slot_hazard(pairs) for pairs in _remap_lists(path))
    p = vm_pair(path)
    for a in (-7, 0, 3, 2**31 - 1, -(2**31)):
        for b in (0, 1, -1):
            p.check("mix", n, a, b, -1)
    path = vm_compile_source(F32_COUNTER_MLIR)
    assert any(regflow.slot_hazard(pairs) for pairs in _remap_lists(path))
    p = vm_pair(path)
    for b in (0.5, -0.5, 0.0, -0.0, 1e-45, 3.0):
        p.check("square", 0, b, n)
