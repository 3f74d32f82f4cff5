func.func @main(%a: tensor<256x384xf32>, %b: tensor<384x200xf32>) -> tensor<256x200xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<256x200xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<256x200xf32>) -> tensor<256x200xf32>
  %r = linalg.matmul ins(%a, %b : tensor<256x384xf32>, tensor<384x200xf32>) outs(%f : tensor<256x200xf32>) -> tensor<256x200xf32>
  return %r : tensor<256x200xf32>
}
