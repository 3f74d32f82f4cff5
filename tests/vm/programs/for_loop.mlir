// A host-side scf.for whose trip count is an argument; each iteration dispatches.
func.func @main(%x: tensor<16xf32>, %n: i32) -> tensor<16xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %ni = arith.index_cast %n : i32 to index
  %r = scf.for %i = %c0 to %ni step %c1 iter_args(%v = %x) -> tensor<16xf32> {
    %m = arith.mulf %v, %v : tensor<16xf32>
    %h = arith.constant dense<0.5> : tensor<16xf32>
    %a = arith.mulf %m, %h : tensor<16xf32>
    %b = arith.addf %a, %h : tensor<16xf32>
    scf.yield %b : tensor<16xf32>
  }
  return %r : tensor<16xf32>
}
