"""`vm.list.get.ref` gives a ref only where the result's declared type is the element's
own: any other type, the opaque `!vm.ref<?>` included, puts null in the register, as
IREE's runtime does. Checked against iree.runtime on the same module."""

from __future__ import annotations

from support.vm_pairs import Pair, vm_compile_source

SOURCE = """
vm.module @lists {
  vm.func @as_opaque(%n : i32) -> i32 {
    %l = vm.list.alloc %n : (i32) -> !vm.list<?>
    vm.list.resize %l, %n : (!vm.list<?>, i32)
    %c0 = vm.const.i32 0
    %c8 = vm.const.i64 8
    %b = vm.buffer.alloc %c8, %c0 : !vm.buffer
    vm.list.set.ref %l, %c0, %b : (!vm.list<?>, i32, !vm.buffer)
    %any = vm.list.get.ref %l, %c0 : (!vm.list<?>, i32) -> !vm.ref<?>
    %nz = vm.cmp.nz.ref %any : !vm.ref<?>
    vm.return %nz : i32
  }
  vm.export @as_opaque
  vm.func @as_buffer(%n : i32) -> i32 {
    %l = vm.list.alloc %n : (i32) -> !vm.list<?>
    vm.list.resize %l, %n : (!vm.list<?>, i32)
    %c0 = vm.const.i32 0
    %c8 = vm.const.i64 8
    %b = vm.buffer.alloc %c8, %c0 : !vm.buffer
    vm.list.set.ref %l, %c0, %b : (!vm.list<?>, i32, !vm.buffer)
    %got = vm.list.get.ref %l, %c0 : (!vm.list<?>, i32) -> !vm.buffer
    %nz = vm.cmp.nz.ref %got : !vm.buffer
    vm.return %nz : i32
  }
  vm.export @as_buffer
}
"""


def test_a_ref_read_as_another_type_is_null_as_in_iree():
    pair = Pair(vm_compile_source(SOURCE, ["--compile-from=vm"]))
    assert pair.check("as_opaque", 1) == 0
    assert pair.check("as_buffer", 1) == 1
