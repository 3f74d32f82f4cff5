func.func private @poly(%x: tensor<8xf32>) -> tensor<8xf32> {
  %m = arith.mulf %x, %x : tensor<8xf32>
  %a = arith.addf %m, %x : tensor<8xf32>
  return %a : tensor<8xf32>
}
func.func private @fact(%n: i64) -> i64 {
  %c1 = arith.constant 1 : index
  %one = arith.constant 1 : i64
  %ni = arith.index_cast %n : i64 to index
  %np1 = arith.addi %ni, %c1 : index
  %r = scf.for %i = %c1 to %np1 step %c1 iter_args(%acc = %one) -> i64 {
    %ii = arith.index_cast %i : index to i64
    %p = arith.muli %acc, %ii : i64
    scf.yield %p : i64
  }
  return %r : i64
}
func.func @main(%x: tensor<8xf32>, %n: i64) -> (tensor<8xf32>, i64) {
  %a = func.call @poly(%x) : (tensor<8xf32>) -> tensor<8xf32>
  %b = func.call @poly(%a) : (tensor<8xf32>) -> tensor<8xf32>
  %f = func.call @fact(%n) : (i64) -> i64
  return %b, %f : tensor<8xf32>, i64
}
