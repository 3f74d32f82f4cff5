func.func @main(%x: tensor<1x8x8x3xf32>) -> tensor<1x4x4x3xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x4x4x3xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<1x4x4x3xf32>) -> tensor<1x4x4x3xf32>
  %k = tensor.empty() : tensor<2x2xf32>
  %s = linalg.pooling_nhwc_sum {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}
      ins(%x, %k : tensor<1x8x8x3xf32>, tensor<2x2xf32>) outs(%f : tensor<1x4x4x3xf32>) -> tensor<1x4x4x3xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(a, b, c, d) -> (a, b, c, d)>, affine_map<(a, b, c, d) -> (a, b, c, d)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%s : tensor<1x4x4x3xf32>) outs(%e : tensor<1x4x4x3xf32>) {
  ^bb0(%v: f32, %o: f32):
    %q = arith.constant 0.25 : f32
    %m = arith.mulf %v, %q : f32
    linalg.yield %m : f32
  } -> tensor<1x4x4x3xf32>
  return %r : tensor<1x4x4x3xf32>
}
