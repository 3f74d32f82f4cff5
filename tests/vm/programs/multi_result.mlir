func.func @main(%a: tensor<4x6xf32>, %b: tensor<4x6xf32>) -> (tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<6x4xf32>) {
  %s = arith.addf %a, %b : tensor<4x6xf32>
  %p = arith.mulf %a, %b : tensor<4x6xf32>
  %m = arith.maximumf %a, %b : tensor<4x6xf32>
  %e = tensor.empty() : tensor<6x4xf32>
  %t = linalg.transpose ins(%a : tensor<4x6xf32>) outs(%e : tensor<6x4xf32>) permutation = [1, 0]
  return %s, %p, %m, %t : tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<6x4xf32>
}
