func.func @main(%a: tensor<1024x1024xf32>, %b: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
  %m = arith.mulf %a, %b : tensor<1024x1024xf32>
  %s = arith.addf %m, %a : tensor<1024x1024xf32>
  return %s : tensor<1024x1024xf32>
}
