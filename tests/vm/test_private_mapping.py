"""Loading from a path maps the file privately (copy-on-write).

Programs whose state starts as module constants (a mutable global initialized from a
constant, weights imported zero-copy from rodata) run from a path and from bytes on every
driver with IREE's results, and the file's bytes never change. Writing into the memory
behind a path-loaded module's constants (what a kernel writing into a constant-backed
buffer does; IREE's tools read the file into writable memory, so it works there) neither
faults nor reaches the file: checked in a child process, since a read-only mapping would
kill the process.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal.errors import NotFoundError

ACCUMULATE = """
util.global private mutable @acc = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>
func.func @step(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = util.global.load @acc : tensor<4xf32>
  %s = arith.addf %a, %x : tensor<4xf32>
  util.global.store %s, @acc : tensor<4xf32>
  return %s : tensor<4xf32>
}
"""

WEIGHTS = """
func.func @affine(%x: tensor<2x64xf32>) -> tensor<2x32xf32> {
  %w = arith.constant dense<0.25> : tensor<64x32xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x32xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x32xf32>) -> tensor<2x32xf32>
  %m = linalg.matmul ins(%x, %w : tensor<2x64xf32>, tensor<64x32xf32>)
                     outs(%f : tensor<2x32xf32>) -> tensor<2x32xf32>
  return %m : tensor<2x32xf32>
}
"""


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _iree_results(path, function: str, inputs: list[np.ndarray], calls: int) -> list:
    import iree.runtime as rt

    config = rt.Config("local-sync")
    ctx = rt.SystemContext(config=config)
    with open(path, "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    fn = ctx.modules.module[function]
    return [np.asarray(fn(*inputs)) for _ in range(calls)]


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
@pytest.mark.parametrize("program,function,shapes,calls", [
    (ACCUMULATE, "step", [(4,)], 3),
    (WEIGHTS, "affine", [(2, 64)], 2),
], ids=["mutable-global", "rodata-weights"])
@pytest.mark.parametrize("source", ["path", "bytes"])
def test_constant_backed_programs_match_iree(driver, program, function, shapes, calls,
                                             source) -> None:
    path = compile_mlir(program, HOST_FLAGS)
    before = _sha(path)
    inputs = [np.random.default_rng(3).standard_normal(s).astype(np.float32) for s in shapes]
    expected = _iree_results(path, function, inputs, calls)
    module = tinyhal.load(str(path) if source == "path" else path.read_bytes(), device=driver)
    try:
        got = [module.invoke(function, *inputs) for _ in range(calls)]
    finally:
        module.close()
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    assert _sha(path) == before


CHILD = r"""
import ctypes, sys
import numpy as np
import tinyhal
from tinyhal.errors import NotFoundError
from tinyhal.vm.hal_module import vm_buffer_view

path, driver = sys.argv[1], sys.argv[2]
module = tinyhal.load(path, device=driver)
x = np.ones((2, 64), np.float32)
first = module.affine(x)
largest = max(module.bytecode.rodata, key=lambda b: vm_buffer_view(b).nbytes)
view = np.frombuffer(vm_buffer_view(largest), np.uint8)
assert not view.flags.writeable            # immutable to the program, as in IREE
ctypes.memset(view.ctypes.data, 0, view.nbytes)   # what a stray kernel write does
assert not view.any()
module.close()
again = tinyhal.load(path, device=driver)
np.testing.assert_array_equal(again.affine(x), first)
print("OK")
"""


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_writes_into_constant_memory_stay_private(driver) -> None:
    path = compile_mlir(WEIGHTS, HOST_FLAGS)
    before = _sha(path)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), driver],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip().endswith("OK")
    assert _sha(path) == before


def test_missing_path_is_not_found_naming_it(tmp_path) -> None:
    missing = tmp_path / "nope.vmfb"
    with pytest.raises(NotFoundError, match="nope.vmfb"):
        tinyhal.load(str(missing))


def test_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "broken.vmfb"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(tinyhal.Error, match="broken.vmfb"):
        tinyhal.load(str(bad))
    with pytest.raises(tinyhal.Error, match="<bytes>"):
        tinyhal.load(b"\x00" * 100)
