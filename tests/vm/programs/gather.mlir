func.func @main(%table: tensor<10x3xf32>, %idx: tensor<6xi32>) -> tensor<6x3xf32> {
  %e = tensor.empty() : tensor<6x3xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}
      ins(%idx : tensor<6xi32>) outs(%e : tensor<6x3xf32>) {
  ^bb0(%i: i32, %o: f32):
    %ii = arith.index_cast %i : i32 to index
    %j = linalg.index 1 : index
    %v = tensor.extract %table[%ii, %j] : tensor<10x3xf32>
    linalg.yield %v : f32
  } -> tensor<6x3xf32>
  return %r : tensor<6x3xf32>
}
