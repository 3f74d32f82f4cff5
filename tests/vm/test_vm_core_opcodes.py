"""VM-dialect programs that reach opcodes frontend MLIR rarely emits, vs iree.runtime."""

from __future__ import annotations

import pytest

from support.vm_pairs import I32_EDGES, I64_EDGES, vm_compile_source
from tinyhal.errors import Error

OPS_VM = """
vm.module @ops {
  vm.rodata private @blob dense<[1, 2, 3, 4, 250, 251, 252, 253]> : tensor<8xi8>
  vm.global.i32 private mutable @g0 : i32
  vm.global.i64 private mutable @g1 : i64
  vm.global.ref private mutable @gr : !vm.buffer
  vm.func @table(%i : i32) -> i32 {
    vm.br_table %i {
      default: ^bb1(%i : i32),
      0: ^bb2,
      1: ^bb3
    }
  ^bb1(%x : i32):
    vm.return %x : i32
  ^bb2:
    %c = vm.const.i32 100
    vm.return %c : i32
  ^bb3:
    %d = vm.const.i32 200
    vm.return %d : i32
  }
  vm.export @table
  vm.func @bufops(%v : i32, %off : i64) -> (i32, i32, i64, i32, i64) {
    %ro = vm.const.ref.rodata @blob : !vm.buffer
    %c0 = vm.const.i64.zero
    %c8 = vm.const.i64 8
    %c16 = vm.const.i64 16
    %a0 = vm.const.i32.zero
    %b = vm.buffer.alloc %c16, %a0 : !vm.buffer
    vm.buffer.copy %ro, %c0, %b, %c0, %c8 : !vm.buffer -> !vm.buffer
    %c2 = vm.const.i64 2
    %c3 = vm.const.i64 3
    vm.buffer.fill.i16 %b, %c2, %c3, %v : i32 -> !vm.buffer
    %x = vm.buffer.load.i16.s %b[%off] : !vm.buffer -> i32
    %y = vm.buffer.load.i8.u %b[%off] : !vm.buffer -> i32
    %h = vm.buffer.hash %b, %c0, %c16 : !vm.buffer -> i64
    %cl = vm.buffer.clone %b, %c2, %c8, %a0 : !vm.buffer -> !vm.buffer
    %len = vm.buffer.length %cl : !vm.buffer -> i64
    %eq = vm.buffer.compare %b, %c2, %cl, %c0, %c8 : !vm.buffer, !vm.buffer
    vm.return %x, %y, %h, %eq, %len : i32, i32, i64, i32, i64
  }
  vm.export @bufops
  vm.func @globals(%a : i32, %b : i64) -> (i32, i64, i32) {
    %o = vm.global.load.i32 @g0 : i32
    %s = vm.add.i32 %o, %a : i32
    vm.global.store.i32 %s, @g0 : i32
    %o1 = vm.global.load.i64 @g1 : i64
    %s1 = vm.xor.i64 %o1, %b : i64
    vm.global.store.i64 %s1, @g1 : i64
    %r = vm.global.load.ref @gr : !vm.buffer
    %nz = vm.cmp.nz.ref %r : !vm.buffer
    %c4 = vm.const.i64 4
    %a0 = vm.const.i32.zero
    %nb = vm.buffer.alloc %c4, %a0 : !vm.buffer
    vm.global.store.ref %nb, @gr : !vm.buffer
    vm.return %s, %s1, %nz : i32, i64, i32
  }
  vm.export @globals
  vm.func @bits(%a : i32, %b : i64) -> (i32, i64, i32, i32) {
    %c = vm.ctlz.i32 %a : i32
    %d = vm.ctlz.i64 %b : i64
    %e = vm.ext.i8.i32.s %a : i32 -> i32
    %f = vm.ext.i16.i32.u %a : i32 -> i32
    vm.return %c, %d, %e, %f : i32, i64, i32, i32
  }
  vm.export @bits
  vm.func @failing(%a : i32) -> i32 {
    %nz = vm.cmp.nz.i32 %a : i32
    vm.cond_br %nz, ^bb1, ^bb2
  ^bb1:
    %code = vm.const.i32 9
    vm.fail %code, "custom failure"
  ^bb2:
    vm.return %a : i32
  }
  vm.export @failing
}"""


@pytest.fixture(scope="module")
def ops_path():
    return vm_compile_source(OPS_VM, ["--compile-from=vm"])


def test_br_table(vm_pair, ops_path):
    p = vm_pair(ops_path)
    for i in (-1, 0, 1, 2, 7, -(2**31)):
        p.check("table", i)


def test_buffer_ops(vm_pair, ops_path):
    p = vm_pair(ops_path)
    for v in (0, 1, -1, 0x1234, 0x8001, -(2**31)):
        for off in (0, 1, 2, 3, 4, 7):
            p.check("bufops", v, off)


def test_buffer_out_of_range(vm_pair, ops_path):
    p = vm_pair(ops_path)
    with pytest.raises(Exception):  # noqa: B017 - IREE raises its own error type
        p.theirs("bufops", 1, 8)
    with pytest.raises(Error, match="out-of-bounds"):
        p.ours("bufops", 1, 8)


def test_module_globals_and_refs(vm_pair, ops_path):
    p = vm_pair(ops_path, fresh=True)
    for a, b in ((1, 2), (5, -1), (-(2**31), 2**40), (7, 0)):
        p.check("globals", a, b)


def test_bit_ops(vm_pair, ops_path):
    p = vm_pair(ops_path)
    for a in I32_EDGES:
        for b in I64_EDGES[:6]:
            p.check("bits", a, b)


def test_fail_status_and_message(vm_pair, ops_path):
    p = vm_pair(ops_path)
    p.check("failing", 0)
    with pytest.raises(Exception, match="custom failure"):
        p.theirs("failing", 3)
    with pytest.raises(Error, match="custom failure") as info:
        p.ours("failing", 3)
    assert info.value.code == 9  # the status code vm.fail was given
