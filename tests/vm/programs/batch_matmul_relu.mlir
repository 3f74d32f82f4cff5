func.func @main(%a: tensor<3x10x12xf32>, %b: tensor<3x12x9xf32>) -> tensor<3x10x9xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<3x10x9xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<3x10x9xf32>) -> tensor<3x10x9xf32>
  %m = linalg.batch_matmul ins(%a, %b : tensor<3x10x12xf32>, tensor<3x12x9xf32>) outs(%f : tensor<3x10x9xf32>) -> tensor<3x10x9xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%m : tensor<3x10x9xf32>) outs(%e : tensor<3x10x9xf32>) {
  ^bb0(%v: f32, %o: f32):
    %r0 = arith.maximumf %v, %z : f32
    linalg.yield %r0 : f32
  } -> tensor<3x10x9xf32>
  return %r : tensor<3x10x9xf32>
}
