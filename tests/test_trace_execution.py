"""`tinyhal-run --trace_execution`: each VM instruction as IREE prints it, line for line.

The default suite compares with traces an IREE build with execution tracing recorded
(`tests/vm/traces/`, made as its README says); `-m iree_trace` with
`TINYHAL_IREE_TRACING_RUN_MODULE` naming such a build compares every corpus program live.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from support.run_compare import tinyhal_run
from support.trace_cases import CASES, TRACES_DIR, TraceCase, iree_trace, normalize

IREE_TRACING = os.environ.get("TINYHAL_IREE_TRACING_RUN_MODULE", "")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_trace_is_iree_s_line_for_line(case: TraceCase):
    rc, out, err = tinyhal_run(case.argv())
    assert rc == 0, err
    assert out.startswith("EXEC @")
    expected = (TRACES_DIR / f"{case.name}.trace").read_text().splitlines()
    assert normalize(err) == expected
    assert len(err.splitlines()) == len(expected)  # nothing but trace lines on stderr


def test_a_run_without_the_flag_prints_the_same_results_and_no_trace():
    case = CASES[1]
    traced = tinyhal_run(case.argv())
    plain = tinyhal_run([a for a in case.argv() if a != "--trace_execution"])
    off = tinyhal_run([a if a != "--trace_execution" else "--trace_execution=false"
                       for a in case.argv()])
    assert traced[0] == plain[0] == off[0] == 0
    assert traced[1] == plain[1] == off[1]
    assert plain[2] == off[2] == ""


def test_tracing_leaves_the_default_translation_alone():
    """Zero cost when off: the translation every untraced run uses has no trace call,
    and a traced context makes its own translation beside it."""
    from tinyhal.hal import create_device
    from tinyhal.vm import Context, create_hal_module, load_module

    path = CASES[1].module_path()
    module = load_module(str(path))
    assert module.program.trace_sites == () and "_tr(" not in module.program.source
    device = create_device("sync")
    try:
        stream = io.StringIO()
        ctx = Context([create_hal_module([device]), module], trace_execution=stream)
        assert ctx.invoke("scalars", [-7, 1.3, 3]) == Context(
            [create_hal_module([device]), module]).invoke("scalars", [-7, 1.3, 3])
        inst = ctx.instances[0]
        assert inst.program is not module.program and inst.program.trace_sites
        assert module.program.trace_sites == ()
        assert stream.getvalue().count("\n") == 45
    finally:
        device.close()


def test_load_traces_to_the_stream_given():
    import tinyhal

    stream = io.StringIO()
    with tinyhal.load(str(CASES[0].module_path()), "sync", trace_execution=stream) as m:
        out = m.main(np.arange(4, dtype=np.float32), np.ones(4, np.float32))
    assert out.tolist() == [1, 2, 3, 4]
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[module@2+00000000]    <block>"
    assert lines[-1].startswith("[module@1+") and "vm.return %R0(!hal.buffer_view/0x" in lines[-1]


def test_flag_values_and_flagfiles(tmp_path, capsys):
    argv = CASES[3].argv()
    rc, _, _ = tinyhal_run([a if a != "--trace_execution" else "--trace_execution=maybe"
                            for a in argv])
    err = capsys.readouterr().err  # argparse's usage errors go to the process's stderr
    assert rc == 2 and err.count("\n") == 1
    assert "--trace_execution" in err and "expected true or false" in err
    flagfile = tmp_path / "trace.flags"
    flagfile.write_text("# as iree-run-module reads it\n--trace_execution=true\n")
    rc, _, err = tinyhal_run([f"--flagfile={flagfile}",
                              *[a for a in argv if a != "--trace_execution"]])
    assert rc == 0
    assert normalize(err) == (TRACES_DIR / "vm_branches.trace").read_text().splitlines()


def test_a_failing_instruction_is_the_last_line_before_the_error():
    case = CASES[2]
    argv = [a if a != "--input=1" else "--input=4096" for a in case.argv()]
    rc, _, err = tinyhal_run(argv)
    lines = err.splitlines()
    assert rc == 1
    assert "vm.buffer.load.i8.s %r1(!vm.buffer/0x" in lines[-2]
    assert lines[-2].endswith(", %i2:3(4096)")
    assert lines[-1].startswith("tinyhal-run: OUT_OF_RANGE")


# -- against a live IREE build with execution tracing (opt-in)

def _corpus_cases() -> list[TraceCase]:
    sys.path.insert(0, str(Path(__file__).parent / "vm" / "programs"))
    from corpus import _cases

    return [TraceCase(c.program, c.program, (f"--function={c.calls[0][0]}",))
            for c in _cases()]


def _corpus_inputs(name: str, folder: Path) -> list[str]:
    from corpus import _cases

    case = next(c for c in _cases() if c.program == name)
    flags = []
    for i, value in enumerate(case.calls[0][1]):
        if isinstance(value, np.ndarray):
            path = folder / f"{i}.npy"
            np.save(path, value)
            flags.append(f"--input=@{path}")
        else:
            flags.append(f"--input={int(value) if isinstance(value, bool) else value}")
    return flags


@pytest.mark.iree_trace
@pytest.mark.skipif(not IREE_TRACING, reason="set TINYHAL_IREE_TRACING_RUN_MODULE to an "
                    "iree-run-module built with execution tracing (tests/vm/traces/README.md)")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", [*CASES, *_corpus_cases()], ids=lambda c: c.name)
def test_live_iree_trace_line_for_line(case: TraceCase, tmp_path):
    if "\n" not in case.source and case not in CASES:  # a corpus program: its inputs
        case = TraceCase(case.name, case.source,
                         (*case.flags, *_corpus_inputs(case.name, tmp_path)))
    expected = iree_trace(IREE_TRACING, case)
    rc, _, err = tinyhal_run(case.argv())
    assert rc == 0, err
    assert normalize(err) == expected


YIELDING_VM = """
vm.module @yt {
  vm.import private optional @native.missing(%a : i32) -> i32
  vm.import private @native.wait(%x : i32) -> i32 attributes {vm.yield}
  vm.func @f(%n : i32) -> (i32, i32) {
    vm.call.yieldable @native.wait(%n) : (i32) -> ^bb1(i32)
  ^bb1(%r : i32):
    vm.yield ^bb2
  ^bb2:
    %res = vm.import.resolved @native.missing : i32
    vm.return %r, %res : i32, i32
  }
  vm.export @f
}
"""


def test_yields_and_unresolved_imports_as_iree_writes_them():
    """Lines iree-run-module cannot produce (the import is a Python native module),
    checked by hand against IREE's disassembler: a resume lands past the block marker,
    `import.resolved` says whether the import resolved."""
    from support.vm_pairs import vm_compile_source
    from tinyhal.vm import Context, NativeModule, load_module

    native = NativeModule("native")
    native.export("wait", "0i_i", yieldable=True)(lambda x: x * 2)
    stream = io.StringIO()
    ctx = Context([native, load_module(vm_compile_source(YIELDING_VM, ["--compile-from=vm"]))],
                  trace_execution=stream)
    assert ctx.invoke("f", [21]) == [42, 0]
    assert stream.getvalue().splitlines() == [
        "[yt.f+00000000]    <block>",
        "[yt.f+00000001]    vm.call.yieldable @native.wait(%i0(21)) -> ^00000012(%i0)",
        "[yt.f+00000013]    vm.yield ^0000001A()",
        "[yt.f+0000001B]    %i1 = vm.import.resolved @native.missing // (unresolved)",
        "[yt.f+00000022]    vm.return %i0(42), %i1(0)",
    ]
