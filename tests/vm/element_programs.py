"""Programs over bf16, the fp8 family and sub-byte integers, and an oracle that runs them
in iree.runtime on raw buffer bytes (iree.runtime's numpy path has no i4), so tinyhal's
results can be compared bit for bit for every element type."""

from __future__ import annotations

import math

import numpy as np

from support.iree_tools import HOST_FLAGS, compile_mlir

FP8_TYPES = ["f8E4M3FN", "f8E4M3FNUZ", "f8E5M2", "f8E5M2FNUZ"]


def _fp8_functions(t: str) -> str:
    s = t.lower()
    return f"""
func.func @{s}_to_f32(%a: tensor<256x{t}>) -> tensor<256xf32> {{
  %0 = arith.extf %a : tensor<256x{t}> to tensor<256xf32>
  return %0 : tensor<256xf32>
}}
func.func @{s}_from_f32(%a: tensor<16xf32>) -> tensor<16x{t}> {{
  %0 = arith.truncf %a : tensor<16xf32> to tensor<16x{t}>
  return %0 : tensor<16x{t}>
}}
func.func @{s}_mul(%a: tensor<256x{t}>, %b: tensor<256x{t}>) -> tensor<256x{t}> {{
  %0 = arith.mulf %a, %b : tensor<256x{t}>
  return %0 : tensor<256x{t}>
}}
func.func @{s}_from_bits(%a: tensor<256xi8>) -> tensor<256x{t}> {{
  %0 = arith.bitcast %a : tensor<256xi8> to tensor<256x{t}>
  return %0 : tensor<256x{t}>
}}
"""


ELEMENTS_MLIR = """
func.func @bf16_add(%a: tensor<8xbf16>, %b: tensor<8xbf16>) -> tensor<8xbf16> {
  %0 = arith.addf %a, %b : tensor<8xbf16>
  return %0 : tensor<8xbf16>
}
func.func @bf16_matmul(%a: tensor<4x8xbf16>, %b: tensor<8x3xbf16>) -> tensor<4x3xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x3xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x3xf32>) -> tensor<4x3xf32>
  %0 = linalg.matmul ins(%a, %b : tensor<4x8xbf16>, tensor<8x3xbf16>)
                     outs(%f : tensor<4x3xf32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}
func.func @bf16_from_f32(%a: tensor<16xf32>) -> tensor<16xbf16> {
  %0 = arith.truncf %a : tensor<16xf32> to tensor<16xbf16>
  return %0 : tensor<16xbf16>
}
func.func @bf16_from_bits(%a: tensor<65536xi16>) -> tensor<65536xbf16> {
  %0 = arith.bitcast %a : tensor<65536xi16> to tensor<65536xbf16>
  return %0 : tensor<65536xbf16>
}
func.func @i4_widen(%a: tensor<2x4xi4>) -> tensor<2x4xi8> {
  %0 = arith.extsi %a : tensor<2x4xi4> to tensor<2x4xi8>
  return %0 : tensor<2x4xi8>
}
func.func @i4_narrow(%a: tensor<16xi8>) -> tensor<16xi4> {
  %0 = arith.trunci %a : tensor<16xi8> to tensor<16xi4>
  return %0 : tensor<16xi4>
}
func.func @i4_add(%a: tensor<16xi4>, %b: tensor<16xi4>) -> tensor<16xi4> {
  %0 = arith.addi %a, %b : tensor<16xi4>
  return %0 : tensor<16xi4>
}
func.func @i4_widen_unsigned(%a: tensor<16xi4>) -> tensor<16xi32> {
  %0 = arith.extui %a : tensor<16xi4> to tensor<16xi32>
  return %0 : tensor<16xi32>
}
""" + "".join(_fp8_functions(t) for t in FP8_TYPES)


def elements_vmfb() -> str:
    return str(compile_mlir(ELEMENTS_MLIR, HOST_FLAGS))


def iree_invoke_raw(path: str, function: str, inputs: list[tuple], driver: str = "local-sync"
                    ) -> list[tuple[tuple[int, ...], int, bytes]]:
    """Runs `function` in iree.runtime with inputs (shape, HAL element type, bytes) and
    returns each result as (shape, element type, buffer bytes)."""
    import iree.runtime as rt

    config = rt.Config(driver)
    instance, device = config.vm_instance, config.device
    module = rt.VmModule.mmap(instance, path)
    context = rt.VmContext(instance, modules=[rt.create_hal_module(instance, device), module])
    fn = module.lookup_function(function)
    args = rt.VmVariantList(len(inputs))
    for shape, element_type, data in inputs:
        raw = np.frombuffer(bytes(data), np.uint8)
        view = device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
            device=device, buffer=raw, element_type=rt.HalElementType.UINT_8)
        args.push_ref(rt.HalBufferView(view.get_buffer(), list(shape), element_type))
    results = rt.VmVariantList(1)
    context.invoke(fn, args, results)
    out = []
    for i in range(len(results)):
        view = results.get_as_object(i, rt.HalBufferView)
        n = view.byte_length
        data = bytes(view.map().asarray([n], np.dtype(np.uint8))) if n else b""
        out.append((tuple(view.shape), int(view.element_type), data))
    return out


def packed_count(shape: tuple[int, ...], bits: int) -> int:
    return (math.prod(shape) * bits + 7) // 8
