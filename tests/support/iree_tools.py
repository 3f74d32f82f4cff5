"""Compiles MLIR carried by the tests with the pinned iree-compile, cached by content hash.

The cache key covers the MLIR text, the flags and the compiler version, so a changed
program or flag recompiles and an unchanged one is reused across runs. The cache lives in
`$TINYHAL_TEST_CACHE` or `~/.cache/tinyhal-tests`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

COMPILER_VERSION = "3.13.0"


def cache_dir() -> Path:
    root = os.environ.get("TINYHAL_TEST_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "tinyhal-tests"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def iree_compile_path() -> str:
    exe = Path(sys.executable).with_name("iree-compile")
    if exe.exists():
        return str(exe)
    found = shutil.which("iree-compile")
    if not found:
        raise RuntimeError("iree-compile not found; install the test extras")
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
    result = subprocess.run(
        [iree_compile_path(), str(src), "-o", str(tmp), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"iree-compile failed:\n{result.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


HOST_FLAGS = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
              "--iree-llvmcpu-target-cpu=host"]
