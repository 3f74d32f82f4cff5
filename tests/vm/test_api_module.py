"""tinyhal.load / Module: conversions, argument checks naming the argument, async interleaving."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import trio
from programs.corpus import compile_program

import tinyhal
from tinyhal import hal
from tinyhal.vm.api import parse_declaration


@pytest.fixture(scope="module", params=["sync", "task"])
def device(request):
    dev = hal.create_device(request.param)
    yield dev
    dev.close()


def test_load_from_path_and_bytes_agree(device):
    vmfb = compile_program("constants_weights")
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    with tinyhal.load(vmfb, device=device) as a, tinyhal.load(vmfb.read_bytes(), device=device) as b:
        assert a.main(x).tobytes() == b.main(x).tobytes()
        assert a.invoke("main", x).tobytes() == a.main(x).tobytes()


def test_top_level_load_owns_its_device():
    vmfb = compile_program("add_f32")
    module = tinyhal.load(str(vmfb), device="local-sync")
    assert module.device.driver_name == "sync"
    np.testing.assert_array_equal(module.main([1, 2, 3, 4], np.ones(4, np.float32)),
                                  [2, 3, 4, 5])
    module.close()
    assert module.device.closed


def test_scalars_and_multiple_results(device):
    with tinyhal.load(compile_program("scalar_i32"), device=device) as m:
        assert m.main(17, 5) == (22, 85, 3, 2, 0)
        flag = m.main(np.int32(-7), 3)[4]
        assert flag == 1 and type(flag) is int  # an i1 result is an int, as iree.runtime gives
    with tinyhal.load(compile_program("dynamic_reduce"), device=device) as m:
        sums, rows = m.main(np.ones((3, 5), np.float32))
        assert rows == 3 and sums.tolist() == [3.0] * 5


@pytest.mark.parametrize("call,needle", [
    (lambda m: m.main(np.ones(4, np.float32)), "takes 2 arguments"),
    (lambda m: m.main(np.ones(4, np.float32), np.ones(4, np.float32), 1), "3 given"),
    (lambda m: m.main(np.ones(5, np.float32), np.ones(4, np.float32)), "argument input0"),
    (lambda m: m.main(np.ones(4, np.float32), np.ones((4, 1), np.float32)), "argument input1"),
    (lambda m: m.main(np.ones(4, np.float64), np.ones(4, np.float32)), "dtype float64"),
    (lambda m: m.main(np.ones(4, np.int32), np.ones(4, np.float32)), "argument input0"),
    (lambda m: m.main("abc", np.ones(4, np.float32)), "argument input0"),
    (lambda m: m.invoke("nope"), "no function 'nope'"),
])
def test_bad_arguments_raise_named_errors(device, call, needle):
    with tinyhal.load(compile_program("add_f32"), device=device) as m:
        with pytest.raises(tinyhal.Error) as info:
            call(m)
    assert needle in str(info.value)
    assert info.value.code in (tinyhal.StatusCode.INVALID_ARGUMENT, tinyhal.StatusCode.NOT_FOUND)


def test_bad_scalar_arguments(device):
    with tinyhal.load(compile_program("scalar_i32"), device=device) as m:
        for bad, needle in [((1.5, 2), "input0"), ((1, 2**40), "input1"),
                            ((np.ones(2, np.int32), 1), "input0")]:
            with pytest.raises(tinyhal.Error) as info:
                m.main(*bad)
            assert needle in str(info.value)


def test_unknown_attribute_lists_functions(device):
    with tinyhal.load(compile_program("globals_counter"), device=device) as m:
        with pytest.raises(AttributeError, match="accumulate"):
            m.nothing  # noqa: B018
        assert sorted(m.function_names) == ["accumulate", "get_count"]


def test_dynamic_shapes_checked_only_where_static(device):
    with tinyhal.load(compile_program("matmul_dynamic"), device=device) as m:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(m.main(a, np.eye(3, dtype=np.float32)), a)
        with pytest.raises(tinyhal.Error, match="input0"):
            m.main(np.ones(3, np.float32), np.ones((3, 3), np.float32))


def _input_heap(module) -> str:
    """The name of the heap a module's input buffers come from."""
    return module.device.allocator.select_heap(module.input_memory_type).name


def test_dynamic_dim_arrays_of_any_row_count_reuse_a_view_of_their_own_shape(device):
    """Arrays for a `tensor<?x?xf32>` argument take the planned copy path; each row count
    gives the right result, a call of the shape of the one before reuses its input
    buffers (no allocation), a call of another shape frees them, `trim()` frees what is
    kept, and a wrong dtype or rank is still refused naming the argument, also right
    after a call of the same row count."""
    with tinyhal.load(compile_program("matmul_dynamic"), device=device) as m:
        eye = np.eye(3, dtype=np.float32)
        m.main(np.ones((1, 3), np.float32), eye)
        m.trim()
        live = m.statistics().live_bytes
        for rows in (1, 4, 4, 2, 7, 7):
            a = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
            np.testing.assert_array_equal(m.main(a, eye), a)
        inputs_heap = m.statistics().heaps[_input_heap(m)]
        allocations = inputs_heap.allocation_count
        for _ in range(3):
            a = np.arange(21, dtype=np.float32).reshape(7, 3)
            np.testing.assert_array_equal(m.main(a, eye), a)
        assert m.statistics().heaps[_input_heap(m)].allocation_count == allocations
        m.trim()
        assert m.statistics().live_bytes == live
        with pytest.raises(tinyhal.Error, match="input0"):
            m.main(np.ones((7, 3, 1), np.float32), eye)
        with pytest.raises(tinyhal.Error, match="input0"):
            m.main(np.ones((7, 3), np.float64), eye)
        with pytest.raises(tinyhal.Error, match="input0"):
            m.main(np.ones(21, np.float32), eye)


def test_invocations_interleave_on_one_event_loop():
    """A yielding hal.fence.await suspends only its own invocation."""
    vmfb = compile_program("large_matmul")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 384)).astype(np.float32)
    b = rng.standard_normal((384, 200)).astype(np.float32)
    with tinyhal.load(vmfb, device="task") as m:
        expected = m.main(a, b)
        events = []

        async def one(i):
            events.append(("start", i))
            out = await m.invoke_async("main", a, b)
            events.append(("end", i))
            assert out.tobytes() == expected.tobytes()

        async def main():
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)

        trio.run(main)
    first_end = next(k for k, e in enumerate(events) if e[0] == "end")
    assert first_end == 6, events  # every invocation started before the first finished


def test_invoke_async_on_sync_device_and_state():
    vmfb = compile_program("globals_counter")
    with tinyhal.load(vmfb, device="sync") as m:
        async def main():
            for _ in range(3):
                await m.invoke_async("accumulate", np.ones(4, np.float32))
            return await m.invoke_async("get_count")

        assert trio.run(main) == 3


def test_parse_declaration_shapes():
    name, ins, outs, is_async = parse_declaration(
        "async func @f(%input0: tensor<?x3xf16>, %input1: i64) -> "
        "(%output0: tensor<i1>, %output1: f32)")
    assert (name, is_async) == ("f", True)
    assert ins[0].shape == (None, 3) and ins[0].dtype == np.float16
    assert ins[1].kind == "scalar" and outs[0].shape == () and outs[1].type == "f32"


KEEPS_INPUTS = """
util.global private mutable @kept = dense<0.0> : tensor<4xf32>
func.func @swap(%a: tensor<4xf32>) -> tensor<4xf32> {
  %old = util.global.load @kept : tensor<4xf32>
  util.global.store %a, @kept : tensor<4xf32>
  return %old : tensor<4xf32>
}
func.func @same(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
"""


def test_input_buffers_reused_only_when_nothing_else_holds_them(device):
    """Module keeps each call's input buffers for the next call of the export, but
    never one that a global, a returned view or a mapping still refers to; idle ones
    stay live memory, and the device's live bytes are unchanged by reuse."""
    from support.iree_tools import HOST_FLAGS, compile_mlir

    gc.collect()  # an earlier test's unreachable buffers must not be freed mid-test
    before = device.allocator.statistics().live_bytes
    with tinyhal.load(compile_mlir(KEEPS_INPUTS, HOST_FLAGS), device=device) as m:
        xs = [np.full(4, k, np.float32) for k in range(1, 6)]
        assert [float(m.swap(x)[0]) for x in xs] == [0.0, 1.0, 2.0, 3.0, 4.0]
        kept = m.invoke_raw("same", xs[0])[0]  # may be the input's own view
        for x in xs[1:]:
            assert np.array_equal(m.same(x), x)
        assert np.array_equal(kept.to_numpy(), xs[0])
        live = m.statistics().live_bytes
        for x in xs:
            assert np.array_equal(m.same(x), x)
        assert m.statistics().live_bytes == live
        if kept.buffer.mappable:
            with kept.buffer.map() as mapped:
                del kept
                for x in xs[1:]:
                    m.same(x)
                assert np.array_equal(np.frombuffer(mapped, np.float32)[:4], xs[0])
    assert device.allocator.statistics().live_bytes == before  # idle inputs released


SCALES = """
func.func @scale(%a: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %a, %a : tensor<?xf32>
  return %r : tensor<?xf32>
}
"""


def test_large_input_buffers_are_freed_after_their_call(device):
    """Only small input buffers are kept for the next call: a large one would hold a
    large request's memory after it ended (and copying it in costs far more than a new
    buffer)."""
    from support.iree_tools import HOST_FLAGS, compile_mlir

    gc.collect()
    with tinyhal.load(compile_mlir(SCALES, HOST_FLAGS), device=device) as m:
        small = np.ones(16, np.float32)
        assert np.array_equal(m.scale(small), small * 2)
        live = m.statistics().live_bytes
        large = np.ones(1 << 20, np.float32)  # 4 MiB
        assert np.array_equal(m.scale(large), large * 2)
        assert m.statistics().live_bytes <= live


def test_device_only_input_buffers_reused_and_written_as_transfers():
    """On memory the host cannot map (emu's device heap) inputs are reused as on host
    memory, by the same rules, and each call still writes its input by a device write
    that emu models as one update of its bytes, reused buffer or new."""
    from support.iree_tools import HOST_FLAGS, compile_mlir

    with hal.create_device("emu") as emu:
        with tinyhal.load(compile_mlir(KEEPS_INPUTS, HOST_FLAGS), device=emu) as m:
            assert not m.input_memory_type & hal.MemoryType.HOST_VISIBLE
            xs = [np.full(4, k, np.float32) for k in range(1, 6)]
            assert [float(m.swap(x)[0]) for x in xs] == [0.0, 1.0, 2.0, 3.0, 4.0]
            kept = m.invoke_raw("same", xs[0])[0]  # may be the input's own view
            device_heap = emu.allocator.statistics()["device"]
            transfers, moved = emu.summary().transfers, emu.summary().bytes_moved
            for x in xs[1:]:
                assert np.array_equal(m.same(x), x)
            # one buffer made for the first of these calls, reused by the others
            assert emu.allocator.statistics()["device"].allocation_count \
                == device_heap.allocation_count + 1
            assert emu.summary().transfers == transfers + 4
            assert emu.summary().bytes_moved == moved + 4 * 16
            assert np.array_equal(kept.to_numpy(), xs[0])  # never written over
            m.trim()


_DOUBLE_MLIR = """
func.func @double(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = arith.addf %x, %x : tensor<4xf32>
  return %y : tensor<4xf32>
}
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("abi", ["sync", "coarse-fences"])
def test_invoke_raw_takes_device_values_and_a_wait_fence(device, abi):
    """A device value whose contents a queue operation writes later goes in as it is,
    with that operation's fence as `wait`: the device (coarse-fences) or the host (sync)
    waits for it; the result stays a device value."""
    import threading

    from support.iree_tools import HOST_FLAGS, compile_mlir

    flags = HOST_FLAGS + (["--iree-execution-model=async-external"]
                          if abi == "coarse-fences" else [])
    module = tinyhal.load(compile_mlir(_DOUBLE_MLIR, flags), device=device)
    assert module.functions["double"].is_async == (abi == "coarse-fences")
    x = np.array([1.5, -2, 3, 0.25], np.float32)
    view = hal.BufferView.from_numpy(device, np.zeros(4, np.float32))
    go, written = device.create_semaphore(0), device.create_semaphore(0)
    device.queue_update(x, view.buffer, wait=[(go, 1)], signal=[(written, 1)])
    timer = threading.Timer(0.05, go.signal, args=(1,))
    timer.start()
    try:
        (result,) = module.invoke_raw("double", view, wait=hal.Fence([(written, 1)]))
    finally:
        timer.join()
    assert isinstance(result, hal.BufferView)
    np.testing.assert_array_equal(result.to_numpy(), 2 * x)
    module.close()
