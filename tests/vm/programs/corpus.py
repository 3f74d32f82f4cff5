"""The VM program corpus: MLIR programs under `programs/`, their calls and inputs.

Each `Case` names a program (`programs/<name>.mlir`, compiled with the pinned
iree-compile for this host; a `// FLAGS:` first line adds compiler flags) and a sequence
of calls `(function, args)` made in order on one module instance, so module state
carries from call to call. `ulps` > 0 allows that many units in the last place for float
results computed by host-side (VM) float math, which Python and IREE's C may round
differently; everything else must match IREE bit for bit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from support.iree_tools import HOST_FLAGS, compile_mlir

PROGRAMS_DIR = Path(__file__).parent


def program_flags(source: str) -> list[str]:
    m = re.match(r"//\s*FLAGS:(.*)\n", source)
    return m.group(1).split() if m else []


def compile_program(name: str) -> Path:
    source = (PROGRAMS_DIR / f"{name}.mlir").read_text()
    return compile_mlir(source, HOST_FLAGS + program_flags(source))


@dataclass
class Case:
    program: str
    calls: list[tuple[str, tuple[Any, ...]]]
    ulps: int = 0
    tags: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.program


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)) * 7919)


def _cases() -> list[Case]:
    def F(r, *shape, dtype=np.float32, scale=1.0):  # noqa: N802
        return (r.standard_normal(shape) * scale).astype(dtype)

    def I(r, *shape, dtype=np.int32, lo=None, hi=None, nonzero=False):  # noqa: N802, E743
        info = np.iinfo(dtype)
        lo = info.min if lo is None else lo
        hi = info.max if hi is None else hi
        v = r.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64 if dtype !=
                       np.uint64 else np.uint64).astype(dtype)
        if nonzero:
            v[v == 0] = 1
        return v

    cases: list[Case] = []

    def add(program: str, calls, ulps: int = 0, tags=()):
        cases.append(Case(program, calls, ulps, set(tags)))

    r = _rng
    add("add_f32", [("main", (F(r("a"), 4), F(r("b"), 4)))], tags={"tiny"})
    add("broadcast_add", [("main", (F(r("ba"), 3, 5), F(r("bb"), 5)))])
    add("scale_by_scalar", [("main", (F(r("s"), 5, 7), 1.75))])
    add("matmul_odd", [("main", (F(r("m1"), 13, 17), F(r("m2"), 17, 11)))])
    add("matmul_dynamic", [("main", (F(r("d1"), 7, 9), F(r("d2"), 9, 5))),
                           ("main", (F(r("d3"), 1, 3), F(r("d4"), 3, 20))),
                           ("main", (F(r("d5"), 33, 65), F(r("d6"), 65, 17)))])
    add("matmul_i8", [("main", (I(r("q1"), 9, 33, dtype=np.int8),
                                I(r("q2"), 33, 7, dtype=np.int8)))])
    add("conv2d_nhwc", [("main", (F(r("c1"), 1, 10, 10, 3), F(r("c2"), 3, 3, 3, 8)))])
    add("conv2d_nchw_strided", [("main", (F(r("n1"), 2, 4, 15, 13), F(r("n2"), 6, 4, 3, 3)))])
    add("depthwise_conv", [("main", (F(r("w1"), 1, 12, 12, 5), F(r("w2"), 3, 3, 5)))])
    add("maxpool", [("main", (F(r("mp"), 1, 9, 9, 4),))])
    add("avgpool", [("main", (F(r("ap"), 1, 8, 8, 3),))])
    add("reduce_sum", [("main", (F(r("rs"), 7, 129),))])
    add("reduce_max_i32", [("main", (I(r("rm"), 6, 10, 4),))])
    add("argmax", [("main", (F(r("am"), 5, 37),))])
    add("softmax", [("main", (F(r("sm"), 4, 19, scale=3.0),))])
    add("while_collatz", [("main", (np.array(27, np.int64),)),
                          ("main", (np.array(1, np.int64),)),
                          ("main", (np.array(97, np.int64),))])
    add("while_double", [("main", (np.abs(F(r("wd"), 8)) + 0.1, np.array(1000.0, np.float32))),
                         ("main", (np.full(8, 200.0, np.float32), np.array(10.0, np.float32)))])
    add("for_loop", [("main", (F(r("fl"), 16, scale=0.5), 5)), ("main", (F(r("fm"), 16), 0))])
    add("if_select", [("main", (I(r("is"), 10, lo=-1000, hi=1000), 1)),
                      ("main", (I(r("it"), 10, lo=-1000, hi=1000), 0))])
    add("dynamic_elementwise", [("main", (F(r("e1"), 37), F(r("e2"), 37))),
                                ("main", (F(r("e3"), 1), F(r("e4"), 1))),
                                ("main", (F(r("e5"), 1000), F(r("e6"), 1000)))])
    add("dynamic_transpose", [("main", (I(r("dt"), 5, 3, dtype=np.int16),)),
                              ("main", (I(r("du"), 64, 17, dtype=np.int16),))])
    add("int_widths", [
        ("i8ops", (I(r("i8a"), 16, dtype=np.int8), I(r("i8b"), 16, dtype=np.int8))),
        ("i16ops", (I(r("i16a"), 16, dtype=np.int16),
                    I(r("i16b"), 16, dtype=np.int16, nonzero=True))),
        ("i32ops", (I(r("i32a"), 16), I(r("i32b"), 16, lo=-70000, hi=70000, nonzero=True))),
        ("i64ops", (I(r("i64a"), 16, dtype=np.int64), I(r("i64b"), 16, dtype=np.int64))),
    ])
    add("compare_select", [("main", (F(r("cs1"), 3, 7), F(r("cs2"), 3, 7)))])
    add("f16_ops", [("main", (F(r("h1"), 33, dtype=np.float16), F(r("h2"), 33, dtype=np.float16)))])
    add("f64_math", [("main", (F(r("f64"), 4, 5, dtype=np.float64),))])
    add("conversions", [("main", (F(r("cv"), 12, scale=100.0), I(r("cw"), 12)))])
    add("scalar_i32", [("main", (17, 5)), ("main", (-7, 3)), ("main", (2**31 - 1, -2))],
        tags={"host"})
    add("scalar_i64", [("main", (2**40 + 3, 12345)), ("main", (-(2**62), 7))], tags={"host"})
    add("scalar_f32", [("main", (1.5, 0.3)), ("main", (-2.25, 1e-3))], ulps=2, tags={"host"})
    add("scalar_f64", [("main", (1.5, 0.3)), ("main", (1e300, 3.0))], ulps=2, tags={"host"})
    add("scalar_to_tensor", [("main", (2.5, F(r("st"), 6)))])
    add("multi_result", [("main", (F(r("mr1"), 4, 6), F(r("mr2"), 4, 6)))])
    add("globals_counter", [("accumulate", (F(r("g1"), 4),)), ("accumulate", (F(r("g2"), 4),)),
                            ("get_count", ()), ("accumulate", (F(r("g3"), 4),)),
                            ("get_count", ())])
    add("private_calls", [("main", (F(r("pc"), 8, scale=0.1), 10)),
                          ("main", (F(r("pd"), 8, scale=0.1), 1))])
    add("large_grid", [("main", (F(r("lg1"), 1024, 1024), F(r("lg2"), 1024, 1024)))],
        tags={"large"})
    add("large_matmul", [("main", (F(r("lm1"), 256, 384), F(r("lm2"), 384, 200)))],
        tags={"large"})
    add("concat_slice_pad", [("main", (I(r("cp1"), 3, 4), I(r("cp2"), 2, 4)))])
    add("gather", [("main", (F(r("ga"), 10, 3), I(r("gi"), 6, lo=0, hi=9)))])
    add("constants_weights", [("main", (F(r("cwt"), 2, 8),))])
    add("cumsum_scan", [("main", (F(r("cu"), 6, 5),))])
    add("bool_logic", [("main", (r("bl1").integers(0, 2, 9).astype(bool),
                                 r("bl2").integers(0, 2, 9).astype(bool), 1)),
                       ("main", (np.zeros(9, bool), np.ones(9, bool), 0))])
    add("batch_matmul_relu", [("main", (F(r("bm1"), 3, 10, 12), F(r("bm2"), 3, 12, 9)))])
    add("dynamic_reduce", [("main", (F(r("dr"), 6, 11),)), ("main", (F(r("ds"), 1, 130),))])
    return cases


CASES = _cases()


def iree_run_calls(vmfb: Path, calls, driver: str = "local-sync") -> list[Any]:
    """Runs `calls` in order on one IREE context; results as numpy / Python values."""
    import iree.runtime as rt

    config = rt.Config(driver)
    ctx = rt.SystemContext(config=config)
    vm_module = rt.VmModule.copy_buffer(ctx.instance, vmfb.read_bytes())
    ctx.add_vm_module(vm_module)
    module = getattr(ctx.modules, vm_module.name)
    out = []
    for fn, args in calls:
        result = module[fn](*args)
        out.append(_iree_host(result))
    return out


def _iree_host(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return tuple(_iree_host(r) for r in result)
    if hasattr(result, "to_host"):
        return result.to_host()
    return result


def ulp_diff(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in units in the last place between two float arrays."""
    a = np.asarray(a)
    b = np.asarray(b)
    itype = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ai = a.view(itype).astype(np.int64)
    bi = b.view(itype).astype(np.int64)
    # map sign-magnitude to a monotonic integer line
    mask = np.int64((1 << (a.dtype.itemsize * 8 - 1)) - 1)
    ai = np.where(ai < 0, -(ai & mask), ai)
    bi = np.where(bi < 0, -(bi & mask), bi)
    return int(np.max(np.abs(ai - bi))) if ai.size else 0


def assert_same(ours: Any, theirs: Any, ulps: int = 0, where: str = "") -> None:
    """Asserts two results are identical (numpy arrays: dtype, shape and bits)."""
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs), (
            f"{where}: {len(theirs)} results expected, got {ours!r}")
        for i, (o, t) in enumerate(zip(ours, theirs)):
            assert_same(o, t, ulps, f"{where} result {i}")
        return
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), f"{where}: expected an array, got {ours!r}"
        assert ours.shape == theirs.shape, f"{where}: shape {ours.shape} != {theirs.shape}"
        if theirs.dtype == np.bool_ or ours.dtype == np.bool_:
            assert np.array_equal(ours.astype(bool), theirs.astype(bool)), where
            return
        assert ours.dtype == theirs.dtype, f"{where}: dtype {ours.dtype} != {theirs.dtype}"
        if ours.dtype.kind == "f" and ulps:
            assert ulp_diff(ours, theirs) <= ulps, f"{where}: more than {ulps} ULP apart"
            return
        assert ours.tobytes() == theirs.tobytes(), (
            f"{where}: values differ\nours  ={ours!r}\ntheirs={theirs!r}")
        return
    if isinstance(theirs, float):
        assert isinstance(ours, float), f"{where}: expected a float, got {ours!r}"
        if ulps:
            width = np.float32 if abs(theirs) < 3.4e38 and np.float32(theirs) == theirs \
                else np.float64
            assert ulp_diff(np.array([ours], width), np.array([theirs], width)) <= ulps, (
                f"{where}: {ours!r} vs {theirs!r}")
        else:
            assert np.float64(ours).tobytes() == np.float64(theirs).tobytes(), (
                f"{where}: {ours!r} != {theirs!r}")
        return
    if isinstance(theirs, (bool, int, np.integer)):
        assert int(ours) == int(theirs), f"{where}: {ours!r} != {theirs!r}"
        return
    assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"
