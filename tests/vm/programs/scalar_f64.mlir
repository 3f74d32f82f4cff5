// FLAGS: --iree-input-demote-f64-to-f32=false
func.func @main(%a: f64, %b: f64) -> (f64, f64, f64) {
  %s = arith.addf %a, %b : f64
  %m = arith.mulf %a, %b : f64
  %d = arith.divf %a, %b : f64
  return %s, %m, %d : f64, f64, f64
}
