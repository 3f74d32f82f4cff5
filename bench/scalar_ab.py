"""Two builds of the C interpreter (`tinyhal.vm.scalar`) side by side on the same programs.

The interpreter's cases are generated from the op table (`vm/optable.py`); a change to a
row or to how rows become C must not slow it down. This loads two compiled interpreters
(`--before`: a `_scalar` module built from another checkout; `--after`: this checkout's,
by default) into one process and runs the integer loops of the native-loop tests
(`tests/vm/native_loops.mlir`: every integer op family, i32 and i64) in both, in
alternating rounds, `--trips` loop trips per run; the table shows the median process CPU
time per run and after / before. Results must be equal, checked every run. Writes
`bench/results/scalar_ab.json`.

    python bench/scalar_ab.py --before OTHER/vm/scalar/_scalar.abi3.so [--rounds 9]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from _common import print_table, write_results  # noqa: E402

from support.vm_pairs import vm_compile_source  # noqa: E402
from tinyhal.vm import load_module, scalar  # noqa: E402

ARGUMENTS = {"mix_i64": (123456789012345, 987654321), "mix_i32": (12345, 678)}


def _interpreter(path: str, label: str) -> ModuleType:
    """A compiled `_scalar` module loaded from `path` (its init function is `_scalar`'s,
    so the module is named `<label>._scalar`, never put in `sys.modules`)."""
    spec = importlib.util.spec_from_file_location(f"{label}._scalar", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(interpreter: ModuleType, program: scalar.ScalarProgram, args: tuple) -> tuple:
    """(CPU seconds, results) of one run of `program` to its return."""
    ffi, lib = interpreter.ffi, interpreter.lib
    code = ffi.from_buffer("int32_t[]", program.words)
    regs = ffi.new("uint32_t[]", program.register_count)
    for (slot, wide), value in zip(program.arguments, args):
        regs[slot] = value & 0xFFFFFFFF
        if wide:
            regs[slot + 1] = (value >> 32) & 0xFFFFFFFF
    pc = ffi.new("uint32_t*")
    out = ffi.new("int64_t[]", max(program.result_count, 1))
    start = time.process_time()
    status = lib.tinyhal_scalar_run(code, regs, pc, 1 << 62, out)
    elapsed = time.process_time() - start
    if status != lib.SCALAR_DONE:
        raise SystemExit(f"the interpreter stopped with status {status}")
    return elapsed, tuple(out[0:program.result_count])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a compiled _scalar module")
    parser.add_argument("--after", help="a compiled _scalar module (default: the one "
                                        "this checkout imports)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--trips", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    os.environ["TINYHAL_VM_NATIVE_LOOPS"] = "1"
    if args.after is None:
        spec = importlib.util.find_spec("tinyhal.vm.scalar._scalar")
        if spec is None or not spec.origin:
            raise SystemExit("this checkout's interpreter is not built in place: pass --after")
        args.after = spec.origin
    interpreters = {"before": _interpreter(args.before, "before"),
                    "after": _interpreter(args.after, "after")}
    source = (HERE.parent / "tests" / "vm" / "native_loops.mlir").read_text()
    module = load_module(vm_compile_source(source))
    names = {f.ordinal: f.name for f in module.functions}
    programs = {names[o]: p for o, p in module.program.native_loops.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name, rest in ARGUMENTS.items():
            order = list(interpreters) if r % 2 == 0 else list(interpreters)[::-1]
            results = {}
            for side in order:
                elapsed, results[side] = _run(interpreters[side], programs[name],
                                              (args.trips, *rest))
                times.setdefault((name, side), []).append(elapsed)
            if results["before"] != results["after"]:
                raise SystemExit(f"{name}: the builds disagree: {results}")
    rows = []
    for name in ARGUMENTS:
        before = statistics.median(times[(name, "before")])
        after = statistics.median(times[(name, "after")])
        rows.append({"program": name, "trips": args.trips, "before cpu ms": before * 1e3,
                     "after cpu ms": after * 1e3, "after / before": after / before})
    print_table(rows, ["program", "trips", "before cpu ms", "after cpu ms", "after / before"])
    write_results("scalar_ab", rows, {"before": args.before, "after": args.after,
                                      "rounds": args.rounds})


if __name__ == "__main__":
    main()
