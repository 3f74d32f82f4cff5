"""`tinyhal-check`, iree-check-module's drop-in: a check-dialect test suite written here,
with passing and deliberately failing checks, run on every driver.

iree-check-module is not shipped in the pinned `iree-base-runtime` wheel, so the expected
verdicts are IREE's semantics as `modules/check/module.cc` and
`tools/iree-check-module-main.cc` define them: a failed expectation fails its test but
the test runs on (gtest `EXPECT_*`), every export is one test in a fresh context, the
exit status is 1 when any test failed, and `--expect_failure` inverts it.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tinyhal
from support.iree_tools import HOST_FLAGS, compile_mlir
from tinyhal.vm.check import check_failures, create_check_module, run

TINYHAL_CHECK = str(Path(sys.executable).with_name("tinyhal-check"))

SUITE_MLIR = """
func.func @true_passes() {
  %c = util.unfoldable_constant 3 : i32
  check.expect_true(%c) : i32
  return
}
func.func @true_fails() {
  %c = util.unfoldable_constant 0 : i32
  check.expect_true(%c) : i32
  return
}
func.func @false_passes() {
  %c = util.unfoldable_constant 0 : i32
  check.expect_false(%c) : i32
  return
}
func.func @false_fails() {
  %c = util.unfoldable_constant 5 : i32
  check.expect_false(%c) : i32
  return
}
func.func @all_true_passes() {
  %t = util.unfoldable_constant dense<[1, -2, 3]> : tensor<3xi32>
  check.expect_all_true(%t) : tensor<3xi32>
  return
}
func.func @all_true_fails() {
  %t = util.unfoldable_constant dense<[1, 0, 3, 0]> : tensor<4xi32>
  check.expect_all_true(%t) : tensor<4xi32>
  return
}
func.func @eq_passes() {
  %a = util.unfoldable_constant dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>
  %b = arith.addi %a, %a : tensor<2x2xi32>
  %c = util.unfoldable_constant dense<[[2, 4], [6, 8]]> : tensor<2x2xi32>
  check.expect_eq(%b, %c) : tensor<2x2xi32>
  return
}
func.func @eq_const_passes() {
  %a = util.unfoldable_constant dense<[1.5, 2.0]> : tensor<2xf32>
  %b = arith.mulf %a, %a : tensor<2xf32>
  check.expect_eq_const(%b, dense<[2.25, 4.0]> : tensor<2xf32>) : tensor<2xf32>
  return
}
func.func @eq_const_fails() {
  %a = util.unfoldable_constant dense<[1, 2, 3]> : tensor<3xi32>
  %b = arith.muli %a, %a : tensor<3xi32>
  check.expect_eq_const(%b, dense<[1, 4, 10]> : tensor<3xi32>) : tensor<3xi32>
  return
}
func.func @almost_eq_passes() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  %b = util.unfoldable_constant dense<[1.00001, 2.00005]> : tensor<2xf32>
  check.expect_almost_eq(%a, %b) : tensor<2xf32>
  return
}
func.func @almost_eq_const_fails() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  check.expect_almost_eq_const(%a, dense<[1.0, 2.5]> : tensor<2xf32>) : tensor<2xf32>
  return
}
func.func @almost_eq_const_tolerances_pass() {
  %a = util.unfoldable_constant dense<[1.0, 2.0]> : tensor<2xf32>
  check.expect_almost_eq_const(%a, dense<[1.0, 2.5]> : tensor<2xf32>, atol 1.0e-2, rtol 0.5) : tensor<2xf32>
  return
}
func.func @bf16_almost_eq_passes() {
  %a = util.unfoldable_constant dense<[1.0, 3.0]> : tensor<2xbf16>
  %b = arith.addf %a, %a : tensor<2xbf16>
  check.expect_almost_eq_const(%b, dense<[2.0, 6.0]> : tensor<2xbf16>) : tensor<2xbf16>
  return
}
func.func @fp8_eq_fails() {
  %a = util.unfoldable_constant dense<[1.0, 3.0]> : tensor<2xf8E4M3FN>
  %b = arith.mulf %a, %a : tensor<2xf8E4M3FN>
  check.expect_eq_const(%b, dense<[1.0, 8.0]> : tensor<2xf8E4M3FN>) : tensor<2xf8E4M3FN>
  return
}
func.func @fails_twice_and_runs_on() {
  %z = util.unfoldable_constant 0 : i32
  %o = util.unfoldable_constant 1 : i32
  check.expect_true(%z) : i32
  check.expect_false(%o) : i32
  check.expect_true(%o) : i32
  return
}
"""

PASSING = {"true_passes", "false_passes", "all_true_passes", "eq_passes", "eq_const_passes",
           "almost_eq_passes", "almost_eq_const_tolerances_pass", "bf16_almost_eq_passes"}
FAILING = {"true_fails": 1, "false_fails": 1, "all_true_fails": 1, "eq_const_fails": 1,
           "almost_eq_const_fails": 1, "fp8_eq_fails": 1, "fails_twice_and_runs_on": 2}


@pytest.fixture(scope="module")
def suite_vmfb() -> str:
    return str(compile_mlir(SUITE_MLIR, HOST_FLAGS))


def _check(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run(args, stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def _verdicts(out: str) -> dict[str, str]:
    return {m.group(2): m.group(1).strip() for m in
            re.finditer(r"^\[ +(OK|FAILED) +\] module\.(\w+) \(\d+ ms\)$", out, re.M)}


@pytest.mark.parametrize("device", ["sync", "task", "emu"])
def test_suite_verdicts_and_exit_code(suite_vmfb, device):
    rc, out, err = _check([f"--module={suite_vmfb}", f"--device={device}"])
    assert err == ""
    assert rc == 1
    verdicts = _verdicts(out)
    assert verdicts == {**{n: "OK" for n in PASSING}, **{n: "FAILED" for n in FAILING}}
    for name, count in FAILING.items():
        block = out.split(f"[ RUN      ] module.{name}\n")[1].split("[  FAILED  ]")[0]
        assert block.count("Failure\n") == count, block
    assert out.startswith(f"[==========] Running {len(verdicts)} tests from 1 test suite.\n")
    assert f"[  PASSED  ] {len(PASSING)} tests.\n" in out
    assert f"[  FAILED  ] {len(FAILING)} tests, listed below:\n" in out
    assert out.endswith(f"\n {len(FAILING)} FAILED TESTS\nTest failed\nOK\n")


def test_failure_messages_are_irees(suite_vmfb):
    _, out, _ = _check([f"--module={suite_vmfb}", "--device=sync"])
    assert "Expected 0 to be nonzero.\n" in out
    assert "Expected 5 to be zero.\n" in out
    assert "whose element #1 equals 0" in out
    assert ("Expected equality of these values. Contents does not match.\n  lhs:\n"
            "    3xi32=1 4 9\n  rhs:\n    3xi32=1 4 10\n") in out
    assert ("Expected near equality of these values. Contents does not match to tolerance "
            "parameters atol=0.0001, rtol=0. The first failure occurs at index 1 as the lhs "
            "value 2 differs from the rhs value 2.5 by 5.000e-01.\n  lhs:\n    2xf32=1 2\n"
            "  rhs:\n    2xf32=1 2.5\n") in out
    assert "2xf8E4M3FN=1 9\n  rhs:\n    2xf8E4M3FN=1 8\n" in out


def test_passing_subset_exits_zero_and_expect_failure_inverts(suite_vmfb):
    only_passing = "--gtest_filter=" + ":".join(f"module.{n}" for n in sorted(PASSING))
    rc, out, _ = _check([f"--module={suite_vmfb}", "--device=sync", only_passing])
    assert rc == 0 and set(_verdicts(out).values()) == {"OK"}
    assert out.endswith(f"[  PASSED  ] {len(PASSING)} tests.\n")
    rc, out, _ = _check([f"--module={suite_vmfb}", "--device=sync", "--expect_failure"])
    assert rc == 0 and out.endswith("Test failed as expected\n")
    rc, out, _ = _check([f"--module={suite_vmfb}", "--device=sync", "--expect_failure",
                         only_passing])
    assert rc == 1 and out.endswith("Test passed but expected failure\n")


def test_exports_with_arguments_are_rejected(tmp_path):
    vmfb = str(compile_mlir("func.func @f(%a: i32) -> i32 { return %a : i32 }", HOST_FLAGS))
    rc, out, err = _check([f"--module={vmfb}", "--device=sync"])
    assert rc == 1
    assert "expected function with no inputs or outputs, but export 'f'" in err
    assert out.endswith("Test failed\nINVALID_ARGUMENT: expected function with no inputs or "
                        "outputs, but export 'f' has signature '0i_i'\n")


def test_check_module_through_load(suite_vmfb):
    with tinyhal.load(suite_vmfb, device="sync", modules=[create_check_module]) as m:
        m.eq_passes()
        assert check_failures(m) == []
        m.fails_twice_and_runs_on()
        assert len(check_failures(m)) == 2


def test_console_script(suite_vmfb):
    proc = subprocess.run([TINYHAL_CHECK, f"--module={suite_vmfb}", "--device=local-sync",
                           "--gtest_filter=module.eq_*"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert _verdicts(proc.stdout) == {"eq_passes": "OK", "eq_const_passes": "OK",
                                      "eq_const_fails": "FAILED"}


def test_narrow_types_in_checks_are_compared_as_irees():
    # almost_eq widens bf16/fp8 to f32; eq compares bytes
    from tinyhal.hal import create_device
    from tinyhal.hal.buffer_view import BufferView

    device = create_device("sync")
    try:
        module = create_check_module(device)
        fns = {name.split(".")[1]: f.fn for name, f in module.functions.items()}

        def view(values, dtype):
            return BufferView.from_numpy(device, np.array(values, dtype))

        bf = ml_dtypes.bfloat16
        fns["expect_almost_eq"](device, view([1.0, np.nan], bf), view([1.0078125, np.nan], bf),
                                0.01, 0.0)
        assert module.state.failures == []
        fns["expect_almost_eq"](device, view([1.0, 2.0], bf), view([1.0, np.inf], bf),
                                1e30, 0.0)
        assert "index 1" in module.state.failures[-1]
        with pytest.raises(tinyhal.Error, match="unsupported element type si32"):
            fns["expect_almost_eq"](device, view([1], np.int32), view([1], np.int32), 0, 0)
        fns["expect_eq"](device, view([1, 2], np.int32), view([1, 2], np.uint32))
        assert "Element types do not match." in module.state.failures[-1]
    finally:
        device.close()
