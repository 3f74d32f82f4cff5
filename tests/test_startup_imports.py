"""Start-up imports only what it uses: running a module from the shell or `tinyhal.load`
from a script builds no cffi FFI (the compiled helpers are installed), imports no event
loop library (nothing runs one), no ml_dtypes (no element type here needs it), no OpenSSL
(`hashlib`; content hashes use `_blake2`), no profiler, `json` or `logging` (nothing is
profiled or logged), no `shutil` (argparse asks it the terminal width only for help) and
neither TinyIREE's inline modules nor parameter support (the module needs neither).
`tinyhal-run` with plain inputs imports no numpy either (`vm/test_run_without_numpy.py`)."""

from __future__ import annotations

from pathlib import Path

from support.child import run_child

SAXPY = Path(__file__).resolve().parents[1] / "server" / "models" / "saxpy" / "1" / "model.vmfb"

NOT_AT_START_UP = ("trio", "asyncio", "pycparser", "cffi.api", "tinyhal.hal.native.build",
                   "tinyhal.vm.scalar.build", "ctypes.util", "tinyhal.hal.kernels", "tempfile", "ml_dtypes",
                   "hashlib", "_hashlib", "tinyhal.hal.profile", "json", "logging", "shutil",
                   "tinyhal.vm.hal_inline", "tinyhal.vm.io_parameters",
                   "tinyhal.vm.parameter_formats")


def test_tinyhal_run_and_load_import_no_ffi_builder_and_no_event_loop():
    out = run_child(f"""
        import io, sys
        import numpy as np
        import tinyhal
        from tinyhal.vm.run import run

        code = run(["--module={SAXPY}", "--function=saxpy", "--input=2",
                    "--input=3xf32=1,2,3", "--input=3xf32=1,1,1", "--device=task"],
                   stdout=io.StringIO(), stderr=sys.stderr)
        assert code == 0
        with tinyhal.load({str(SAXPY)!r}, device="sync") as module:
            assert module.saxpy(np.float32(2), np.ones(3, np.float32),
                                np.ones(3, np.float32)).tolist() == [3.0, 3.0, 3.0]
        print(sorted(m for m in {NOT_AT_START_UP!r} if m in sys.modules))
    """)
    assert out.strip() == "[]"


# Each costs a few milliseconds of a ~100 ms start: `dataclasses` (with `inspect`, `ast`,
# `dis`) at import, and then per class it defines; `subprocess` is only for a large
# translation compiled in a child; `ast` only for a .npy input's header.
NOT_IN_A_WARM_RUN = ("dataclasses", "inspect", "subprocess", "ast")


def test_a_warm_tinyhal_run_defines_no_dataclass():
    program = f"""
        import io, sys
        from tinyhal.vm.run import run

        code = run(["--module={SAXPY}", "--function=saxpy", "--input=2",
                    "--input=3xf32=1,2,3", "--input=3xf32=1,1,1", "--device=task"],
                   stdout=io.StringIO(), stderr=sys.stderr)
        assert code == 0
        print(sorted(m for m in {NOT_IN_A_WARM_RUN!r} if m in sys.modules))
    """
    run_child(program)  # translates on a cold cache: the translator may use them
    assert run_child(program).strip() == "[]"
