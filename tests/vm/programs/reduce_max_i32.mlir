func.func @main(%x: tensor<6x10x4xi32>) -> tensor<6x4xi32> {
  %z = arith.constant -2147483648 : i32
  %e = tensor.empty() : tensor<6x4xi32>
  %f = linalg.fill ins(%z : i32) outs(%e : tensor<6x4xi32>) -> tensor<6x4xi32>
  %r = linalg.reduce ins(%x : tensor<6x10x4xi32>) outs(%f : tensor<6x4xi32>) dimensions = [1]
    (%in: i32, %acc: i32) {
      %s = arith.maxsi %in, %acc : i32
      linalg.yield %s : i32
    }
  return %r : tensor<6x4xi32>
}
