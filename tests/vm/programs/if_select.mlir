// Host-side branch on a scalar argument picks which dispatch runs.
func.func @main(%x: tensor<10xi32>, %flag: i32) -> tensor<10xi32> {
  %c0 = arith.constant 0 : i32
  %c = arith.cmpi ne, %flag, %c0 : i32
  %r = scf.if %c -> tensor<10xi32> {
    %a = arith.addi %x, %x : tensor<10xi32>
    scf.yield %a : tensor<10xi32>
  } else {
    %m = arith.muli %x, %x : tensor<10xi32>
    scf.yield %m : tensor<10xi32>
  }
  return %r : tensor<10xi32>
}
