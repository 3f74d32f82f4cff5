// Module state: a call counter and a running sum persist across calls.
util.global private mutable @count = 0 : i32
util.global private mutable @acc = dense<0.0> : tensor<4xf32>
func.func @accumulate(%x: tensor<4xf32>) -> (tensor<4xf32>, i32) {
  %c = util.global.load @count : i32
  %one = arith.constant 1 : i32
  %n = arith.addi %c, %one : i32
  util.global.store %n, @count : i32
  %a = util.global.load @acc : tensor<4xf32>
  %s = arith.addf %a, %x : tensor<4xf32>
  util.global.store %s, @acc : tensor<4xf32>
  return %s, %n : tensor<4xf32>, i32
}
func.func @get_count() -> i32 {
  %c = util.global.load @count : i32
  return %c : i32
}
