"""Programs nobody wrote a test for, run by tinyhal on every driver and by iree.runtime.

`support.differential` generates valid programs from a seed (host code over i32/i64/f32
edge values with loops, branches, divisions and conversions; VM-level buffer and list
code at wrapping and out-of-range indices; small linalg programs whose dispatches run on
the HAL; linalg over every element type, f64 to bf16 and i8 to i64, with dynamic shapes,
reductions, transposes, broadcasts, gathers and two results, for llvm-cpu and VMVX;
small models imported from ONNX, for both targets; host code with f64, a kept call,
mutable globals and a list holding a tensor), compiles them with the pinned iree-compile
(cached by content) and compares every call's bits, or error status, in a child process
with a timeout.

The default suite runs a fixed sample: seeds that found differences when the harness was
written (kept as regressions) and a few more. The storm runs many more seeds and is
opt-in: `python -m pytest -m differential_storm tests/vm/test_differential_programs.py`
(`TINYHAL_DIFFERENTIAL_SEEDS=N` programs of each kind, 40 by default).
"""

from __future__ import annotations

import functools
import os

import pytest

from support.differential import (
    host_program,
    model_program,
    run_program,
    scalar_program,
    tensor_program,
    typed_program,
    vm_program,
)

pytest.importorskip("iree.runtime")

# seeds whose programs showed a difference, each fixed since (see the commit that adds it)
SCALAR_SEEDS = [10, 12, 20, 25, 26, 105]  # ordered remaps mixing f32 and i64; fptoui(NaN)
INTEGER_SEEDS = [0, 1]  # integer-only functions: the C interpreter
VM_SEEDS = [2, 5, 9, 145, 1018]  # wrapping indices, ranges before a buffer (IREE dies);
# 145, 1018: a clone after a head write (IREE crashes, or answers: undefined)
TENSOR_SEEDS = [0]
TYPED_SEEDS = [5, 17]  # VMVX f64; llvm-cpu bf16 (through f32)
MODEL_SEEDS = [0, 2, 4]  # attention on VMVX, a grouped strided conv, int8 matmul on VMVX
HOST_SEEDS = [0, 224]  # f64, a kept call, globals, a list of refs; 224: an f64 swapped through a temporary

GENERATORS = {"scalar": scalar_program,
              "integer": functools.partial(scalar_program, integers=True),
              "vm": vm_program, "tensor": tensor_program, "typed": typed_program,
              "model": model_program, "host": host_program}


def _check(kind: str, seed: int) -> None:
    report = run_program(GENERATORS[kind](seed))
    assert not report.not_compiled, report.not_compiled
    assert report.calls_run == len(report.program.calls)
    assert not report.differences, "\n".join(report.differences[:10])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind,seed", [("scalar", s) for s in SCALAR_SEEDS]
                         + [("integer", s) for s in INTEGER_SEEDS]
                         + [("vm", s) for s in VM_SEEDS]
                         + [("tensor", s) for s in TENSOR_SEEDS]
                         + [("typed", s) for s in TYPED_SEEDS]
                         + [("model", s) for s in MODEL_SEEDS]
                         + [("host", s) for s in HOST_SEEDS])
def test_sample_matches_iree(kind, seed):
    _check(kind, seed)


def test_generated_programs_are_deterministic():
    """A seed is the whole reproducer: the same seed gives the same program and calls."""
    for kind, generate in GENERATORS.items():
        a, b = generate(5), generate(5)
        assert (a.source, repr(a.calls)) == (b.source, repr(b.calls)), kind
        assert generate(6).source != a.source, kind


STORM_SEEDS = int(os.environ.get("TINYHAL_DIFFERENTIAL_SEEDS", "40"))


@pytest.mark.differential_storm
@pytest.mark.timeout(0)
@pytest.mark.parametrize("kind", list(GENERATORS))
def test_storm_matches_iree(kind):
    differences: list[str] = []
    refused = 0  # programs the compiler rejects (a division it folds to one by zero)
    for seed in range(1000, 1000 + STORM_SEEDS):
        report = run_program(GENERATORS[kind](seed))
        differences += report.differences
        refused += bool(report.not_compiled)
    assert not differences, f"{len(differences)} differences:\n" + "\n".join(differences[:20])
    assert refused <= STORM_SEEDS // 10, f"{refused} of {STORM_SEEDS} programs did not compile"
