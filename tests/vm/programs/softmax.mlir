func.func @main(%x: tensor<4x19xf32>) -> tensor<4x19xf32> {
  %e = tensor.empty() : tensor<4x19xf32>
  %r = linalg.softmax dimension(1) ins(%x : tensor<4x19xf32>) outs(%e : tensor<4x19xf32>) -> tensor<4x19xf32>
  return %r : tensor<4x19xf32>
}
