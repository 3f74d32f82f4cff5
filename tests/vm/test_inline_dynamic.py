"""TinyIREE's inline execution: programs compiled with
`--iree-execution-model=inline-dynamic` (imports `hal_inline` and `hal_loader`, no `hal`)
give iree-run-module's bits on every driver, through `tinyhal.load` and `tinyhal-run`.
The programs are the VM corpus's single-call cases, recompiled for inline execution."""

from __future__ import annotations

import re

import numpy as np
import pytest
from programs.corpus import CASES, PROGRAMS_DIR, program_flags

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from support.run_compare import iree_run_module, tinyhal_run

INLINE = ["--iree-execution-model=inline-dynamic"]
DRIVERS = ["sync", "task", "emu"]


def _simple(value) -> bool:
    return isinstance(value, np.ndarray) and value.dtype in (np.float32, np.int32) or (
        isinstance(value, (int, float)) and not isinstance(value, bool))


SINGLE = [c for c in CASES if len(c.calls) == 1 and not c.ulps
          and all(_simple(a) for a in c.calls[0][1])][:14]


def _compile(case) -> object:
    source = (PROGRAMS_DIR / f"{case.program}.mlir").read_text()
    return compile_mlir(source, HOST_FLAGS + program_flags(source) + INLINE)


@pytest.mark.parametrize("case", SINGLE, ids=[c.id for c in SINGLE])
def test_inline_program_gives_iree_bits(case, tmp_path):
    vmfb = _compile(case)
    function, args = case.calls[0]
    inputs = []
    for i, arg in enumerate(args):
        if isinstance(arg, np.ndarray):
            np.save(tmp_path / f"in{i}.npy", arg)
            inputs.append(f"--input=@{tmp_path / f'in{i}.npy'}")
        else:
            inputs.append(f"--input={arg}")
    with tinyhal.load(vmfb, device="sync") as module:
        assert not any(m.name == "hal" for m in module.bytecode.dependencies)
        ours = module.invoke(function, *args)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    outputs = [f"--output=@{tmp_path / f'out{i}.npy'}" for i in range(len(ours))]
    rc, text = iree_run_module(["--device=local-sync", f"--module={vmfb}",
                                f"--function={function}", *inputs, *outputs])
    assert rc == 0, text
    for i, value in enumerate(ours):
        theirs = np.load(tmp_path / f"out{i}.npy")
        assert np.asarray(value).tobytes() == theirs.tobytes(), f"result {i}"
    for driver in ("task", "emu"):
        with tinyhal.load(vmfb, device=driver) as module:
            again = module.invoke(function, *args)
        again = list(again) if isinstance(again, tuple) else [again]
        assert all(np.asarray(a).tobytes() == np.asarray(b).tobytes()
                   for a, b in zip(again, ours)), driver
        flags = [f"--device={driver}", f"--module={vmfb}", f"--function={function}", *inputs]
        rc_ours, out_ours, err = tinyhal_run(flags)
        rc_iree, out_iree = iree_run_module(["--device=local-sync", *flags[1:]])
        assert (rc_ours, err) == (0, "") and out_ours == out_iree


def test_inline_program_memory_is_exact(tmp_path):
    """Every byte an inline program allocates is a buffer of the device allocator: the
    peak after a call is what the program held, and it all returns afterwards."""
    case = next(c for c in SINGLE if c.program.startswith("matmul"))
    vmfb = _compile(case)
    function, args = case.calls[0]
    with tinyhal.load(vmfb, device="task") as module:
        before = module.statistics()
        result = module.invoke(function, *args)
        after = module.statistics()
        assert after.peak_bytes > before.live_bytes
        del result
        assert module.statistics().live_bytes <= after.live_bytes


TWO_RESULTS = """
func.func @main(%x: tensor<256xf32>, %y: tensor<128xf32>) -> (tensor<256xf32>, tensor<128xf32>) {
  %a = arith.mulf %x, %x : tensor<256xf32>
  %b = arith.addf %y, %y : tensor<128xf32>
  return %a, %b : tensor<256xf32>, tensor<128xf32>
}
"""


def test_inline_peak_memory_is_the_bytes_the_program_allocates():
    """The allocator's peak over a call is exactly the inputs plus every
    `hal_inline.buffer.allocate` of the compiled program (read from its VM IR), on every
    driver, and the same peak as the program compiled for the full HAL."""
    ir = compile_mlir(TWO_RESULTS, HOST_FLAGS + INLINE + ["--compile-to=vm"], ".mlir")
    sizes = dict(re.findall(r"(%c\d+) = vm\.const\.i64 (\d+)", ir.read_text()))
    allocated = [int(sizes[size]) for size in re.findall(
        r"@hal_inline\.buffer\.allocate\(%\w+, (%\w+)\)", ir.read_text())]
    assert allocated
    x, y = np.linspace(0, 1, 256, dtype=np.float32), np.linspace(0, 1, 128, dtype=np.float32)
    expected_peak = x.nbytes + y.nbytes + sum(allocated)
    full = compile_mlir(TWO_RESULTS, HOST_FLAGS)
    for vmfb in (compile_mlir(TWO_RESULTS, HOST_FLAGS + INLINE), full):
        for driver in DRIVERS:
            with tinyhal.load(vmfb, device=driver) as module:
                assert module.statistics().peak_bytes == 0
                a, b = module.main(x, y)
                assert a.tobytes() == (x * x).tobytes() and b.tobytes() == (y + y).tobytes()
                assert module.statistics().peak_bytes == expected_peak, (vmfb, driver)
                module.trim()
                assert module.statistics().live_bytes == 0
