func.func @main(%a: tensor<13x17xf32>, %b: tensor<17x11xf32>) -> tensor<13x11xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<13x11xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<13x11xf32>) -> tensor<13x11xf32>
  %r = linalg.matmul ins(%a, %b : tensor<13x17xf32>, tensor<17x11xf32>) outs(%f : tensor<13x11xf32>) -> tensor<13x11xf32>
  return %r : tensor<13x11xf32>
}
