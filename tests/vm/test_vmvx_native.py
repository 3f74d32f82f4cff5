"""VMVX workgroup functions in the C interpreter (`tinyhal.vm.scalar`): which exports run
natively (plain VM loops) and which stay Python (calls into the `vmvx` module); the native
and Python paths give iree.runtime's bits; a VM error in a native run (an access out of a
binding's bounds, a faulting division) is the Python run's error, word for word; slicing
a run by its branch budget changes nothing and Ctrl-C stops a long run; corrupted
executables never crash the process (in a child). tests/vm/test_vmvx.py runs every
program, flavour and driver with the native path on (the default)."""

from __future__ import annotations

import numpy as np
import pytest

import tinyhal
from support.child import run_child
from support.iree_tools import compile_mlir
from support.models import iree_function
from support.vmvx_programs import DYNAMIC_MATMUL, FLAVOURS, mlp_input, mlp_mlir
from tinyhal.hal import create_device
from tinyhal.vm import load_module, scalar
from tinyhal.vm.vmvx import VMVX_EXPORTS

DRIVERS = ["sync", "task", "emu"]

PROGRAM = """
func.func @mixed(%a: tensor<9x7xf32>, %b: tensor<9x7xf32>, %n: tensor<9x7xi32>,
                 %q: tensor<9x7xi32>)
    -> (tensor<9x7xf32>, tensor<9x7xf32>, tensor<9x7xi32>, tensor<9x7xf32>, tensor<9x7xi8>) {
  %m = arith.maximumf %a, %b : tensor<9x7xf32>
  %t = math.tanh %a : tensor<9x7xf32>
  %s = math.sqrt %m : tensor<9x7xf32>
  %x = arith.addf %t, %s : tensor<9x7xf32>
  %c = arith.cmpf olt, %a, %b : tensor<9x7xf32>
  %y = arith.select %c, %a, %b : tensor<9x7xi1>, tensor<9x7xf32>
  %d = arith.divsi %n, %q : tensor<9x7xi32>
  %r = arith.remui %n, %q : tensor<9x7xi32>
  %dr = arith.xori %d, %r : tensor<9x7xi32>
  %f = arith.sitofp %dr : tensor<9x7xi32> to tensor<9x7xf32>
  %i = arith.fptosi %a : tensor<9x7xf32> to tensor<9x7xi8>
  return %x, %y, %dr, %f, %i
      : tensor<9x7xf32>, tensor<9x7xf32>, tensor<9x7xi32>, tensor<9x7xf32>, tensor<9x7xi8>
}
"""


def _mixed_inputs(zero_divisor: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((9, 7)) * 40).astype(np.float32)
    a[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    b = (rng.standard_normal((9, 7)) * 40).astype(np.float32)
    b[1, :2] = [np.nan, np.float32(3e-38)]
    n = rng.integers(-(1 << 31), 1 << 31, (9, 7), dtype=np.int64).astype(np.int32)
    q = rng.integers(1, 1000, (9, 7), dtype=np.int32)
    if zero_divisor:
        q[4, 3] = 0
    return [a, b, n, q]


def _bits(values) -> list[bytes]:
    values = values if isinstance(values, tuple) else (values,)
    return [np.ascontiguousarray(np.asarray(v)).tobytes() for v in values]


def _executables(vmfb) -> list[bytes]:
    return [bytes(s.data) for s in load_module(vmfb).rodata
            if bytes(s.data[:4]) == b"PK\x03\x04"]


@pytest.fixture(params=["native", "python"])
def path(request, monkeypatch):
    """Runs a test with VMVX workgroup functions in C (the default) and all in Python."""
    monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "1" if request.param == "native" else "0")
    return request.param


def test_the_interpreter_has_every_vmvx_operation():
    assert set(scalar.KERNELS) == {f"vmvx.{e.name}" for e in VMVX_EXPORTS}


def test_which_workgroup_functions_run_natively(monkeypatch):
    """Plain loops and calls of the `vmvx` operations (including `query_tile_sizes.2d`,
    asked at run time by dynamic data-tiled shapes) run in C; a function using what the
    interpreter lacks stays Python, decided per function at load (here: with one
    operation taken out of the interpreter's table)."""
    with create_device("sync") as device:
        for flavour in ("loops", "ukernels", "data-tiling"):
            for data in _executables(compile_mlir(mlp_mlir(), FLAVOURS[flavour])):
                executable = device.load_executable(data)
                assert executable.native_exports == executable.export_names, flavour
        dynamic = _executables(compile_mlir(DYNAMIC_MATMUL, FLAVOURS["data-tiling"]))
        for data in dynamic:
            executable = device.load_executable(data)
            assert executable.native_exports == executable.export_names
    monkeypatch.setenv("TINYHAL_VM_CACHE", "0")  # translate again, with the smaller table
    monkeypatch.delitem(scalar.KERNELS, "vmvx.query_tile_sizes.2d")
    with create_device("sync") as device:
        exports = [device.load_executable(data) for data in dynamic]
        names = [name for e in exports for name in e.export_names]
        native = [name for e in exports for name in e.native_exports]
        assert len(native) < len(names)


@pytest.mark.parametrize("shape", [(13, 33, 9), (40, 17, 33), (1, 5, 1)])
def test_dynamic_data_tiled_matmul_runs_natively_with_iree_bits(shape):
    """Dynamic data-tiled shapes ask `query_tile_sizes.2d` at run time: the interpreter
    answers as IREE's microkernels do on this host, so `mmt4d` runs the same tiles."""
    vmfb = compile_mlir(DYNAMIC_MATMUL, FLAVOURS["data-tiling"])
    m, k, n = shape
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    expected = _bits(iree_function(vmfb, "matmul")(a, b))
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver) as module:
            assert _bits(module.matmul(a, b)) == expected, driver


@pytest.mark.parametrize("flavour", ["loops", "ukernels", "data-tiling"])
def test_both_paths_give_iree_bits(path, flavour):
    vmfb = compile_mlir(PROGRAM, FLAVOURS[flavour])
    args = _mixed_inputs()
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-sync"))
    context.add_vm_module(rt.VmModule.mmap(context.instance, str(vmfb)))
    expected = [np.asarray(r.to_host()).tobytes() for r in context.modules.module["mixed"](*args)]
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver) as module:
            assert _bits(module.mixed(*args)) == expected, driver
        with tinyhal.load(compile_mlir(mlp_mlir(), FLAVOURS[flavour]), device=driver) as module:
            x = mlp_input()
            assert _bits(module.mlp(x)) == _bits(iree_function(
                compile_mlir(mlp_mlir(), FLAVOURS[flavour]), "mlp")(x)), driver


def test_subnormal_operands_give_iree_bits(path):
    """IREE runs dispatches with subnormals flushed (FTZ/DAZ), as tinyhal's HAL does
    around a dispatch: both paths compute under that state and move values as bits, so
    a subnormal passed through (a select) survives and one computed with is flushed, as
    in IREE (tests/vm/test_f32_bits.py has more moves)."""
    import iree.runtime as rt

    args = _mixed_inputs()
    args[0][2, :3] = [np.float32(2e-39), np.float32(-1e-45), np.float32(1e-38)]
    args[1][1, :3] = [np.float32(1e-40), np.float32(-3e-39), np.float32(5e-39)]
    for flavour in ("loops", "data-tiling"):
        vmfb = compile_mlir(PROGRAM, FLAVOURS[flavour])
        context = rt.SystemContext(config=rt.Config("local-sync"))
        context.add_vm_module(rt.VmModule.mmap(context.instance, str(vmfb)))
        expected = [np.asarray(r.to_host()).tobytes()
                    for r in context.modules.module["mixed"](*args)]
        for driver in DRIVERS:
            with tinyhal.load(vmfb, device=driver) as module:
                assert _bits(module.mixed(*args)) == expected, (flavour, driver)


def _failure(native: bool, monkeypatch, run) -> str:
    monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "1" if native else "0")
    with pytest.raises(tinyhal.Error) as info:
        run()
    return f"{type(info.value).__name__}: {info.value}"


def test_a_faulting_division_fails_natively_as_in_python(monkeypatch):
    """IREE's VMVX divides with the host's instruction (a zero divisor kills its
    process); tinyhal fails the dispatch with the VM's error, the same on both paths."""
    vmfb = compile_mlir(PROGRAM, FLAVOURS["loops"])
    args = _mixed_inputs(zero_divisor=True)
    for driver in DRIVERS:
        def run(driver=driver):
            with tinyhal.load(vmfb, device=driver) as module:
                module.mixed(*args)

        native, python = (_failure(flag, monkeypatch, run) for flag in (True, False))
        assert native == python, driver
        assert "integer division fault" in native


def test_an_access_out_of_bounds_fails_natively_as_in_python(monkeypatch):
    """A dispatch whose bindings are shorter than the program reads: OUT_OF_RANGE,
    naming the access, word for word the Python run's error."""
    executable_bytes = _executables(compile_mlir(mlp_mlir(), FLAVOURS["loops"]))[0]
    messages = []
    for native in (True, False):
        monkeypatch.setenv("TINYHAL_VM_NATIVE_LOOPS", "1" if native else "0")
        with create_device("task") as device:
            executable = device.load_executable(executable_bytes)
            assert bool(executable.native_exports) == native
            bindings = [device.allocator.allocate(16)
                        for _ in range(executable.exports[0].binding_count)]
            cb = device.create_command_buffer()
            cb.dispatch(executable, 0, (1, 1, 1), bindings=bindings)
            cb.finalize()
            semaphore = device.create_semaphore()
            device.submit(cb, signal=[(semaphore, 1)])
            with pytest.raises(tinyhal.errors.OutOfRangeError) as info:
                semaphore.wait(1, timeout=60)
            messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "out-of-bounds access" in messages[0]


def test_a_run_sliced_by_a_tiny_branch_budget_gives_the_same_bits(monkeypatch):
    monkeypatch.setattr(scalar, "BRANCH_BUDGET", 3)
    vmfb = compile_mlir(mlp_mlir(), FLAVOURS["loops"])
    x = mlp_input()
    with tinyhal.load(vmfb, device="task") as module:
        assert _bits(module.mlp(x)) == _bits(iree_function(vmfb, "mlp")(x))


@pytest.mark.timeout(300)
def test_ctrl_c_stops_a_long_native_workgroup():
    out = run_child("""
        import os, subprocess, time
        import numpy as np
        import tinyhal
        from support.iree_tools import compile_mlir
        from support.vmvx_programs import VMVX

        n = 1280
        source = f'''
        func.func @matmul(%a: tensor<{n}x{n}xf32>, %b: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
          %z = arith.constant 0.0 : f32
          %e = tensor.empty() : tensor<{n}x{n}xf32>
          %f = linalg.fill ins(%z : f32) outs(%e : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
          %r = linalg.matmul ins(%a, %b : tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>)
                             outs(%f : tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
          return %r : tensor<{n}x{n}xf32>
        }}
        '''
        vmfb = compile_mlir(source, VMVX)
        a = np.ones((n, n), np.float32)
        with tinyhal.load(vmfb, device="sync") as module:
            # from another process, as a terminal's Ctrl-C: a thread of this one would
            # need the interpreter lock the workgroup loop holds to send it
            subprocess.Popen(["sh", "-c", f"sleep 1; kill -INT {os.getpid()}"])
            start = time.monotonic()
            try:
                module.matmul(a, a)
                print("ran to the end")
            except KeyboardInterrupt:
                print("interrupted", round(time.monotonic() - start, 1))
            except tinyhal.Error as exc:
                print("interrupted", "KeyboardInterrupt" in str(exc), exc)
    """, timeout=240)
    assert out.startswith("interrupted"), out


CORRUPTION_CHILD = """
import os, random, signal, sys
import numpy as np
import tinyhal
from support.iree_tools import compile_mlir
from support.vmvx_programs import FLAVOURS, mlp_mlir
from tinyhal.hal import create_device
from tinyhal.vm import load_module, scalar

scalar.BRANCH_BUDGET = 1 << 12

def alarm(signum, frame):
    raise TimeoutError("runaway")

signal.signal(signal.SIGALRM, alarm)
cases, flavours = int(sys.argv[1]), sys.argv[2].split(",")
VALUES = (0, 1, 2, 3, 7, 64, 255, 256, 4096, 1 << 20, (1 << 31) - 1, 1 << 31, -1, -2,
          -4096, -(1 << 40), (1 << 62) + 5)

def mutants(data, seed):
    module = load_module(data)
    spans = [(data.find(bytes(f.bytecode)), len(f.bytecode)) for f in module.functions]
    # integer literals (loop bounds, strides, offsets, kernel sizes and flags): changed,
    # the code still verifies and reaches the interpreter's and the kernels' checks
    literals = [(start + i.pc + 1, 8 if i.name == "const.i64" else 4)
                for f, (start, _) in zip(module.functions, spans)
                for i in f.instructions if i.name in ("const.i32", "const.i64")]
    for case in range(cases):
        rng = random.Random(f"vmvx-native-{seed}-{case}")
        mutant = bytearray(data)
        if case % 4:
            for _ in range(rng.randint(1, 3)):
                at, width = rng.choice(literals)
                value = (rng.choice(VALUES) if rng.random() < 0.7
                         else rng.randrange(-(1 << 16), 1 << 16))
                mutant[at:at + width] = (value % (1 << 8 * width)).to_bytes(width, "little")
        else:
            start, length = rng.choice(spans)
            for _ in range(rng.randint(1, 4)):
                mutant[start + rng.randrange(length)] = rng.randrange(256)
        yield bytes(mutant)

def run(device, executable, ordinal, export):
    rng = np.random.default_rng(ordinal)
    bindings = []
    for _ in range(export.binding_count):
        buffer = device.allocator.allocate(2048)
        device.write_bytes(buffer, rng.standard_normal(512).astype(np.float32))
        bindings.append(buffer)
    cb = device.create_command_buffer()
    cb.dispatch(executable, ordinal, (2, 1, 1), bindings=bindings)
    cb.finalize()
    semaphore = device.create_semaphore()
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        device.submit(cb, signal=[(semaphore, 1)])
        semaphore.wait(1, timeout=30)
        outcome = "ok"
    except TimeoutError:
        return None
    except tinyhal.Error as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return outcome, [device.read_bytes(b, 0, 2048) for b in bindings]

counts = {"refused": 0, "same": 0, "runaway": 0, "native": 0}
with create_device("sync") as native, create_device("sync") as python:
    for seed, flavour in enumerate(flavours):
        vmfb = compile_mlir(mlp_mlir(), FLAVOURS[flavour])
        for data in [bytes(s.data) for s in load_module(vmfb).rodata
                     if bytes(s.data[:4]) == b"PK\\x03\\x04"]:
            for mutant in mutants(data, seed):
                try:
                    os.environ["TINYHAL_VM_NATIVE_LOOPS"] = "1"
                    fast = native.load_executable(mutant)
                    os.environ["TINYHAL_VM_NATIVE_LOOPS"] = "0"
                    slow = python.load_executable(mutant)
                except tinyhal.Error:
                    counts["refused"] += 1
                    continue
                counts["native"] += len(fast.native_exports)
                for ordinal, export in enumerate(fast.exports):
                    if export.name not in fast.native_exports:
                        continue
                    ours, theirs = run(native, fast, ordinal, export), run(python, slow, ordinal, export)
                    if ours is None or theirs is None or "runaway" in ours[0] + theirs[0]:
                        counts["runaway"] += 1
                        continue
                    if ours != theirs:
                        print("DIFFER", flavour, export.name, ours[0], "|", theirs[0])
                        sys.exit(1)
                    counts["same"] += 1
print(counts)
"""


@pytest.mark.timeout(300)
def test_corrupted_workgroup_bytecode_runs_natively_as_in_python():
    """Workgroup functions' bytecode changed at random (seeded; integer literals above
    all, so it still verifies and drives loop bounds, strides and the kernels' operands
    out of range): each mutant is refused at load, or runs natively and in Python with
    the same outcome (the same error, word for word, or the same bytes in every
    binding); a runaway loop is stopped by an alarm between budget slices. In a child, so
    a crash fails the test rather than the run."""
    out = run_child(CORRUPTION_CHILD, "40", "loops,data-tiling", timeout=280)
    counts = eval(out.strip().splitlines()[-1])  # noqa: S307 - our own child's dict
    assert counts["native"] > 0 and counts["same"] > 0, counts
