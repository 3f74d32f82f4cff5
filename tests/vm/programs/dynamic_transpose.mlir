func.func @main(%a: tensor<?x?xi16>) -> tensor<?x?xi16> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xi16>
  %n = tensor.dim %a, %c1 : tensor<?x?xi16>
  %e = tensor.empty(%n, %m) : tensor<?x?xi16>
  %r = linalg.transpose ins(%a : tensor<?x?xi16>) outs(%e : tensor<?x?xi16>) permutation = [1, 0]
  return %r : tensor<?x?xi16>
}
