// FLAGS: --iree-input-demote-f64-to-f32=false
func.func @main(%a: tensor<12xf32>, %b: tensor<12xi32>) -> (tensor<12xi32>, tensor<12xf32>, tensor<12xf16>, tensor<12xi8>, tensor<12xf64>) {
  %i = arith.fptosi %a : tensor<12xf32> to tensor<12xi32>
  %f = arith.sitofp %b : tensor<12xi32> to tensor<12xf32>
  %h = arith.truncf %a : tensor<12xf32> to tensor<12xf16>
  %t = arith.trunci %b : tensor<12xi32> to tensor<12xi8>
  %u = arith.uitofp %b : tensor<12xi32> to tensor<12xf64>
  return %i, %f, %h, %t, %u : tensor<12xi32>, tensor<12xf32>, tensor<12xf16>, tensor<12xi8>, tensor<12xf64>
}
