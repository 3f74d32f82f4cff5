func.func @main(%a: tensor<3x7xf32>, %b: tensor<3x7xf32>) -> (tensor<3x7xi1>, tensor<3x7xf32>) {
  %c = arith.cmpf olt, %a, %b : tensor<3x7xf32>
  %s = arith.select %c, %a, %b : tensor<3x7xi1>, tensor<3x7xf32>
  return %c, %s : tensor<3x7xi1>, tensor<3x7xf32>
}
