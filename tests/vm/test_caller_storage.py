"""Caller-provided storage and lists: `&` inputs of tinyhal-run, `Buffer` and
`BufferView` arguments through `Module.invoke`, Python lists for `!util.list`
arguments and lists as results, each compared with iree.runtime / iree-run-module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from support.run_compare import assert_same_output
from tinyhal.errors import FailedPreconditionError, InvalidArgumentError
from tinyhal.hal.buffer_view import BufferView

DRIVERS = ["sync", "task", "emu"]

STORAGE = """
func.func @transients(%x: tensor<64xf32>, %storage: !hal.buffer {iree.abi.transients})
    -> tensor<64xf32> {
  %e = tensor.empty() : tensor<64xf32>
  %a = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%x : tensor<64xf32>) outs(%e : tensor<64xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = arith.mulf %v, %v : f32
    linalg.yield %s : f32
  } -> tensor<64xf32>
  %b = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%a : tensor<64xf32>) outs(%e : tensor<64xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = arith.addf %v, %x0 : f32
    linalg.yield %s : f32
  } -> tensor<64xf32>
  return %b : tensor<64xf32>
}
func.func @output(%x: tensor<4xf32>, %out: !hal.buffer)
    -> (tensor<4xf32> {iree.abi.output = 1 : index}) {
  %r = arith.addf %x, %x : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""

LISTS = """
func.func @sum_list(%l: !util.list<?>) -> (tensor<4xf32>, i32, f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %v0 = util.list.get %l[%c0] : !util.list<?> -> !hal.buffer_view
  %v1 = util.list.get %l[%c1] : !util.list<?> -> !hal.buffer_view
  %t0 = hal.tensor.import %v0 : !hal.buffer_view -> tensor<4xf32>
  %t1 = hal.tensor.import %v1 : !hal.buffer_view -> tensor<4xf32>
  %k = util.list.get %l[%c2] : !util.list<?> -> i32
  %f = util.list.get %l[%c3] : !util.list<?> -> f32
  %s = arith.addf %t0, %t1 : tensor<4xf32>
  return %s, %k, %f : tensor<4xf32>, i32, f32
}
func.func @make_list(%a: tensor<4xf32>, %x: i32) -> !util.list<?> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %l = util.list.create %c2 : !util.list<?>
  util.list.resize %l, %c2 : !util.list<?>
  %d = arith.addf %a, %a : tensor<4xf32>
  %v = hal.tensor.export %d : tensor<4xf32> -> !hal.buffer_view
  util.list.set %l[%c0], %v : !hal.buffer_view -> !util.list<?>
  util.list.set %l[%c1], %x : i32 -> !util.list<?>
  return %l : !util.list<?>
}
"""


@pytest.fixture(scope="module")
def storage_vmfb() -> Path:
    return compile_mlir(STORAGE.replace("%x0", "%v"), HOST_FLAGS)


@pytest.fixture(scope="module")
def lists_vmfb() -> Path:
    return compile_mlir(LISTS, HOST_FLAGS)


def _iree_context(vmfb: Path):
    import iree.runtime as rt

    config = rt.Config("local-sync")
    main = rt.VmModule.mmap(config.vm_instance, str(vmfb))
    return rt, config, main, rt.SystemContext(vm_modules=[main], config=config)


def _iree_with_buffer(vmfb: Path, function: str, x: np.ndarray, size: int) -> np.ndarray:
    """iree.runtime with a caller-allocated hal.buffer (its high-level call refuses
    buffers, so through a VM variant list, as the C API does)."""
    rt, config, main, context = _iree_context(vmfb)
    device = config.device
    view = device.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
        device=device, buffer=x, element_type=rt.HalElementType.FLOAT_32)
    buffer = device.allocator.allocate_buffer(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
        allocation_size=size)
    args = rt.VmVariantList(2)
    args.push_ref(view)
    args.push_ref(buffer)
    results = rt.VmVariantList(1)
    context.vm_context.invoke(main.lookup_function(function), args, results)
    out = results.get_as_object(0, rt.HalBufferView)
    return rt.DeviceArray(device, out, implicit_host_transfer=True).to_host()


@pytest.mark.parametrize("driver", DRIVERS)
def test_buffer_and_buffer_view_arguments(storage_vmfb, driver):
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    expected = _iree_with_buffer(storage_vmfb, "transients", x, 4096)
    with tinyhal.load(storage_vmfb, device=driver) as module:
        transients = module.device.allocator.allocate(4096)
        got = module.transients(x, transients)
        assert got.tobytes() == expected.tobytes()
        view = BufferView.from_numpy(module.device, x)  # a BufferView for a tensor
        assert module.invoke("transients", view, transients).tobytes() == expected.tobytes()

        out = module.device.allocator.allocate(16)
        y = np.array([1.5, -2, 0.25, 3e8], np.float32)
        want = _iree_with_buffer(storage_vmfb, "output", y, 16)
        assert module.output(y, out).tobytes() == want.tobytes()
        with pytest.raises(InvalidArgumentError, match="not a bare hal.buffer"):
            module.output(out, out)


def test_storage_inputs_in_tinyhal_run(storage_vmfb):
    for function, inputs in (("transients", ["--input=64xf32=1.5", "--input=&4096xi8=0"]),
                             ("output", ["--input=4xf32=3 -1 0.5 7", "--input=&4xf32=0"])):
        assert_same_output([f"--module={storage_vmfb}", f"--function={function}", *inputs],
                           DRIVERS)


def _iree_sum_list(vmfb: Path, items: list) -> list:
    _, _, main, context = _iree_context(vmfb)
    results = context.modules[main.name]["sum_list"](items)
    return [r.to_host() if hasattr(r, "to_host") else r for r in results]


LIST_CASES = [
    ("arrays-int-float", lambda a: [a, a * 3, 7, 2.5]),
    ("wrapping-i64", lambda a: [a, a, 2**40 + 5, 1.5]),
    ("int-read-as-float", lambda a: [a, a, 7, 1]),
    ("tuple", lambda a: (a, -a, -1, 0.1)),
]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("case,make", LIST_CASES, ids=[c[0] for c in LIST_CASES])
def test_list_arguments_as_iree_runtime(lists_vmfb, driver, case, make):
    a = np.arange(4, dtype=np.float32) / 3
    expected = _iree_sum_list(lists_vmfb, make(a))
    with tinyhal.load(lists_vmfb, device=driver) as module:
        got = module.sum_list(make(a))
    assert got[0].tobytes() == expected[0].tobytes()
    assert got[1:] == tuple(expected[1:])


def test_list_errors_name_the_element(lists_vmfb):
    a = np.zeros(4, np.float32)
    with tinyhal.load(lists_vmfb, device="sync") as module:
        for bad in (True, "x", None, object()):
            with pytest.raises(InvalidArgumentError,
                               match=r"sum_list argument input0\[2\].*cannot infer a VM type"):
                module.sum_list([a, a, bad, 1.0])
        # an array where the program reads a number: the VM's own error, as in IREE
        with pytest.raises(FailedPreconditionError, match="not a value type"):
            module.sum_list([a, a, np.int32(3), 1.0])


@pytest.mark.parametrize("driver", DRIVERS)
def test_list_results(lists_vmfb, driver):
    a = np.array([1, -2, 3.5, 0], np.float32)
    rt, _, main, context = _iree_context(lists_vmfb)
    theirs = context.modules[main.name]["make_list"](a, 5).deref(rt.VmVariantList)
    their_view = theirs.get_as_object(0, rt.HalBufferView)
    their_array = rt.DeviceArray(context.config.device, their_view,
                                 implicit_host_transfer=True).to_host()
    with tinyhal.load(lists_vmfb, device=driver) as module:
        got = module.make_list(a, 5)
    assert isinstance(got, list) and len(got) == len(theirs) == 2
    assert got[0].tobytes() == their_array.tobytes()
    assert got[1] == theirs.get_variant(1) == 5
