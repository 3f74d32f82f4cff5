// Integer loops for tests/vm/test_native_loops.py: every integer op family the native
// interpreter runs, i32 and i64, and a loop whose division faults after a few trips.
func.func @mix_i64(%n: i32, %a: i64, %b: i64) -> (i64, i64, i32, i64) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %one = arith.constant 1 : i64
  %r:4 = scf.while (%i = %c0, %x = %a, %y = %b, %z = %c0) : (i32, i64, i64, i32)
      -> (i32, i64, i64, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %y, %z : i32, i64, i64, i32
  } do {
  ^bb0(%i: i32, %x: i64, %y: i64, %z: i32):
    %d = arith.ori %y, %one : i64
    %q = arith.divsi %x, %d : i64
    %rm = arith.remui %x, %d : i64
    %mn = arith.minsi %q, %rm : i64
    %mx = arith.maxui %x, %y : i64
    %sh = arith.shrsi %mx, %one : i64
    %lt = arith.cmpi ult, %q, %y : i64
    %s = arith.select %lt, %mn, %sh : i64
    %t = arith.trunci %s : i64 to i32
    %e = arith.extui %t : i32 to i64
    %x1 = arith.xori %e, %s : i64
    %y1 = arith.subi %y, %x1 : i64
    %z1 = arith.addi %z, %t : i32
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %x1, %y1, %z1 : i32, i64, i64, i32
  }
  return %r#1, %r#2, %r#3, %r#1 : i64, i64, i32, i64
}

func.func @mix_i32(%n: i32, %a: i32, %b: i32) -> (i32, i32) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %c7 = arith.constant 7 : i32
  %r:3 = scf.while (%i = %c0, %x = %a, %y = %b) : (i32, i32, i32) -> (i32, i32, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %x, %y : i32, i32, i32
  } do {
  ^bb0(%i: i32, %x: i32, %y: i32):
    %d = arith.ori %y, %c1 : i32
    %q = arith.divui %x, %d : i32
    %rm = arith.remsi %x, %c7 : i32
    %sl = arith.shli %q, %i : i32
    %su = arith.shrui %x, %c7 : i32
    %mn = arith.minui %sl, %su : i32
    %mx = arith.maxsi %rm, %y : i32
    %e = arith.extsi %mn : i32 to i64
    %t = arith.trunci %e : i64 to i16
    %w = arith.extsi %t : i16 to i32
    %x1 = arith.addi %w, %mx : i32
    %y1 = arith.muli %y, %x1 : i32
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %x1, %y1 : i32, i32, i32
  }
  return %r#1, %r#2 : i32, i32
}

func.func @divide_down(%n: i32, %x: i32, %d: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %r:3 = scf.while (%i = %c0, %acc = %x, %k = %d) : (i32, i32, i32) -> (i32, i32, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %acc, %k : i32, i32, i32
  } do {
  ^bb0(%i: i32, %acc: i32, %k: i32):
    %q = arith.divsi %acc, %k : i32
    %a1 = arith.addi %q, %acc : i32
    %k1 = arith.subi %k, %c1 : i32
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %a1, %k1 : i32, i32, i32
  }
  return %r#1 : i32
}

func.func @straight(%a: i32, %b: i32) -> i32 {
  %s = arith.addi %a, %b : i32
  return %s : i32
}
