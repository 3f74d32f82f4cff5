func.func @main(%a: i64, %b: i64) -> (i64, i64, i64, i64) {
  %s = arith.subi %a, %b : i64
  %m = arith.muli %a, %b : i64
  %d = arith.divui %a, %b : i64
  %c3 = arith.constant 3 : i64
  %sh = arith.shli %a, %c3 : i64
  return %s, %m, %d, %sh : i64, i64, i64, i64
}
