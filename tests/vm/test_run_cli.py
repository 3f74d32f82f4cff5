"""`tinyhal-run` prints what `iree-run-module` prints for the same module and flags."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from programs.corpus import compile_program

from tinyhal.vm.run import run

IREE_RUN = str(Path(sys.executable).with_name("iree-run-module"))
TINYHAL_RUN = str(Path(sys.executable).with_name("tinyhal-run"))


def iree_run(args: list[str]) -> tuple[int, str]:
    proc = subprocess.run([IREE_RUN, "--device=local-sync", *args], capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, proc.stdout


def tinyhal_run(args: list[str], device: str = "sync") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run([f"--device={device}", *args], stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


CLI_CASES = [
    ("add_f32", ["--input=4xf32=1,2,3,4", "--input=4xf32=0.5 0.25 -1 1e10"]),
    ("matmul_odd", ["--input=13x17xf32=0.125", "--input=17x11xf32=3"]),
    ("matmul_dynamic", ["--input=2x3xf32=[1 2 3][4 5 6]", "--input=3x2xf32=[1,0][0,1][1,1]"]),
    ("compare_select", ["--input=3x7xf32=1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21",
                        "--input=3x7xf32=5"]),
    ("scalar_i32", ["--input=-7", "--input=3"]),
    ("scalar_i64", ["--input=1099511627779", "--input=12345"]),
    ("scalar_f32", ["--input=1.5", "--input=0.3"]),
    ("scalar_f64", ["--input=1.5", "--input=-3"]),
    ("f16_ops", ["--input=33xf16=1.5", "--input=33xf16=0.1"]),
    ("f64_math", ["--input=4x5xf64=2.5"]),
    ("dynamic_reduce", ["--input=2x3xf32=[1,2,3][4,5,6]"]),
    ("bool_logic", ["--input=9xi1=01 00 01 00 01 01 01 00 00", "--input=9xi1=01", "--input=1"]),
    ("while_collatz", ["--input=i64=27"]),
    ("globals_counter", ["--function=accumulate", "--input=4xf32=1 2 3 4"]),
    ("int_widths", ["--function=i8ops", "--input=16xi8=-5", "--input=16xui8=200"]),
    ("conversions", ["--input=12xf32=-3.7", "--input=12xi32=300"]),
    ("reduce_sum", ["--input=7x129xf32=0.5", "--output_max_element_count=3"]),
    ("multi_result", ["--input=4x6xf32=1", "--input=4x6xf32=2", "--output=-", "--output=",
                      "--output=-", "--output=-"]),
    ("large_grid", ["--input=1024x1024xf32=1.5", "--input=1024x1024xf32=2"]),
]


@pytest.mark.parametrize("program,args", CLI_CASES, ids=[c[0] for c in CLI_CASES])
@pytest.mark.parametrize("device", ["sync", "task"])
def test_same_output_as_iree_run_module(program, args, device):
    vmfb = str(compile_program(program))
    flags = [f"--module={vmfb}", *args]
    if program not in ("globals_counter", "int_widths") and not any(
            a.startswith("--function") for a in args):
        flags.append("--function=main")
    rc_iree, out_iree = iree_run(flags)
    rc, out, err = tinyhal_run(flags, device)
    assert rc_iree == 0, out_iree
    assert (rc, err) == (0, "")
    assert out == out_iree


def test_npy_inputs_and_outputs(tmp_path):
    vmfb = str(compile_program("multi_result"))
    a = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    b = np.full((4, 6), -2.5, np.float32)
    np.save(tmp_path / "a.npy", a)
    with open(tmp_path / "ab.npy", "wb") as f:
        np.save(f, a)
        np.save(f, b)
    common = [f"--module={vmfb}", "--function=main"]
    for inputs in ([f"--input=@{tmp_path}/a.npy", "--input=4x6xf32=-2.5"],
                   [f"--input=@{tmp_path}/ab.npy", f"--input=+{tmp_path}/ab.npy"]):
        outs = {}
        for tool in ("iree", "tinyhal"):
            o = tmp_path / f"{tool}.npy"
            flags = [*common, *inputs, f"--output=@{o}", f"--output=+{o}", "--output=",
                     f"--output=@{tmp_path}/{tool}.bin"]
            if tool == "iree":
                rc, _ = iree_run(flags)
            else:
                rc, _, err = tinyhal_run(flags)
                assert err == ""
            assert rc == 0
            with open(o, "rb") as f:
                outs[tool] = (np.load(f), np.load(f), (tmp_path / f"{tool}.bin").read_bytes())
        for mine, theirs in zip(outs["tinyhal"], outs["iree"]):
            if isinstance(mine, bytes):
                assert mine == theirs
            else:
                assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
        np.testing.assert_array_equal(outs["tinyhal"][0], a + b)


def test_scalar_output_to_npy(tmp_path):
    vmfb = str(compile_program("scalar_i32"))
    flags = [f"--module={vmfb}", "--input=i32=9", "--input=4"] + [
        f"--output=@{tmp_path}/r{i}.npy" for i in range(5)]
    rc, out, err = tinyhal_run(flags)
    assert (rc, err) == (0, ""), err
    assert out == "EXEC @main\n"
    values = [np.load(tmp_path / f"r{i}.npy") for i in range(5)]
    assert [v.item() for v in values] == [13, 36, 2, 1, 0]
    assert all(v.shape == () and v.dtype == np.int32 for v in values)


BAD = [
    (["--input=4xf32=1,2,3,4"], "argument"),  # too few inputs
    (["--input=4xf32=1", "--input=4xf32=1", "--input=4xf32=1"], "fewer input"),
    (["--input=5xf32=1", "--input=4xf32=1"], "input0"),  # wrong shape
    (["--input=4xi32=1", "--input=4xf32=1"], "input0"),  # wrong dtype
    (["--input=4xf32=1,2,x", "--input=4xf32=1"], "invalid floating-point value 'x'"),
    (["--input=4xf32=1,2,3,4,5", "--input=4xf32=1"], "overflow"),
    (["--input=4xf32=1,2", "--input=4xf32=1"], "underflow"),
    (["--input=4xq32=1", "--input=4xf32=1"], "element type"),
    (["--input=@/nonexistent/x.npy", "--input=4xf32=1"], "cannot open"),
    (["--input=7", "--input=4xf32=1"], "shape/type"),
    (["--function=nope"], "nope"),
    (["--input=4xf32=1", "--input=4xf32=1", "--output=-", "--output=-"], "outputs specified"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_message_not_a_traceback(args, needle):
    vmfb = str(compile_program("add_f32"))
    flags = [f"--module={vmfb}", *args]
    if not any(a.startswith("--function") for a in args):
        flags.append("--function=main")
    rc, _out, err = tinyhal_run(flags)
    assert rc == 1
    assert needle in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_console_script_runs_and_fails_cleanly():
    vmfb = str(compile_program("add_f32"))
    ok = subprocess.run([TINYHAL_RUN, f"--module={vmfb}", "--device=local-sync",
                         "--input=4xf32=1", "--input=4xf32=2"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "EXEC @main\nresult[0]: hal.buffer_view\n4xf32=3 3 3 3\n"
    bad = subprocess.run([TINYHAL_RUN, "--module=/nonexistent.vmfb"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0
    assert "Traceback" not in bad.stderr and "NOT_FOUND: module file not found" in bad.stderr
