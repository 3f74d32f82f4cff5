"""f32 values the VM only moves keep their bits, as in IREE's VM, on the Python path too.

The HAL runs dispatches with flush-to-zero and denormals-are-zero on, as IREE does. IREE's
VM moves f32 registers as 32-bit patterns, so a subnormal that is loaded and stored, selected,
copied, negated or taken the absolute value of survives, while one that is computed with
counts as a zero of its sign. The Python VM holds f32 values as Python floats, whose
conversion from binary32 that state flushes; these tests compare its bits with
iree.runtime's on inputs with subnormals, NaN payloads (quiet and signalling) and -0.0.
(tests/vm/test_vmvx_native.py covers the C interpreter on the same kind of inputs.)"""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.iree_tools import compile_mlir
from support.vmvx_programs import FLAVOURS

T = "tensor<4x8xf32>"
TI = "tensor<4x8xi32>"


def _elementwise(name: str, body: str) -> str:
    """A one-input elementwise `linalg.generic` over `%a`, its region being `body`
    (over `%p`, yielding `%r`)."""
    return (
        f"  %{name} = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i, j)>], iterator_types = [\"parallel\", \"parallel\"]} "
        f"ins(%a : {T}) outs(%e : {T}) {{\n  ^bb0(%p: f32, %o: f32):\n{body}"
        f"    linalg.yield %r : f32\n  }} -> {T}\n")


OUTPUTS = {  # name: (type, definition)
    "transpose": ("tensor<8x4xf32>",
                  "  %et = tensor.empty() : tensor<8x4xf32>\n"
                  "  %transpose = linalg.transpose ins(%a : {T}) outs(%et : tensor<8x4xf32>) "
                  "permutation = [1, 0]\n"),
    "select": (T, "  %c = arith.cmpf olt, %a, %b : {T}\n"
                  "  %select = arith.select %c, %a, %b : tensor<4x8xi1>, {T}\n"),
    "select_constants": (T, _elementwise("select_constants",
                                         "    %q = arith.cmpf ogt, %p, %zero : f32\n"
                                         "    %r = arith.select %q, %tiny, %ntiny : f32\n")),
    "fill": (T, "  %fill = linalg.fill ins(%tiny : f32) outs(%e : {T}) -> {T}\n"),
    "negf": (T, "  %negf = arith.negf %a : {T}\n"),
    "absf": (T, "  %absf = math.absf %a : {T}\n"),
    "minimumf": (T, "  %minimumf = arith.minimumf %a, %b : {T}\n"),
    "maxnumf": (T, "  %maxnumf = arith.maxnumf %a, %b : {T}\n"),
    "bitcast_to_f32": (T, "  %bitcast_to_f32 = arith.bitcast %n : {TI} to {T}\n"),
    "bitcast_to_i32": (TI, "  %bitcast_to_i32 = arith.bitcast %a : {T} to {TI}\n"),
    # computed with: subnormal operands count as zeros, subnormal results flush
    "addf": (T, "  %addf = arith.addf %a, %b : {T}\n"),
    "scaled": (T, _elementwise("scaled", "    %r = arith.mulf %p, %big : f32\n")),
    "zero_compare": (T, _elementwise("zero_compare",
                                     "    %q = arith.cmpf oeq, %p, %zero : f32\n"
                                     "    %r = arith.select %q, %one, %p : f32\n")),
}

PROGRAM = (
    f"func.func @moves(%a: {T}, %b: {T}, %n: {TI}) -> ("
    + ", ".join(t for t, _ in OUTPUTS.values()) + ") {\n"
    "  %tiny = arith.constant 1.0e-40 : f32\n"
    "  %ntiny = arith.constant 0x80000ABC : f32\n"
    "  %big = arith.constant 1.0e30 : f32\n"
    "  %zero = arith.constant 0.0 : f32\n"
    "  %one = arith.constant 1.0 : f32\n"
    f"  %e = tensor.empty() : {T}\n"
    + "".join(d.replace("{T}", T).replace("{TI}", TI) for _, d in OUTPUTS.values())
    + "  return " + ", ".join(f"%{k}" for k in OUTPUTS) + " : "
    + ", ".join(t for t, _ in OUTPUTS.values()) + "\n}\n"
)


def _f32(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=np.uint32).view(np.float32).reshape(4, 8)


def _inputs() -> list[np.ndarray]:
    a = _f32(0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00012345, 0x80054321,
             0x3F800000, 0xBF800000, 0x7FC12345, 0xFFC00001, 0x7F812345, 0x80000000,
             0x00000000, 0x00800000, 0x00400000, 0x80400000, 0x00000010, 0x3F800000,
             0x00000020, 0x80000000, 0x00000000, 0x00000003, 0x7FC00000, 0x00111111,
             0x40000000, 0x00200000, 0x80200000, 0x00000001, 0x80000001, 0x7FA00001,
             0x00300000, 0xC0000000)
    b = _f32(0x00000002, 0x00000001, 0x80000001, 0x00000000, 0x80000000, 0x00054321,
             0x00000005, 0x80000005, 0x00000001, 0x7FC00002, 0x3F800000, 0x00000001,
             0x80000001, 0x00000001, 0x00400001, 0x80400001, 0x7FC00003, 0x00000001,
             0x80000000, 0x00000020, 0x00000000, 0x80000003, 0x00100000, 0x00111111,
             0x00700000, 0x80200000, 0x00200000, 0x3F000000, 0xBF000000, 0x00000004,
             0x7F800000, 0x00000007)
    n = _f32(*[0x1, 0x80000001, 0x7FFFFF, 0x7FC12345, 0x7F812345, 0xFF800001,
               0x80000000, 0x12345] * 4).view(np.int32)
    return [a, b, n]


def _iree_bits(vmfb, function: str, args) -> list[bytes]:
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-sync"))
    context.add_vm_module(rt.VmModule.mmap(context.instance, str(vmfb)))
    results = context.modules.module[function](*args)
    results = results if isinstance(results, (list, tuple)) else [results]
    return [np.asarray(r.to_host()).tobytes() for r in results]


@pytest.fixture(scope="module")
def program():
    vmfb = compile_mlir(PROGRAM, FLAVOURS["loops"])
    args = _inputs()
    return vmfb, args, _iree_bits(vmfb, "moves", args)


@pytest.mark.parametrize("path", ["python", "native"])
def test_moved_f32_keep_their_bits_in_dispatches(program, path, monkeypatch):
    monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "0" if path == "python" else "1")
    vmfb, args, expected = program
    with tinyhal.load(vmfb, device="sync") as module:
        results = module.moves(*args)
    got = [np.ascontiguousarray(np.asarray(r)).tobytes() for r in results]
    differing = [name for name, g, e in zip(OUTPUTS, got, expected) if g != e]
    assert not differing, f"{path} path: bits differ from iree.runtime in {differing}"


HOST_PROGRAM = """
func.func @host(%ci: i32, %t: tensor<4xf32>) -> tensor<5xf32> {
  %i0 = arith.constant 0 : index
  %i1 = arith.constant 1 : index
  %a = tensor.extract %t[%i0] : tensor<4xf32>
  %b = tensor.extract %t[%i1] : tensor<4xf32>
  %z = arith.constant 0 : i32
  %c = arith.cmpi ne, %ci, %z : i32
  %s = arith.select %c, %a, %b : f32
  %n = arith.negf %a : f32
  %k = arith.constant 0x80000ABC : f32
  %ks = arith.select %c, %k, %b : f32
  %r = tensor.from_elements %s, %n, %ks, %a, %b : tensor<5xf32>
  return %r : tensor<5xf32>
}
"""


@pytest.mark.parametrize("a,b", [(0x00000001, 0x80000002), (0x7FA00001, 0x00000001),
                                 (0x80000000, 0x807FFFFF), (0x7FC12345, 0x00000003)])
@pytest.mark.parametrize("condition", [0, 1])
def test_moved_f32_keep_their_bits_in_host_functions(a, b, condition, monkeypatch):
    """Outside dispatches (no flushing state), on the Python path."""
    monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "0")
    vmfb = compile_mlir(HOST_PROGRAM, FLAVOURS["loops"])
    t = np.array([a, b, a, 4], dtype=np.uint32).view(np.float32)
    expected = _iree_bits(vmfb, "host", [condition, t])
    with tinyhal.load(vmfb, device="sync") as module:
        assert [np.asarray(module.host(condition, t)).tobytes()] == expected


BUFFER_VM = """
vm.module @f32_buffers {
  vm.rodata private @blob dense<[1.0, 2.0]> : tensor<2xf32>
  vm.func @load(%index : i64, %null : i32) -> f32 {
    %c8 = vm.const.i64 8
    %a0 = vm.const.i32.zero
    %fresh = vm.buffer.alloc %c8, %a0 : !vm.buffer
    %none = vm.const.ref.zero : !vm.buffer
    %b = vm.select.ref %null, %none, %fresh : !vm.buffer
    %v = vm.buffer.load.f32 %b[%index] : !vm.buffer -> f32
    vm.return %v : f32
  }
  vm.export @load
  vm.func @store(%index : i64, %rodata : i32, %v : f32) {
    %c8 = vm.const.i64 8
    %a0 = vm.const.i32.zero
    %fresh = vm.buffer.alloc %c8, %a0 : !vm.buffer
    %ro = vm.const.ref.rodata @blob : !vm.buffer
    %b = vm.select.ref %rodata, %ro, %fresh : !vm.buffer
    vm.buffer.store.f32 %v, %b[%index] : f32 -> !vm.buffer
    vm.return
  }
  vm.export @store
}
"""


@pytest.mark.parametrize("call,message", [
    (("load", 2, 0), "buffer.load.f32: out-of-bounds access"),
    (("load", 0, 1), "source_buffer is null"),
    (("store", 2, 0, 1.0), "buffer.store.f32: out-of-bounds access"),
    (("store", 0, 1, 1.0), "read-only"),
])
def test_f32_buffer_access_errors(call, message):
    """A bad access fails the invocation with the VM's error (IREE fails it too)."""
    from support.vm_pairs import Pair, vm_compile_source

    pair = Pair(vm_compile_source(BUFFER_VM, ["--compile-from=vm"]))
    with pytest.raises(Exception):  # noqa: B017 - IREE raises its own error type
        pair.theirs(*call)
    with pytest.raises(tinyhal.Error, match=message):
        pair.ours(*call)
    pair.check("load", 1, 0)


PRODUCER_VM = """
vm.module @producer {
  vm.func @make(%bits : i32) -> f32 {
    %f = vm.bitcast.i32.f32 %bits : i32 -> f32
    vm.return %f : f32
  }
  vm.export @make
}
"""
CONSUMER_VM = """
vm.module @consumer {
  vm.import private @producer.make(%bits : i32) -> f32
  vm.func @roundtrip(%bits : i32) -> i32 {
    %f = vm.call @producer.make(%bits) : (i32) -> f32
    %i = vm.bitcast.f32.i32 %f : f32 -> i32
    vm.return %i : i32
  }
  vm.export @roundtrip
}
"""


def test_f32_results_of_imports_keep_their_bits():
    """An f32 a module gets back from another module's function is the callee's value,
    bit for bit (not rounded to an integer, nor a signalling NaN quieted)."""
    import iree.runtime as rt

    from support.vm_pairs import vm_compile_source
    from tinyhal.vm import Context, load_module

    paths = [vm_compile_source(s, ["--compile-from=vm"]) for s in (PRODUCER_VM, CONSUMER_VM)]
    oracle = rt.SystemContext(config=rt.Config("local-sync"))
    for path in paths:
        with open(path, "rb") as f:
            oracle.add_vm_module(rt.VmModule.copy_buffer(oracle.instance, f.read()))
    ours = Context([load_module(path) for path in paths])
    for bits in (0x3FC00000, 0x402CCCCD, 0x00000001, -0x7FFFFFFF, 0x7FA00001, 0x7FC12345,
                 -0x80000000):
        assert ours.invoke("roundtrip", [bits]) == [oracle.modules.consumer["roundtrip"](bits)]
