"""A host loop carrying f32 values: the Python translation, the C interpreter and IREE.

Host code whose loop mixes f32 arithmetic with integers (a generated program's shape:
a float recurrence, an integer hash and a compare per trip) runs in the C interpreter
since it qualifies like an integer loop. This runs one such function with
`TINYHAL_VM_NATIVE_LOOPS=0` (the Python translation), with native loops on, and in
iree.runtime, each in its own child process, in alternating rounds; the table shows the
median process CPU time per call and the ratio to IREE. The three results must carry the
same bits. Writes `bench/results/f32_loops.json`.

    python bench/f32_loops.py [--trips 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from _common import print_table, write_results  # noqa: E402

from support.iree_tools import compile_mlir  # noqa: E402

LOOP = """
func.func @loop(%x: f32, %n: i32) -> (i32, i32) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %k = arith.constant 0.999 : f32
  %r:3 = scf.while (%i = %c0, %f = %x, %h = %c0) : (i32, f32, i32) -> (i32, f32, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %f, %h : i32, f32, i32
  } do {
  ^bb0(%i: i32, %f: f32, %h: i32):
    %m = arith.mulf %f, %k : f32
    %s = arith.sitofp %i : i32 to f32
    %a = arith.addf %m, %s : f32
    %b = arith.bitcast %a : f32 to i32
    %x1 = arith.xori %h, %b : i32
    %h1 = arith.muli %x1, %c1 : i32
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %a, %h1 : i32, f32, i32
  }
  %bits = arith.bitcast %r#1 : f32 to i32
  return %bits, %r#2 : i32, i32
}
"""

CHILD = r"""
import json, sys, time
path, side, trips = sys.argv[1], sys.argv[2], int(sys.argv[3])
if side == "iree":
    import iree.runtime as rt
    module = rt.load_vm_flatbuffer_file(path, driver="local-sync")
    call = lambda: module.loop(1.5, trips)
else:
    import tinyhal
    module = tinyhal.load(path, device="sync")
    call = lambda: module.invoke("loop", 1.5, trips)
call()  # warm
start = time.process_time()
result = call()
print(json.dumps([time.process_time() - start, [int(v) for v in result]]))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    path = str(compile_mlir(LOOP, ["--iree-hal-target-device=local",
                                   "--iree-hal-local-target-device-backends=llvm-cpu"]))
    sides = {"python": ("tinyhal", "0"), "native": ("tinyhal", "1"), "iree": ("iree", "1")}
    times: dict[str, list[float]] = {name: [] for name in sides}
    answers = set()
    for _ in range(args.rounds):
        for name, (side, native) in sides.items():
            env = dict(os.environ, TINYHAL_VM_NATIVE_LOOPS=native)
            out = subprocess.run([sys.executable, "-c", CHILD, path, side, str(args.trips)],
                                 capture_output=True, text=True, env=env, timeout=600,
                                 check=True).stdout
            seconds, result = json.loads(out)
            times[name].append(seconds)
            answers.add(tuple(result))
    if len(answers) != 1:
        raise SystemExit(f"results differ: {answers}")
    iree = statistics.median(times["iree"])
    rows = [{"run": name, "cpu_ms": round(statistics.median(t) * 1e3, 2),
             "vs_iree": round(statistics.median(t) / iree, 2)} for name, t in times.items()]
    print_table(rows, ["run", "cpu_ms", "vs_iree"])
    write_results("f32_loops", rows, {"trips": args.trips, "rounds": args.rounds,
                                      "cpu_seconds": times})


if __name__ == "__main__":
    main()
