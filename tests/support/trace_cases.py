"""`--trace_execution` cases: programs, calls, and IREE's traces of them recorded as files.

Each case is one `iree-run-module` / `tinyhal-run` command line; its recorded trace
(`tests/vm/traces/<case>.trace`) is what an `iree-run-module` built with execution
tracing printed to stderr for it, every ref's address replaced by `PTR` (`normalize`):
addresses are the only part of a line two runtimes cannot share.

Recording them again, with such a build (see `tests/vm/traces/README.md`):

    python tests/support/trace_cases.py /path/to/iree-run-module
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parent.parent / "vm" / "traces"

# i64 arithmetic in a counted loop, an internal call, an i64 global, f32 arithmetic,
# compares, selects and casts: the data registers and branch lists of plain code.
SCALARS = """
util.global private mutable @calls = 0 : i64

func.func private @mix(%a: i64, %x: f32) -> (i64, f32) {
  %c3 = arith.constant 3 : i64
  %m = arith.muli %a, %c3 : i64
  %s = arith.shrsi %m, %c3 : i64
  %h = arith.constant 0.5 : f32
  %y = arith.mulf %x, %h : f32
  %z = math.absf %y : f32
  return %s, %z : i64, f32
}

func.func @scalars(%a: i64, %x: f32, %n: i32) -> (i64, f32, i32) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %a) -> (i64) : i32 {
    %ii = arith.extsi %i : i32 to i64
    %acc1 = arith.addi %acc, %ii : i64
    %c5 = arith.constant 5 : i64
    %acc2 = arith.muli %acc1, %c5 : i64
    scf.yield %acc2 : i64
  }
  %m:2 = func.call @mix(%r, %x) : (i64, f32) -> (i64, f32)
  %old = util.global.load @calls : i64
  %one = arith.constant 1 : i64
  %new = arith.addi %old, %one : i64
  util.global.store %new, @calls : i64
  %f1 = arith.addf %m#1, %x : f32
  %lt = arith.cmpf olt, %f1, %x : f32
  %sel = arith.select %lt, %m#0, %new : i64
  %t = arith.fptosi %f1 : f32 to i32
  %q = arith.divf %f1, %x : f32
  return %sel, %q, %t : i64, f32, i32
}
"""

# VM-dialect code frontends rarely emit: rodata, vm.buffer operations, i32 and ref
# globals, br_table.
VM_OPS = """
vm.module @vm_ops {
  vm.rodata private @bytes dense<[7, 6, 5, 4, 3, 2, 1, 0]> : tensor<8xi8>
  vm.global.i32 private mutable @count : i32
  vm.global.ref private mutable @last : !vm.buffer
  vm.func @buffers(%v : i32, %at : i64) -> (i32, i32, i64, i32) {
    %ro = vm.const.ref.rodata @bytes : !vm.buffer
    %z = vm.const.i64.zero
    %n8 = vm.const.i64 8
    %n12 = vm.const.i64 12
    %al = vm.const.i32.zero
    %b = vm.buffer.alloc %n12, %al : !vm.buffer
    vm.buffer.copy %ro, %z, %b, %z, %n8 : !vm.buffer -> !vm.buffer
    %one = vm.const.i64 1
    %two = vm.const.i64 2
    vm.buffer.fill.i8 %b, %one, %two, %v : i32 -> !vm.buffer
    vm.buffer.store.i32 %v, %b[%two] : i32 -> !vm.buffer
    %l = vm.buffer.load.i8.s %b[%at] : !vm.buffer -> i32
    %w = vm.buffer.load.i32 %b[%two] : !vm.buffer -> i32
    %len = vm.buffer.length %b : !vm.buffer -> i64
    %eq = vm.buffer.compare %ro, %z, %b, %z, %n8 : !vm.buffer, !vm.buffer
    %o = vm.global.load.i32 @count : i32
    %o1 = vm.add.i32 %o, %l : i32
    vm.global.store.i32 %o1, @count : i32
    vm.global.store.ref %b, @last : !vm.buffer
    vm.return %l, %w, %len, %eq : i32, i32, i64, i32
  }
  vm.export @buffers
  vm.func @branches(%i : i32) -> i32 {
    vm.br_table %i {
      default: ^bb1(%i : i32),
      0: ^bb2,
      1: ^bb3
    }
  ^bb1(%x : i32):
    %k = vm.const.i32 -5
    %y = vm.mul.i32 %x, %k : i32
    %c = vm.cmp.lt.i32.s %y, %x : i32
    vm.cond_br %c, ^bb2, ^bb3
  ^bb2:
    %a = vm.const.i32 100
    vm.return %a : i32
  ^bb3:
    %r = vm.global.load.ref @last : !vm.buffer
    %nz = vm.cmp.nz.ref %r : !vm.buffer
    vm.return %nz : i32
  }
  vm.export @branches
}
"""

# Lists of i32, i64 and refs, a ref select, a switch.
VM_LISTS = """
vm.module @vm_lists {
  vm.func @lists(%n : i32, %v : i32, %w : i64, %k : i32) -> (i32, i64, i32, i32, i32) {
    %l = vm.list.alloc %n : (i32) -> !vm.list<i32>
    vm.list.resize %l, %n : (!vm.list<i32>, i32)
    %c1 = vm.const.i32 1
    vm.list.set.i32 %l, %c1, %v : (!vm.list<i32>, i32, i32)
    %g = vm.list.get.i32 %l, %c1 : (!vm.list<i32>, i32) -> i32
    %s = vm.list.size %l : (!vm.list<i32>) -> i32
    %wl = vm.list.alloc %n : (i32) -> !vm.list<i64>
    vm.list.resize %wl, %n : (!vm.list<i64>, i32)
    vm.list.set.i64 %wl, %c1, %w : (!vm.list<i64>, i32, i64)
    %gw = vm.list.get.i64 %wl, %c1 : (!vm.list<i64>, i32) -> i64
    %rl = vm.list.alloc %n : (i32) -> !vm.list<?>
    vm.list.resize %rl, %n : (!vm.list<?>, i32)
    %c8 = vm.const.i64 8
    %al = vm.const.i32.zero
    %b = vm.buffer.alloc %c8, %al : !vm.buffer
    vm.list.set.ref %rl, %c1, %b : (!vm.list<?>, i32, !vm.buffer)
    %back = vm.list.get.ref %rl, %c1 : (!vm.list<?>, i32) -> !vm.buffer
    %z = vm.const.ref.zero : !vm.buffer
    %pick = vm.select.ref %k, %back, %z : !vm.buffer
    %nz = vm.cmp.nz.ref %pick : !vm.buffer
    %c100 = vm.const.i32 100
    %c200 = vm.const.i32 200
    %sw = vm.switch.i32 %k[%c100, %v, %c200] else %n : i32
    vm.return %g, %gw, %s, %nz, %sw : i32, i64, i32, i32, i32
  }
  vm.export @lists
}
"""


@dataclass(frozen=True)
class TraceCase:
    name: str
    source: str  # MLIR text, or a corpus program's name
    flags: tuple[str, ...]  # run flags after --module=: function and inputs
    vm_dialect: bool = False

    def module_path(self) -> Path:
        from support.vm_pairs import vm_compile_source

        if "\n" in self.source:
            flags = ["--compile-from=vm"] if self.vm_dialect else []
            return Path(vm_compile_source(self.source, flags))
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vm" / "programs"))
        from corpus import compile_program

        return compile_program(self.source)

    def argv(self) -> list[str]:
        return [f"--module={self.module_path()}", "--device=local-sync",
                "--trace_execution", *self.flags]


CASES = [
    # the HAL path: imports, variadic calls, refs, a yieldable fence wait
    TraceCase("add_f32", "add_f32",
              ("--function=main", "--input=4xf32=1,2,3,4", "--input=4xf32=1,1,1,1")),
    TraceCase("scalars", SCALARS, ("--function=scalars", "--input=-7", "--input=1.3",
                                   "--input=3")),
    TraceCase("vm_buffers", VM_OPS, ("--function=buffers", "--input=300", "--input=1"),
              vm_dialect=True),
    TraceCase("vm_branches", VM_OPS, ("--function=branches", "--input=9"), vm_dialect=True),
    TraceCase("vm_lists", VM_LISTS, ("--function=lists", "--input=4", "--input=-9",
                                     "--input=-5000000000", "--input=1"), vm_dialect=True),
]

_ADDRESS = re.compile(r"/(?:0x[0-9a-f]+|\(nil\))\)")


def normalize(stderr: str) -> list[str]:
    """The trace lines of a run's stderr, every ref's address replaced by `PTR`."""
    return [_ADDRESS.sub("/PTR)", line) for line in stderr.splitlines()
            if line.startswith("[")]


def iree_trace(binary: str, case: TraceCase) -> list[str]:
    """`case`'s trace lines from an `iree-run-module` built with execution tracing."""
    proc = subprocess.run([binary, *case.argv()], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} failed on {case.name}: {proc.stderr[-2000:]}")
    lines = normalize(proc.stderr)
    if not lines:
        raise RuntimeError(f"{binary} printed no trace: was it built with "
                           "-DIREE_VM_EXECUTION_TRACING_ENABLE=1?")
    return lines


def record(binary: str) -> None:
    for case in CASES:
        lines = iree_trace(binary, case)
        (TRACES_DIR / f"{case.name}.trace").write_text("\n".join(lines) + "\n")
        print(f"{case.name}: {len(lines)} lines")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    record(sys.argv[1])
