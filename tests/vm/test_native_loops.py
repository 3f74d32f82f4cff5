"""Integer loops in C (`tinyhal.vm.scalar`): which functions qualify, and that the native
run is the Python translation's twin: same results as IREE, the same error where a
division faults, Ctrl-C still interrupting a loop, other threads running meanwhile.

The integer suites (`test_vm_int_flow.py`, `test_vm_remap_slots.py`) run every program
both ways (`loop_mode`) against iree.runtime; this file covers what is particular to the
native path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from support.models import VM_LOOP_MLIR
from support.vm_pairs import I32_EDGES, I64_EDGES, vm_compile_source


@pytest.fixture(scope="module")
def ops_path():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_loops.mlir")) as f:
        return vm_compile_source(f.read())


def _native_names(pair) -> set[str]:
    module = pair.module
    return {module.functions[o].name for o in module.program.native_loops}


def test_integer_loops_qualify_and_straight_code_does_not(vm_pair, ops_path, loop_mode):
    names = _native_names(vm_pair(ops_path))
    if loop_mode == "python loops":
        assert names == set()
    else:
        assert {"mix_i64", "mix_i32", "divide_down"} <= names
        assert "straight" not in names


def test_loops_with_every_integer_op_family_match_iree(vm_pair, ops_path, loop_mode):
    p = vm_pair(ops_path)
    for n in (0, 1, 2, 9):
        for a in I64_EDGES[::2]:
            for b in I64_EDGES[1::3]:
                p.check("mix_i64", n, a, b)
        for a in I32_EDGES[::2]:
            for b in I32_EDGES[1::3]:
                p.check("mix_i32", n, a, b)


def test_a_faulting_division_raises_the_vm_error_on_both_paths(vm_pair, ops_path, loop_mode):
    """divide_down(n, x, d) divides by d, d-1, ...: with n > d it divides by zero on trip
    d + 1, after the loop has run; both paths name the instruction the same way."""
    from tinyhal.errors import InvalidArgumentError

    p = vm_pair(ops_path)
    p.check("divide_down", 3, 1000, 5)
    with pytest.raises(InvalidArgumentError, match=r"div.i32.s: integer division fault "
                       r"\(\d+ / 0\)") as fault:
        p.ours("divide_down", 10, 1000, 5)
    assert "divide_down+" in str(fault.value)
    with pytest.raises(InvalidArgumentError, match=r"\(-2147483648 / -1\)"):
        p.ours("divide_down", 1, -(2**31), -1)


def test_other_threads_run_while_a_native_loop_runs(vm_pair, loop_mode):
    """The C loop runs without the GIL: a Python thread keeps counting meanwhile."""
    if loop_mode == "python loops":
        pytest.skip("the Python translation holds the GIL by nature")
    p = vm_pair(vm_compile_source(VM_LOOP_MLIR))
    stop = threading.Event()
    ticks = [0]

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    worker = threading.Thread(target=count)
    worker.start()
    try:
        p.ours("loop", 20_000_000)
    finally:
        stop.set()
        worker.join(10)
    assert ticks[0] > 1000


CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    # Python installs its Ctrl-C handler only if SIGINT was not ignored when it started;
    # a shell's `&` starts pytest (and so this child) with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from support.models import VM_LOOP_MLIR
    from support.vm_pairs import vm_compile_source
    from tinyhal.vm import Context, load_module

    module = load_module(vm_compile_source(VM_LOOP_MLIR))
    assert module.program.native_loops
    ctx = Context([module])
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        ctx.invoke("loop", [2**31 - 1])  # minutes of work, natively
    except KeyboardInterrupt:
        print("interrupted after", round(time.monotonic() - start, 2))
        sys.exit(0)
    print("ran to the end")
    sys.exit(1)
""")


@pytest.mark.timeout(120)
def test_ctrl_c_interrupts_a_long_native_loop(tmp_path):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=tests))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "interrupted after" in proc.stdout


def test_a_register_out_of_range_keeps_the_function_in_python(vm_pair, ops_path):
    """The encoder checks every register against the register file it sizes, so a
    program the C side could address out of bounds is never run natively."""
    from tinyhal.vm import scalar
    from tinyhal.vm.cconv import cconv_registers

    module = vm_pair(ops_path).module
    fn = next(f for f in module.functions if f.name == "mix_i64")
    slots = [reg for _bank, reg in cconv_registers(fn.cconv.args)]
    args = (fn.instructions, fn.cconv.args, fn.cconv.results, slots)
    assert scalar.encode(*args, 64) is not None
    assert scalar.encode(*args, 4) is None


def test_every_supported_op_has_a_case_in_the_interpreter():
    """The interpreter's opcode constants are generated from `vm/isa.py` (build.py); an op
    the encoder accepts without a case in scalar.c would stop a run as a bad opcode, so
    the preprocessed source is checked to hold a `case` for each."""
    import re
    import shutil

    from tinyhal.vm import scalar
    from tinyhal.vm.scalar import build

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to preprocess the interpreter")
    done = subprocess.run([compiler, "-E", "-P", "-I", build.HERE, "-I", build.HAL_NATIVE,
                           "-I", build.MATHLIB, "-x", "c", "-"],
                          input=build.generated_source(),
                          capture_output=True, text=True, timeout=60, check=True)
    cases = set(re.findall(r"case (OP_[A-Z0-9_]+)\s*:", done.stdout))
    spelled = {f"OP_{name.upper().replace('.', '_')}" for name in scalar.ENTRY_SUPPORTED}
    assert spelled <= cases, sorted(spelled - cases)
    assert scalar.SUPPORTED <= scalar.ENTRY_SUPPORTED


F32_LOOP = """
func.func @f32_loop(%x: f32, %y: f32, %n: i32) -> (f32, i32, f32) {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %r:4 = scf.while (%i = %c0, %f = %x, %g = %y, %h = %c0) : (i32, f32, f32, i32)
      -> (i32, f32, f32, i32) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %f, %g, %h : i32, f32, f32, i32
  } do {
  ^bb0(%i: i32, %f: f32, %g: f32, %h: i32):
    %m = arith.mulf %f, %g : f32
    %s = arith.sitofp %i : i32 to f32
    %a = arith.addf %m, %s : f32
    %d = arith.divf %a, %g : f32
    %e = math.exp %d : f32
    %lt = arith.cmpf ult, %e, %f : f32
    %pick = arith.select %lt, %e, %d : f32
    %mx = arith.maximumf %pick, %g : f32
    %b = arith.bitcast %mx : f32 to i32
    %t = arith.fptosi %a : f32 to i32
    %h1 = arith.xori %h, %b : i32
    %h2 = arith.addi %h1, %t : i32
    %i1 = arith.addi %i, %c1 : i32
    scf.yield %i1, %g, %pick, %h2 : i32, f32, f32, i32
  }
  return %r#1, %r#3, %r#2 : f32, i32, f32
}
"""

F32_EDGES = [0.0, -0.0, 1.5, -2.5, 1e-45, -1e-40, 3.4e38, float("inf"), -float("inf"),
             float("nan"), 0.1, 16777217.0]


def test_loops_carrying_f32_values_qualify_and_match_iree(vm_pair, loop_mode):
    """A loop mixing f32 arithmetic, C library math, NaN-aware compares and selects,
    conversions and bitcasts with integers runs in C like an integer loop; f32
    arguments enter as their bits (subnormals included) and results leave as register
    values, all bit for bit IREE's."""
    p = vm_pair(vm_compile_source(F32_LOOP))
    assert _native_names(p) == (set() if loop_mode == "python loops" else {"f32_loop"})
    for n in (0, 1, 3):
        for x in F32_EDGES[::2]:
            for y in F32_EDGES[1::2]:
                p.check("f32_loop", x, y, n)
