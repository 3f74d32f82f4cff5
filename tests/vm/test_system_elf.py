"""Modules whose executables are system ELF (`--iree-llvmcpu-link-embedded=false`):
`hal.executable.format` answers for it and the dylib loads from rodata, on every driver."""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir

SOURCE = """
func.func @main(%a: tensor<3x70xf32>, %b: tensor<70x5xf32>) -> (tensor<3x5xf32>, tensor<3xf32>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x5xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<3x5xf32>) -> tensor<3x5xf32>
  %m = linalg.matmul ins(%a, %b : tensor<3x70xf32>, tensor<70x5xf32>)
                     outs(%f : tensor<3x5xf32>) -> tensor<3x5xf32>
  %e2 = tensor.empty() : tensor<3xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e2 : tensor<3xf32>) -> tensor<3xf32>
  %s = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>,
                                        affine_map<(d0, d1) -> (d0)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<3x70xf32>) outs(%f2 : tensor<3xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %t = math.tanh %x : f32
    %r = arith.addf %t, %acc : f32
    linalg.yield %r : f32
  } -> tensor<3xf32>
  return %m, %s : tensor<3x5xf32>, tensor<3xf32>
}
"""


@pytest.fixture(scope="module")
def system_elf_vmfb():
    return compile_mlir(SOURCE, [*HOST_FLAGS, "--iree-llvmcpu-link-embedded=false"])


@pytest.mark.parametrize("driver", ["sync", "task", "emu"])
def test_system_elf_module_matches_iree(system_elf_vmfb, driver):
    import iree.runtime as rt

    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 70)).astype(np.float32)
    b = rng.standard_normal((70, 5)).astype(np.float32)
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(system_elf_vmfb)))
    expected = [r.to_host() for r in ctx.modules.module["main"](a, b)]
    with tinyhal.load(system_elf_vmfb, device=driver) as module:
        got = module.main(a, b)
    for ours, theirs in zip(got, expected):
        assert ours.tobytes() == theirs.tobytes()
