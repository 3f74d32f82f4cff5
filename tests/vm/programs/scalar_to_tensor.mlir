// Scalars go into a tensor (host writes) and come back out (host reads).
func.func @main(%a: f32, %x: tensor<6xf32>) -> (tensor<6xf32>, f32) {
  %e = tensor.empty() : tensor<6xf32>
  %t = linalg.fill ins(%a : f32) outs(%e : tensor<6xf32>) -> tensor<6xf32>
  %r = arith.addf %t, %x : tensor<6xf32>
  %c2 = arith.constant 2 : index
  %v = tensor.extract %r[%c2] : tensor<6xf32>
  return %r, %v : tensor<6xf32>, f32
}
