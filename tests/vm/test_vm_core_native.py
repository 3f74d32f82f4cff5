"""Native imports and suspension: `Suspend` flows through nested VM calls to the driver."""

from __future__ import annotations

import threading

import pytest
import trio

from support.vm_pairs import vm_compile_source
from tinyhal.errors import (
    DeadlineExceededError,
    Error,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from tinyhal.vm import Context, NativeModule, Suspend, VMBuffer, load_module

YIELD_VM = """
vm.module @ym {
  vm.import private @native.wait(%x : i32) -> i32 attributes {vm.yield}
  vm.import private @native.add(%a : i32, %b : i64) -> i64
  vm.import private @native.fill(%b : !vm.buffer, %v : i32) -> !vm.buffer
  vm.import private @native.sum(%xs : i32 ...) -> i32
  vm.import private optional @native.missing(%a : i32) -> i32
  vm.func private @inner(%n : i32) -> i32 {
    %c1 = vm.const.i32 1
    vm.call.yieldable @native.wait(%n) : (i32) -> ^bb1(i32)
  ^bb1(%r : i32):
    vm.yield ^bb2
  ^bb2:
    %s = vm.add.i32 %r, %c1 : i32
    vm.return %s : i32
  }
  vm.func @outer(%n : i32) -> (i32, i64, i32) {
    %a = vm.call @inner(%n) : (i32) -> i32
    %b = vm.call @inner(%a) : (i32) -> i32
    %w = vm.ext.i32.i64.s %b : i32 -> i64
    %c = vm.call @native.add(%b, %w) : (i32, i64) -> i64
    %res = vm.import.resolved @native.missing : i32
    vm.return %b, %c, %res : i32, i64, i32
  }
  vm.export @outer
  vm.func @buf(%v : i32) -> !vm.buffer {
    %c8 = vm.const.i64 8
    %c0 = vm.const.i32 0
    %b = vm.buffer.alloc %c8, %c0 : !vm.buffer
    %r = vm.call @native.fill(%b, %v) : (!vm.buffer, i32) -> !vm.buffer
    vm.return %r : !vm.buffer
  }
  vm.export @buf
  vm.func @variadic(%a : i32, %b : i32) -> i32 {
    %s = vm.call.variadic @native.sum([%a, %b, %a]) : (i32 ...) -> i32
    vm.return %s : i32
  }
  vm.export @variadic
  vm.func @call_missing(%a : i32) -> i32 {
    %s = vm.call @native.missing(%a) : (i32) -> i32
    vm.return %s : i32
  }
  vm.export @call_missing
}
"""


def make_native(log: list) -> NativeModule:
    m = NativeModule("native")

    @m.export("wait", "0i_i", yieldable=True)
    def wait(x):
        log.append(("wait", x))
        done = threading.Event()
        threading.Timer(0.001, done.set).start()

        def block():
            done.wait()
            return x * 2

        async def wait_async():
            await trio.sleep(0.001)
            return x * 2

        return Suspend(block, wait_async)

    @m.export("add", "0iI_I")
    def add(a, b):
        return a + b + (1 << 40)

    @m.export("fill", "0ri_r")
    def fill(buf, v):
        assert isinstance(buf, VMBuffer)
        buf.data[:] = bytes([v & 0xFF]) * len(buf.data)
        return buf

    @m.export("sum", "0CiD_i")
    def sum_(xs):
        assert all(isinstance(t, tuple) and len(t) == 1 for t in xs)
        return sum(t[0] for t in xs) + 2**32  # wrapped to i32 by the interpreter

    return m


@pytest.fixture(scope="module")
def ym_path():
    return vm_compile_source(YIELD_VM, ["--compile-from=vm"])


def expected(n):
    a = n * 2 + 1
    b = a * 2 + 1
    return [b, b + b + (1 << 40), 0]


def test_suspend_blocking(ym_path):
    log = []
    ctx = Context([make_native(log), load_module(ym_path)])
    assert ctx.invoke("outer", [3]) == expected(3)
    assert log == [("wait", 3), ("wait", 7)]
    assert ctx.lookup_function("outer").is_generator


def test_suspend_driven_by_hand(ym_path):
    """begin / resume / end, the protocol `invoke` and `invoke_async` drive."""
    ctx = Context([make_native([]), load_module(ym_path)])
    invocation = ctx.begin("ym.outer", [5])
    kinds = []
    while not invocation.done:
        request = invocation.request
        kinds.append(type(request).__name__)
        invocation.resume(None if request is None else request.block())
    assert list(invocation.end()) == expected(5)
    assert kinds == ["Suspend", "NoneType", "Suspend", "NoneType"]


def test_an_invocation_that_waits_has_not_ended(ym_path):
    ctx = Context([make_native([]), load_module(ym_path)])
    invocation = ctx.begin("ym.outer", [5])
    assert not invocation.done and invocation.request is not None
    with pytest.raises(FailedPreconditionError, match="has not ended"):
        invocation.end()


def test_a_failed_wait_raises_where_the_invocation_waits(ym_path):
    """The wait's error is raised in the suspended frame: it comes out of `resume`
    with the VM stack of the call that waited."""
    ctx = Context([make_native([]), load_module(ym_path)])
    invocation = ctx.begin("ym.outer", [5])
    with pytest.raises(DeadlineExceededError, match=r"gave up; at ym\.\S+\+") as info:
        invocation.resume(error=DeadlineExceededError("gave up"))
    assert info.value.vm_stack


def test_suspend_trio_interleaves(ym_path):
    log = []
    ctx = Context([make_native(log), load_module(ym_path)])
    results = {}

    async def one(n):
        results[n] = await ctx.invoke_async("outer", [n])

    async def main():
        async with trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(one, n)

    trio.run(main)
    assert results == {n: expected(n) for n in range(5)}
    firsts = [x for _, x in log[:5]]
    assert sorted(firsts) == list(range(5))  # all five started before any finished


def test_ref_and_variadic_imports(ym_path):
    ctx = Context([make_native([]), load_module(ym_path)])
    (buf,) = ctx.invoke("buf", [0x1AB])
    assert isinstance(buf, VMBuffer) and buf.tobytes() == b"\xab" * 8
    assert ctx.invoke("variadic", [4, 5]) == [13]


def test_optional_import_missing(ym_path):
    ctx = Context([make_native([]), load_module(ym_path)])
    with pytest.raises(NotFoundError, match="native.missing"):
        ctx.invoke("call_missing", [1])


def test_missing_required_import_named(ym_path):
    empty = NativeModule("native")
    with pytest.raises(NotFoundError, match="native.wait"):
        Context([empty, load_module(ym_path)])


def test_import_signature_mismatch(ym_path):
    m = make_native([])
    bad = NativeModule("native", functions=dict(m.functions))
    bad.export("add", "0ii_i")(lambda a, b: a)
    with pytest.raises(Error, match="native.add"):
        Context([bad, load_module(ym_path)])


def test_native_error_propagates_with_location(ym_path):
    m = make_native([])

    @m.export("add", "0iI_I")
    def add(a, b):
        raise InvalidArgumentError("boom from native")

    ctx = Context([m, load_module(ym_path)])
    with pytest.raises(InvalidArgumentError, match="boom from native.*ym.outer"):
        ctx.invoke("outer", [1])


def test_wait_failure_reaches_caller(ym_path):
    m = make_native([])

    @m.export("wait", "0i_i", yieldable=True)
    def wait(x):
        def block():
            raise InvalidArgumentError("wait failed")

        async def wait_async():
            raise InvalidArgumentError("wait failed")

        return Suspend(block, wait_async)

    ctx = Context([m, load_module(ym_path)])
    with pytest.raises(InvalidArgumentError, match="wait failed"):
        ctx.invoke("outer", [1])
    with pytest.raises(InvalidArgumentError, match="wait failed"):
        trio.run(ctx.invoke_async, "outer", [1])


def test_argument_validation(ym_path):
    ctx = Context([make_native([]), load_module(ym_path)])
    with pytest.raises(InvalidArgumentError):
        ctx.invoke("outer", [])
    with pytest.raises(InvalidArgumentError):
        ctx.invoke("outer", [1 << 40])
    with pytest.raises(NotFoundError):
        ctx.invoke("nope", [])


def test_trap_names_function_and_source_location(ym_path):
    ctx = Context([make_native([]), load_module(ym_path)])
    with pytest.raises(NotFoundError, match=r"at ym\.call_missing\+[0-9A-F]{8} \S+\.mlir:\d+:\d+"):
        ctx.invoke("call_missing", [1])


LIB_VM = """
vm.module @lib {
  vm.import private @native.wait(%x : i32) -> i32 attributes {vm.yield}
  vm.func @twice(%x : i32, %y : i64) -> (i32, i64) {
    vm.call.yieldable @native.wait(%x) : (i32) -> ^bb1(i32)
  ^bb1(%r : i32):
    %z = vm.add.i64 %y, %y : i64
    vm.return %r, %z : i32, i64
  }
  vm.export @twice
}
"""

APP_VM = """
vm.module @app {
  vm.import private @lib.twice(%x : i32, %y : i64) -> (i32, i64) attributes {vm.yield}
  vm.func @main(%x : i32) -> (i32, i64) {
    %y = vm.ext.i32.i64.s %x : i32 -> i64
    vm.call.yieldable @lib.twice(%x, %y) : (i32, i64) -> ^bb1(i32, i64)
  ^bb1(%a : i32, %b : i64):
    vm.return %a, %b : i32, i64
  }
  vm.export @main
  vm.func @main_sync(%x : i32) -> (i32, i64) {
    %y = vm.const.i64 -3
    %a, %b = vm.call @lib.twice(%x, %y) : (i32, i64) -> (i32, i64)
    vm.return %a, %b : i32, i64
  }
  vm.export @main_sync
}
"""


def test_bytecode_module_imports_bytecode_module():
    lib = load_module(vm_compile_source(LIB_VM, ["--compile-from=vm"]))
    app = load_module(vm_compile_source(APP_VM, ["--compile-from=vm"]))
    ctx = Context([make_native([]), lib, app])
    assert ctx.invoke("app.main", [21]) == [42, 42]
    assert ctx.invoke("main_sync", [5]) == [10, -6]
    assert trio.run(ctx.invoke_async, "app.main", [-4]) == [-8, -8]
