// Baked-in weights (rodata imported zero-copy) applied to the input.
func.func @main(%x: tensor<2x8xf32>) -> tensor<2x4xf32> {
  %w = arith.constant dense<[[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.5, 1.0], [0.125, 0.75, -2.0, 3.0], [1.0, 1.0, 1.0, 1.0], [-0.25, 0.5, 0.5, -1.5], [2.0, -2.0, 0.0, 0.5], [0.0, 0.25, 1.25, -0.75], [3.0, 0.5, -1.0, 0.0]]> : tensor<8x4xf32>
  %bias = arith.constant dense<[0.1, -0.2, 0.3, -0.4]> : tensor<4xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<2x4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<2x4xf32>) -> tensor<2x4xf32>
  %m = linalg.matmul ins(%x, %w : tensor<2x8xf32>, tensor<8x4xf32>) outs(%f : tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%m, %bias : tensor<2x4xf32>, tensor<4xf32>) outs(%e : tensor<2x4xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %zero = arith.constant 0.0 : f32
    %relu = arith.maximumf %s, %zero : f32
    linalg.yield %relu : f32
  } -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}
