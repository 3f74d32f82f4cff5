// FLAGS: --iree-input-demote-f64-to-f32=false
func.func @main(%a: tensor<4x5xf64>) -> (tensor<4x5xf64>, tensor<4x5xf64>) {
  %m = arith.mulf %a, %a : tensor<4x5xf64>
  %s = math.sqrt %m : tensor<4x5xf64>
  %d = arith.divf %a, %s : tensor<4x5xf64>
  %n = arith.negf %a : tensor<4x5xf64>
  %x = arith.maximumf %n, %d : tensor<4x5xf64>
  return %s, %x : tensor<4x5xf64>, tensor<4x5xf64>
}
