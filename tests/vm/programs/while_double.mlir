// Doubles a vector until its sum exceeds a threshold read from another argument.
func.func @main(%x: tensor<8xf32>, %limit: tensor<f32>) -> (tensor<8xf32>, i32) {
  %c0 = arith.constant 0 : i32
  %lim = tensor.extract %limit[] : tensor<f32>
  %r:2 = scf.while (%v = %x, %n = %c0) : (tensor<8xf32>, i32) -> (tensor<8xf32>, i32) {
    %z = arith.constant 0.0 : f32
    %e = tensor.empty() : tensor<f32>
    %f = linalg.fill ins(%z : f32) outs(%e : tensor<f32>) -> tensor<f32>
    %s = linalg.reduce ins(%v : tensor<8xf32>) outs(%f : tensor<f32>) dimensions = [0]
      (%in: f32, %acc: f32) {
        %a = arith.addf %in, %acc : f32
        linalg.yield %a : f32
      }
    %sv = tensor.extract %s[] : tensor<f32>
    %c = arith.cmpf olt, %sv, %lim : f32
    %c100 = arith.constant 100 : i32
    %small = arith.cmpi slt, %n, %c100 : i32
    %go = arith.andi %c, %small : i1
    scf.condition(%go) %v, %n : tensor<8xf32>, i32
  } do {
  ^bb0(%v: tensor<8xf32>, %n: i32):
    %d = arith.addf %v, %v : tensor<8xf32>
    %c1 = arith.constant 1 : i32
    %m = arith.addi %n, %c1 : i32
    scf.yield %d, %m : tensor<8xf32>, i32
  }
  return %r#0, %r#1 : tensor<8xf32>, i32
}
