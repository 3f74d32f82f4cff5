func.func @main(%a: tensor<3x4xi32>, %b: tensor<2x4xi32>) -> (tensor<5x4xi32>, tensor<2x2xi32>, tensor<5x7xi32>) {
  %c = tensor.concat dim(0) %a, %b : (tensor<3x4xi32>, tensor<2x4xi32>) -> tensor<5x4xi32>
  %s = tensor.extract_slice %c[1, 1] [2, 2] [2, 1] : tensor<5x4xi32> to tensor<2x2xi32>
  %z = arith.constant -1 : i32
  %p = tensor.pad %c low[0, 1] high[0, 2] {
  ^bb0(%i: index, %j: index):
    tensor.yield %z : i32
  } : tensor<5x4xi32> to tensor<5x7xi32>
  return %c, %s, %p : tensor<5x4xi32>, tensor<2x2xi32>, tensor<5x7xi32>
}
