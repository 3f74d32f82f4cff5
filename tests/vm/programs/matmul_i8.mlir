func.func @main(%a: tensor<9x33xi8>, %b: tensor<33x7xi8>) -> tensor<9x7xi32> {
  %z = arith.constant 0 : i32
  %e = tensor.empty() : tensor<9x7xi32>
  %f = linalg.fill ins(%z : i32) outs(%e : tensor<9x7xi32>) -> tensor<9x7xi32>
  %r = linalg.matmul ins(%a, %b : tensor<9x33xi8>, tensor<33x7xi8>) outs(%f : tensor<9x7xi32>) -> tensor<9x7xi32>
  return %r : tensor<9x7xi32>
}
