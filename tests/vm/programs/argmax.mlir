func.func @main(%x: tensor<5x37xf32>) -> tensor<5xi64> {
  %ninf = arith.constant 0xFF800000 : f32
  %c0 = arith.constant 0 : i64
  %ev = tensor.empty() : tensor<5xf32>
  %ei = tensor.empty() : tensor<5xi64>
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<5xf32>) -> tensor<5xf32>
  %fi = linalg.fill ins(%c0 : i64) outs(%ei : tensor<5xi64>) -> tensor<5xi64>
  %r:2 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<5x37xf32>) outs(%fv, %fi : tensor<5xf32>, tensor<5xi64>) {
  ^bb0(%in: f32, %best: f32, %bi: i64):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i64
    %gt = arith.cmpf ogt, %in, %best : f32
    %nv = arith.select %gt, %in, %best : f32
    %ni = arith.select %gt, %ji, %bi : i64
    linalg.yield %nv, %ni : f32, i64
  } -> (tensor<5xf32>, tensor<5xi64>)
  return %r#1 : tensor<5xi64>
}
