func.func @main(%a: tensor<9xi1>, %b: tensor<9xi1>, %flag: i1) -> (tensor<9xi1>, tensor<9xi1>, i1) {
  %x = arith.xori %a, %b : tensor<9xi1>
  %o = arith.ori %a, %b : tensor<9xi1>
  %t = arith.constant true
  %n = arith.xori %flag, %t : i1
  return %x, %o, %n : tensor<9xi1>, tensor<9xi1>, i1
}
