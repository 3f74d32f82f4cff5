// Host-side float math (VM f32 instructions).
func.func @main(%a: f32, %b: f32) -> (f32, f32, f32, f32, i32) {
  %s = arith.addf %a, %b : f32
  %m = arith.mulf %a, %b : f32
  %d = arith.divf %a, %b : f32
  %e = math.sqrt %s : f32
  %i = arith.fptosi %m : f32 to i32
  return %s, %m, %d, %e, %i : f32, f32, f32, f32, i32
}
