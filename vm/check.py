"""`tinyhal-check`: a drop-in for `iree-check-module`, with IREE's `check` module built in.

    tinyhal-check --module=tests.vmfb [--device=sync|task|emu] [--expect_failure]

Programs written with IREE's check dialect (`check.expect_eq(%a, %b)`,
`check.expect_almost_eq_const(%x, dense<...>)`, ...) import `check.expect_*`; the
compiler folds the `_const` forms into `expect_eq` / `expect_almost_eq` with a constant
operand and bakes the tolerances in as `f32` operands. Every export (except `__*` and
`*$*`) must take and return nothing and runs as one test in a fresh context on a fresh
device, as iree-check-module registers each as a gtest test. A failed expectation is
recorded and the test goes on (gtest's `EXPECT_*`); an invocation that fails (a trap, an
unsupported element type) fails the test with the error. Output follows gtest's console
format as iree-check-module prints it, with `check.expect_eq: Failure` where gtest names
the C++ source line; the exit status is 0 when every test passed and 1 otherwise
(`--expect_failure` inverts that, printing "Test failed as expected").

The `check` module (`create_check_module`) is also usable on its own:
`tinyhal.load(path, modules=[create_check_module])` followed by `check_failures(module)`.

The expectations follow `runtime/src/iree/modules/check/module.cc`:
- `expect_true(i32)` / `expect_false(i32)`: nonzero / zero;
- `expect_all_true(device, view)`: every element nonzero (i8..i64 of any signedness,
  f32, f64; other element types are an INVALID_ARGUMENT error);
- `expect_eq(device, lhs, rhs)`: same element type, same shape, same bytes;
- `expect_almost_eq(device, lhs, rhs, atol, rtol)`: same element type and shape, and
  per element (widened to f32; f64 as itself) `lhs == rhs`, both NaN, or rhs finite and
  `|lhs - rhs| <= atol + rtol * |rhs|` (f32, f64, f16, bf16 and the fp8 types).
"""

from __future__ import annotations

import fnmatch
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import Error, InvalidArgumentError, NotFoundError
from ..hal.buffer_view import BufferView
from ..hal.text import format_buffer_elements, format_shape_and_element_type
from ..hal.types import ElementType, element_info, format_element_type, unpack_elements
from .native import NativeModule
from .run_flags import EXIT_USAGE, UsageParser

__all__ = ["CheckModule", "CheckState", "check_failures", "create_check_module", "main", "run"]


@dataclass
class CheckState:
    """The failed expectations of one context, in order."""

    failures: list[str] = field(default_factory=list)


def _view_text(view: BufferView) -> str:
    device = view.buffer.allocator.device_ref()
    data = device.read_array(view.buffer, 0, view.byte_length)
    return (format_shape_and_element_type(view.shape, view.element_type) + "="
            + format_buffer_elements(data, view.shape, view.element_type, 1024))


def _view_bytes(view: Any, what: str) -> np.ndarray:
    if not isinstance(view, BufferView):
        raise InvalidArgumentError(f"{what} must be a hal.buffer_view, not {view!r}")
    device = view.buffer.allocator.device_ref()
    return device.read_array(view.buffer, 0, view.byte_length)


def _cxx_double(value: float) -> str:
    """How a C++ ostream prints a double by default (six significant digits)."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return "%g" % value


_ALL_TRUE_TYPES = {
    int(ElementType.INT_8), int(ElementType.SINT_8), int(ElementType.UINT_8),
    int(ElementType.INT_16), int(ElementType.SINT_16), int(ElementType.UINT_16),
    int(ElementType.INT_32), int(ElementType.SINT_32), int(ElementType.UINT_32),
    int(ElementType.INT_64), int(ElementType.SINT_64), int(ElementType.UINT_64),
    int(ElementType.FLOAT_32), int(ElementType.FLOAT_64),
}
_ALMOST_EQ_TYPES = {
    int(ElementType.FLOAT_64), int(ElementType.FLOAT_32), int(ElementType.FLOAT_16),
    int(ElementType.BFLOAT_16), int(ElementType.FLOAT_8_E4M3_FN),
    int(ElementType.FLOAT_8_E4M3_FNUZ), int(ElementType.FLOAT_8_E5M2),
    int(ElementType.FLOAT_8_E5M2_FNUZ), int(ElementType.FLOAT_8_E8M0_FNU),
}


class CheckModule(NativeModule):
    """IREE's `check` native module; `state` holds the expectations that failed."""

    def __init__(self, state: CheckState) -> None:
        super().__init__("check", 0)
        self.state = state


def _unsupported(element_type: int) -> Error:
    return InvalidArgumentError(f"unsupported element type {format_element_type(element_type)}")


def create_check_module(device: Any = None, state: CheckState | None = None) -> NativeModule:
    """IREE's `check` module (version 0) recording failures in `state` (a new one if
    None; reachable as `module.state`)."""
    state = state if state is not None else CheckState()
    module = CheckModule(state)

    @module.export("expect_true", "0i_v")
    def expect_true(operand: int) -> None:
        if not operand:
            state.failures.append(
                "check.expect_true: Failure\n"
                f"Value of: operand\n  Actual: false\nExpected: true\n"
                f"Expected {operand} to be nonzero.")

    @module.export("expect_false", "0i_v")
    def expect_false(operand: int) -> None:
        if operand:
            state.failures.append(
                "check.expect_false: Failure\n"
                f"Value of: operand\n  Actual: true\nExpected: false\n"
                f"Expected {operand} to be zero.")

    @module.export("expect_all_true", "0rr_v")
    def expect_all_true(_device: Any, view: Any) -> None:
        data = _view_bytes(view, "operand")
        element_type = int(view.element_type)
        if element_type not in _ALL_TRUE_TYPES:
            raise _unsupported(element_type)
        values = unpack_elements(data, (math.prod(view.shape),), element_type)
        zero = np.nonzero(values == 0)[0]
        if len(zero):
            shown = ", ".join(
                str(v) if values.dtype.kind in "iu" else _cxx_double(float(v))
                for v in values[:32]) + (", ..." if len(values) > 32 else "")
            state.failures.append(
                "check.expect_all_true: Failure\n"
                f"Value of: ToSpan<T>(bytes)\nExpected: only contains elements that isn't "
                f"equal to 0\n  Actual: {{ {shown} }}, whose element #{int(zero[0])} "
                f"equals 0")

    @module.export("expect_eq", "0rrr_v")
    def expect_eq(_device: Any, lhs: Any, rhs: Any) -> None:
        lhs_data, rhs_data = _view_bytes(lhs, "lhs"), _view_bytes(rhs, "rhs")
        types_eq = lhs.element_type == rhs.element_type
        shape_eq = tuple(lhs.shape) == tuple(rhs.shape)
        contents_eq = lhs_data.tobytes() == rhs_data.tobytes()
        if types_eq and shape_eq and contents_eq:
            return
        reasons = ("" if types_eq else " Element types do not match.") + (
            "" if shape_eq else " Shapes do not match.") + (
            "" if contents_eq else " Contents does not match.")
        state.failures.append(
            "check.expect_eq: Failure\nFailed\n"
            f"Expected equality of these values.{reasons}\n  lhs:\n    {_view_text(lhs)}\n"
            f"  rhs:\n    {_view_text(rhs)}")

    @module.export("expect_almost_eq", "0rrrff_v")
    def expect_almost_eq(_device: Any, lhs: Any, rhs: Any, atol: float, rtol: float) -> None:
        lhs_data, rhs_data = _view_bytes(lhs, "lhs"), _view_bytes(rhs, "rhs")
        types_eq = lhs.element_type == rhs.element_type
        shape_eq = tuple(lhs.shape) == tuple(rhs.shape)
        atol = float(np.float32(atol))
        rtol = float(np.float32(rtol))
        almost_eq = True
        diagnostic = (0, 0.0, 0.0)
        if types_eq and shape_eq:
            element_type = int(lhs.element_type)
            if element_type not in _ALMOST_EQ_TYPES:
                raise _unsupported(element_type)
            count = math.prod(lhs.shape)
            wide = np.float64 if element_type == ElementType.FLOAT_64 else np.float32
            a = unpack_elements(lhs_data, (count,), element_type).astype(wide)
            b = unpack_elements(rhs_data, (count,), element_type).astype(wide)
            if element_info(element_type) is not None and element_type != ElementType.FLOAT_64:
                a[np.isnan(a)] = np.nan  # IREE's narrow-float loads give positive NaNs
                b[np.isnan(b)] = np.nan
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                ok = (a64 == b64) | (np.isnan(a64) & np.isnan(b64)) | (
                    np.isfinite(b64) & (np.abs(a64 - b64) <= atol + rtol * np.abs(b64)))
            bad = np.nonzero(~ok)[0]
            if len(bad):
                i = int(bad[0])
                almost_eq = False
                diagnostic = (i, float(a64[i]), float(b64[i]))
        if types_eq and shape_eq and almost_eq:
            return
        message = "Expected near equality of these values."
        if not types_eq:
            message += " Element types do not match."
        if not shape_eq:
            message += " Shapes do not match."
        if not almost_eq:
            index, lhs_value, rhs_value = diagnostic
            with np.errstate(invalid="ignore", over="ignore"):
                delta = rhs_value - lhs_value
            delta_text = "%.3e" % delta if math.isfinite(delta) else _cxx_double(delta)
            message += (
                f" Contents does not match to tolerance parameters atol="
                f"{_cxx_double(atol)}, rtol={_cxx_double(rtol)}. The first failure occurs "
                f"at index {index} as the lhs value {_cxx_double(lhs_value)} differs from "
                f"the rhs value {_cxx_double(rhs_value)} by {delta_text}.")
        state.failures.append(
            f"check.expect_almost_eq: Failure\nFailed\n{message}\n  lhs:\n    {_view_text(lhs)}\n  rhs:\n    {_view_text(rhs)}")

    return module


def check_failures(module: Any) -> list[str]:
    """The failed expectations recorded so far by the `check` module linked into a
    `tinyhal.Module` (empty when there is none)."""
    context = getattr(module, "context", None)
    for m in context.modules if context is not None else ():
        if isinstance(m, CheckModule):
            return list(m.state.failures)
    return []


# -- the runner ----------------------------------------------------------------------------


@dataclass
class TestResult:
    name: str
    failures: list[str]
    milliseconds: int


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _selected(name: str, pattern: str) -> bool:
    positive, _, negative = pattern.partition("-")
    pos = [p for p in positive.split(":") if p] or ["*"]
    neg = [p for p in negative.split(":") if p]
    return any(fnmatch.fnmatchcase(name, p) for p in pos) and not any(
        fnmatch.fnmatchcase(name, p) for p in neg)


def _run_test(path: str, device: str, native: list[Any], name: str) -> list[str]:
    from .api import Module

    state = CheckState()
    module = None
    try:
        module = Module(path, device,
                        modules=[lambda dev: create_check_module(dev, state), *native])
        module.invoke(name)
    except Error as exc:
        state.failures.append(
            f"{name}: Failure\nValue of: status\nExpected: is OK\n  Actual: {exc}")
    finally:
        if module is not None:
            module.close()
    return state.failures


def run(argv: Sequence[str], stdout=None, stderr=None) -> int:
    from .api import Module
    from .run import create_devices, device_name, native_module_factory

    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = UsageParser(
        prog="tinyhal-check",
        description="Runs every export of a module as a test with IREE's check module "
                    "(iree-check-module's flags and output).",
        epilog="A mistake on the command line exits 2; a failed test 1.",
        allow_abbrev=False)
    parser.add_argument("--module", action="append", default=[], help="the .vmfb to test")
    parser.add_argument("--native_module", action="append", default=[],
                        help="package.module:factory of another Python native module")
    parser.add_argument("--device", default="task",
                        help="sync, task (default) or emu, local-sync/local-task as IREE "
                             "spells them, emu://PRESET (generic, mcu-npu, edge-npu, "
                             "datacenter)")
    parser.add_argument("--expect_failure", action="store_true",
                        help="succeed only if some test fails")
    parser.add_argument("--gtest_filter", default="*", help="tests to run (gtest syntax)")
    try:
        args = parser.parse_args(list(argv))
        if len(args.module) != 1:
            raise InvalidArgumentError("tinyhal-check takes one --module=")
        for device in create_devices([args.device], {}):  # refuses an unknown driver now
            device.close()
    except SystemExit as exc:
        return int(exc.code or 0)
    except InvalidArgumentError as exc:
        stderr.write(f"tinyhal-check: {exc}\n")
        return EXIT_USAGE
    exit_code = 1
    status = "OK"
    try:
        path = args.module[0]
        if not os.path.exists(path):
            raise NotFoundError(f"module file not found: {path}")  # as tinyhal-run
        device = device_name(args.device)
        native = [native_module_factory(s) for s in args.native_module]
        with Module(path, device,
                    modules=[lambda dev: create_check_module(dev), *native]) as probe:
            suite = probe.name
            names = []
            for export_name, export in probe.bytecode.exports.items():
                if export_name.startswith("__") or "$" in export_name:
                    continue
                if export.cconv.args or export.cconv.results:
                    raise InvalidArgumentError(
                        f"expected function with no inputs or outputs, but export "
                        f"'{export_name}' has signature '{export.cconv.text}'")
                if _selected(f"{suite}.{export_name}", args.gtest_filter):
                    names.append(export_name)
        exit_code = _run_suite(suite, names, path, device, native, stdout)
    except Error as exc:
        stderr.write(f"tinyhal-check: {exc}\n")
        status = str(exc)
        exit_code = 1
    stdout.flush()
    if args.expect_failure:
        if exit_code == 0:
            stdout.write("Test passed but expected failure\n")
            return 1
        stdout.write("Test failed as expected\n")
        return 0
    if exit_code != 0:
        stdout.write(f"Test failed\n{status}\n")
    return exit_code


def _run_suite(suite: str, names: list[str], path: str, device: str, native: list[Any],
               out: Any) -> int:
    out.write(f"[==========] Running {_plural(len(names), 'test')} from "
              f"{_plural(1 if names else 0, 'test suite')}.\n")
    out.write("[----------] Global test environment set-up.\n")
    results: list[TestResult] = []
    total_start = time.monotonic()
    if names:
        out.write(f"[----------] {_plural(len(names), 'test')} from {suite}\n")
    for name in names:
        out.write(f"[ RUN      ] {suite}.{name}\n")
        out.flush()
        start = time.monotonic()
        failures = _run_test(path, device, native, name)
        ms = int((time.monotonic() - start) * 1000)
        for failure in failures:
            out.write(f"{failure}\n")
        out.write(f"{'[  FAILED  ]' if failures else '[       OK ]'} {suite}.{name} ({ms} ms)\n")
        out.flush()
        results.append(TestResult(name, failures, ms))
    total_ms = int((time.monotonic() - total_start) * 1000)
    if names:
        out.write(f"[----------] {_plural(len(names), 'test')} from {suite} "
                  f"({total_ms} ms total)\n\n")
    out.write("[----------] Global test environment tear-down\n")
    out.write(f"[==========] {_plural(len(names), 'test')} from "
              f"{_plural(1 if names else 0, 'test suite')} ran. ({total_ms} ms total)\n")
    passed = [r for r in results if not r.failures]
    failed = [r for r in results if r.failures]
    out.write(f"[  PASSED  ] {_plural(len(passed), 'test')}.\n")
    if failed:
        out.write(f"[  FAILED  ] {_plural(len(failed), 'test')}, listed below:\n")
        for r in failed:
            out.write(f"[  FAILED  ] {suite}.{r.name}\n")
        out.write(f"\n{len(failed):2d} FAILED {'TEST' if len(failed) == 1 else 'TESTS'}\n")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    sys.exit(run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
