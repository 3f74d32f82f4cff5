func.func @main(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %0 = arith.mulf %a, %b : tensor<?xf32>
  %1 = arith.addf %0, %a : tensor<?xf32>
  return %1 : tensor<?xf32>
}
