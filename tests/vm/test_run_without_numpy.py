"""`tinyhal-run` on plain inputs and outputs needs no numpy: text inputs are parsed with
`struct`, results printed from their bytes, buffers are plain memory. numpy's import
alone is ~60 ms and ~15 MiB, more than the rest of the tool, so a small module's run
stays near `iree-run-module`'s cost only without it. What prints must still be
`iree-run-module`'s output byte for byte, for every element type that takes this path;
`.npy` files of whole-byte types are read and written without numpy too. Nor does it
import `platform` (a few ms; the CPU's architecture comes from `os.uname`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.child import run_child
from support.iree_tools import HOST_FLAGS, compile_mlir

IREE_RUN = str(Path(sys.executable).with_name("iree-run-module"))

ELEMENTWISE = """
func.func @{name}(%a: tensor<2x3x{t}>, %b: tensor<2x3x{t}>) -> tensor<2x3x{t}> {{
  %init = tensor.empty() : tensor<2x3x{t}>
  %r = linalg.generic {{indexing_maps = [affine_map<(i, j) -> (i, j)>,
                                        affine_map<(i, j) -> (i, j)>,
                                        affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}}
      ins(%a, %b : tensor<2x3x{t}>, tensor<2x3x{t}>) outs(%init : tensor<2x3x{t}>) {{
    ^bb0(%x: {t}, %y: {t}, %o: {t}):
      %z = arith.{op} %x, %y : {t}
      linalg.yield %z : {t}
  }} -> tensor<2x3x{t}>
  return %r : tensor<2x3x{t}>
}}
"""
TYPES = {"f32": "addf", "f16": "addf", "bf16": "addf", "i8": "addi",
         "i16": "addi", "i32": "addi", "i64": "addi", "i1": "xori"}
EXTRA = """
func.func @scalars(%a: i32, %b: f32) -> (i32, f32, tensor<f32>) {
  %c = arith.muli %a, %a : i32
  %d = arith.mulf %b, %b : f32
  %t = tensor.from_elements %d : tensor<f32>
  return %c, %d, %t : i32, f32, tensor<f32>
}
"""
PROGRAM = "".join(ELEMENTWISE.format(name=f"add_{t}", t=t, op=op)
                  for t, op in TYPES.items()) + EXTRA

CASES = {
    "f32": ["--input=2x3xf32=[1 2.5 -3][1e10 nan -inf]", "--input=2x3xf32=0.1"],
    "f16": ["--input=2x3xf16=[1 65504 -3][0.00001 nan inf]", "--input=2x3xf16=0.1"],
    "bf16": ["--input=2x3xbf16=1.5,3.3e38,-2,0.1,nan,-inf", "--input=2x3xbf16=3.3e38"],
    "i8": ["--input=2x3xi8=-128 127 5 -1 0 100", "--input=2x3xi8=1 1 -6 -128 0 100"],
    "i16": ["--input=2x3xi16=-32768 32767 5 -1 0 100", "--input=2x3xi16=-1"],
    "i32": ["--input=2x3xi32=[-2147483648 7 8][9 10 2147483647]", "--input=2x3xi32=1"],
    "i64": ["--input=2x3xi64=-9223372036854775808 1 2 3 4 5", "--input=2x3xi64=-1"],
    "i1": ["--input=2x3xi1=01 00 01 00 01 01", "--input=2x3xi1=01"],
}


@pytest.fixture(scope="module")
def vmfb() -> str:
    return str(compile_mlir(PROGRAM, HOST_FLAGS))


def _iree_run(flags: list[str]) -> str:
    proc = subprocess.run([IREE_RUN, "--device=local-task", *flags], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _tinyhal_runs(runs: dict[str, list[str]]) -> dict[str, str]:
    """Each run's stdout, all in one fresh child that then checks numpy never loaded."""
    out = run_child("""
        import io, json, sys
        from tinyhal.vm.run import run

        outputs = {}
        for name, flags in json.loads(sys.argv[1]).items():
            stdout = io.StringIO()
            assert run(["--device=task", *flags], stdout=stdout, stderr=sys.stderr) == 0
            outputs[name] = stdout.getvalue()
        print(json.dumps({"outputs": outputs,
                          "loaded": [m for m in ("numpy", "ml_dtypes", "platform")
                                     if m in sys.modules]}))
    """, json.dumps(runs))
    result = json.loads(out)
    assert result["loaded"] == []
    return result["outputs"]


def test_every_plain_element_type_prints_as_iree_does_without_numpy(vmfb):
    runs = {t: [f"--module={vmfb}", f"--function=add_{t}", *inputs]
            for t, inputs in CASES.items()}
    runs["scalars"] = [f"--module={vmfb}", "--function=scalars", "--input=-46341",
                       "--input=1e20"]
    runs["elided"] = [*runs["f32"], "--output_max_element_count=4"]
    ours = _tinyhal_runs(runs)
    for name, flags in runs.items():
        assert ours[name] == _iree_run(flags), name


def test_npy_files_in_and_out_without_numpy(vmfb, tmp_path):
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 3
    np.save(tmp_path / "a.npy", a)
    with open(tmp_path / "ab.npy", "wb") as f:
        np.save(f, np.arange(6, dtype=np.int32).reshape(2, 3))
        np.save(f, np.full((2, 3), -7, np.int32))
    runs = {
        "f32": [f"--module={vmfb}", "--function=add_f32", f"--input=@{tmp_path / 'a.npy'}",
                f"--input=@{tmp_path / 'a.npy'}", f"--output=@{tmp_path / 'OUT.npy'}"],
        "i32": [f"--module={vmfb}", "--function=add_i32", f"--input=@{tmp_path / 'ab.npy'}",
                f"--input=+{tmp_path / 'ab.npy'}", f"--output=+{tmp_path / 'OUT.npy'}"],
    }
    ours = _tinyhal_runs({name: [f.replace("OUT", "ours") for f in flags]
                          for name, flags in runs.items()})
    for name, flags in runs.items():
        assert ours[name] == _iree_run([f.replace("OUT", "iree") for f in flags]), name
    assert (tmp_path / "ours.npy").read_bytes() == (tmp_path / "iree.npy").read_bytes()
    with open(tmp_path / "ours.npy", "rb") as f:
        assert np.array_equal(np.load(f), a + a)
        assert np.load(f).tolist() == [[-7, -6, -5], [-4, -3, -2]]

    scalars = [f"--module={vmfb}", "--function=scalars", "--input=-46341", "--input=1e20"] + [
        f"--output=@{tmp_path / f'r{i}.npy'}" for i in range(3)]
    assert _tinyhal_runs({"scalars": scalars})["scalars"] == "EXEC @scalars\n"
    values = [np.load(tmp_path / f"r{i}.npy") for i in range(3)]
    assert values[0].dtype == np.int32 and values[0].item() == 46341 * 46341 - (1 << 32)
    assert values[1].dtype == np.float32 and values[1].item() == np.float32(np.inf)
    assert values[2].dtype == np.float32 and values[2].shape == () and np.isinf(values[2])
