"""Compiles MLIR carried by the tests with the pinned iree-compile, cached by content hash.

The cache key covers the MLIR text, the flags and the compiler version, so a changed
program or flag recompiles and an unchanged one is reused across runs. The cache lives in
`$TINYHAL_TEST_CACHE` or `~/.cache/tinyhal-tests`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

COMPILER_VERSION = "3.13.0"
COMPILE_TIMEOUT = 300


def cache_dir() -> Path:
    root = os.environ.get("TINYHAL_TEST_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tinyhal-tests"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def iree_compile_path() -> str:
    """The compiler binary itself (not the console-script wrapper, whose child would
    outlive a timeout)."""
    try:
        from iree.compiler.tools import binaries

        return binaries.find_tool("iree-compile")
    except Exception:
        found = shutil.which("iree-compile")
        if not found:
            raise RuntimeError("iree-compile not found; install the test extras") from None
        return found


def compile_mlir(source: str, flags: list[str] | tuple[str, ...] = (), suffix: str = ".vmfb") -> Path:
    """Returns the path of `source` compiled with `flags`, compiling only on a cache miss."""
    flags = list(flags)
    key = hashlib.sha256(
        "\0".join([COMPILER_VERSION, source, *flags]).encode()
    ).hexdigest()[:24]
    out = cache_dir() / f"{key}{suffix}"
    if out.exists():
        return out
    src = cache_dir() / f"{key}.mlir"
    src.write_text(source)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    proc = subprocess.Popen(
        [iree_compile_path(), str(src), "-o", str(tmp), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = proc.communicate(timeout=COMPILE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"iree-compile did not finish within {COMPILE_TIMEOUT} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"iree-compile failed:\n{stderr[-4000:]}")
    os.replace(tmp, out)
    return out


HOST_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
              "--iree-llvmcpu-target-cpu=host"]
