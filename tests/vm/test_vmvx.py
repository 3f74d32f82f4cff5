"""VMVX executables (`--iree-hal-local-target-device-backends=vmvx`): programs compiled by
the pinned compiler give iree-run-module's bits on every driver, through `tinyhal.load`
and `tinyhal-run`, in each of the three shapes VMVX code comes in: plain VM loops, the
`vmvx` module's microkernels, and microkernels with data tiling (`mmt4d`, `pack`,
`unpack`), and in TinyIREE's inline-dynamic mode; so does the VM corpus compiled to
VMVX, and the tests' small CNN. Where iree-compile's own VMVX lowering is wrong, both
runtimes fail alike. The executable policy `"portable"` refuses machine code with the
policy named, and still runs VMVX (also the VMVX half of a program compiled for both)."""

from __future__ import annotations

import numpy as np
import pytest
from programs.corpus import CASES as CORPUS_CASES
from programs.corpus import PROGRAMS_DIR as CORPUS_DIR
from programs.corpus import program_flags as corpus_flags

import tinyhal
from support.child import run_child
from support.iree_tools import HOST_FLAGS, compile_mlir
from support.run_compare import iree_run_module, tinyhal_run
from support.vmvx_programs import DYNAMIC_MATMUL, FLAVOURS, VMVX, mlp_mlir
from tinyhal.errors import PermissionDeniedError
from tinyhal.hal import create_device
from tinyhal.vm import VMBuffer, create_vmvx_module, load_module
from tinyhal.vm.vmvx import VMVX_EXPORTS, VMVXExecutable

DRIVERS = ["sync", "task", "emu"]

ELEMENTWISE = """
func.func @f32ops(%a: tensor<6x10xf32>, %b: tensor<6x10xf32>)
    -> (tensor<6x10xf32>, tensor<6x10xf32>, tensor<6x10xf32>, tensor<6x10xf32>) {
  %s = arith.addf %a, %b : tensor<6x10xf32>
  %d = arith.subf %a, %b : tensor<6x10xf32>
  %m = arith.mulf %s, %d : tensor<6x10xf32>
  %q = arith.divf %m, %b : tensor<6x10xf32>
  %e = math.exp %a : tensor<6x10xf32>
  %ab = math.absf %b : tensor<6x10xf32>
  %l = math.log %ab : tensor<6x10xf32>
  %r = math.rsqrt %ab : tensor<6x10xf32>
  %fl = math.floor %e : tensor<6x10xf32>
  %ce = math.ceil %l : tensor<6x10xf32>
  %x = arith.addf %q, %fl : tensor<6x10xf32>
  %y = arith.addf %ce, %r : tensor<6x10xf32>
  return %x, %y, %e, %l : tensor<6x10xf32>, tensor<6x10xf32>, tensor<6x10xf32>,
                          tensor<6x10xf32>
}
func.func @neg(%a: tensor<6x10xf32>) -> tensor<6x10xf32> {
  %n = arith.negf %a : tensor<6x10xf32>
  return %n : tensor<6x10xf32>
}
func.func @i32ops(%a: tensor<6x10xi32>, %b: tensor<6x10xi32>)
    -> (tensor<6x10xi32>, tensor<6x10xi32>, tensor<6x10xi32>) {
  %s = arith.addi %a, %b : tensor<6x10xi32>
  %d = arith.subi %a, %b : tensor<6x10xi32>
  %m = arith.muli %s, %d : tensor<6x10xi32>
  %an = arith.andi %m, %a : tensor<6x10xi32>
  %o = arith.ori %an, %b : tensor<6x10xi32>
  %x = arith.xori %o, %s : tensor<6x10xi32>
  %cl = math.ctlz %x : tensor<6x10xi32>
  return %m, %x, %cl : tensor<6x10xi32>, tensor<6x10xi32>, tensor<6x10xi32>
}
func.func @shifts(%a: tensor<6x10xi32>, %n: tensor<6x10xi32>, %q: tensor<6x10xi32>)
    -> (tensor<6x10xi32>, tensor<6x10xi32>, tensor<6x10xi32>, tensor<6x10xi32>,
        tensor<6x10xi32>) {
  %sh = arith.shli %a, %n : tensor<6x10xi32>
  %sr = arith.shrsi %a, %n : tensor<6x10xi32>
  %su = arith.shrui %a, %n : tensor<6x10xi32>
  %ds = arith.divsi %a, %q : tensor<6x10xi32>
  %du = arith.divui %a, %q : tensor<6x10xi32>
  return %sh, %sr, %su, %ds, %du : tensor<6x10xi32>, tensor<6x10xi32>, tensor<6x10xi32>,
                                   tensor<6x10xi32>, tensor<6x10xi32>
}
func.func @concats(%a: tensor<6x10xf32>, %b: tensor<6x10xi8>, %c: tensor<6x10xi16>,
                   %d: tensor<6x10xi64>)
    -> (tensor<6x20xf32>, tensor<6x20xi8>, tensor<6x20xi16>, tensor<6x20xi64>) {
  %0 = tensor.concat dim(1) %a, %a : (tensor<6x10xf32>, tensor<6x10xf32>) -> tensor<6x20xf32>
  %1 = tensor.concat dim(1) %b, %b : (tensor<6x10xi8>, tensor<6x10xi8>) -> tensor<6x20xi8>
  %2 = tensor.concat dim(1) %c, %c : (tensor<6x10xi16>, tensor<6x10xi16>) -> tensor<6x20xi16>
  %3 = tensor.concat dim(1) %d, %d : (tensor<6x10xi64>, tensor<6x10xi64>) -> tensor<6x20xi64>
  return %0, %1, %2, %3 : tensor<6x20xf32>, tensor<6x20xi8>, tensor<6x20xi16>,
                          tensor<6x20xi64>
}
"""

MATMUL = """
func.func @matmul(%a: tensor<13x33xf32>, %b: tensor<33x9xf32>) -> tensor<13x9xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<13x9xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<13x9xf32>) -> tensor<13x9xf32>
  %r = linalg.matmul ins(%a, %b : tensor<13x33xf32>, tensor<33x9xf32>)
                     outs(%f : tensor<13x9xf32>) -> tensor<13x9xf32>
  return %r : tensor<13x9xf32>
}
func.func @matmul_i8(%a: tensor<8x16xi8>, %b: tensor<16x4xi8>) -> tensor<8x4xi32> {
  %z = arith.constant 0 : i32
  %e = tensor.empty() : tensor<8x4xi32>
  %f = linalg.fill ins(%z : i32) outs(%e : tensor<8x4xi32>) -> tensor<8x4xi32>
  %r = linalg.matmul ins(%a, %b : tensor<8x16xi8>, tensor<16x4xi8>)
                     outs(%f : tensor<8x4xi32>) -> tensor<8x4xi32>
  return %r : tensor<8x4xi32>
}
"""

REDUCTIONS = """
func.func @reduce(%a: tensor<12x40xf32>) -> (tensor<12xf32>, tensor<40xf32>) {
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e0 = tensor.empty() : tensor<12xf32>
  %f0 = linalg.fill ins(%z : f32) outs(%e0 : tensor<12xf32>) -> tensor<12xf32>
  %sum = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (i)>],
                         iterator_types = ["parallel", "reduction"]}
      ins(%a : tensor<12x40xf32>) outs(%f0 : tensor<12xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %s = arith.addf %x, %acc : f32
    linalg.yield %s : f32
  } -> tensor<12xf32>
  %e1 = tensor.empty() : tensor<40xf32>
  %f1 = linalg.fill ins(%ninf : f32) outs(%e1 : tensor<40xf32>) -> tensor<40xf32>
  %max = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                          affine_map<(i, j) -> (j)>],
                         iterator_types = ["reduction", "parallel"]}
      ins(%a : tensor<12x40xf32>) outs(%f1 : tensor<40xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %m = arith.maximumf %x, %acc : f32
    linalg.yield %m : f32
  } -> tensor<40xf32>
  return %sum, %max : tensor<12xf32>, tensor<40xf32>
}
"""


def _inputs() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(4)
    f = lambda *s: (rng.standard_normal(s) * 3).astype(np.float32)  # noqa: E731
    i32 = lambda *s: rng.integers(-50000, 50000, s, dtype=np.int32)  # noqa: E731
    return {
        "f32ops": [f(6, 10), f(6, 10)],
        "neg": [f(6, 10)],
        "i32ops": [i32(6, 10), i32(6, 10)],
        "shifts": [i32(6, 10), rng.integers(0, 32, (6, 10), dtype=np.int32),
                   rng.integers(1, 100, (6, 10), dtype=np.int32)],
        "concats": [f(6, 10), rng.integers(-128, 128, (6, 10), dtype=np.int8),
                       rng.integers(-30000, 30000, (6, 10), dtype=np.int16),
                       rng.integers(-2**62, 2**62, (6, 10), dtype=np.int64)],
        "matmul": [f(13, 33), f(33, 9)],
        "matmul_i8": [rng.integers(-128, 128, (8, 16), dtype=np.int8),
                      rng.integers(-128, 128, (16, 4), dtype=np.int8)],
        "reduce": [f(12, 40)],
        "mlp": [f(4, 20)],
    }


PROGRAMS = {"elementwise": ELEMENTWISE, "matmul": MATMUL, "reductions": REDUCTIONS,
            "mlp": None}
CASES = [("elementwise", fn) for fn in ("f32ops", "neg", "i32ops", "shifts", "concats")] + [
    ("matmul", "matmul"), ("matmul", "matmul_i8"), ("reductions", "reduce"), ("mlp", "mlp")]


def _compile(program: str, flavour: str):
    source = PROGRAMS[program] or mlp_mlir()
    return compile_mlir(source, FLAVOURS[flavour])


def _bits(value) -> bytes:
    return np.ascontiguousarray(np.asarray(value)).tobytes()


# iree-compile 3.13 emits a null binding for the weights of a program with constants in
# inline-dynamic mode; IREE's hal_loader refuses it, and so does tinyhal's.
IREE_FAILS = {("mlp", "inline"): tinyhal.errors.InvalidArgumentError}


@pytest.mark.parametrize("flavour", list(FLAVOURS))
@pytest.mark.parametrize("program,function", CASES, ids=[f for _, f in CASES])
def test_vmvx_program_gives_iree_bits(program, function, flavour, tmp_path):
    vmfb = _compile(program, flavour)
    args = _inputs()[function]
    inputs = []
    for i, arg in enumerate(args):
        np.save(tmp_path / f"in{i}.npy", arg)
        inputs.append(f"--input=@{tmp_path / f'in{i}.npy'}")
    failure = IREE_FAILS.get((function, flavour))
    if failure is not None:
        rc, _ = iree_run_module(["--device=local-sync", f"--module={vmfb}",
                                 f"--function={function}", *inputs])
        assert rc != 0
        for driver in DRIVERS:
            with tinyhal.load(vmfb, device=driver) as module:
                with pytest.raises(failure):
                    module.invoke(function, *args)
        return
    with tinyhal.load(vmfb, device="sync") as module:
        ours = module.invoke(function, *args)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    outputs = [f"--output=@{tmp_path / f'out{i}.npy'}" for i in range(len(ours))]
    flags = [f"--module={vmfb}", f"--function={function}", *inputs]
    rc, text = iree_run_module(["--device=local-sync", *flags, *outputs])
    assert rc == 0, text
    theirs = [np.load(tmp_path / f"out{i}.npy") for i in range(len(ours))]
    assert [_bits(v) for v in ours] == [_bits(v) for v in theirs]
    for driver in ("task", "emu"):
        with tinyhal.load(vmfb, device=driver) as module:
            again = module.invoke(function, *args)
        again = list(again) if isinstance(again, tuple) else [again]
        assert [_bits(v) for v in again] == [_bits(v) for v in theirs], driver
    rc, expected = iree_run_module(["--device=local-task", *flags])
    assert rc == 0, expected
    for driver in DRIVERS:
        assert tinyhal_run([f"--device={driver}", *flags]) == (0, expected, ""), driver


def _vmvx_imports(vmfb) -> set[str]:
    """The `vmvx` functions the program's executables import."""
    names: set[str] = set()
    for segment in load_module(vmfb).rodata:
        data = bytes(segment.data)
        if data[:4] == b"PK\x03\x04":
            names |= {i.full_name for i in load_module(data).imports}
    return names


def test_the_programs_exercise_every_vmvx_operation():
    """Which of the `vmvx` module's operations the programs above reach (and so are
    compared with IREE bit for bit); the rest are named here."""
    used: set[str] = set()
    for program in PROGRAMS:
        for flavour in ("ukernels", "data-tiling"):
            used |= _vmvx_imports(_compile(program, flavour))
    exported = {f"vmvx.{e.name}" for e in VMVX_EXPORTS}
    assert used <= exported
    # shru: the compiler lowers it to VM code (checked directly in
    # test_vmvx_operation_checks_its_operands); query_tile_sizes: only for dynamic
    # shapes, in test_dynamic_data_tiled_matmul_gives_iree_bits.
    assert exported - used == {"vmvx.shru.2d.i32", "vmvx.query_tile_sizes.2d"}


def test_vmvx_executable_loads_through_the_hal(tmp_path):
    vmfb = _compile("elementwise", "ukernels")
    executables = [bytes(s.data) for s in load_module(vmfb).rodata
                   if bytes(s.data[:4]) == b"PK\x03\x04"]
    with create_device("sync", executable_policy="portable") as device:
        executable = device.load_executable(executables[0])
        assert isinstance(executable, VMVXExecutable)
        assert executable.format == "vmvx-bytecode-fb"
        assert device.query("hal.executable.format", "vmvx-bytecode-fb") == 1
        assert device.query("hal.executable.format", "embedded-elf-x86_64") == 0
        assert executable.exports[0].binding_count >= 2
        assert device.load_executable(executables[0]) is executable  # cached by content
    path = tmp_path / "executable.vmfb"
    path.write_bytes(executables[0])
    out = run_child("""
        import sys
        from tinyhal.errors import UnimplementedError
        from tinyhal.hal import create_device

        with create_device("sync") as device:
            try:
                device.load_executable(sys.argv[1])
            except UnimplementedError as exc:
                print("tinyhal.vm" in str(exc), "tinyhal.vm" in sys.modules)
    """, str(path))
    assert out.split() == ["True", "False"]  # the HAL alone names what registers VMVX


_ADD = """
func.func @main(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = arith.addf %a, %b : tensor<4x8xf32>
  %1 = math.exp %0 : tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
"""


def test_portable_policy_refuses_native_code_and_names_it():
    native = compile_mlir(_ADD, HOST_FLAGS)
    a = np.ones((4, 8), np.float32)
    with pytest.raises(tinyhal.Error) as info:
        tinyhal.load(native, device="sync", executable_policy="portable")
    assert "executable policy 'portable'" in str(info.value)
    assert "embedded-elf" in str(info.value)
    executable = next(bytes(s.data) for s in load_module(native).rodata
                      if bytes(s.data[:4]) == b"\x7fELF")
    with create_device("task", executable_policy="portable") as device:
        with pytest.raises(PermissionDeniedError, match="policy 'portable' refuses"):
            device.load_executable(executable, name="add_dispatch")
        with pytest.raises(PermissionDeniedError, match="'add_dispatch'"):
            device.load_executable(executable, name="add_dispatch")
    inline = compile_mlir(_ADD, HOST_FLAGS + ["--iree-execution-model=inline-dynamic"])
    with pytest.raises(tinyhal.errors.UnavailableError, match="policy 'portable'"):
        tinyhal.load(inline, device="sync", executable_policy="portable")
    with tinyhal.load(native, device="sync") as module:  # the default policy: any
        expected = module.main(a, a)
    both = compile_mlir(_ADD, HOST_FLAGS + ["--iree-hal-local-target-device-backends=vmvx"])
    for driver in DRIVERS:
        with tinyhal.load(both, device=driver, executable_policy="portable") as module:
            assert _bits(module.main(a, a)) == _bits(expected)
            kinds = {type(e).__name__ for e in module.device._executables.values()}
            assert kinds == {"VMVXExecutable"}
    with pytest.raises(tinyhal.Error, match="executable_policy must be one of"):
        create_device("sync", executable_policy="trusting")


def test_tinyhal_run_executable_policy(tmp_path):
    native = compile_mlir(_ADD, HOST_FLAGS)
    vmvx = compile_mlir(_ADD, VMVX)
    flags = ["--function=main", "--input=4x8xf32=1", "--input=4x8xf32=2"]
    rc, out, err = tinyhal_run(["--device=sync", "--executable_policy=portable",
                                f"--module={native}", *flags])
    assert rc == 1 and "executable policy 'portable'" in err
    rc_iree, expected = iree_run_module(["--device=local-sync", f"--module={vmvx}", *flags])
    assert rc_iree == 0
    assert tinyhal_run(["--device=task", "--executable_policy=portable",
                        f"--module={vmvx}", *flags]) == (0, expected, "")


@pytest.mark.parametrize("shape", [(13, 33, 9), (40, 17, 33), (1, 5, 1)])
def test_dynamic_data_tiled_matmul_gives_iree_bits(shape):
    """Dynamic shapes with data tiling ask the microkernels for their tile sizes at run
    time (`query_tile_sizes.2d`): tinyhal answers as IREE's do on this host, so `mmt4d`
    runs the same tile function, fused multiply-adds where IREE's has them."""
    from support.models import iree_function

    vmfb = compile_mlir(DYNAMIC_MATMUL, FLAVOURS["data-tiling"])
    assert "vmvx.query_tile_sizes.2d" in _vmvx_imports(vmfb)
    m, k, n = shape
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    expected = iree_function(vmfb, "matmul", "local-task")(a, b)
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver) as module:
            assert _bits(module.matmul(a, b)) == _bits(expected), driver


TRANSPOSE = """
func.func @transpose(%a: tensor<6x10xf32>) -> tensor<10x6xf32> {
  %e = tensor.empty() : tensor<10x6xf32>
  %t = linalg.transpose ins(%a : tensor<6x10xf32>) outs(%e : tensor<10x6xf32>)
       permutation = [1, 0]
  return %t : tensor<10x6xf32>
}
"""


def test_out_of_bounds_copy_fails_as_in_iree():
    """iree-compile 3.13 lowers this transpose with microkernels to a `copy.2d.x32`
    whose source range overruns its binding; IREE's runtime refuses it
    (OUT_OF_RANGE), and so does tinyhal, on every driver, naming the operand."""
    vmfb = compile_mlir(TRANSPOSE, FLAVOURS["ukernels"])
    flags = [f"--module={vmfb}", "--function=transpose", "--input=6x10xf32=1"]
    rc, _ = iree_run_module(["--device=local-sync", *flags])
    assert rc != 0
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver) as module:
            with pytest.raises(tinyhal.errors.OutOfRangeError,
                               match=r"copy|vmvx in: range \[0, 384\)"):
                module.transpose(np.ones((6, 10), np.float32))
    with tinyhal.load(compile_mlir(TRANSPOSE, FLAVOURS["loops"]), device="task") as module:
        a = np.arange(60, dtype=np.float32).reshape(6, 10)
        assert np.array_equal(module.transpose(a), a.T)


def test_vmvx_operation_checks_its_operands():
    """Operands are mapped as IREE maps them: out of bounds, misplaced writes and
    division faults are errors, never a crash or a silent wrap."""
    module = create_vmvx_module()
    add = module.lookup("vmvx.add.2d.f32").fn
    small = VMBuffer(bytearray(16))
    big = VMBuffer(bytearray(64))
    with pytest.raises(tinyhal.errors.OutOfRangeError, match="out of bounds"):
        add(big, 0, 4, 1, big, 0, 4, 1, small, 0, 4, 1, 4, 4)
    with pytest.raises(PermissionDeniedError):
        add(big, 0, 4, 1, big, 0, 4, 1, VMBuffer(bytes(64)), 0, 4, 1, 4, 4)
    with pytest.raises(tinyhal.errors.InvalidArgumentError, match="buffer overflow"):
        add(big, 0, -4, 1, big, 0, 4, 1, big, 0, 4, 1, 4, 4)
    with pytest.raises(tinyhal.errors.InvalidArgumentError, match="without overlapping"):
        add(big, 0, 0, 1, big, 0, 0, 1, big, 0, 0, 1, 1 << 30, 4)  # one row, 2**30 times
    divs = module.lookup("vmvx.divs.2d.i32").fn
    with pytest.raises(tinyhal.errors.InvalidArgumentError, match="division fault"):
        divs(big, 0, 4, 1, VMBuffer(bytearray(64)), 0, 4, 1, big, 0, 4, 1, 4, 4)
    shru = module.lookup("vmvx.shru.2d.i32").fn
    values = np.array([-1, -8, -(1 << 31), 7], np.int32)
    counts = np.array([1, 35, 31, 0], np.int32)  # counts taken modulo 32, as x86 does
    shifted = np.zeros(4, np.int32)
    shru(VMBuffer(memoryview(values).cast("B")), 0, 4, 1,
         VMBuffer(memoryview(counts).cast("B")), 0, 4, 1,
         VMBuffer(memoryview(shifted).cast("B")), 0, 4, 1, 1, 4)
    assert shifted.tolist() == [0x7FFFFFFF, 0x1FFFFFFF, 1, 7]
    query = module.lookup("vmvx.query_tile_sizes.2d").fn
    (m0, k0), (n0, k0_rhs), result = (query(13, 33, 0x0101), query(33, 9, 0x0102),
                                      query(13, 9, 0x0103))
    assert k0 == k0_rhs and result == (m0, n0)
    with pytest.raises(tinyhal.errors.InvalidArgumentError, match="no matmul operand"):
        query(1, 1, 0x0104)
    lhs = np.arange(16, dtype=np.float32)
    out = np.zeros(16, np.float32)
    add(VMBuffer(memoryview(lhs).cast("B")), 0, 4, 1, VMBuffer(memoryview(lhs).cast("B")),
        0, 1, 4, VMBuffer(memoryview(out).cast("B")), 0, 4, 1, 4, 4)
    grid = lhs.reshape(4, 4)
    assert np.array_equal(out.reshape(4, 4), grid + grid.T)


@pytest.mark.timeout(600)
def test_small_cnn_compiled_to_vmvx_gives_iree_bits():
    """The tests' small CNN (three strided conv + ReLU layers, global pool, dense; from
    ONNX) compiled to VMVX, plain and with data tiling: iree.runtime's bits on every
    driver. Its convolutions are VM loops, which the C interpreter runs (seconds a run
    when they were Python)."""
    from support.models import import_onnx, iree_function, small_cnn_onnx

    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    for flavour in ("loops", "data-tiling"):
        vmfb = compile_mlir(import_onnx(small_cnn_onnx()), FLAVOURS[flavour])
        expected = iree_function(vmfb, "small_cnn")(x)
        for driver in DRIVERS:
            with tinyhal.load(vmfb, device=driver) as module:
                assert _bits(module.small_cnn(x)) == _bits(expected), (flavour, driver)


LARGE = """
func.func @main(%a: tensor<96x1000xf32>, %b: tensor<96x1000xf32>) -> tensor<96x1000xf32> {
  %0 = arith.addf %a, %b : tensor<96x1000xf32>
  %1 = math.exp %0 : tensor<96x1000xf32>
  return %1 : tensor<96x1000xf32>
}
"""


def test_many_workgroups_run_on_every_driver():
    """A dispatch of many workgroups: on `task` the native helper threads call into the
    VM too (each workgroup one callback, serialised by the GIL), with IREE's bits."""
    from support.models import iree_function

    vmfb = compile_mlir(LARGE, FLAVOURS["ukernels"])
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((96, 1000)).astype(np.float32) for _ in range(2))
    expected = iree_function(vmfb, "main", "local-task")(a, b)
    for driver in DRIVERS:
        with tinyhal.load(vmfb, device=driver) as module:
            assert _bits(module.main(a, b)) == _bits(expected), driver


# iree-compile 3.13 cannot lower these for VMVX (f16 and f64 conversions); the rest of
# the VM corpus's single-call programs run.
VMVX_UNCOMPILABLE = {"f16_ops", "conversions"}
CORPUS = [c for c in CORPUS_CASES if len(c.calls) == 1 and c.program not in VMVX_UNCOMPILABLE]


def _iree_results(vmfb, function: str, args) -> list:
    import iree.runtime as rt

    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.mmap(context.instance, str(vmfb)))
    results = context.modules.module[function](*args)
    if not isinstance(results, (list, tuple)):
        results = [results]
    return [r.to_host() if hasattr(r, "to_host") else r for r in results]


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_corpus_program_compiled_to_vmvx_gives_iree_bits(case):
    """The VM corpus (programs written for llvm-cpu), compiled to VMVX with data tiling:
    iree.runtime's bits, or its failure (multi_result: iree-compile's VMVX lowering
    overruns a binding, and both runtimes refuse it with OUT_OF_RANGE)."""
    source = (CORPUS_DIR / f"{case.program}.mlir").read_text()
    flags = [f for f in corpus_flags(source) if "llvmcpu" not in f]
    vmfb = compile_mlir(source, FLAVOURS["data-tiling"] + flags)
    function, args = case.calls[0]
    try:
        expected = _iree_results(vmfb, function, args)
    except Exception as exc:  # noqa: BLE001 - IREE's runtime raises plain exceptions
        assert "OUT_OF_RANGE" in str(exc)
        with tinyhal.load(vmfb, device="task") as module:
            with pytest.raises(tinyhal.errors.OutOfRangeError):
                module.invoke(function, *args)
        return
    with tinyhal.load(vmfb, device="task") as module:
        ours = module.invoke(function, *args)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    assert [_bits(v) for v in ours] == [_bits(v) for v in expected]
