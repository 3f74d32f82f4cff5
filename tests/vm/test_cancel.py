"""Cancelling `Module.invoke_async` has a defined meaning on every driver (see the
"Cancellation" section of `tinyhal.vm.api`): the invocation is abandoned, device work it
submitted runs to completion and its memory returns when that work retires.

Each scenario runs in a child process (see `support.child`) so that a kernel writing
freed memory fails the test instead of killing the runner. The program is a chain of
256x256 matmuls (several dispatches, transients from `queue_alloca`), so a call takes
milliseconds and cancels land before, during and after its device work.
"""

from __future__ import annotations

import pytest

from support.child import run_child
from support.iree_tools import HOST_FLAGS, compile_mlir

DRIVERS = ["sync", "task", "emu"]


def matmul_chain_mlir(n: int = 256, count: int = 4) -> str:
    """`main(a, b)` = ((a @ b) @ b) ... @ b, `count` matmuls of n x n f32."""
    t = f"tensor<{n}x{n}xf32>"
    lines = [f"func.func @main(%a: {t}, %b: {t}) -> {t} {{",
             "  %zero = arith.constant 0.0 : f32"]
    prev = "%a"
    for i in range(count):
        lines += [
            f"  %e{i} = tensor.empty() : {t}",
            f"  %f{i} = linalg.fill ins(%zero : f32) outs(%e{i} : {t}) -> {t}",
            f"  %m{i} = linalg.matmul ins({prev}, %b : {t}, {t}) outs(%f{i} : {t}) -> {t}",
        ]
        prev = f"%m{i}"
    lines += [f"  return {prev} : {t}", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def chain_vmfb() -> str:
    return str(compile_mlir(matmul_chain_mlir(), HOST_FLAGS))


@pytest.fixture(scope="module")
def chain_vmfb_coarse_fences() -> str:
    """The same program with the coarse-fences ABI: `main` takes a wait and a signal
    fence and returns before its device work is done; the caller awaits the signal."""
    return str(compile_mlir(matmul_chain_mlir(),
                            HOST_FLAGS + ["--iree-execution-model=async-external"]))


PRELUDE = """
import gc, math, random, sys, time
import numpy as np
import trio
import tinyhal

path, driver = sys.argv[1], sys.argv[2]
m = tinyhal.load(path, device=driver)
dev = m.device
rng = np.random.default_rng(7)
a = (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)
b = (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)
start = time.perf_counter()
ref = m.main(a, b)
call_seconds = time.perf_counter() - start
expected = a
for _ in range(4):
    expected = expected @ b
assert np.allclose(ref, expected, rtol=1e-3, atol=1e-5)

def live():
    m.trim()  # input buffers kept for the next call are live memory, not a leak
    gc.collect()
    return dev.allocator.statistics().live_bytes

baseline = live()
"""


@pytest.mark.parametrize("abi", ["sync", "coarse-fences"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_cancel_at_random_points(request, driver, abi):
    vmfb = request.getfixturevalue("chain_vmfb" if abi == "sync" else "chain_vmfb_coarse_fences")
    iterations = 500 if abi == "sync" else 200
    out = run_child(PRELUDE + """
iterations = int(sys.argv[3])
choice = random.Random(1234)
outcomes = {"completed": 0, "cancelled": 0, "deadline": 0, "before": 0}

async def one(kind, delay):
    if kind == "before":
        with trio.CancelScope() as scope:
            scope.cancel()
            await m.invoke_async("main", a, b)
            raise AssertionError("a cancelled scope ran the invocation to the end")
        return "before"
    if kind == "deadline":
        try:
            with trio.fail_after(delay):
                got = await m.invoke_async("main", a, b)
        except trio.TooSlowError:
            return "deadline"
    else:
        with trio.move_on_after(delay) as scope:
            got = await m.invoke_async("main", a, b)
        if scope.cancelled_caught:
            return "cancelled"
    assert np.array_equal(got, ref), "a completed invocation gave different bits"
    return "completed"

async def main():
    async with trio.open_nursery() as nursery:
        # something else on the loop, as a server would have
        nursery.start_soon(trio.sleep, 0)
        for _ in range(iterations):
            kind = choice.choice(["move_on", "move_on", "deadline", "before"])
            delay = choice.uniform(0, 1.5 * call_seconds)
            outcome = await one(kind, delay)
            outcomes[outcome] += 1
            if outcome != "completed" and choice.random() < 0.5:
                # Free what the abandoned frames held now, not at some later collection,
                # so memory still in use by device work would be reused at once.
                gc.collect()
                junk = np.full(1 << 20, 0xAB, np.uint8)
                del junk

trio.run(main)
assert dev.wait_idle(60), "abandoned device work did not retire"
after = live()
assert after == baseline, (after, baseline)
# the module, its state and the device stay usable, sync and async
assert np.array_equal(m.main(a, b), ref)
assert np.array_equal(trio.run(m.invoke_async, "main", a, b), ref)
assert outcomes["before"] > 0 and outcomes["completed"] > 0
if driver == "task" or m.functions["main"].is_async:
    # sync, and emu in its fast mode, run ready device work inline: unless the ABI
    # returns before awaiting the signal fence, cancels land only before it
    assert outcomes["cancelled"] + outcomes["deadline"] > 0
m.close()
print(outcomes)
print("ok")
""", vmfb, driver, str(iterations), timeout=180)
    assert out.strip().endswith("ok")


@pytest.mark.parametrize("driver", DRIVERS)
def test_close_and_exit_with_abandoned_invocations(chain_vmfb, driver):
    out = run_child(PRELUDE + """
async def abandon(count):
    for i in range(count):
        with trio.move_on_after(call_seconds * (i % 3) / 4):
            await m.invoke_async("main", a, b)

trio.run(abandon, 6)
m.close()                      # owns the device: closes it with work possibly in flight
assert dev.in_flight == 0
after = live()
assert after == 0, after
m2 = tinyhal.load(path, device=driver)
trio.run(abandon.__call__, 0)
async def leave_running():
    with trio.move_on_after(call_seconds / 4):
        await m2.invoke_async("main", a, b)
trio.run(leave_running)
print("exiting", flush=True)   # exit with the abandoned call's work still running
""", chain_vmfb, driver, timeout=120)
    assert "exiting" in out


INIT_MLIR = """
util.global private @w : tensor<256x256xf32>
util.initializer {
  %a = arith.constant dense<0.01> : tensor<256x256xf32>
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x256xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<256x256xf32>) -> tensor<256x256xf32>
  %m = linalg.matmul ins(%a, %a : tensor<256x256xf32>, tensor<256x256xf32>)
      outs(%f : tensor<256x256xf32>) -> tensor<256x256xf32>
  util.global.store %m, @w : tensor<256x256xf32>
  util.return
}
func.func @main(%x: tensor<256x256xf32>) -> tensor<256x256xf32> {
  %w = util.global.load @w : tensor<256x256xf32>
  %r = arith.addf %x, %w : tensor<256x256xf32>
  return %r : tensor<256x256xf32>
}
"""


@pytest.mark.parametrize("driver", DRIVERS)
def test_cancel_during_deferred_initialization_leaves_the_context_usable(driver):
    # The initializer computes a global on the device (const-eval off), so a deferred
    # context's first invoke_async suspends inside `__init`; a cancel there must not
    # leave the globals half set.
    vmfb = compile_mlir(INIT_MLIR, HOST_FLAGS + ["--iree-opt-const-eval=false"])
    out = run_child("""
import sys
import numpy as np
import trio
from tinyhal import hal
from tinyhal.hal.buffer_view import BufferView
from tinyhal.vm.context import Context
from tinyhal.vm.hal_module import create_hal_module
from tinyhal.vm.loader import load_module

path, driver = sys.argv[1], sys.argv[2]
for delay in (0.0, 0.0001, 0.0005, 0.002):
    dev = hal.create_device(driver)
    ctx = Context([create_hal_module(dev), load_module(path)], defer_init=True)
    x = BufferView.from_numpy(dev, np.ones((256, 256), np.float32))

    async def first_call():
        with trio.move_on_after(delay):
            await ctx.invoke_async("main", [x])

    trio.run(first_call)
    (result,) = ctx.invoke("main", [x])
    got = dev.read_array(result.buffer).view(np.float32)
    assert np.allclose(got, 1 + 0.01 * 0.01 * 256), got[:4]
    dev.close()

# Concurrent first calls: the later ones wait for the one running `__init`.
dev = hal.create_device(driver)
ctx = Context([create_hal_module(dev), load_module(path)], defer_init=True)
x = BufferView.from_numpy(dev, np.ones((256, 256), np.float32))
results = []

async def call():
    (result,) = await ctx.invoke_async("main", [x])
    results.append(dev.read_array(result.buffer).view(np.float32))

async def several():
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(call)

trio.run(several)
assert len(results) == 4
for got in results:
    assert np.allclose(got, 1 + 0.01 * 0.01 * 256), got[:4]
dev.close()
print("ok")
""", str(vmfb), driver)
    assert out.strip().endswith("ok")
