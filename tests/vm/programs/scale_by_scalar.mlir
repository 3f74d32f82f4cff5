func.func @main(%a: tensor<5x7xf32>, %s: f32) -> tensor<5x7xf32> {
  %e = tensor.empty() : tensor<5x7xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%a : tensor<5x7xf32>) outs(%e : tensor<5x7xf32>) {
  ^bb0(%x: f32, %o: f32):
    %m = arith.mulf %x, %s : f32
    %c = arith.constant 0.5 : f32
    %n = arith.subf %m, %c : f32
    linalg.yield %n : f32
  } -> tensor<5x7xf32>
  return %r : tensor<5x7xf32>
}
