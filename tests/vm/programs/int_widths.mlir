// Every integer width, signed and unsigned arithmetic.
func.func @i8ops(%a: tensor<16xi8>, %b: tensor<16xi8>) -> (tensor<16xi8>, tensor<16xi8>, tensor<16xi8>) {
  %s = arith.addi %a, %b : tensor<16xi8>
  %m = arith.muli %a, %b : tensor<16xi8>
  %u = arith.maxui %a, %b : tensor<16xi8>
  return %s, %m, %u : tensor<16xi8>, tensor<16xi8>, tensor<16xi8>
}
func.func @i16ops(%a: tensor<16xi16>, %b: tensor<16xi16>) -> (tensor<16xi16>, tensor<16xi16>) {
  %d = arith.divui %a, %b : tensor<16xi16>
  %r = arith.remsi %a, %b : tensor<16xi16>
  return %d, %r : tensor<16xi16>, tensor<16xi16>
}
func.func @i32ops(%a: tensor<16xi32>, %b: tensor<16xi32>) -> (tensor<16xi32>, tensor<16xi32>, tensor<16xi32>) {
  %d = arith.divsi %a, %b : tensor<16xi32>
  %sh = arith.constant dense<3> : tensor<16xi32>
  %l = arith.shrui %a, %sh : tensor<16xi32>
  %x = arith.xori %a, %b : tensor<16xi32>
  return %d, %l, %x : tensor<16xi32>, tensor<16xi32>, tensor<16xi32>
}
func.func @i64ops(%a: tensor<16xi64>, %b: tensor<16xi64>) -> (tensor<16xi64>, tensor<16xi64>) {
  %m = arith.muli %a, %b : tensor<16xi64>
  %sh = arith.constant dense<7> : tensor<16xi64>
  %r = arith.shrsi %a, %sh : tensor<16xi64>
  return %m, %r : tensor<16xi64>, tensor<16xi64>
}
