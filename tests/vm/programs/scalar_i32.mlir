// Pure host arithmetic: no dispatch at all, runs entirely in the VM.
func.func @main(%a: i32, %b: i32) -> (i32, i32, i32, i32, i1) {
  %s = arith.addi %a, %b : i32
  %m = arith.muli %a, %b : i32
  %d = arith.divsi %a, %b : i32
  %r = arith.remui %a, %b : i32
  %c = arith.cmpi slt, %a, %b : i32
  return %s, %m, %d, %r, %c : i32, i32, i32, i32, i1
}
