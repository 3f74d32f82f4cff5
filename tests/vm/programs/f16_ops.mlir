func.func @main(%a: tensor<33xf16>, %b: tensor<33xf16>) -> (tensor<33xf16>, tensor<33xf32>) {
  %m = arith.mulf %a, %b : tensor<33xf16>
  %s = arith.addf %m, %a : tensor<33xf16>
  %e = arith.extf %s : tensor<33xf16> to tensor<33xf32>
  return %s, %e : tensor<33xf16>, tensor<33xf32>
}
