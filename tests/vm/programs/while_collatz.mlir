// Data-dependent host loop: the trip count is read back from the device each step.
func.func @main(%n: tensor<i64>) -> (tensor<i64>, i32) {
  %c0 = arith.constant 0 : i32
  %r:2 = scf.while (%v = %n, %steps = %c0) : (tensor<i64>, i32) -> (tensor<i64>, i32) {
    %x = tensor.extract %v[] : tensor<i64>
    %one = arith.constant 1 : i64
    %cond = arith.cmpi sgt, %x, %one : i64
    scf.condition(%cond) %v, %steps : tensor<i64>, i32
  } do {
  ^bb0(%v: tensor<i64>, %steps: i32):
    %e = tensor.empty() : tensor<i64>
    %nv = linalg.generic {indexing_maps = [affine_map<() -> ()>, affine_map<() -> ()>], iterator_types = []}
        ins(%v : tensor<i64>) outs(%e : tensor<i64>) {
    ^bb0(%x: i64, %o: i64):
      %two = arith.constant 2 : i64
      %three = arith.constant 3 : i64
      %one = arith.constant 1 : i64
      %rem = arith.remsi %x, %two : i64
      %odd = arith.cmpi ne, %rem, %one : i64
      %half = arith.divsi %x, %two : i64
      %t = arith.muli %x, %three : i64
      %t1 = arith.addi %t, %one : i64
      %y = arith.select %odd, %half, %t1 : i64
      linalg.yield %y : i64
    } -> tensor<i64>
    %c1 = arith.constant 1 : i32
    %s = arith.addi %steps, %c1 : i32
    scf.yield %nv, %s : tensor<i64>, i32
  }
  return %r#0, %r#1 : tensor<i64>, i32
}
